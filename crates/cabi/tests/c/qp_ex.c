/* The ibv_qp_ex interface (ibv_create_qp_ex with send ops, ibv_wr_*) over the library in
 * LD_LIBRARY_PATH, on device "lo" (GID 0, ::ffff:127.0.0.1): two RC QPs connected to each
 * other and two UD QPs in this process. Built and run by tests/qp_ex.rs; prints "ok <check>"
 * per check and exits 1 at the first failure with "FAIL <check>: <why>". */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <arpa/inet.h>
#include <infiniband/verbs.h>

static void fail(const char *check, const char *fmt, ...)
{
	va_list ap;
	printf("FAIL %s: ", check);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	exit(1);
}

#define CHECK(name, cond, ...) do { if (!(cond)) fail(name, __VA_ARGS__); } while (0)

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static union ibv_gid gid;
enum { BUF = 4096, DEPTH = 16 };

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

/* One completion from cq within 5 s (wait > 0), or none within 0.2 s (wait == 0: 0 if none). */
static int poll1(struct ibv_cq *cq, struct ibv_wc *wc, int wait)
{
	double end = now() + (wait ? 5.0 : 0.2);
	while (now() < end) {
		int n = ibv_poll_cq(cq, 1, wc);
		if (n < 0)
			fail("poll", "ibv_poll_cq %d", n);
		if (n == 1)
			return 1;
	}
	if (wait)
		fail("poll", "no completion within 5 s");
	return 0;
}

static void expect_wc(const char *check, struct ibv_cq *cq, uint64_t wr_id, int opcode)
{
	struct ibv_wc wc;
	poll1(cq, &wc, 1);
	CHECK(check, wc.status == IBV_WC_SUCCESS, "status %s (wr_id %llu)",
	      ibv_wc_status_str(wc.status), (unsigned long long)wc.wr_id);
	CHECK(check, wc.wr_id == wr_id, "wr_id %llu, want %llu",
	      (unsigned long long)wc.wr_id, (unsigned long long)wr_id);
	CHECK(check, (int)wc.opcode == opcode, "opcode %d, want %d", wc.opcode, opcode);
}

static void expect_none(const char *check, struct ibv_cq *cq)
{
	struct ibv_wc wc;
	CHECK(check, !poll1(cq, &wc, 0), "unexpected completion wr_id %llu",
	      (unsigned long long)wc.wr_id);
}

struct side {
	struct ibv_cq *scq, *rcq;
	struct ibv_qp *qp;
	struct ibv_qp_ex *x;
	struct ibv_mr *mr;
	char *buf;
	struct ibv_qp_cap cap; /* as granted */
};

static void make(struct side *s, enum ibv_qp_type type, uint64_t ops)
{
	struct ibv_qp_init_attr_ex a;
	s->scq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	s->rcq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	s->buf = calloc(1, BUF);
	s->mr = ibv_reg_mr(pd, s->buf, BUF, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
			   IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);
	if (!s->scq || !s->rcq || !s->mr)
		fail("setup", "cq/mr: %s", strerror(errno));
	memset(&a, 0, sizeof(a));
	a.send_cq = s->scq;
	a.recv_cq = s->rcq;
	a.cap.max_send_wr = DEPTH;
	a.cap.max_recv_wr = DEPTH;
	a.cap.max_send_sge = 2;
	a.cap.max_recv_sge = 1;
	a.cap.max_inline_data = 64;
	a.qp_type = type;
	a.pd = pd;
	a.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	a.send_ops_flags = ops;
	s->qp = ibv_create_qp_ex(ctx, &a);
	if (!s->qp)
		fail("create_qp_ex", "%s", strerror(errno));
	s->cap = a.cap;
	s->x = ibv_qp_to_qp_ex(s->qp);
	CHECK("qp_to_qp_ex", s->x != NULL, "NULL for a QP made with send ops");
	CHECK("qp_to_qp_ex", &s->x->qp_base == s->qp, "qp_base is not the QP");
}

static void to_rts(struct side *s, uint32_t dqpn, int ud)
{
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	if (ud) {
		a.qkey = 0x11111111;
		if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				  IBV_QP_QKEY))
			fail("init", "%s", strerror(errno));
		a.qp_state = IBV_QPS_RTR;
		if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE))
			fail("rtr", "%s", strerror(errno));
		a.qp_state = IBV_QPS_RTS;
		if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN))
			fail("rts", "%s", strerror(errno));
		return;
	}
	a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
			    IBV_ACCESS_REMOTE_ATOMIC;
	if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
			  IBV_QP_ACCESS_FLAGS))
		fail("init", "%s", strerror(errno));
	a.qp_state = IBV_QPS_RTR;
	/* a refused modify returns its errno and sets errno, as rdma-core's failed write does
	 * (programs print it with %m) */
	errno = 0;
	int r = ibv_modify_qp(s->qp, &a, IBV_QP_STATE);
	if (r != EINVAL || errno != EINVAL)
		fail("rtr without its attributes", "returned %d, errno %d", r, errno);
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = dqpn;
	a.rq_psn = 0;
	a.max_dest_rd_atomic = 4;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = gid;
	a.ah_attr.grh.sgid_index = 0;
	a.ah_attr.grh.hop_limit = 64;
	/* UCX passes its "auto" flow label, all ones: the kernel takes it (the low 20 bits) */
	a.ah_attr.grh.flow_label = 0xffffffff;
	a.ah_attr.port_num = 1;
	if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
			  IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
			  IBV_QP_MIN_RNR_TIMER))
		fail("rtr", "%s", strerror(errno));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = 0;
	a.max_rd_atomic = 4;
	if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
			  IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
		fail("rts", "%s", strerror(errno));
}

static void post_recv(struct side *s, uint64_t id, size_t off, uint32_t len)
{
	struct ibv_sge sge = { (uintptr_t)s->buf + off, len, s->mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = id, .sg_list = &sge, .num_sge = 1 }, *bad;
	if (ibv_post_recv(s->qp, &wr, &bad))
		fail("post_recv", "%s", strerror(errno));
}

static const uint64_t ALL_RC = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM |
	IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |
	IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |
	IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD;

static void creation(void)
{
	struct ibv_cq *cq = ibv_create_cq(ctx, 8, NULL, NULL, 0);
	struct ibv_qp_init_attr_ex a;
	struct ibv_qp_init_attr b;
	struct ibv_qp *qp;

	memset(&a, 0, sizeof(a));
	a.send_cq = a.recv_cq = cq;
	a.cap.max_send_wr = a.cap.max_recv_wr = 4;
	a.cap.max_send_sge = a.cap.max_recv_sge = 1;
	a.qp_type = IBV_QPT_RC;
	a.pd = pd;
	a.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	a.send_ops_flags = IBV_QP_EX_WITH_BIND_MW;
	errno = 0;
	CHECK("unsupported send op", !ibv_create_qp_ex(ctx, &a) && errno == EOPNOTSUPP,
	      "BIND_MW: errno %d", errno);
	a.qp_type = IBV_QPT_UD;
	a.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE;
	errno = 0;
	CHECK("unsupported send op", !ibv_create_qp_ex(ctx, &a) && errno == EOPNOTSUPP,
	      "RDMA_WRITE on UD: errno %d", errno);
	a.qp_type = IBV_QPT_RC;
	a.send_ops_flags = 0;
	a.comp_mask |= IBV_QP_INIT_ATTR_CREATE_FLAGS;
	a.create_flags = IBV_QP_CREATE_SCATTER_FCS;
	errno = 0;
	CHECK("create flags", !ibv_create_qp_ex(ctx, &a) && errno == EOPNOTSUPP,
	      "errno %d", errno);
	/* A PD alone: ibv_create_qp, no ibv_qp_ex (NULL, as rdma-core). */
	a.comp_mask = IBV_QP_INIT_ATTR_PD;
	qp = ibv_create_qp_ex(ctx, &a);
	CHECK("pd only", qp && !ibv_qp_to_qp_ex(qp), "qp %p", (void *)qp);
	ibv_destroy_qp(qp);
	memset(&b, 0, sizeof(b));
	b.send_cq = b.recv_cq = cq;
	b.cap.max_send_wr = b.cap.max_recv_wr = 4;
	b.cap.max_send_sge = b.cap.max_recv_sge = 1;
	b.qp_type = IBV_QPT_RC;
	qp = ibv_create_qp(pd, &b);
	CHECK("plain qp", qp && !ibv_qp_to_qp_ex(qp), "ibv_qp_to_qp_ex of a plain QP");
	ibv_destroy_qp(qp);
	ibv_destroy_cq(cq);
	printf("ok creation\n");
}

static void rc(void)
{
	struct side a, b;
	struct ibv_wc wc;
	struct ibv_sge two[2];
	struct ibv_sge many[3];
	struct ibv_data_buf parts[2] = { { "inl", 3 }, { "ine", 3 } };
	char big[4096];
	uint64_t *word;
	int i, rc;

	make(&a, IBV_QPT_RC, ALL_RC);
	make(&b, IBV_QPT_RC, ALL_RC);

	/* Before RTS: wr_complete reports what ibv_post_send would (EINVAL), nothing posted. */
	ibv_wr_start(a.x);
	a.x->wr_id = 1;
	a.x->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(a.x);
	ibv_wr_set_sge(a.x, a.mr->lkey, (uintptr_t)a.buf, 8);
	rc = ibv_wr_complete(a.x);
	CHECK("bad state", rc == EINVAL, "wr_complete in RESET gave %d", rc);
	printf("ok bad state\n");

	to_rts(&a, b.qp->qp_num, 0);
	to_rts(&b, a.qp->qp_num, 0);

	/* A batch: send (two SGEs), send with immediate (inline list), write, write with
	 * immediate, read; completions in order. */
	strcpy(a.buf, "hello, ");
	strcpy(a.buf + 100, "world");
	post_recv(&b, 101, 0, 64);
	post_recv(&b, 102, 64, 64);
	post_recv(&b, 103, 128, 64);
	ibv_wr_start(a.x);
	a.x->wr_id = 10;
	a.x->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(a.x);
	two[0] = (struct ibv_sge){ (uintptr_t)a.buf, 7, a.mr->lkey };
	two[1] = (struct ibv_sge){ (uintptr_t)a.buf + 100, 6, a.mr->lkey };
	ibv_wr_set_sge_list(a.x, 2, two);
	a.x->wr_id = 11;
	ibv_wr_send_imm(a.x, htonl(0xabcd));
	ibv_wr_set_inline_data_list(a.x, 2, parts);
	a.x->wr_id = 12;
	strcpy(a.buf + 200, "written");
	ibv_wr_rdma_write(a.x, b.mr->rkey, (uintptr_t)b.buf + 1000);
	ibv_wr_set_sge(a.x, a.mr->lkey, (uintptr_t)a.buf + 200, 8);
	a.x->wr_id = 13;
	ibv_wr_rdma_write_imm(a.x, b.mr->rkey, (uintptr_t)b.buf + 1100, htonl(7));
	ibv_wr_set_inline_data(a.x, "inline write", 13);
	a.x->wr_id = 14;
	strcpy(b.buf + 2000, "read me");
	ibv_wr_rdma_read(a.x, b.mr->rkey, (uintptr_t)b.buf + 2000);
	ibv_wr_set_sge(a.x, a.mr->lkey, (uintptr_t)a.buf + 300, 8);
	rc = ibv_wr_complete(a.x);
	CHECK("batch", rc == 0, "wr_complete %d", rc);
	expect_wc("batch", a.scq, 10, IBV_WC_SEND);
	expect_wc("batch", a.scq, 11, IBV_WC_SEND);
	expect_wc("batch", a.scq, 12, IBV_WC_RDMA_WRITE);
	expect_wc("batch", a.scq, 13, IBV_WC_RDMA_WRITE);
	expect_wc("batch", a.scq, 14, IBV_WC_RDMA_READ);
	poll1(b.rcq, &wc, 1);
	CHECK("send sge list", wc.wr_id == 101 && wc.byte_len == 13 &&
	      !memcmp(b.buf, "hello, world", 13), "wr_id %llu len %u data %.13s",
	      (unsigned long long)wc.wr_id, wc.byte_len, b.buf);
	poll1(b.rcq, &wc, 1);
	CHECK("send imm inline list", wc.wr_id == 102 && wc.byte_len == 6 &&
	      (wc.wc_flags & IBV_WC_WITH_IMM) && ntohl(wc.imm_data) == 0xabcd &&
	      !memcmp(b.buf + 64, "inline", 6), "wr_id %llu len %u imm %x data %.6s",
	      (unsigned long long)wc.wr_id, wc.byte_len, ntohl(wc.imm_data), b.buf + 64);
	poll1(b.rcq, &wc, 1);
	CHECK("write imm", wc.wr_id == 103 && wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM &&
	      ntohl(wc.imm_data) == 7, "wr_id %llu opcode %d", (unsigned long long)wc.wr_id,
	      wc.opcode);
	CHECK("write", !strcmp(b.buf + 1000, "written"), "%.8s", b.buf + 1000);
	CHECK("write inline", !strcmp(b.buf + 1100, "inline write"), "%.13s", b.buf + 1100);
	CHECK("read", !strcmp(a.buf + 300, "read me"), "%.8s", a.buf + 300);
	printf("ok batch\n");

	/* Atomics. */
	word = (uint64_t *)(b.buf + 3000);
	*word = 5;
	ibv_wr_start(a.x);
	a.x->wr_id = 20;
	ibv_wr_atomic_fetch_add(a.x, b.mr->rkey, (uintptr_t)word, 3);
	ibv_wr_set_sge(a.x, a.mr->lkey, (uintptr_t)a.buf + 3000, 8);
	a.x->wr_id = 21;
	ibv_wr_atomic_cmp_swp(a.x, b.mr->rkey, (uintptr_t)word, 8, 100);
	ibv_wr_set_sge(a.x, a.mr->lkey, (uintptr_t)a.buf + 3008, 8);
	CHECK("atomics", ibv_wr_complete(a.x) == 0, "wr_complete");
	expect_wc("atomics", a.scq, 20, IBV_WC_FETCH_ADD);
	expect_wc("atomics", a.scq, 21, IBV_WC_COMP_SWAP);
	CHECK("atomics", *word == 100 && *(uint64_t *)(a.buf + 3000) == 5 &&
	      *(uint64_t *)(a.buf + 3008) == 8, "remote %llu, fetched %llu and %llu",
	      (unsigned long long)*word, (unsigned long long)*(uint64_t *)(a.buf + 3000),
	      (unsigned long long)*(uint64_t *)(a.buf + 3008));
	printf("ok atomics\n");

	/* Errors, reported at wr_complete; the whole batch is dropped (the first, valid, WR
	 * of each batch never reaches the peer). */
	memset(b.buf, 0, 64);
	for (i = 0; i < 3; i++)
		many[i] = (struct ibv_sge){ (uintptr_t)a.buf, 1, a.mr->lkey };
	ibv_wr_start(a.x);
	a.x->wr_id = 30;
	ibv_wr_rdma_write(a.x, b.mr->rkey, (uintptr_t)b.buf);
	ibv_wr_set_sge(a.x, a.mr->lkey, (uintptr_t)a.buf, 5);
	a.x->wr_id = 31;
	ibv_wr_send(a.x);
	CHECK("too many sges", a.cap.max_send_sge < 3, "max_send_sge %u", a.cap.max_send_sge);
	ibv_wr_set_sge_list(a.x, 3, many);
	rc = ibv_wr_complete(a.x);
	CHECK("too many sges", rc == ENOSPC, "wr_complete %d", rc);
	memset(big, 'x', sizeof(big));
	ibv_wr_start(a.x);
	a.x->wr_id = 32;
	ibv_wr_rdma_write(a.x, b.mr->rkey, (uintptr_t)b.buf);
	ibv_wr_set_sge(a.x, a.mr->lkey, (uintptr_t)a.buf, 5);
	a.x->wr_id = 33;
	ibv_wr_send(a.x);
	ibv_wr_set_inline_data(a.x, big, a.cap.max_inline_data + 1);
	rc = ibv_wr_complete(a.x);
	CHECK("inline too long", rc == ENOSPC, "wr_complete %d", rc);
	ibv_wr_start(a.x);
	a.x->wr_id = 34;
	ibv_wr_rdma_write(a.x, b.mr->rkey, (uintptr_t)b.buf);
	ibv_wr_set_sge(a.x, a.mr->lkey, (uintptr_t)a.buf, 5);
	a.x->wr_id = 35;
	ibv_wr_local_inv(a.x, 0);
	rc = ibv_wr_complete(a.x);
	CHECK("unsupported op", rc == EOPNOTSUPP, "wr_complete %d", rc);
	ibv_wr_start(a.x);
	ibv_wr_set_sge(a.x, a.mr->lkey, (uintptr_t)a.buf, 5); /* no WR to set */
	rc = ibv_wr_complete(a.x);
	CHECK("setter first", rc == EINVAL, "wr_complete %d", rc);
	ibv_wr_start(a.x);
	for (i = 0; i <= (int)a.cap.max_send_wr; i++) {
		a.x->wr_id = 40 + i;
		ibv_wr_rdma_write(a.x, b.mr->rkey, (uintptr_t)b.buf);
		ibv_wr_set_sge(a.x, a.mr->lkey, (uintptr_t)a.buf, 5);
	}
	rc = ibv_wr_complete(a.x);
	CHECK("queue full", rc == ENOSPC, "%u WRs in one batch: wr_complete %d",
	      a.cap.max_send_wr + 1, rc);
	ibv_wr_start(a.x);
	a.x->wr_id = 36;
	a.x->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(a.x, b.mr->rkey, (uintptr_t)b.buf);
	ibv_wr_set_sge(a.x, a.mr->lkey, (uintptr_t)a.buf, 5);
	ibv_wr_abort(a.x);
	expect_none("errors", a.scq);
	CHECK("errors", b.buf[0] == 0, "a WR of a failed or aborted batch was posted: %.5s",
	      b.buf);
	/* The QP still works, and the next batch's WR is the first completion. */
	ibv_wr_start(a.x);
	a.x->wr_id = 37;
	a.x->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(a.x, b.mr->rkey, (uintptr_t)b.buf);
	ibv_wr_set_sge(a.x, a.mr->lkey, (uintptr_t)a.buf, 5);
	CHECK("after errors", ibv_wr_complete(a.x) == 0, "wr_complete");
	expect_wc("after errors", a.scq, 37, IBV_WC_RDMA_WRITE);
	CHECK("after errors", !memcmp(b.buf, "hello", 5), "%.5s", b.buf);
	/* The interface and ibv_post_send mix on one QP. */
	{
		struct ibv_sge s = { (uintptr_t)a.buf, 5, a.mr->lkey };
		struct ibv_send_wr w = { .wr_id = 38, .sg_list = &s, .num_sge = 1,
			.opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED }, *bad;
		w.wr.rdma.remote_addr = (uintptr_t)b.buf + 10;
		w.wr.rdma.rkey = b.mr->rkey;
		CHECK("post_send", ibv_post_send(a.qp, &w, &bad) == 0, "%s", strerror(errno));
		expect_wc("post_send", a.scq, 38, IBV_WC_RDMA_WRITE);
	}
	printf("ok errors\n");
}

static void ud(void)
{
	struct side a, b;
	struct ibv_ah_attr aa;
	struct ibv_ah *ah;
	struct ibv_wc wc;
	int rc;

	make(&a, IBV_QPT_UD, IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM);
	make(&b, IBV_QPT_UD, IBV_QP_EX_WITH_SEND);
	to_rts(&a, 0, 1);
	to_rts(&b, 0, 1);
	memset(&aa, 0, sizeof(aa));
	aa.is_global = 1;
	aa.grh.dgid = gid;
	aa.grh.hop_limit = 64;
	aa.port_num = 1;
	ah = ibv_create_ah(pd, &aa);
	CHECK("ud", ah != NULL, "ibv_create_ah: %s", strerror(errno));
	post_recv(&b, 201, 0, 40 + 64);
	strcpy(a.buf, "datagram");
	ibv_wr_start(a.x);
	a.x->wr_id = 200;
	a.x->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send_imm(a.x, htonl(42));
	ibv_wr_set_ud_addr(a.x, ah, b.qp->qp_num, 0x11111111);
	ibv_wr_set_sge(a.x, a.mr->lkey, (uintptr_t)a.buf, 9);
	rc = ibv_wr_complete(a.x);
	CHECK("ud", rc == 0, "wr_complete %d", rc);
	expect_wc("ud", a.scq, 200, IBV_WC_SEND);
	poll1(b.rcq, &wc, 1);
	CHECK("ud", wc.status == IBV_WC_SUCCESS && wc.byte_len == 40 + 9 &&
	      wc.src_qp == a.qp->qp_num && ntohl(wc.imm_data) == 42 &&
	      !strcmp(b.buf + 40, "datagram"), "status %d len %u src %u data %.9s",
	      wc.status, wc.byte_len, wc.src_qp, b.buf + 40);
	/* A UD send without an address fails at wr_complete. */
	ibv_wr_start(a.x);
	a.x->wr_id = 202;
	ibv_wr_send(a.x);
	ibv_wr_set_sge(a.x, a.mr->lkey, (uintptr_t)a.buf, 9);
	rc = ibv_wr_complete(a.x);
	CHECK("ud without address", rc == EINVAL, "wr_complete %d", rc);
	printf("ok ud\n");
}

int main(void)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	int i;

	for (i = 0; list && list[i]; i++)
		if (!strcmp(ibv_get_device_name(list[i]), "lo"))
			ctx = ibv_open_device(list[i]);
	if (!ctx)
		fail("setup", "no device lo");
	pd = ibv_alloc_pd(ctx);
	if (!pd || ibv_query_gid(ctx, 1, 0, &gid))
		fail("setup", "pd / gid: %s", strerror(errno));
	creation();
	rc();
	ud();
	printf("all passed\n");
	return 0;
}
