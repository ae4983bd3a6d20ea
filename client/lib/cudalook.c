/*
 * cudalook.c — what the driver says of a list of pointers, asked on a thread of the library,
 * so that a plan's memory is looked up while the caller does other work (dsckpt_plan_prepare).
 *
 * lib_cuda_look_start takes the array of pointers and queues it for the library's look
 * thread, which pushes the context it is given (the caller's thread has it current;
 * cuPointerGetAttributes may want one), asks about each pointer and keeps the answers.
 * lib_cuda_look_answer waits for that on first need (or, when the thread has not started
 * it yet, takes the look back and asks on the caller's thread rather than wait for the
 * thread to be scheduled) and gives the answer about pointer i when the driver gave one;
 * lib_cuda_place asks the driver itself otherwise. An answer is as old as
 * the moment it was asked: the caller uses it only where the memory cannot have changed since
 * (dsckpt.h says when).
 *
 * The thread is one per process, started by the first look and kept, idle on a condition
 * variable, so that a save does not pay for a thread's creation (its stack's mappings). It
 * blocks every signal. A child of fork has no such thread: the fork handler marks what the
 * parent had queued or running as failed (the child's callers ask the driver themselves) and
 * the child starts its own at its first look. When the library is unloaded (or the process
 * exits) its destructor stops the thread.
 */
#include "cudrv.h"

#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

struct lib_cuda_look {
	struct lib_cuda_look *next;  /* in the queue */
	int done, failed;            /* failed: done without answers (fork) */
	CUcontext ctx;
	size_t n;
	uintptr_t *ptrs;
	CUresult *rs;
	struct lib_cudrv_attrs *as;
};

/* The look thread and its queue, under mu. */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t posted = PTHREAD_COND_INITIALIZER;    /* a look queued, or stop */
static pthread_cond_t finished = PTHREAD_COND_INITIALIZER;  /* a look done */
static struct lib_cuda_look *head, **tail = &head;
static struct lib_cuda_look *running;
static pthread_t thread;
static int started, stop;
static pthread_once_t forks = PTHREAD_ONCE_INIT;

/* Asks the driver about every pointer of l (mu not held). */
static void look_run(struct lib_cuda_look *l)
{
	CUcontext popped;
	int pushed = l->ctx && lib_cu.CtxPushCurrent(l->ctx) == CUDA_SUCCESS;

	for (size_t i = 0; i < l->n; i++)
		l->rs[i] = lib_cudrv_query((CUdeviceptr)l->ptrs[i], &l->as[i]);
	if (pushed)
		lib_cu.CtxPopCurrent(&popped);
}

/* The thread: takes queued looks in order until stopped, then fails those left. */
static void *look_thread(void *arg)
{
	pthread_mutex_lock(&mu);
	for (;;) {
		while (!head && !stop)
			pthread_cond_wait(&posted, &mu);
		if (stop)
			break;
		struct lib_cuda_look *l = head;
		if (!(head = l->next))
			tail = &head;
		running = l;
		pthread_mutex_unlock(&mu);
		look_run(l);
		pthread_mutex_lock(&mu);
		running = NULL;
		l->done = 1;
		pthread_cond_broadcast(&finished);
	}
	for (struct lib_cuda_look *l = head; l; l = l->next)   /* stopped: none will run */
		l->done = l->failed = 1;
	head = NULL;
	tail = &head;
	pthread_cond_broadcast(&finished);
	pthread_mutex_unlock(&mu);
	return NULL;
}

/* fork: the parent's thread holds no lock while its child is made. */
static void fork_prepare(void)
{
	pthread_mutex_lock(&mu);
}

/* fork, in the parent: goes on. */
static void fork_parent(void)
{
	pthread_mutex_unlock(&mu);
}

/* fork, in the child: no look thread here; what the parent's had is failed, not waited for. */
static void fork_child(void)
{
	for (struct lib_cuda_look *l = head; l; l = l->next)
		l->done = l->failed = 1;
	if (running)
		running->done = running->failed = 1;
	head = running = NULL;
	tail = &head;
	started = 0;
	pthread_cond_init(&posted, NULL);    /* the parent's waiters are not here */
	pthread_cond_init(&finished, NULL);
	pthread_mutex_unlock(&mu);
}

/* Registers the fork handlers (once per process). */
static void forks_register(void)
{
	pthread_atfork(fork_prepare, fork_parent, fork_child);
}

/* Starts the look thread unless it runs (mu held); 0, or -1 when no thread can be made. */
static int thread_start(void)
{
	sigset_t all, old;

	if (started)
		return 0;
	pthread_once(&forks, forks_register);
	sigfillset(&all);   /* the caller's signals stay with the caller's threads */
	pthread_sigmask(SIG_SETMASK, &all, &old);
	int e = pthread_create(&thread, NULL, look_thread, NULL);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (e != 0)
		return -1;
	started = 1;
	return 0;
}

/* Stops the look thread when the library is unloaded or the process exits: waits for it
 * when it is idle; one still asking the driver (whose own teardown may be under way at exit)
 * is left to finish alone. */
__attribute__((destructor)) static void thread_stop(void)
{
	pthread_mutex_lock(&mu);
	int had = started, idle = !running;
	stop = 1;
	started = 0;
	pthread_cond_broadcast(&posted);
	pthread_mutex_unlock(&mu);
	if (had && idle)
		pthread_join(thread, NULL);
	else if (had)
		pthread_detach(thread);
}

/* Frees a look the thread no longer holds. */
static void look_free(struct lib_cuda_look *l)
{
	free(l->ptrs);
	free(l->rs);
	free(l->as);
	free(l);
}

/* Queues a look at the n pointers of ptrs (malloc'd, taken over) in context ctx; NULL
 * without the driver, or when memory or the thread is short (the caller then asks itself). */
struct lib_cuda_look *lib_cuda_look_start(uintptr_t *ptrs, size_t n, void *ctx)
{
	struct lib_cuda_look *l;

	if (n == 0 || !lib_cudrv_present() || !(l = calloc(1, sizeof(*l)))) {
		free(ptrs);
		return NULL;
	}
	l->ptrs = ptrs;
	l->rs = malloc(n * sizeof(*l->rs));
	l->as = malloc(n * sizeof(*l->as));
	if (!l->ptrs || !l->rs || !l->as) {
		look_free(l);
		return NULL;
	}
	l->n = n;
	l->ctx = ctx;
	pthread_mutex_lock(&mu);
	if (stop || thread_start() < 0) {
		pthread_mutex_unlock(&mu);
		look_free(l);
		return NULL;
	}
	*tail = l;
	tail = &l->next;
	pthread_cond_signal(&posted);
	pthread_mutex_unlock(&mu);
	return l;
}

/* Waits until the thread is done with l (mu held). */
static void look_wait(struct lib_cuda_look *l)
{
	while (!l->done)
		pthread_cond_wait(&finished, &mu);
}

/* Takes l off the queue when the thread has not started it (mu held); 1 when taken. */
static int look_dequeue(struct lib_cuda_look *l)
{
	struct lib_cuda_look **q = &head;

	while (*q && *q != l)
		q = &(*q)->next;
	if (!*q)
		return 0;
	if (!(*q = l->next))
		tail = q;
	return 1;
}

/* The driver's answer about pointer i of l, which must be p: 1 with *a set, or 0 when there
 * is none (the driver failed there: the caller asks again and reports what it says). */
int lib_cuda_look_answer(struct lib_cuda_look *l, size_t i, CUdeviceptr p,
			 struct lib_cudrv_attrs *a)
{
	pthread_mutex_lock(&mu);
	if (!l->done && look_dequeue(l)) {   /* not started: asking beats waiting for the thread */
		pthread_mutex_unlock(&mu);
		look_run(l);
		pthread_mutex_lock(&mu);
		l->done = 1;
	}
	look_wait(l);
	pthread_mutex_unlock(&mu);
	if (l->failed || i >= l->n || (CUdeviceptr)l->ptrs[i] != p || l->rs[i] != CUDA_SUCCESS)
		return 0;
	*a = l->as[i];
	return 1;
}

/* Takes l off the queue when the thread has not started it, else waits for it; frees it. */
void lib_cuda_look_free(struct lib_cuda_look *l)
{
	if (!l)
		return;
	pthread_mutex_lock(&mu);
	if (!look_dequeue(l))
		look_wait(l);
	pthread_mutex_unlock(&mu);
	look_free(l);
}
