/* A SEND that arrives before its receive is posted: the responder answers RNR NAK, the
 * requester waits and sends again, and the SEND completes once the receive is there.
 *
 *   rnr_wait s ADDR PORT ROUNDS DELAY_MS   server: each round posts its receive DELAY_MS
 *                                          after the previous one completed
 *   rnr_wait c ADDR PORT ROUNDS            client: sends each round at once
 *
 * Built against the system's headers; runs over our libraries and over rdma-core + rxe
 * alike (the Linux check in docs/CABI.md). Prints "round N ok <ms>" per round and
 * "all passed" at the end; exits 1 with a message on any failure. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>

#define MSG 64

static void die(const char *what) {
	perror(what);
	exit(1);
}

static double now_ms(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static void check_wc(struct ibv_wc *wc, int n, const char *what) {
	if (n != 1) die(what);
	if (wc->status != IBV_WC_SUCCESS) {
		fprintf(stderr, "%s: %s\n", what, ibv_wc_status_str(wc->status));
		exit(1);
	}
}

int main(int argc, char **argv) {
	if (argc < 5 || (argv[1][0] == 's' && argc < 6)) {
		fprintf(stderr, "usage: rnr_wait s|c ADDR PORT ROUNDS [DELAY_MS]\n");
		return 2;
	}
	int server = argv[1][0] == 's';
	int rounds = atoi(argv[4]);
	int delay = server ? atoi(argv[5]) : 0;
	struct rdma_addrinfo hints = {0}, *res;
	hints.ai_port_space = RDMA_PS_TCP;
	if (server) hints.ai_flags = RAI_PASSIVE;
	if (rdma_getaddrinfo(argv[2], argv[3], &hints, &res)) die("rdma_getaddrinfo");

	struct ibv_qp_init_attr attr = {0};
	attr.cap.max_send_wr = attr.cap.max_recv_wr = 4;
	attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
	attr.sq_sig_all = 1;
	struct rdma_cm_id *id, *listen_id = NULL;
	struct rdma_conn_param param = {0};
	param.retry_count = 7;
	param.rnr_retry_count = 7; /* 7: retry for ever */
	char buf[MSG];
	struct ibv_mr *mr;
	struct ibv_wc wc;

	if (server) {
		if (rdma_create_ep(&listen_id, res, NULL, &attr)) die("rdma_create_ep");
		if (rdma_listen(listen_id, 1)) die("rdma_listen");
		if (rdma_get_request(listen_id, &id)) die("rdma_get_request");
		if (!(mr = rdma_reg_msgs(id, buf, MSG))) die("rdma_reg_msgs");
		if (rdma_accept(id, &param)) die("rdma_accept");
		for (int r = 0; r < rounds; r++) {
			usleep(delay * 1000); /* the client's SEND is on its way: no receive yet */
			memset(buf, 0, MSG);
			if (rdma_post_recv(id, NULL, buf, MSG, mr)) die("rdma_post_recv");
			double t = now_ms();
			check_wc(&wc, rdma_get_recv_comp(id, &wc), "receive");
			char want[MSG];
			memset(want, 'a' + r % 26, MSG);
			if (wc.byte_len != MSG || memcmp(buf, want, MSG)) {
				fprintf(stderr, "round %d: wrong data (%u bytes)\n", r, wc.byte_len);
				return 1;
			}
			printf("round %d ok %.1f\n", r, now_ms() - t);
			fflush(stdout);
		}
	} else {
		if (rdma_create_ep(&id, res, NULL, &attr)) die("rdma_create_ep");
		if (!(mr = rdma_reg_msgs(id, buf, MSG))) die("rdma_reg_msgs");
		if (rdma_connect(id, &param)) die("rdma_connect");
		for (int r = 0; r < rounds; r++) {
			memset(buf, 'a' + r % 26, MSG);
			double t = now_ms();
			if (rdma_post_send(id, NULL, buf, MSG, mr, 0)) die("rdma_post_send");
			check_wc(&wc, rdma_get_send_comp(id, &wc), "send");
			printf("round %d ok %.1f\n", r, now_ms() - t);
			fflush(stdout);
		}
	}
	rdma_disconnect(id);
	rdma_dereg_mr(mr);
	rdma_destroy_ep(id);
	if (listen_id) rdma_destroy_ep(listen_id);
	rdma_freeaddrinfo(res);
	printf("all passed\n");
	return 0;
}
