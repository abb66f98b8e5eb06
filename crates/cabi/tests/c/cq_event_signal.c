/* ibv_get_cq_event blocked on an empty channel returns -1 / EINTR when a signal handler
 * without SA_RESTART runs (qperf ends each test with such a SIGALRM), as rdma-core's
 * blocking read of the channel's fd does; with SA_RESTART it goes on waiting. */
#include <infiniband/verbs.h>
#include "signal_util.h"

static volatile int returned, restarted_returned;

int main(void)
{
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list || n < 1)
		FAIL("no device");
	struct ibv_context *ctx = ibv_open_device(list[0]);
	struct ibv_comp_channel *ch = ctx ? ibv_create_comp_channel(ctx) : NULL;
	struct ibv_cq *cq = ch ? ibv_create_cq(ctx, 4, NULL, ch, 0) : NULL;
	if (!cq || ibv_req_notify_cq(cq, 0))
		FAIL("setup failed: %s", strerror(errno));
	struct ibv_cq *got;
	void *gctx;

	handle(SIGALRM, 0); /* no SA_RESTART: the wait ends */
	after_signal(must_have_returned, (void *)&returned, 2000000);
	alarm(1);
	errno = 0;
	int rc = ibv_get_cq_event(ch, &got, &gctx);
	returned = 1;
	if (rc != -1 || errno != EINTR || !fired)
		FAIL("ibv_get_cq_event: rc %d errno %d fired %d", rc, errno, (int)fired);
	printf("ok eintr\n");
	fflush(stdout);

	fired = 0;
	handle(SIGALRM, SA_RESTART); /* the wait goes on */
	after_signal(must_still_wait, (void *)&restarted_returned, 500000);
	alarm(1);
	rc = ibv_get_cq_event(ch, &got, &gctx);
	restarted_returned = 1;
	FAIL("with SA_RESTART: rc %d errno %d fired %d", rc, errno, (int)fired);
}
