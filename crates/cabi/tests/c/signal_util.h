/* Shared by the C programs of tests/signals.rs (the _signal and _destroy ones): a signal
 * handler that records that it ran, a thread that acts once it has run, and a thread
 * blocked in one of the library's waits (started, seen blocked, ended by signals). */
#ifndef SIGNAL_UTIL_H
#define SIGNAL_UTIL_H

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/syscall.h>

/* Prints the failure and ends the process with 1 (from any thread). */
#define FAIL(...) do { printf(__VA_ARGS__); printf("\n"); fflush(stdout); _exit(1); } while (0)

static volatile sig_atomic_t fired;

static inline void on_signal(int sig)
{
	(void)sig;
	fired = 1;
}

/* Installs on_signal for sig with sa_flags flags (0: the blocked call ends with EINTR;
 * SA_RESTART: it goes on). */
static inline void handle(int sig, int flags)
{
	struct sigaction act;
	memset(&act, 0, sizeof act);
	act.sa_handler = on_signal;
	act.sa_flags = flags;
	sigaction(sig, &act, NULL);
}

struct after {
	void (*fn)(void *);
	void *arg;
	useconds_t delay;
};

static inline void *after_main(void *p)
{
	struct after a = *(struct after *)p;
	free(p);
	while (!fired)
		usleep(10000);
	usleep(a.delay);
	a.fn(a.arg);
	return NULL;
}

/* Starts a thread that, delay µs after the handler ran, calls fn(arg): a later event that
 * ends the restarted wait, or one of the checks below. */
static inline void after_signal(void (*fn)(void *), void *arg, useconds_t delay)
{
	struct after *a = malloc(sizeof *a);
	if (!a)
		FAIL("malloc");
	*a = (struct after){ fn, arg, delay };
	pthread_t t;
	pthread_create(&t, NULL, after_main, a);
	pthread_detach(t);
}

/* After a signal without SA_RESTART: the blocked call must have returned (*flag set by the
 * program), else the library keeps waiting where rdma-core's read ends with EINTR. */
static inline void must_have_returned(void *flag)
{
	if (!*(volatile int *)flag)
		FAIL("still waiting after a signal without SA_RESTART");
}

/* After a signal with SA_RESTART: the blocked call must still be waiting (*flag not set):
 * then the program passed, and this ends it. */
static inline void must_still_wait(void *flag)
{
	if (*(volatile int *)flag)
		FAIL("with SA_RESTART: the blocked call returned");
	printf("ok restart\nall passed\n");
	fflush(stdout);
	_exit(0);
}

/* A thread blocked in call(arg) (one of the library's waits): its return and errno. */
struct waiter {
	pthread_t t;
	int (*call)(void *);
	void *arg;
	int rc, err;
	volatile int tid, done;
};

static inline void *waiter_main(void *p)
{
	struct waiter *w = p;
	__atomic_store_n(&w->tid, (int)syscall(SYS_gettid), __ATOMIC_RELEASE);
	errno = 0;
	w->rc = w->call(w->arg);
	w->err = errno;
	__atomic_store_n(&w->done, 1, __ATOMIC_RELEASE);
	return NULL;
}

static inline void start_waiter(struct waiter *w, int (*call)(void *), void *arg)
{
	memset(w, 0, sizeof *w);
	w->call = call;
	w->arg = arg;
	pthread_create(&w->t, NULL, waiter_main, w);
}

static inline int waiter_done(struct waiter *w)
{
	return __atomic_load_n(&w->done, __ATOMIC_ACQUIRE);
}

/* Waits until the waiter sleeps (in the call's wait: nothing else blocks it). */
static inline void until_blocked(struct waiter *w)
{
	for (int i = 0; i < 5000; i++) {
		int tid = __atomic_load_n(&w->tid, __ATOMIC_ACQUIRE);
		char path[64], buf[256];
		snprintf(path, sizeof path, "/proc/self/task/%d/stat", tid);
		FILE *f = tid ? fopen(path, "r") : NULL;
		size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
		if (f)
			fclose(f);
		buf[n] = 0;
		char *end = strrchr(buf, ')'); /* "tid (comm) S ..." */
		if (end && end[1] == ' ' && end[2] == 'S')
			return;
		if (waiter_done(w))
			FAIL("the call returned instead of blocking: rc %d errno %d", w->rc, w->err);
		usleep(1000);
	}
	FAIL("the waiter never blocked");
}

/* Signals the waiter with sig (0: none) until it returns (a signal between its checks is
 * lost). */
static inline void end_waiter(struct waiter *w, int sig)
{
	for (int i = 0; !waiter_done(w); i++) {
		if (i == 5000)
			FAIL("the waiter did not return within 5 s of signals");
		pthread_kill(w->t, sig);
		usleep(1000);
	}
	pthread_join(w->t, NULL);
}

#endif
