/* ibv_get_cq_event blocked on an empty channel returns -1 / EINTR when a signal handler
 * without SA_RESTART runs (qperf ends each test with such a SIGALRM), as rdma-core's
 * blocking read of the channel's fd does. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <infiniband/verbs.h>

static volatile sig_atomic_t fired;

static void on_alarm(int sig)
{
    (void)sig;
    fired = 1;
}

int main(void)
{
    int n = 0;
    struct ibv_device **list = ibv_get_device_list(&n);
    if (!list || n < 1) {
        printf("no device\n");
        return 1;
    }
    struct ibv_context *ctx = ibv_open_device(list[0]);
    struct ibv_comp_channel *ch = ctx ? ibv_create_comp_channel(ctx) : NULL;
    struct ibv_cq *cq = ch ? ibv_create_cq(ctx, 4, NULL, ch, 0) : NULL;
    if (!cq || ibv_req_notify_cq(cq, 0)) {
        printf("setup failed: %s\n", strerror(errno));
        return 1;
    }
    struct sigaction act;
    memset(&act, 0, sizeof act);
    act.sa_handler = on_alarm; /* no SA_RESTART */
    sigaction(SIGALRM, &act, NULL);
    alarm(1);
    struct ibv_cq *got;
    void *gctx;
    errno = 0;
    int rc = ibv_get_cq_event(ch, &got, &gctx);
    if (rc != -1 || errno != EINTR || !fired) {
        printf("ibv_get_cq_event: rc %d errno %d fired %d\n", rc, errno, (int)fired);
        return 1;
    }
    printf("ok eintr\n");
    ibv_destroy_cq(cq);
    ibv_destroy_comp_channel(ch);
    ibv_close_device(ctx);
    ibv_free_device_list(list);
    printf("all passed\n");
    return 0;
}
