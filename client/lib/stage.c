/*
 * stage.c — staging arenas: memfds a save copies host memory into, and a load has the daemon
 * write into before it copies them out, when the library did not allocate that memory (it is
 * not a dsckpt_host_alloc block, so the daemon cannot reach it).
 * Arenas are at least STAGE_MIN bytes and sub-allocated 4096-aligned; each is registered on
 * the connection when created and unregistered by lib_stage_free (the daemon keeps its own
 * mapping for a request still in flight). The save or load owns its arenas.
 *
 * Staging runs at memory bandwidth, not at the speed of first touching memory: a save gives
 * its arenas to the connection's pool as soon as a reply says it reached SNAPSHOT (the daemon
 * reads them no more), still registered and their pages in place, and the next save takes
 * them from there
 * (first touching fresh shared memory ran at 0.1-0.4 GB/s on a 2-core VM against 2-4 GB/s
 * for a copy into memory touched before); and a large copy is split between threads, one
 * per CPU up to STAGE_THREADS. A new arena's pages are left to the copy's first touch:
 * allocating them up front (fallocate) or populating each thread's slice first
 * (MADV_POPULATE_WRITE) was no faster (tests/bench_stage_first.c).
 */
#include "internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define STAGE_MIN ((size_t)64 << 20)
#define STAGE_ALIGN 4096
#define STAGE_POOL 8                       /* arenas a connection keeps for later saves */
#define STAGE_THREADS 8                    /* threads of one copy, at most */
#define STAGE_SLICE ((size_t)16 << 20)     /* the least bytes a copy gives one thread */

/* One arena. */
struct lib_stage {
	uint64_t region;
	int fd;
	uint8_t *base;
	size_t size, used;
};

/* Takes the smallest arena of the connection's pool that holds nbytes into *out; whether
 * there was one. */
static int lib_stage_reuse(dsckpt_conn_t *c, size_t nbytes, struct lib_stage *out)
{
	struct lib_stages *pool = lib_conn_stage_pool(c);
	size_t best = pool->n;

	for (size_t i = 0; i < pool->n; i++)
		if (pool->v[i].size >= nbytes && (best == pool->n ||
						   pool->v[i].size < pool->v[best].size))
			best = i;
	if (best == pool->n)
		return 0;
	*out = pool->v[best];
	out->used = 0;
	pool->v[best] = pool->v[--pool->n];
	return 1;
}

/* Creates and registers an arena for at least nbytes (or takes one from the connection's
 * pool) as the last of ss. */
static int lib_stage_new(dsckpt_conn_t *c, struct lib_stages *ss, size_t nbytes)
{
	struct lib_stage n = {.region = lib_region_id()};
	void *base;
	int e;

	if (nbytes > SIZE_MAX - STAGE_ALIGN)
		return lib_conn_fail(c, DSCKPT_ENOMEM, "tensor too large to stage");
	struct lib_stage *v = realloc(ss->v, (ss->n + 1) * sizeof(*v));
	if (!v)
		return lib_conn_fail(c, DSCKPT_ENOMEM, "out of memory");
	ss->v = v;
	if (lib_stage_reuse(c, nbytes, &ss->v[ss->n])) {
		ss->n++;
		return 0;
	}
	n.size = (nbytes + STAGE_ALIGN - 1) / STAGE_ALIGN * STAGE_ALIGN;
	if (n.size < STAGE_MIN)
		n.size = STAGE_MIN;
	if ((e = lib_memfd_map("dsckpt-stage", n.size, &n.fd, &base)) < 0)
		return lib_conn_fail(c, e, "staging memory of %zu bytes: %s", n.size,
				     strerror(errno));
	n.base = base;
	if ((e = lib_conn_region_add(c, n.region, n.fd, n.size)) < 0) {
		munmap(n.base, n.size);
		close(n.fd);
		return e;
	}
	ss->v[ss->n++] = n;
	return 0;
}

/* Reserves nbytes in the last arena, creating one if they do not fit. */
int lib_stage_alloc(dsckpt_conn_t *c, struct lib_stages *ss, size_t nbytes, uint64_t *region,
		    uint64_t *offset, void **at)
{
	struct lib_stage *st = ss->n ? &ss->v[ss->n - 1] : NULL;
	size_t off = st ? (st->used + STAGE_ALIGN - 1) / STAGE_ALIGN * STAGE_ALIGN : 0;
	int e;

	if (!st || off > st->size || nbytes > st->size - off) {
		if ((e = lib_stage_new(c, ss, nbytes)) < 0)
			return e;
		st = &ss->v[ss->n - 1];
		off = 0;
	}
	st->used = off + nbytes;
	*region = st->region;
	*offset = off;
	*at = st->base + off;
	return 0;
}

/* One thread's share of a copy. */
struct stage_slice {
	uint8_t *dst;
	const uint8_t *src;
	size_t n;
};

/* Copies one slice (a thread's body). */
static void *stage_copy_slice(void *arg)
{
	struct stage_slice *sl = arg;

	memcpy(sl->dst, sl->src, sl->n);
	return NULL;
}

/* Copies n bytes from src to dst, split between up to one thread per CPU (STAGE_THREADS)
 * when there is at least STAGE_SLICE for each; this thread copies the first slice. */
static void stage_copy(void *dst, const void *src, size_t n)
{
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	size_t k = n / STAGE_SLICE;
	struct stage_slice sl[STAGE_THREADS];
	pthread_t th[STAGE_THREADS];
	int started[STAGE_THREADS] = {0};

	if (cpus > 0 && k > (size_t)cpus)
		k = (size_t)cpus;
	if (k > STAGE_THREADS)
		k = STAGE_THREADS;
	if (k < 2) {
		memcpy(dst, src, n);
		return;
	}
	size_t per = (n / k + STAGE_ALIGN - 1) / STAGE_ALIGN * STAGE_ALIGN;
	for (size_t i = 0; i < k; i++) {
		size_t at = i * per < n ? i * per : n;
		sl[i] = (struct stage_slice){(uint8_t *)dst + at, (const uint8_t *)src + at,
					     at + per < n ? per : n - at};
		if (i > 0)
			started[i] = pthread_create(&th[i], NULL, stage_copy_slice, &sl[i]) == 0;
	}
	stage_copy_slice(&sl[0]);
	for (size_t i = 1; i < k; i++) {
		if (started[i])
			pthread_join(th[i], NULL);
		else
			stage_copy_slice(&sl[i]);	/* no thread: copied here */
	}
}

/* Copies bytes into an arena. */
int lib_stage_copy(dsckpt_conn_t *c, struct lib_stages *ss, const void *ptr, size_t nbytes,
		   uint64_t *region, uint64_t *offset)
{
	void *at;
	int e = lib_stage_alloc(c, ss, nbytes, region, offset, &at);

	if (e == 0 && nbytes > 0)
		stage_copy(at, ptr, nbytes);
	return e;
}

/* Unregisters (while the connection is alive) and frees arena st. */
static void lib_stage_drop(dsckpt_conn_t *c, struct lib_stage *st)
{
	if (lib_conn_alive(c))
		lib_conn_region_del(c, st->region);
	munmap(st->base, st->size);
	close(st->fd);
}

/* Unregisters (while the connection is alive) and frees every arena. */
void lib_stage_free(dsckpt_conn_t *c, struct lib_stages *ss)
{
	for (size_t i = 0; i < ss->n; i++)
		lib_stage_drop(c, &ss->v[i]);
	free(ss->v);
	ss->v = NULL;
	ss->n = 0;
}

/* Moves the arenas of ss into the connection's pool; past STAGE_POOL arenas the smallest
 * are freed. */
void lib_stage_keep(dsckpt_conn_t *c, struct lib_stages *ss)
{
	struct lib_stages *pool = lib_conn_stage_pool(c);

	if (ss->n == 0)
		return;
	struct lib_stage *v = lib_conn_alive(c) ? realloc(pool->v, (pool->n + ss->n) *
							  sizeof(*v)) : NULL;
	if (!v) {
		lib_stage_free(c, ss);
		return;
	}
	pool->v = v;
	memcpy(pool->v + pool->n, ss->v, ss->n * sizeof(*v));
	pool->n += ss->n;
	free(ss->v);
	ss->v = NULL;
	ss->n = 0;
	while (pool->n > STAGE_POOL) {
		size_t small = 0;
		for (size_t i = 1; i < pool->n; i++)
			if (pool->v[i].size < pool->v[small].size)
				small = i;
		lib_stage_drop(c, &pool->v[small]);
		pool->v[small] = pool->v[--pool->n];
	}
}
