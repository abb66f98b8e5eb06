/* rdma_get_cm_event blocked on an empty channel returns -1 / EINTR when a signal handler
 * without SA_RESTART runs, as rdma-core's blocking read of the channel's fd does; with
 * SA_RESTART it waits on and returns the event that comes after the signal. */
#include <arpa/inet.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <rdma/rdma_cma.h>

static volatile sig_atomic_t fired;

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

/* After the signal ran, resolves 127.0.0.1 on the id: its event ends the wait. */
static void *resolve_later(void *arg)
{
    struct rdma_cm_id *id = arg;
    while (!fired)
        usleep(10000);
    usleep(200000);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (rdma_resolve_addr(id, NULL, (struct sockaddr *)&a, 2000))
        printf("rdma_resolve_addr: %s\n", strerror(errno));
    return NULL;
}

int main(void)
{
    struct rdma_event_channel *ch = rdma_create_event_channel();
    struct rdma_cm_id *id = NULL;
    if (!ch || rdma_create_id(ch, &id, NULL, RDMA_PS_TCP)) {
        printf("setup failed: %s\n", strerror(errno));
        return 1;
    }
    struct rdma_cm_event *ev = NULL;

    handle(0); /* no SA_RESTART: the wait ends */
    alarm(1);
    errno = 0;
    int rc = rdma_get_cm_event(ch, &ev);
    if (rc != -1 || errno != EINTR || !fired) {
        printf("rdma_get_cm_event: rc %d errno %d fired %d\n", rc, errno, (int)fired);
        return 1;
    }
    printf("ok eintr\n");

    fired = 0;
    handle(SA_RESTART); /* the wait goes on until the event */
    pthread_t t;
    pthread_create(&t, NULL, resolve_later, id);
    alarm(1);
    rc = rdma_get_cm_event(ch, &ev);
    if (rc != 0 || !fired || ev->event != RDMA_CM_EVENT_ADDR_RESOLVED) {
        printf("with SA_RESTART: rc %d errno %d fired %d event %s\n", rc, errno, (int)fired,
               rc ? "-" : rdma_event_str(ev->event));
        return 1;
    }
    pthread_join(t, NULL);
    rdma_ack_cm_event(ev);
    printf("ok restart\n");
    rdma_destroy_id(id);
    rdma_destroy_event_channel(ch);
    printf("all passed\n");
    return 0;
}
