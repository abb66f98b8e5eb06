/* ibv_reg_mr of memalign'd memory, as perftest registers its buffers, over the libraries in
 * LD_LIBRARY_PATH: a page-aligned buffer of whole pages moves onto a region file in place
 * while registered (/proc/self/maps names the memfd at its address, the bytes and the
 * application's pointer stay), an RDMA WRITE from it over a host-local rdma_cm connection on
 * 127.0.0.1 (both ids in this process) lands, and after ibv_dereg_mr the buffer is private
 * memory again with its bytes. A malloc'd buffer (not page-aligned) stays where it is and
 * works the same. With "kept" after the port (RDMA_SOFT_PULL_IN_PLACE=off) nothing moves.
 * Built and run by tests/reg_in_place.rs (port in argv[1]); prints "ok
 * <check>" per check and exits 1 at the first failure with "FAIL <check>: <why>". */
#include <errno.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <rdma/rdma_cma.h>

#define CHECK(name, cond, ...) do { if (!(cond)) { printf("FAIL %s: ", name); \
	printf(__VA_ARGS__); printf(" (errno %d)\n", errno); exit(1); } } while (0)

enum { MSG = 64 << 10, BUF = 2 * MSG };
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

/* Whether /proc/self/maps names a memfd region file at `p`. */
static int on_region_file(const void *p)
{
	char line[512];
	int found = 0;
	FILE *f = fopen("/proc/self/maps", "r");
	CHECK("maps", f, "/proc/self/maps");
	while (fgets(line, sizeof(line), f)) {
		unsigned long s, e;
		if (sscanf(line, "%lx-%lx", &s, &e) == 2 && (unsigned long)p >= s &&
		    (unsigned long)p < e) {
			found = strstr(line, "/memfd:rdma-mr") != NULL;
			break;
		}
	}
	fclose(f);
	return found;
}

/* This process's inspection snapshot (JSON) from $RDMA_SOFT_INSPECT_DIR/<pid>.sock, or
 * NULL when the variable is unset. */
static char *snapshot(void)
{
	static char buf[1 << 16];
	const char *dir = getenv("RDMA_SOFT_INSPECT_DIR");
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	size_t got = 0;
	ssize_t n;
	int fd;
	if (!dir)
		return NULL;
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/%d.sock", dir, (int)getpid());
	fd = socket(AF_UNIX, SOCK_STREAM, 0);
	CHECK("inspect", fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0, "%s",
	      sa.sun_path);
	while (got + 1 < sizeof(buf) && (n = read(fd, buf + got, sizeof(buf) - 1 - got)) > 0)
		got += n;
	close(fd);
	buf[got] = 0;
	return buf;
}

/* Whether the snapshot has the QP counter `name` at `value` (compact JSON). */
static int has(const char *snap, const char *name, int value)
{
	char want[64];
	snprintf(want, sizeof(want), "\"%s\":%d,", name, value);
	return strstr(snap, want) != NULL;
}

static void pattern(unsigned char *b, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		b[i] = (unsigned char)(i * 31 + seed);
}

static int is_pattern(const unsigned char *b, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		if (b[i] != (unsigned char)(i * 31 + seed))
			return 0;
	return 1;
}

static struct ibv_qp_init_attr qp_attr(void)
{
	struct ibv_qp_init_attr a;
	memset(&a, 0, sizeof(a));
	a.cap.max_send_wr = a.cap.max_recv_wr = 4;
	a.cap.max_send_sge = a.cap.max_recv_sge = 1;
	a.qp_type = IBV_QPT_RC;
	a.sq_sig_all = 1;
	return a;
}

/* WRITEs MSG bytes of `buf` (mr) to the server's `raddr`/`rkey`. */
static void write_msg(const char *check, struct rdma_cm_id *id, struct ibv_mr *mr,
		      unsigned char *buf, uint64_t raddr, uint32_t rkey, uint64_t wr_id)
{
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = MSG, .lkey = mr->lkey };
	struct ibv_send_wr wr, *bad;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = wr_id;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_RDMA_WRITE;
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	CHECK(check, ibv_post_send(id->qp, &wr, &bad) == 0, "ibv_post_send");
	wait_wc(check, id->send_cq, wr_id);
}

int main(int argc, char **argv)
{
	struct rdma_cm_id *lid, *cid, *sid;
	struct rdma_cm_event *ev;
	struct sockaddr_in sin;
	struct ibv_pd *cpd, *spd;
	struct ibv_mr *cmr, *smr, *umr;
	struct rdma_conn_param cp;
	struct ibv_qp_init_attr qa;
	long page = sysconf(_SC_PAGESIZE);
	unsigned char *cbuf = memalign(page, BUF), *sbuf = memalign(page, BUF);
	unsigned char *ubuf = malloc(MSG + 64);
	int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;

	/* "kept": RDMA_SOFT_PULL_IN_PLACE=off, nothing moves */
	int moves = !(argc == 3 && strcmp(argv[2], "kept") == 0);

	CHECK("args", argc == 2 || argc == 3, "usage: reg_in_place PORT [kept]");
	CHECK("setup", cbuf && sbuf && ubuf, "memory");
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
	qa = qp_attr();
	CHECK("setup", rdma_create_qp(cid, cpd, &qa) == 0, "rdma_create_qp");

	/* perftest's buffer: memalign(page, 2 x 64 KiB), registered whole */
	pattern(cbuf, BUF, 3);
	CHECK("moved", !on_region_file(cbuf), "a region file before registration");
	cmr = ibv_reg_mr(cpd, cbuf, BUF, IBV_ACCESS_LOCAL_WRITE);
	CHECK("moved", cmr && cmr->addr == cbuf, "ibv_reg_mr");
	CHECK("moved", on_region_file(cbuf) == moves, "on a region file: %d", !moves);
	CHECK("moved", is_pattern(cbuf, BUF, 3), "bytes changed by the move");
	printf("ok moved\n");
	/* not page-aligned: stays where it is */
	pattern(ubuf + 16, MSG, 5);
	umr = ibv_reg_mr(cpd, ubuf + 16, MSG, IBV_ACCESS_LOCAL_WRITE);
	CHECK("unaligned", umr, "ibv_reg_mr");
	CHECK("unaligned", !on_region_file(ubuf + 16), "moved");
	printf("ok unaligned\n");

	memset(&cp, 0, sizeof(cp));
	cp.responder_resources = cp.initiator_depth = 1;
	CHECK("setup", rdma_connect(cid, &cp) == 0, "rdma_connect");
	ev = expect(RDMA_CM_EVENT_CONNECT_REQUEST);
	sid = ev->id;
	rdma_ack_cm_event(ev);
	spd = ibv_alloc_pd(sid->verbs);
	CHECK("setup", spd, "ibv_alloc_pd (server)");
	qa = qp_attr();
	CHECK("setup", rdma_create_qp(sid, spd, &qa) == 0, "server's QP");
	memset(sbuf, 0, BUF);
	smr = ibv_reg_mr(spd, sbuf, BUF, access);
	CHECK("setup", smr, "ibv_reg_mr (server)");
	CHECK("setup", rdma_accept(sid, &cp) == 0, "rdma_accept");
	for (int i = 0; i < 2; i++)
		rdma_ack_cm_event(expect(RDMA_CM_EVENT_ESTABLISHED));

	/* the application writes through its own pointer, then WRITEs from the buffer */
	memcpy(cbuf + MSG, "the application's bytes", 24);
	write_msg("write", cid, cmr, cbuf + MSG, (uintptr_t)sbuf, smr->rkey, 1);
	CHECK("write", memcmp(sbuf, "the application's bytes", 24) == 0, "server holds '%.24s'",
	      sbuf);
	CHECK("write", memcmp(sbuf + 24, cbuf + MSG + 24, MSG - 24) == 0, "the rest differs");
	printf("ok write\n");
	char *snap = snapshot();
	if (snap) {
		/* the client QP sent it as a pull, the server QP copied it from the buffer */
		CHECK("pulled", has(snap, "pulls_sent", moves) && has(snap, "pulls_done", moves),
		      "pulls_sent/pulls_done not %d: %s", moves, snap);
		printf("ok pulled\n");
	}
	write_msg("write unaligned", cid, umr, ubuf + 16, (uintptr_t)sbuf + MSG, smr->rkey, 2);
	CHECK("write unaligned", is_pattern(sbuf + MSG, MSG, 5), "server's bytes differ");
	printf("ok write unaligned\n");
	snap = snapshot();
	if (snap) {
		CHECK("not pulled", has(snap, "pulls_sent", moves) && !has(snap, "pulls_sent", 2),
		      "the unaligned buffer's WRITE was pulled: %s", snap);
		printf("ok not pulled\n");
	}

	/* deregistered: private memory again, same bytes, and the application's own */
	CHECK("dereg", ibv_dereg_mr(cmr) == 0, "ibv_dereg_mr");
	CHECK("dereg", !on_region_file(cbuf), "still on a region file");
	CHECK("dereg", is_pattern(cbuf, MSG, 3), "bytes changed by the way back");
	CHECK("dereg", memcmp(cbuf + MSG, "the application's bytes", 24) == 0, "bytes lost");
	memset(cbuf, 0x5a, BUF);
	CHECK("dereg", cbuf[0] == 0x5a && cbuf[BUF - 1] == 0x5a, "not writable");
	printf("ok dereg\n");

	rdma_disconnect(cid);
	rdma_destroy_qp(cid);
	rdma_destroy_qp(sid);
	ibv_dereg_mr(umr);
	ibv_dereg_mr(smr);
	free(cbuf);
	free(sbuf);
	free(ubuf);
	printf("all passed\n");
	return 0;
}
