/* rdma_get_cm_event blocked on an empty channel returns -1 / EINTR when a signal handler
 * without SA_RESTART runs, as rdma-core's blocking read of the channel's fd does; with
 * SA_RESTART it waits on and returns the event that comes after the signal. */
#include <arpa/inet.h>
#include <rdma/rdma_cma.h>
#include "signal_util.h"

static volatile int returned;

/* After the signal ran, resolves 127.0.0.1 on the id: its event ends the wait. */
static void resolve(void *arg)
{
	struct sockaddr_in a;
	memset(&a, 0, sizeof a);
	a.sin_family = AF_INET;
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (rdma_resolve_addr(arg, NULL, (struct sockaddr *)&a, 2000))
		printf("rdma_resolve_addr: %s\n", strerror(errno));
}

int main(void)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *id = NULL;
	if (!ch || rdma_create_id(ch, &id, NULL, RDMA_PS_TCP))
		FAIL("setup failed: %s", strerror(errno));
	struct rdma_cm_event *ev = NULL;

	handle(SIGALRM, 0); /* no SA_RESTART: the wait ends */
	after_signal(must_have_returned, (void *)&returned, 2000000);
	alarm(1);
	errno = 0;
	int rc = rdma_get_cm_event(ch, &ev);
	returned = 1;
	if (rc != -1 || errno != EINTR || !fired)
		FAIL("rdma_get_cm_event: rc %d errno %d fired %d", rc, errno, (int)fired);
	printf("ok eintr\n");

	fired = 0;
	handle(SIGALRM, SA_RESTART); /* the wait goes on until the event */
	after_signal(resolve, id, 200000);
	alarm(1);
	rc = rdma_get_cm_event(ch, &ev);
	if (rc != 0 || !fired || ev->event != RDMA_CM_EVENT_ADDR_RESOLVED)
		FAIL("with SA_RESTART: rc %d errno %d fired %d event %s", rc, errno, (int)fired,
		     rc ? "-" : rdma_event_str(ev->event));
	rdma_ack_cm_event(ev);
	printf("ok restart\n");
	rdma_destroy_id(id);
	rdma_destroy_event_channel(ch);
	printf("all passed\n");
	return 0;
}
