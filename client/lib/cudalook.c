/*
 * cudalook.c — what the driver says of a list of pointers, asked on a thread of the library,
 * so that a plan's memory is looked up while the caller does other work (dsckpt_plan_prepare).
 *
 * lib_cuda_look_start takes the array of pointers and starts the thread, which pushes the context it
 * is given (the caller's thread has it current; cuPointerGetAttributes may want one), asks
 * about each pointer and keeps the answers. lib_cuda_look_answer joins the thread on first
 * need and gives the answer about pointer i when the driver gave one; lib_cuda_place asks
 * the driver itself otherwise. An answer is as old as the moment it was asked: the caller
 * uses it only where the memory cannot have changed since (dsckpt.h says when).
 */
#include "cudrv.h"

#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

struct lib_cuda_look {
	pthread_t thread;
	int joined;
	CUcontext ctx;
	size_t n;
	uintptr_t *ptrs;
	CUresult *rs;
	struct lib_cudrv_attrs *as;
};

/* The thread: asks the driver about every pointer. */
static void *look_run(void *arg)
{
	struct lib_cuda_look *l = arg;
	CUcontext popped;
	int pushed = l->ctx && lib_cu.CtxPushCurrent(l->ctx) == CUDA_SUCCESS;

	for (size_t i = 0; i < l->n; i++)
		l->rs[i] = lib_cudrv_query((CUdeviceptr)l->ptrs[i], &l->as[i]);
	if (pushed)
		lib_cu.CtxPopCurrent(&popped);
	return NULL;
}

/* Frees a look whose thread is joined or was never started. */
static void look_free(struct lib_cuda_look *l)
{
	free(l->ptrs);
	free(l->rs);
	free(l->as);
	free(l);
}

/* Starts asking about the n pointers of ptrs (malloc'd, taken over) in context ctx; NULL
 * without the driver, or when memory or a thread is short (the caller then asks itself). */
struct lib_cuda_look *lib_cuda_look_start(uintptr_t *ptrs, size_t n, void *ctx)
{
	struct lib_cuda_look *l;
	sigset_t all, old;

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
	sigfillset(&all);   /* the caller's signals stay with the caller's threads */
	pthread_sigmask(SIG_SETMASK, &all, &old);
	int e = pthread_create(&l->thread, NULL, look_run, l);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (e != 0) {
		look_free(l);
		return NULL;
	}
	return l;
}

/* The driver's answer about pointer i of l, which must be p: 1 with *a set, or 0 when there
 * is none (the driver failed there: the caller asks again and reports what it says). */
int lib_cuda_look_answer(struct lib_cuda_look *l, size_t i, CUdeviceptr p,
			 struct lib_cudrv_attrs *a)
{
	if (!l->joined) {
		pthread_join(l->thread, NULL);
		l->joined = 1;
	}
	if (i >= l->n || (CUdeviceptr)l->ptrs[i] != p || l->rs[i] != CUDA_SUCCESS)
		return 0;
	*a = l->as[i];
	return 1;
}

/* Waits for l's thread and frees it. */
void lib_cuda_look_free(struct lib_cuda_look *l)
{
	if (!l)
		return;
	if (!l->joined)
		pthread_join(l->thread, NULL);
	look_free(l);
}
