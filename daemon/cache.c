/*
 * cache.c — the host cache: one anonymous mapping allocated, touched and locked at start,
 * cut into equal chunks handed out from free stacks. Copy threads take chunks, flush
 * threads give them back; cache_get waits while none is free.
 *
 * NUMA: where the machine has several nodes with CPUs, the mapping is cut into one pool per
 * node (consecutive slices of whole chunks), each bound to its node with mbind and faulted
 * in by threads pinned to that node's CPUs. cache_get prefers the pool of a given node (the
 * node of the GPU a piece is copied from) and falls back to any pool, so a caller never waits
 * while any chunk is free. With one node there is a single pool, as before. The topology
 * comes from sysfs through cache_numa.c.
 *
 * Eviction: chunks may be held by resident files (resident.c) that give them up on demand.
 * When no chunk is free, cache_get and cache_tryget call the evict hook without the cache's
 * lock (the hook takes its own and puts a chunk back through cache_put), then look again;
 * cache_get waits only when the hook found nothing to give. A hook that later has something
 * (a chunk just kept, a pin ended) says so with cache_evictable, which wakes the waiters;
 * evict_gen tells a taker that this happened while it was calling the hook; a chunk put back
 * or a shutdown meanwhile is seen under the lock as it returns (their signal found no waiter,
 * so waiting then would sleep with a chunk free: a resident file dropped after a failed save
 * puts its chunks back while a copy thread waits for the lock inside the hook).
 *
 * Start-up takes minutes for hundreds of GiB (touching faults every page in, locking walks
 * them again): cache_create tells its caller how far it got at each step's start and end and
 * about once a second in between (the daemon turns that into systemd's STATUS= and
 * EXTEND_TIMEOUT_USEC=), while the touch threads run or between steps of the lock.
 */
#include "dsckptd.h"

#include <errno.h>
#include <linux/mempolicy.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define CACHE_PAGE 4096
#define CACHE_MAX_TOUCH_THREADS 8
#define CACHE_REPORT_STEP (64ULL << 20) /* a touch thread publishes its progress this often */
#define CACHE_LOCK_STEP (1ULL << 30)    /* mlock'ed at once between progress checks */

/* The chunks of one NUMA node (or of the whole cache when it is not split). */
struct cache_pool {
	int node;              /* NUMA node, or -1 when the cache is not split */
	unsigned char *base;   /* its slice of the mapping */
	size_t nchunks;
	void **free_stack;     /* (lock) free chunks of the pool; nfree of them */
	size_t nfree;          /* (lock) */
};

struct cache {
	pthread_mutex_t lock;  /* protects the pools' free stacks, nfree, out, shutdown */
	pthread_cond_t freed;  /* signalled when a chunk is put back or at shutdown */
	size_t nfree;          /* free chunks over every pool */
	unsigned char *out;    /* per chunk: 1 while handed out */
	int shutdown;
	cache_evict_fn evict;  /* (lock) gives one held chunk back, or NULL */
	unsigned evict_gen;    /* (lock) bumped by cache_evictable */

	struct cache_pool *pools; /* immutable after cache_create but for the (lock) fields */
	unsigned npools;
	unsigned char *base;
	uint64_t total;
	uint64_t chunk;
	size_t nchunks;
	double touch_ms;
	uint64_t locked;       /* bytes mlock'ed at start (all of total unless RLIMIT_MEMLOCK) */
};

/* A slice of the mapping one touch thread faults in, on the CPUs of its pool's node. */
struct cache_touch {
	unsigned char *start;
	uint64_t len;
	const cpu_set_t *cpus; /* NULL: anywhere */
	_Atomic uint64_t done; /* bytes touched so far (every CACHE_REPORT_STEP) */
	pthread_t thread;
	int started;
};

/* Binds [p, p+len) to node (before it is touched); a failure only costs locality. */
static void cache_bind(void *p, uint64_t len, int node)
{
	unsigned long mask = 1UL << node;

	/* maxnode counts one past the bits the kernel reads (it decrements it first). */
	if (syscall(SYS_mbind, p, (unsigned long)len, MPOL_BIND, &mask,
		    (unsigned long)CACHE_MAX_NODES + 1, 0UL) != 0)
		log_warn("cannot bind %llu MiB of the cache to NUMA node %d",
			 (unsigned long long)(len >> 20), node);
}

/* Writes one byte of every page of a slice (from its node's CPUs) so the kernel backs it
 * now, not on first copy. */
static void *cache_touch_slice(void *arg)
{
	struct cache_touch *t = arg;

	if (t->cpus && sched_setaffinity(0, sizeof(*t->cpus), t->cpus) != 0)
		log_debug("touch thread: sched_setaffinity: %s", strerror(errno));
	for (uint64_t off = 0; off < t->len; off += CACHE_PAGE) {
		t->start[off] = 0;
		if (off % CACHE_REPORT_STEP == 0)
			atomic_store_explicit(&t->done, off, memory_order_relaxed);
	}
	atomic_store_explicit(&t->done, t->len, memory_order_relaxed);
	return NULL;
}

/* Cuts a pool's slice into up to nthreads touch slices at t; returns how many. */
static unsigned cache_touch_plan(const struct cache *c, const struct cache_pool *p,
				 const cpu_set_t *cpus, unsigned nthreads, struct cache_touch *t)
{
	uint64_t pages = (uint64_t)p->nchunks * c->chunk / CACHE_PAGE, per;

	if (nthreads > pages)
		nthreads = (unsigned)pages;
	per = (pages + nthreads - 1) / nthreads;
	for (unsigned i = 0; i < nthreads; i++) {
		uint64_t first = i * per, count = first + per > pages ? pages - first : per;
		t[i].start = p->base + first * CACHE_PAGE;
		t[i].len = count * CACHE_PAGE;
		t[i].cpus = cpus;
	}
	return nthreads;
}

/* Does nothing with a progress report (a cache_create without a progress callback). */
static void cache_progress_none(const char *step, uint64_t done, uint64_t total)
{
}

/* Bytes the n touch threads at t have touched so far. */
static uint64_t cache_touched(struct cache_touch *t, unsigned n)
{
	uint64_t sum = 0;

	for (unsigned i = 0; i < n; i++)
		sum += atomic_load_explicit(&t[i].done, memory_order_relaxed);
	return sum;
}

/* Joins the touch threads that were started, reporting progress about once a second. */
static void cache_touch_join(struct cache *c, struct cache_touch *t, unsigned n,
			     cache_progress_fn progress)
{
	struct timespec deadline;

	for (unsigned i = 0; i < n; i++) {
		if (!t[i].started)
			continue;
		for (;;) {
			clock_gettime(CLOCK_REALTIME, &deadline);	/* the join's clock */
			deadline.tv_sec += 1;
			if (pthread_timedjoin_np(t[i].thread, NULL, &deadline) != ETIMEDOUT)
				break;
			progress("touched", cache_touched(t, n), c->total);
		}
	}
}

/* Faults every pool in at once, up to 8 threads per pool (each on its node's CPUs), telling
 * progress; returns the time taken in ms, or -1 without memory. */
static double cache_touch(struct cache *c, const cpu_set_t *cpus, cache_progress_fn progress)
{
	long nproc = sysconf(_SC_NPROCESSORS_ONLN);
	struct cache_touch *t = calloc((size_t)c->npools * CACHE_MAX_TOUCH_THREADS, sizeof(*t));
	struct timespec t0, t1;
	unsigned n = 0;

	if (t == NULL)
		return -1;
	for (unsigned i = 0; i < c->npools; i++) {
		long cores = cpus ? CPU_COUNT(&cpus[i]) : nproc;
		unsigned k = cores < 1 ? 1 : cores > CACHE_MAX_TOUCH_THREADS
					     ? CACHE_MAX_TOUCH_THREADS : (unsigned)cores;
		n += cache_touch_plan(c, &c->pools[i], cpus ? &cpus[i] : NULL, k, t + n);
	}
	progress("touched", 0, c->total);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (unsigned i = 0; i < n; i++) {
		/* A thread that cannot be started is replaced by doing its share here. */
		t[i].started = pthread_create(&t[i].thread, NULL, cache_touch_slice, &t[i]) == 0;
		if (!t[i].started) {
			t[i].cpus = NULL;	/* never pin the calling thread */
			cache_touch_slice(&t[i]);
		}
	}
	cache_touch_join(c, t, n, progress);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	free(t);
	progress("touched", c->total, c->total);
	return (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
}

/* Cuts the mapping into npools pools of nearly equal whole chunks (nodes: their NUMA nodes,
 * or NULL for one unbound pool); -1 without memory. */
static int cache_pools_make(struct cache *c, unsigned npools, const int *nodes)
{
	unsigned char *at = c->base;

	if ((c->pools = calloc(npools, sizeof(*c->pools))) == NULL)
		return -1;
	c->npools = npools;
	for (unsigned i = 0; i < npools; i++) {
		struct cache_pool *p = &c->pools[i];
		p->node = nodes ? nodes[i] : -1;
		p->base = at;
		p->nchunks = c->nchunks / npools + (i < c->nchunks % npools);
		if ((p->free_stack = calloc(p->nchunks, sizeof(void *))) == NULL)
			return -1;
		/* Pushed in reverse so that the first chunks handed out are at the start. */
		for (size_t k = p->nchunks; k-- > 0;)
			p->free_stack[p->nfree++] = p->base + (uint64_t)k * c->chunk;
		at += (uint64_t)p->nchunks * c->chunk;
	}
	c->nfree = c->nchunks;
	return 0;
}

/* Frees the pools' arrays. */
static void cache_pools_free(struct cache *c)
{
	for (unsigned i = 0; c->pools && i < c->npools; i++)
		free(c->pools[i].free_stack);
	free(c->pools);
}

/* Locks the mapping CACHE_LOCK_STEP at a time, telling progress about once a second; at the
 * first failure it says so (once per process) and stops, leaving what it locked locked, and
 * the last report says how far it got. */
static void cache_lock(struct cache *c, cache_progress_fn progress)
{
	static atomic_flag warned_mlock = ATOMIC_FLAG_INIT;
	struct timespec last, now;
	uint64_t off, len;

	progress("locked", 0, c->total);
	clock_gettime(CLOCK_MONOTONIC, &last);
	for (off = 0; off < c->total; off += len) {
		len = c->total - off < CACHE_LOCK_STEP ? c->total - off : CACHE_LOCK_STEP;
		if (mlock(c->base + off, len) != 0) {
			c->locked = off;
			if (!atomic_flag_test_and_set(&warned_mlock))
				log_warn("cannot lock the cache beyond %llu of %llu MiB, so it is "
					 "not pinned (raise RLIMIT_MEMLOCK: ulimit -l by hand, "
					 "LimitMEMLOCK= under systemd)", (unsigned long long)(off >> 20),
					 (unsigned long long)(c->total >> 20));
			progress("locked", off, c->total);
			return;
		}
		clock_gettime(CLOCK_MONOTONIC, &now);
		if ((double)(now.tv_sec - last.tv_sec) + (double)(now.tv_nsec - last.tv_nsec) / 1e9 >=
		    1.0) {
			last = now;
			progress("locked", off + len, c->total);
		}
	}
	c->locked = c->total;
	progress("locked", c->total, c->total);
}

/* Maps bytes of host memory (one pool per NUMA node with CPUs, each bound to its node),
 * touches it with several threads and locks it (best effort), telling progress (may be NULL)
 * how far it got. */
int cache_create(uint64_t bytes, uint64_t chunk_bytes, cache_progress_fn progress,
		 struct cache **out, char *err, size_t errlen)
{
	cpu_set_t cpus[CACHE_MAX_NODES];
	int nodes[CACHE_MAX_NODES];
	unsigned nnodes;
	struct cache *c;
	void *base;

	*out = NULL;
	if (progress == NULL)
		progress = cache_progress_none;
	if (chunk_bytes == 0 || chunk_bytes % CACHE_PAGE != 0 || bytes < chunk_bytes ||
	    bytes / chunk_bytes > SIZE_MAX / sizeof(void *)) {
		snprintf(err, errlen, "bad cache geometry: %llu bytes in chunks of %llu",
			 (unsigned long long)bytes, (unsigned long long)chunk_bytes);
		return ERR_EINVAL;
	}
	if ((c = calloc(1, sizeof(*c))) == NULL)
		goto fail_struct;
	c->chunk = chunk_bytes;
	c->nchunks = (size_t)(bytes / chunk_bytes);
	c->total = (uint64_t)c->nchunks * chunk_bytes;
	nnodes = cache_nodes(nodes, cpus);
	if (nnodes > c->nchunks)
		nnodes = (unsigned)c->nchunks;	/* every pool holds a chunk at least */
	if ((c->out = calloc(c->nchunks, 1)) == NULL)
		goto fail_arrays;

	base = mmap(NULL, c->total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (base == MAP_FAILED)
		goto fail_arrays;
	c->base = base;
	if (cache_pools_make(c, nnodes > 1 ? nnodes : 1, nnodes > 1 ? nodes : NULL) < 0)
		goto fail_map;
	if (madvise(base, c->total, MADV_HUGEPAGE) != 0)
		log_debug("madvise(MADV_HUGEPAGE) on the cache: %s", strerror(errno));
	for (unsigned i = 0; nnodes > 1 && i < c->npools; i++)
		cache_bind(c->pools[i].base, (uint64_t)c->pools[i].nchunks * c->chunk,
			   c->pools[i].node);
	if ((c->touch_ms = cache_touch(c, nnodes > 1 ? cpus : NULL, progress)) < 0)
		goto fail_map;
	cache_lock(c, progress);
	pthread_mutex_init(&c->lock, NULL);
	pthread_cond_init(&c->freed, NULL);
	*out = c;
	return 0;

fail_map:
	munmap(c->base, c->total);
fail_arrays:
	cache_pools_free(c);
	free(c->out);
	free(c);
fail_struct:
	snprintf(err, errlen, "cannot allocate a host cache of %llu bytes: %s",
		 (unsigned long long)bytes, strerror(errno));
	return ERR_ENOMEM;
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
	cache_pools_free(c);
	free(c->out);
	free(c);
}

/* Pops a free chunk from node's pool when it has one, else from the pool with the most free
 * chunks; the lock must be held and c->nfree > 0. */
static void *cache_pop(struct cache *c, int node)
{
	struct cache_pool *best = NULL;
	void *p;

	for (unsigned i = 0; i < c->npools; i++) {
		struct cache_pool *q = &c->pools[i];
		if (q->nfree == 0)
			continue;
		if (node >= 0 && q->node == node) {
			best = q;
			break;
		}
		if (best == NULL || q->nfree > best->nfree)
			best = q;
	}
	p = best->free_stack[--best->nfree];
	c->nfree--;
	c->out[((unsigned char *)p - c->base) / c->chunk] = 1;
	return p;
}

/* Calls the evict hook with the lock dropped (lock held on entry and return); 1 when it gave
 * a chunk back, something became evictable, a chunk was put back or the cache was shut down
 * meanwhile (look again: whoever did it signalled while nobody waited), 0 when none. */
static int cache_evict(struct cache *c)
{
	cache_evict_fn fn = c->evict;
	unsigned gen = c->evict_gen;
	int got;

	if (!fn)
		return 0;
	pthread_mutex_unlock(&c->lock);
	got = fn(c);
	pthread_mutex_lock(&c->lock);
	return got || gen != c->evict_gen || c->nfree > 0 || c->shutdown;
}

/* Takes a free chunk, node's first (-1: any), evicting a held one when none is free, waiting
 * while none is free or evictable; NULL once cache_shutdown was called. */
void *cache_get(struct cache *c, int node)
{
	void *p = NULL;

	pthread_mutex_lock(&c->lock);
	while (c->nfree == 0 && !c->shutdown)
		if (!cache_evict(c))
			pthread_cond_wait(&c->freed, &c->lock);
	if (!c->shutdown)
		p = cache_pop(c, node);
	pthread_mutex_unlock(&c->lock);
	return p;
}

/* Takes a free chunk, node's first (-1: any), if one is free now or can be evicted (and not
 * shut down). */
void *cache_tryget(struct cache *c, int node)
{
	void *p = NULL;

	pthread_mutex_lock(&c->lock);
	while (c->nfree == 0 && !c->shutdown)
		if (!cache_evict(c))
			break;
	if (c->nfree > 0 && !c->shutdown)
		p = cache_pop(c, node);
	pthread_mutex_unlock(&c->lock);
	return p;
}

/* Returns a chunk to its pool; a pointer that is not a chunk handed out by c aborts. */
void cache_put(struct cache *c, void *chunk)
{
	uintptr_t p = (uintptr_t)chunk, base = (uintptr_t)c->base;
	size_t i = (size_t)((p - base) / c->chunk);
	struct cache_pool *pool = c->pools;

	if (p < base || p - base >= c->total || (p - base) % c->chunk != 0) {
		log_error("cache_put of %p, not a chunk of the cache", chunk);
		abort();
	}
	while ((unsigned char *)chunk >= pool->base + (uint64_t)pool->nchunks * c->chunk)
		pool++;
	pthread_mutex_lock(&c->lock);
	if (!c->out[i]) {
		log_error("cache_put of chunk %zu, which is not in use", i);
		abort();
	}
	c->out[i] = 0;
	pool->free_stack[pool->nfree++] = chunk;
	c->nfree++;
	pthread_cond_signal(&c->freed);
	pthread_mutex_unlock(&c->lock);
}

/* Sets the hook that gives a held chunk back when none is free (before the cache is shared). */
void cache_set_evict(struct cache *c, cache_evict_fn fn)
{
	pthread_mutex_lock(&c->lock);
	c->evict = fn;
	pthread_mutex_unlock(&c->lock);
}

/* Tells the waiters of cache_get that the hook may now find a chunk to give back. */
void cache_evictable(struct cache *c)
{
	pthread_mutex_lock(&c->lock);
	c->evict_gen++;
	pthread_cond_broadcast(&c->freed);
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

/* Number of pools: one per NUMA node the cache is split over, or 1. */
unsigned cache_pools(struct cache *c)
{
	return c->npools;
}

/* Pool i's NUMA node (-1: not split), size and bytes handed out (any may be NULL). */
void cache_pool_info(struct cache *c, unsigned i, int *node, uint64_t *total, uint64_t *used)
{
	const struct cache_pool *p = &c->pools[i];

	if (node)
		*node = p->node;
	if (total)
		*total = (uint64_t)p->nchunks * c->chunk;
	if (used) {
		pthread_mutex_lock(&c->lock);
		*used = (uint64_t)(p->nchunks - p->nfree) * c->chunk;
		pthread_mutex_unlock(&c->lock);
	}
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

/* Bytes of the cache locked in memory at start (less than cache_total: RLIMIT_MEMLOCK). */
uint64_t cache_locked(struct cache *c)
{
	return c->locked;
}
