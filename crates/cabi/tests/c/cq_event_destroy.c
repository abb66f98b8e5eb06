/* ibv_destroy_comp_channel while another thread is blocked in ibv_get_cq_event on it: the
 * waiter must never touch the freed channel. rdma-core's contract: destroying a channel
 * with CQs attached fails with EBUSY; after the destroy the waiter's read goes on (a close
 * does not wake it), a signal handler with SA_RESTART restarts the read on the closed fd,
 * which fails with EBADF, and one without SA_RESTART ends it with EINTR; ibv_destroy_cq
 * waits until every event ibv_get_cq_event returned for the CQ is acked.
 *
 * "closed": deterministic. The channel is destroyed under the waiter, then a SA_RESTART
 * signal makes it look at the channel again: -1 / EBADF.
 * "cq_in_use": ibv_destroy_cq of a CQ a QP uses fails with EBUSY (the kernel's answer).
 * "acked": ibv_destroy_cq after an event blocks until ibv_ack_cq_events.
 * "race": ROUNDS rounds (argv[1]) of an event arriving at the destroy: with the waiter
 * blocked, the main thread arms the CQ, completes a receive (a QP in the error state
 * flushes it at once) and destroys QP, CQ and channel while the waiter wakes up; the waiter
 * gets the event (0 and the round's CQ, which it acks) or, having missed it, waits on until
 * a signal without SA_RESTART ends the wait (-1 / EINTR). */
#include <stdlib.h>
#include <infiniband/verbs.h>
#include "signal_util.h"

struct get {
	struct ibv_comp_channel *ch;
	struct ibv_cq *cq;
	void *ctx;
};

static int get_event(void *arg)
{
	struct get *g = arg;
	int rc = ibv_get_cq_event(g->ch, &g->cq, &g->ctx);
	if (rc == 0)
		ibv_ack_cq_events(g->cq, 1);
	return rc;
}

static int destroy_cq(void *cq)
{
	return ibv_destroy_cq(cq);
}

static void closed(struct ibv_context *ctx)
{
	struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
	struct ibv_cq *cq = ch ? ibv_create_cq(ctx, 4, NULL, ch, 0) : NULL;
	if (!cq || ibv_req_notify_cq(cq, 0))
		FAIL("closed: setup failed: %s", strerror(errno));
	int rc = ibv_destroy_comp_channel(ch);
	if (rc != EBUSY)
		FAIL("closed: destroying a channel with a CQ: %d, want EBUSY", rc);
	printf("ok ebusy\n");

	handle(SIGUSR2, SA_RESTART);
	struct get g = { .ch = ch };
	struct waiter w;
	start_waiter(&w, get_event, &g);
	until_blocked(&w);
	if ((rc = ibv_destroy_cq(cq)) || (rc = ibv_destroy_comp_channel(ch)))
		FAIL("closed: destroy: %d", rc);
	usleep(100000);
	if (waiter_done(&w))
		FAIL("closed: the waiter returned at the destroy: rc %d errno %d", w.rc, w.err);
	end_waiter(&w, SIGUSR2);
	if (w.rc != -1 || w.err != EBADF)
		FAIL("closed: the restarted wait: rc %d errno %d, want -1 EBADF", w.rc, w.err);
	printf("ok closed\n");
}

static struct ibv_qp *error_qp(struct ibv_pd *pd, struct ibv_cq *cq)
{
	struct ibv_qp_init_attr ia;
	memset(&ia, 0, sizeof ia);
	ia.send_cq = cq;
	ia.recv_cq = cq;
	ia.qp_type = IBV_QPT_RC;
	ia.cap.max_send_wr = 1;
	ia.cap.max_recv_wr = 1;
	ia.cap.max_send_sge = 1;
	ia.cap.max_recv_sge = 1;
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	if (!qp)
		FAIL("ibv_create_qp: %s", strerror(errno));
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_ERR;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE))
		FAIL("race: to the error state: %s", strerror(errno));
	return qp;
}

static void acked(struct ibv_context *ctx, struct ibv_pd *pd)
{
	struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
	struct ibv_cq *cq = ch ? ibv_create_cq(ctx, 4, NULL, ch, 0) : NULL;
	if (!cq || ibv_req_notify_cq(cq, 0))
		FAIL("acked: setup failed: %s", strerror(errno));
	struct ibv_qp *qp = error_qp(pd, cq);
	struct ibv_recv_wr wr, *bad;
	memset(&wr, 0, sizeof wr);
	if (ibv_post_recv(qp, &wr, &bad))
		FAIL("acked: ibv_post_recv: %s", strerror(errno));
	struct ibv_cq *got;
	void *gctx;
	if (ibv_get_cq_event(ch, &got, &gctx) || got != cq)
		FAIL("acked: ibv_get_cq_event: %s", strerror(errno));
	int rc = ibv_destroy_cq(cq);
	if (rc != EBUSY)
		FAIL("acked: destroying a CQ a QP uses: %d, want EBUSY", rc);
	printf("ok cq_in_use\n");
	if ((rc = ibv_destroy_qp(qp)))
		FAIL("acked: ibv_destroy_qp: %d", rc);
	struct waiter w;
	start_waiter(&w, destroy_cq, cq);
	until_blocked(&w);
	usleep(100000);
	if (waiter_done(&w))
		FAIL("acked: ibv_destroy_cq returned before the ack: %d", w.rc);
	ibv_ack_cq_events(cq, 1);
	end_waiter(&w, 0);
	if (w.rc || (rc = ibv_destroy_comp_channel(ch)))
		FAIL("acked: ibv_destroy_cq %d, ibv_destroy_comp_channel %d", w.rc, rc);
	printf("ok acked\n");
}

static void race(struct ibv_context *ctx, struct ibv_pd *pd, int rounds)
{
	handle(SIGUSR1, 0);
	int got = 0, missed = 0;
	for (int r = 0; r < rounds; r++) {
		struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
		if (!ch)
			FAIL("race %d: ibv_create_comp_channel: %s", r, strerror(errno));
		struct ibv_cq *cq = ibv_create_cq(ctx, 4, &got, ch, 0);
		if (!cq || ibv_req_notify_cq(cq, 0))
			FAIL("race %d: CQ setup failed: %s", r, strerror(errno));
		struct ibv_qp *qp = error_qp(pd, cq);
		struct get g = { .ch = ch };
		struct waiter w;
		start_waiter(&w, get_event, &g);
		until_blocked(&w);
		struct ibv_recv_wr wr, *bad;
		memset(&wr, 0, sizeof wr);
		wr.wr_id = r;
		if (ibv_post_recv(qp, &wr, &bad))
			FAIL("race: ibv_post_recv: %s", strerror(errno));
		int rc;
		if ((rc = ibv_destroy_qp(qp)) || (rc = ibv_destroy_cq(cq)) ||
		    (rc = ibv_destroy_comp_channel(ch)))
			FAIL("race %d: destroy: %d", r, rc);
		end_waiter(&w, SIGUSR1);
		if (w.rc == 0 && g.cq == cq && g.ctx == &got)
			got++;
		else if (w.rc == -1 && w.err == EINTR)
			missed++;
		else
			FAIL("race %d: rc %d errno %d cq %p (want %p)", r, w.rc, w.err,
			     (void *)g.cq, (void *)cq);
	}
	printf("race: %d rounds, %d got the event, %d interrupted\n", rounds, got, missed);
	printf("ok race\n");
}

int main(int argc, char **argv)
{
	int rounds = argc > 1 ? atoi(argv[1]) : 200;
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list || n < 1)
		FAIL("no device");
	struct ibv_context *ctx = ibv_open_device(list[0]);
	struct ibv_pd *pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	if (!pd)
		FAIL("setup failed: %s", strerror(errno));
	closed(ctx);
	acked(ctx, pd);
	race(ctx, pd, rounds);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	printf("all passed\n");
	return 0;
}
