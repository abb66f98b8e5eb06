/* ibv_get_async_event blocked with no event returns -1 / EINTR when a signal handler
 * without SA_RESTART runs, as rdma-core's blocking read of the async fd does; with
 * SA_RESTART it goes on waiting (a watchdog thread checks it has not returned after the
 * signal ran, then ends the process). */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <infiniband/verbs.h>

static volatile sig_atomic_t fired;
static volatile int returned;

static void on_alarm(int sig)
{
    (void)sig;
    fired = 1;
}

static void handle(int flags)
{
    struct sigaction act;
    memset(&act, 0, sizeof act);
    act.sa_handler = on_alarm;
    act.sa_flags = flags;
    sigaction(SIGALRM, &act, NULL);
}

static void *watchdog(void *arg)
{
    (void)arg;
    while (!fired)
        usleep(10000);
    usleep(500000);
    if (returned) {
        printf("with SA_RESTART: ibv_get_async_event returned\n");
        _exit(1);
    }
    printf("ok restart\nall passed\n");
    fflush(stdout);
    _exit(0);
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
    if (!ctx) {
        printf("setup failed: %s\n", strerror(errno));
        return 1;
    }
    struct ibv_async_event ev;

    handle(0); /* no SA_RESTART: the wait ends */
    alarm(1);
    errno = 0;
    int rc = ibv_get_async_event(ctx, &ev);
    if (rc != -1 || errno != EINTR || !fired) {
        printf("ibv_get_async_event: rc %d errno %d fired %d\n", rc, errno, (int)fired);
        return 1;
    }
    printf("ok eintr\n");
    fflush(stdout);

    fired = 0;
    handle(SA_RESTART); /* the wait goes on */
    pthread_t t;
    pthread_create(&t, NULL, watchdog, NULL);
    alarm(1);
    rc = ibv_get_async_event(ctx, &ev);
    returned = 1;
    printf("with SA_RESTART: rc %d errno %d fired %d\n", rc, errno, (int)fired);
    fflush(stdout);
    _exit(1);
}
