/* rdma_destroy_event_channel while another thread is blocked in rdma_get_cm_event on it:
 * the waiter must never touch the freed channel. As rdma-core's blocking write of the
 * channel's fd: the destroy (a close) does not wake it, a signal handler with SA_RESTART
 * restarts the call on the closed fd, which fails with EBADF; later calls on the destroyed
 * channel are EINVAL (ours: rdma-core would read freed memory). */
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include "signal_util.h"

static int get_event(void *arg)
{
	struct rdma_cm_event *ev;
	return rdma_get_cm_event(arg, &ev);
}

int main(void)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	if (!ch)
		FAIL("setup failed: %s", strerror(errno));
	handle(SIGUSR2, SA_RESTART);
	struct waiter w;
	start_waiter(&w, get_event, ch);
	until_blocked(&w);
	rdma_destroy_event_channel(ch);
	usleep(100000);
	if (waiter_done(&w))
		FAIL("the waiter returned at the destroy: rc %d errno %d", w.rc, w.err);
	end_waiter(&w, SIGUSR2);
	if (w.rc != -1 || w.err != EBADF)
		FAIL("the restarted wait: rc %d errno %d, want -1 EBADF", w.rc, w.err);
	printf("ok closed\n");
	struct rdma_cm_event *ev;
	errno = 0;
	int rc = rdma_get_cm_event(ch, &ev);
	if (rc != -1 || errno != EINVAL)
		FAIL("on the destroyed channel: rc %d errno %d, want -1 EINVAL", rc, errno);
	printf("ok stale\nall passed\n");
	return 0;
}
