/* rdma_create_qp_ex with IBV_QP_INIT_ATTR_SEND_OPS_FLAGS over the libraries in
 * LD_LIBRARY_PATH: an RC connection through rdma_cm on 127.0.0.1 (both ids in this process,
 * one event channel), whose client QP sends with ibv_wr_* and whose server QP answers with
 * an RDMA WRITE built the same way. Built and run by tests/qp_ex.rs (port in argv[1]); prints
 * "ok <check>" per check and exits 1 at the first failure with "FAIL <check>: <why>". */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <arpa/inet.h>
#include <rdma/rdma_cma.h>

#define CHECK(name, cond, ...) do { if (!(cond)) { printf("FAIL %s: ", name); \
	printf(__VA_ARGS__); printf(" (errno %d)\n", errno); exit(1); } } while (0)

enum { BUF = 256 };
static struct rdma_event_channel *ch;

static struct rdma_cm_event *expect(enum rdma_cm_event_type want)
{
	struct rdma_cm_event *ev;
	CHECK("event", rdma_get_cm_event(ch, &ev) == 0, "rdma_get_cm_event");
	CHECK("event", ev->event == want, "%s, not %s", rdma_event_str(ev->event),
	      rdma_event_str(want));
	return ev;
}

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static void wait_wc(const char *check, struct ibv_cq *cq, uint64_t wr_id)
{
	struct ibv_wc wc;
	double end = now() + 10;
	int n = 0;
	while (n == 0 && now() < end)
		n = ibv_poll_cq(cq, 1, &wc);
	CHECK(check, n == 1, "no completion (%d)", n);
	CHECK(check, wc.status == IBV_WC_SUCCESS && wc.wr_id == wr_id, "status %s wr_id %llu",
	      ibv_wc_status_str(wc.status), (unsigned long long)wc.wr_id);
}

/* The id's QP with send ops `ops`: 0 on success, else -1 and errno. */
static int make_qp(struct rdma_cm_id *id, struct ibv_pd *pd, uint64_t ops)
{
	struct ibv_qp_init_attr_ex a;
	memset(&a, 0, sizeof(a));
	a.cap.max_send_wr = a.cap.max_recv_wr = 4;
	a.cap.max_send_sge = a.cap.max_recv_sge = 1;
	a.qp_type = IBV_QPT_RC;
	a.pd = pd;
	a.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	a.send_ops_flags = ops;
	return rdma_create_qp_ex(id, &a);
}

int main(int argc, char **argv)
{
	struct rdma_cm_id *lid, *cid, *sid;
	struct rdma_cm_event *ev;
	struct sockaddr_in sin;
	struct ibv_pd *cpd, *spd;
	struct ibv_mr *cmr, *smr;
	struct ibv_qp_ex *cx, *sx;
	struct rdma_conn_param cp;
	struct ibv_sge sge;
	struct ibv_recv_wr rwr, *bad;
	char *cbuf = calloc(1, BUF), *sbuf = calloc(1, BUF);

	CHECK("args", argc == 2, "usage: cm_qp_ex PORT");
	memset(&sin, 0, sizeof(sin));
	sin.sin_family = AF_INET;
	sin.sin_port = htons(atoi(argv[1]));
	sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	ch = rdma_create_event_channel();
	CHECK("setup", ch, "rdma_create_event_channel");
	CHECK("setup", rdma_create_id(ch, &lid, NULL, RDMA_PS_TCP) == 0, "listener id");
	CHECK("setup", rdma_bind_addr(lid, (struct sockaddr *)&sin) == 0, "bind");
	CHECK("setup", rdma_listen(lid, 1) == 0, "listen");

	CHECK("setup", rdma_create_id(ch, &cid, NULL, RDMA_PS_TCP) == 0, "client id");
	CHECK("setup", rdma_resolve_addr(cid, NULL, (struct sockaddr *)&sin, 2000) == 0, "resolve");
	rdma_ack_cm_event(expect(RDMA_CM_EVENT_ADDR_RESOLVED));
	CHECK("setup", rdma_resolve_route(cid, 2000) == 0, "route");
	rdma_ack_cm_event(expect(RDMA_CM_EVENT_ROUTE_RESOLVED));
	cpd = ibv_alloc_pd(cid->verbs);
	CHECK("setup", cpd, "ibv_alloc_pd");

	/* Unsupported send ops: no QP, EOPNOTSUPP (as ibv_create_qp_ex). */
	errno = 0;
	CHECK("unsupported ops", make_qp(cid, cpd, IBV_QP_EX_WITH_BIND_MW) == -1 &&
	      errno == EOPNOTSUPP && !cid->qp, "BIND_MW gave a QP");
	printf("ok unsupported ops\n");

	CHECK("qp_ex", make_qp(cid, cpd, IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE) == 0,
	      "rdma_create_qp_ex");
	cx = ibv_qp_to_qp_ex(cid->qp);
	CHECK("qp_ex", cx, "ibv_qp_to_qp_ex of rdma_create_qp_ex's QP with send ops is NULL");
	CHECK("qp_ex", cx->wr_send && cx->wr_rdma_write && cx->wr_start, "no builders");
	printf("ok qp_ex\n");
	cmr = ibv_reg_mr(cpd, cbuf, BUF, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	CHECK("setup", cmr, "ibv_reg_mr");
	memset(&cp, 0, sizeof(cp));
	cp.private_data = &cmr->rkey;
	cp.private_data_len = sizeof(cmr->rkey);
	cp.responder_resources = cp.initiator_depth = 1;
	CHECK("setup", rdma_connect(cid, &cp) == 0, "rdma_connect");

	ev = expect(RDMA_CM_EVENT_CONNECT_REQUEST);
	sid = ev->id;
	uint32_t rkey;
	memcpy(&rkey, ev->param.conn.private_data, sizeof(rkey));
	rdma_ack_cm_event(ev);
	spd = ibv_alloc_pd(sid->verbs);
	CHECK("setup", spd, "ibv_alloc_pd (server)");
	CHECK("qp_ex", make_qp(sid, spd, IBV_QP_EX_WITH_RDMA_WRITE) == 0, "server's QP");
	sx = ibv_qp_to_qp_ex(sid->qp);
	CHECK("qp_ex", sx, "server's ibv_qp_to_qp_ex is NULL");
	smr = ibv_reg_mr(spd, sbuf, BUF, IBV_ACCESS_LOCAL_WRITE);
	CHECK("setup", smr, "ibv_reg_mr (server)");
	sge.addr = (uintptr_t)sbuf;
	sge.length = BUF;
	sge.lkey = smr->lkey;
	memset(&rwr, 0, sizeof(rwr));
	rwr.wr_id = 7;
	rwr.sg_list = &sge;
	rwr.num_sge = 1;
	CHECK("setup", ibv_post_recv(sid->qp, &rwr, &bad) == 0, "ibv_post_recv");
	CHECK("setup", rdma_accept(sid, &cp) == 0, "rdma_accept");
	/* Both ESTABLISHED events, in either order. */
	for (int i = 0; i < 2; i++)
		rdma_ack_cm_event(expect(RDMA_CM_EVENT_ESTABLISHED));

	strcpy(cbuf, "sent with ibv_wr_send");
	ibv_wr_start(cx);
	cx->wr_id = 11;
	cx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(cx);
	ibv_wr_set_sge(cx, cmr->lkey, (uintptr_t)cbuf, strlen(cbuf) + 1);
	CHECK("send", ibv_wr_complete(cx) == 0, "ibv_wr_complete");
	wait_wc("send", cid->send_cq, 11);
	wait_wc("send", sid->recv_cq, 7);
	CHECK("send", strcmp(sbuf, "sent with ibv_wr_send") == 0, "received '%s'", sbuf);
	printf("ok send\n");

	strcpy(sbuf, "written back");
	ibv_wr_start(sx);
	sx->wr_id = 12;
	sx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(sx, rkey, (uintptr_t)cbuf + 64);
	ibv_wr_set_sge(sx, smr->lkey, (uintptr_t)sbuf, strlen(sbuf) + 1);
	CHECK("write", ibv_wr_complete(sx) == 0, "ibv_wr_complete (server)");
	wait_wc("write", sid->send_cq, 12);
	CHECK("write", strcmp(cbuf + 64, "written back") == 0, "client holds '%s'", cbuf + 64);
	printf("ok write\n");

	rdma_disconnect(cid);
	rdma_destroy_qp(cid);
	rdma_destroy_qp(sid);
	ibv_dereg_mr(cmr);
	ibv_dereg_mr(smr);
	printf("all passed\n");
	return 0;
}
