/*
 * cache.c — the host cache: one anonymous mapping allocated, touched and locked at start,
 * cut into equal chunks handed out from a free stack. Copy threads take chunks, flush
 * threads give them back; cache_get waits while none is free.
 */
#include "dsckptd.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define CACHE_PAGE 4096
#define CACHE_MAX_TOUCH_THREADS 8

struct cache {
	pthread_mutex_t lock;  /* protects free_stack, nfree, out, shutdown */
	pthread_cond_t freed;  /* signalled when a chunk is put back or at shutdown */
	void **free_stack;     /* free chunks; nfree of them */
	size_t nfree;
	unsigned char *out;    /* per chunk: 1 while handed out */
	int shutdown;

	unsigned char *base;   /* immutable after cache_create */
	uint64_t total;
	uint64_t chunk;
	size_t nchunks;
	double touch_ms;
};

/* A slice of the mapping one touch thread faults in. */
struct cache_touch {
	unsigned char *start;
	uint64_t len;
	pthread_t thread;
	int started;
};

/* Writes one byte of every page of a slice so the kernel backs it now, not on first copy. */
static void *cache_touch_slice(void *arg)
{
	struct cache_touch *t = arg;
	for (uint64_t off = 0; off < t->len; off += CACHE_PAGE)
		t->start[off] = 0;
	return NULL;
}

/* Faults in the whole mapping with min(nproc, 8) threads; returns the time taken in ms. */
static double cache_touch(unsigned char *base, uint64_t len)
{
	struct cache_touch t[CACHE_MAX_TOUCH_THREADS];
	long nproc = sysconf(_SC_NPROCESSORS_ONLN);
	uint64_t pages = len / CACHE_PAGE, per;
	struct timespec t0, t1;
	unsigned n;

	n = nproc < 1 ? 1 : nproc > CACHE_MAX_TOUCH_THREADS ? CACHE_MAX_TOUCH_THREADS
							    : (unsigned)nproc;
	if (n > pages)
		n = (unsigned)pages;
	per = (pages + n - 1) / n;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (unsigned i = 0; i < n; i++) {
		uint64_t first = i * per, count = first + per > pages ? pages - first : per;
		t[i].start = base + first * CACHE_PAGE;
		t[i].len = count * CACHE_PAGE;
		/* A thread that cannot be started is replaced by doing its share here. */
		t[i].started = pthread_create(&t[i].thread, NULL, cache_touch_slice, &t[i]) == 0;
		if (!t[i].started)
			cache_touch_slice(&t[i]);
	}
	for (unsigned i = 0; i < n; i++)
		if (t[i].started)
			pthread_join(t[i].thread, NULL);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	return (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
}

/* Maps bytes of host memory, touches it with several threads and locks it (best effort). */
int cache_create(uint64_t bytes, uint64_t chunk_bytes, struct cache **out, char *err,
		 size_t errlen)
{
	static atomic_flag warned_mlock = ATOMIC_FLAG_INIT;
	struct cache *c;
	void *base;

	*out = NULL;
	if (chunk_bytes == 0 || chunk_bytes % CACHE_PAGE != 0 || bytes < chunk_bytes ||
	    bytes / chunk_bytes > SIZE_MAX / sizeof(void *)) {
		snprintf(err, errlen, "bad cache geometry: %llu bytes in chunks of %llu",
			 (unsigned long long)bytes, (unsigned long long)chunk_bytes);
		return DSCKPT_EINVAL;
	}
	if ((c = calloc(1, sizeof(*c))) == NULL)
		goto fail_struct;
	c->chunk = chunk_bytes;
	c->nchunks = (size_t)(bytes / chunk_bytes);
	c->total = (uint64_t)c->nchunks * chunk_bytes;
	c->free_stack = calloc(c->nchunks, sizeof(void *));
	c->out = calloc(c->nchunks, 1);
	if (c->free_stack == NULL || c->out == NULL)
		goto fail_arrays;

	base = mmap(NULL, c->total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (base == MAP_FAILED)
		goto fail_arrays;
	c->base = base;
	if (madvise(base, c->total, MADV_HUGEPAGE) != 0)
		log_debug("madvise(MADV_HUGEPAGE) on the cache: %s", strerror(errno));
	c->touch_ms = cache_touch(c->base, c->total);
	if (mlock(base, c->total) != 0 && !atomic_flag_test_and_set(&warned_mlock))
		log_warnx("cannot lock the cache (raise LimitMEMLOCK)");

	/* Pushed in reverse so that the first chunks handed out are at the start. */
	for (size_t i = c->nchunks; i-- > 0;)
		c->free_stack[c->nfree++] = c->base + (uint64_t)i * chunk_bytes;
	pthread_mutex_init(&c->lock, NULL);
	pthread_cond_init(&c->freed, NULL);
	*out = c;
	return 0;

fail_arrays:
	free(c->free_stack);
	free(c->out);
	free(c);
fail_struct:
	snprintf(err, errlen, "cannot allocate a host cache of %llu bytes: %s",
		 (unsigned long long)bytes, strerror(errno));
	return DSCKPT_ENOMEM;
}

/* Unmaps the cache; every chunk must be back (a broken invariant aborts). */
void cache_destroy(struct cache *c)
{
	if (c == NULL)
		return;
	if (c->nfree != c->nchunks) {
		log_error("cache destroyed with %zu chunks still in use", c->nchunks - c->nfree);
		abort();
	}
	munmap(c->base, c->total);
	pthread_cond_destroy(&c->freed);
	pthread_mutex_destroy(&c->lock);
	free(c->free_stack);
	free(c->out);
	free(c);
}

/* Pops a free chunk; the lock must be held and nfree > 0. */
static void *cache_pop(struct cache *c)
{
	void *p = c->free_stack[--c->nfree];
	c->out[((unsigned char *)p - c->base) / c->chunk] = 1;
	return p;
}

/* Takes a free chunk, waiting while none is free; NULL once cache_shutdown was called. */
void *cache_get(struct cache *c)
{
	void *p = NULL;

	pthread_mutex_lock(&c->lock);
	while (c->nfree == 0 && !c->shutdown)
		pthread_cond_wait(&c->freed, &c->lock);
	if (!c->shutdown)
		p = cache_pop(c);
	pthread_mutex_unlock(&c->lock);
	return p;
}

/* Takes a free chunk if one is free now (and not shut down), else NULL. */
void *cache_tryget(struct cache *c)
{
	void *p = NULL;

	pthread_mutex_lock(&c->lock);
	if (c->nfree > 0 && !c->shutdown)
		p = cache_pop(c);
	pthread_mutex_unlock(&c->lock);
	return p;
}

/* Returns a chunk; a pointer that is not a chunk handed out by c aborts. */
void cache_put(struct cache *c, void *chunk)
{
	uintptr_t p = (uintptr_t)chunk, base = (uintptr_t)c->base;
	size_t i = (size_t)((p - base) / c->chunk);

	if (p < base || p - base >= c->total || (p - base) % c->chunk != 0) {
		log_error("cache_put of %p, not a chunk of the cache", chunk);
		abort();
	}
	pthread_mutex_lock(&c->lock);
	if (!c->out[i]) {
		log_error("cache_put of chunk %zu, which is not in use", i);
		abort();
	}
	c->out[i] = 0;
	c->free_stack[c->nfree++] = chunk;
	pthread_cond_signal(&c->freed);
	pthread_mutex_unlock(&c->lock);
}

/* Wakes every waiter of cache_get; they get NULL from now on. */
void cache_shutdown(struct cache *c)
{
	pthread_mutex_lock(&c->lock);
	c->shutdown = 1;
	pthread_cond_broadcast(&c->freed);
	pthread_mutex_unlock(&c->lock);
}

/* Base address of the whole mapping (for pinning with CUDA). */
void *cache_base(struct cache *c)
{
	return c->base;
}

/* Length of the whole mapping: a whole number of chunks. */
uint64_t cache_total(struct cache *c)
{
	return c->total;
}

/* Bytes currently handed out. */
uint64_t cache_used(struct cache *c)
{
	uint64_t used;

	pthread_mutex_lock(&c->lock);
	used = (uint64_t)(c->nchunks - c->nfree) * c->chunk;
	pthread_mutex_unlock(&c->lock);
	return used;
}

/* Size of one chunk. */
uint64_t cache_chunk(struct cache *c)
{
	return c->chunk;
}

/* Milliseconds the start-up touch took. */
double cache_touch_ms(struct cache *c)
{
	return c->touch_ms;
}
