/*
 * restore.c — the restore threads: a load's pieces, from the resident copy or the file, are
 * checked and written into the client's tensors.
 *
 * A job's data region is cut into cache-chunk-sized pieces at chunk-aligned offsets (the same
 * pieces a save wrote, so a resident copy is indexed the same way); only pieces that hold a
 * destination are visited, in ascending order. A thread takes a piece from the job's pinned
 * resident copy when it is still there; otherwise it first takes a free cache chunk (so that
 * a claimed piece always owns memory, as in engine.c) and reads the piece into it: from the
 * page cache when the whole piece is there (preadv2 RWF_NOWAIT on the buffered descriptor),
 * else with O_DIRECT (at once when cachestat says none of it is cached). It then queues the writes of every destination the piece holds
 * (copier_write: pwrite into a memfd, or a host-to-device copy on its own stream), hashes the
 * destinations' bytes while those copies run, waits for them and gives the chunk back.
 *
 * Checksums: a tensor's XXH3-64 streams over its bytes in order, but no thread waits for
 * that order. A tensor's part in a piece is hashed at once when every earlier part is;
 * otherwise it is left in the tensor's slot for that piece, and whichever thread hashes the
 * part before it goes on with it. A piece's chunk goes back to the cache once its copies are
 * done and its last part is hashed (a count per piece), so a tensor's parts are hashed one
 * after another while different tensors are hashed on every thread at once. A tensor whose
 * last part is hashed is compared with the header's checksum. No deadlock: the first
 * unhashed part of every tensor lies in a claimed piece, which owns its memory (claimed
 * only after its chunk was taken) and whose thread hashes it.
 *
 * Lock order: R.lock, then resident.c's lock (resident_piece), the cache's lock (cache_put)
 * or R.post_lock; nothing here is called with either of the first two held. R.lock guards the
 * job list, every job field marked (L) and stop; post_lock the finished queue.
 */
#include "dsckptd.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>
#include <uv.h>
#include <xxh_x86dispatch.h>  /* XXH3 with the CPU's widest vectors (AVX2, AVX-512) */

#define DIRECT_ALIGN 4096

/* A tensor's part in a piece, left for the thread that hashes the part before it. */
struct part {
	const uint8_t *p;          /* the bytes, in a chunk or a resident piece; NULL: none */
	uint64_t a, b;             /* data offsets */
	uint64_t ord;              /* the piece's index in pieces */
};

/* One restore job; R.lock guards the fields marked (L). */
struct restore_job {
	struct restore_req r;
	uint64_t chunk;
	uint64_t *pieces;          /* the pieces holding a destination, ascending */
	uint64_t npieces;
	uint64_t next_claim;       /* (L) index into pieces */
	unsigned active;           /* (L) pieces claimed and not yet done */
	int failed;                /* (L) */
	int finished;              /* (L) the final event is posted */
	int code;                  /* (L) */
	char error[ERRLEN];        /* (L) */
	uint64_t *hashed;          /* (L) per destination: bytes hashed so far */
	XXH3_state_t **hs;         /* per destination with a checksum (NULL otherwise) */
	struct part *slot;         /* (L) per destination and piece it spans, from slot0[i] */
	uint64_t *slot0;
	void **chunk_of;           /* (L) per claimed piece: its cache chunk (NULL: resident) */
	unsigned *holds;           /* (L) per claimed piece: its copies + its unhashed parts */
	uint64_t done;             /* atomic: destination bytes in place */
	struct restore_job *next;      /* (L) link in the active list */
	struct restore_job *post_next; /* (post_lock) link in the finished queue */
};

static struct {
	pthread_mutex_t lock;
	pthread_cond_t work_cv;    /* a job has a piece to claim, or stop */
	struct restore_job *jobs;  /* (L) active jobs, served round robin */
	struct restore_job *rr;    /* (L) */
	int stop;                  /* (L) */
	struct cache *cache;
	pthread_t *threads;
	struct copier **copiers;
	unsigned nthreads;
	restore_cb cb;
	pthread_mutex_t post_lock;
	struct restore_job *post_head;  /* finished jobs, for the loop */
	uv_async_t async;
} R;

/* Loop side: hands every finished job to the callback (which frees it). */
static void on_async(uv_async_t *a)
{
	struct restore_job *j, *next;

	pthread_mutex_lock(&R.post_lock);
	j = R.post_head;
	R.post_head = NULL;
	pthread_mutex_unlock(&R.post_lock);
	for (; j; j = next) {
		next = j->post_next;
		char why[ERRLEN];
		snprintf(why, sizeof(why), "%s", j->error);
		R.cb(j->r.owner, j, j->code, j->code < 0 ? why : NULL);
	}
}

/* Ends a job whose pieces are all done or given up (R.lock held): off the list, posted. */
static void finish_locked(struct restore_job *j)
{
	if (j->finished || j->active > 0 || (!j->failed && j->next_claim < j->npieces))
		return;
	j->finished = 1;
	/* After a failure, parts left unhashed still hold their pieces' chunks. */
	for (uint64_t o = 0; o < j->next_claim; o++)
		if (j->chunk_of[o]) {
			cache_put(R.cache, j->chunk_of[o]);
			j->chunk_of[o] = NULL;
		}
	for (struct restore_job **p = &R.jobs; *p; p = &(*p)->next) {
		if (*p == j) {
			*p = j->next;
			break;
		}
	}
	if (R.rr == j)
		R.rr = NULL;
	pthread_mutex_lock(&R.post_lock);
	j->post_next = R.post_head;
	R.post_head = j;
	pthread_mutex_unlock(&R.post_lock);
	uv_async_send(&R.async);
}

/* Records a job's first error (R.lock held). */
static void fail_locked(struct restore_job *j, int code, const char *error)
{
	if (!j->failed) {
		j->failed = 1;
		j->code = code < 0 ? code : ERR_EIO;
		snprintf(j->error, sizeof(j->error), "%s", error);
	}
}

/* The next job with a piece to claim after the round-robin cursor (R.lock held). */
static struct restore_job *pick_locked(void)
{
	struct restore_job *start = R.rr && R.rr->next ? R.rr->next : R.jobs, *j = start;

	if (!j)
		return NULL;
	do {
		if (!j->failed && j->next_claim < j->npieces)
			return R.rr = j;
		j = j->next ? j->next : R.jobs;
	} while (j != start);
	return NULL;
}

/* Bytes of the data region in piece p. */
static uint64_t piece_len(const struct restore_job *j, uint64_t p)
{
	uint64_t start = p * j->chunk;
	return start + j->chunk < j->r.data_len ? j->chunk : j->r.data_len - start;
}

/* Reads len bytes at off of fd into buf, retrying short reads; what was read, or -errno. */
static ssize_t read_full(int fd, uint8_t *buf, size_t len, uint64_t off, int flags)
{
	size_t got = 0;

	while (got < len) {
		struct iovec iov = {buf + got, len - got};
		ssize_t r = preadv2(fd, &iov, 1, (off_t)(off + got), flags);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return got > 0 && flags ? (ssize_t)got : -errno;
		if (r == 0)
			break;
		got += (size_t)r;
	}
	return (ssize_t)got;
}

#ifndef __NR_cachestat
#define __NR_cachestat 451	/* Linux 6.5 on every architecture; older kernels: ENOSYS */
#endif

/* Whether any page of [off, off + len) of fd is in the page cache: 1, 0, or -1 when the
 * kernel cannot tell (before Linux 6.5). Asked so that a cold piece goes to O_DIRECT without
 * first trying the page cache, which starts readahead of the very bytes O_DIRECT then reads. */
static int any_cached(int fd, uint64_t off, uint64_t len)
{
	struct { uint64_t off, len; } range = {off, len};
	struct { uint64_t nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recent; } cs;

	if (syscall(__NR_cachestat, fd, &range, &cs, 0) < 0)
		return -1;
	return cs.nr_cache > 0;
}

/* Reads piece p of the file into chunk: from the page cache when the whole piece is there,
 * else the rest with O_DIRECT; 0 or a negative ERR_E* with err. */
static int read_piece(struct restore_job *j, uint64_t p, uint8_t *chunk, char *err,
		      size_t errlen)
{
	uint64_t len = piece_len(j, p), off = j->r.data_start + p * j->chunk;
	ssize_t got = 0;

	if (j->r.dfd >= 0) {
		if (any_cached(j->r.fd, off, len) != 0)
			got = read_full(j->r.fd, chunk, len, off, RWF_NOWAIT);
		if (got < (ssize_t)len) {
			/* Not all cached: the rest from the disk, aligned, past the page cache. */
			uint64_t from = got > 0 ? (uint64_t)got & ~(uint64_t)(DIRECT_ALIGN - 1) : 0;
			uint64_t want = (len - from + DIRECT_ALIGN - 1) & ~(uint64_t)(DIRECT_ALIGN - 1);
			ssize_t r = read_full(j->r.dfd, chunk + from, want, off + from, 0);
			got = r < 0 ? r : (ssize_t)(from + (uint64_t)r);
		}
	} else {
		got = read_full(j->r.fd, chunk, len, off, 0);
	}
	if (got < 0)
		return seterr(err, errlen, err_from_errno((int)-got), "%s: reading byte %llu: %s",
			      j->r.path, (unsigned long long)off, strerror((int)-got));
	if ((uint64_t)got < len)
		return seterr(err, errlen, ERR_EIO, "%s: the file ends at byte %llu, inside its data",
			      j->r.path, (unsigned long long)(off + (uint64_t)got));
	return 0;
}

/* First destination ending after data offset start (d is sorted by begin and, as the
 * tensors of a file, does not overlap); n when none does. */
static size_t first_dst(const struct restore_job *j, uint64_t start)
{
	size_t lo = 0, hi = j->r.n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (j->r.d[mid].end <= start)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* Lets go of one hold on claimed piece o (R.lock held): the last gives its chunk back. */
static void unhold_locked(struct restore_job *j, uint64_t o)
{
	if (--j->holds[o] == 0 && j->chunk_of[o]) {
		cache_put(R.cache, j->chunk_of[o]);
		j->chunk_of[o] = NULL;
	}
}

/* Hashes destination i from part pt on, then every part left for it that follows (R.lock
 * held on entry and on return, dropped while hashing); a mismatch at its end fails the job. */
static void hash_chain_locked(struct restore_job *j, size_t i, struct part pt)
{
	const struct restore_dst *d = &j->r.d[i];
	char why[ERRLEN];

	while (pt.p) {
		pthread_mutex_unlock(&R.lock);
		XXH3_64bits_update(j->hs[i], pt.p, pt.b - pt.a);
		uint64_t h = pt.b == d->end ? XXH3_64bits_digest(j->hs[i]) : 0;
		pthread_mutex_lock(&R.lock);
		j->hashed[i] = pt.b - d->begin;
		unhold_locked(j, pt.ord);
		if (pt.b == d->end) {
			if (h != d->xxh3) {
				snprintf(why, sizeof(why), "%s: tensor '%s' does not match its checksum "
					 "(the file's bytes are corrupted)", j->r.path, d->name);
				fail_locked(j, ERR_ECHECKSUM, why);
			}
			return;
		}
		/* The next part, if its piece has been read already. */
		struct part *next = &j->slot[j->slot0[i] + pt.b / j->chunk - d->begin / j->chunk];
		pt = *next;
		*next = (struct part){0};
		if (j->failed && pt.p) {
			unhold_locked(j, pt.ord);
			return;
		}
	}
}

/* Hashes, or leaves for later, destination i's part [a, b) of claimed piece o, whose bytes
 * are at p (R.lock held). */
static void hash_part_locked(struct restore_job *j, size_t i, uint64_t a, uint64_t b,
			     const uint8_t *p, uint64_t o)
{
	const struct restore_dst *d = &j->r.d[i];
	struct part pt = {.p = p, .a = a, .b = b, .ord = o};

	if (j->failed) {
		unhold_locked(j, o);
	} else if (j->hashed[i] == a - d->begin) {
		hash_chain_locked(j, i, pt);
	} else {
		j->slot[j->slot0[i] + a / j->chunk - d->begin / j->chunk] = pt;
	}
}

/* Writes and checks every destination part in claimed piece o, piece p (its bytes at data):
 * 0, or a negative ERR_E* with err. */
static int fill_piece(struct copier *cp, struct restore_job *j, uint64_t o, uint64_t p,
		      const uint8_t *data, char *err, size_t errlen)
{
	uint64_t start = p * j->chunk, end = start + piece_len(j, p), bytes = 0;
	size_t first = first_dst(j, start), i;
	int rc = 0;

	copier_fence(cp, j->r.fence);
	for (i = first; i < j->r.n && j->r.d[i].begin < end && rc == 0; i++) {
		const struct restore_dst *d = &j->r.d[i];
		uint64_t a = d->begin > start ? d->begin : start;
		uint64_t b = d->end < end ? d->end : end;
		if (a < b)
			rc = copier_write(cp, d->dst, d->dst_off + (a - d->begin), data + (a - start),
					  b - a, err, errlen);
		bytes += b - a;
	}
	/* The copies run while the bytes are hashed: both only read the piece. Each part holds
	 * the piece until it is hashed, here or by whoever hashes the part before it. */
	pthread_mutex_lock(&R.lock);
	for (i = first; i < j->r.n && j->r.d[i].begin < end && rc == 0; i++) {
		const struct restore_dst *d = &j->r.d[i];
		uint64_t a = d->begin > start ? d->begin : start;
		uint64_t b = d->end < end ? d->end : end;
		if (a < b && j->hs[i]) {
			j->holds[o]++;
			hash_part_locked(j, i, a, b, data + (a - start), o);
		}
	}
	pthread_mutex_unlock(&R.lock);
	int src = copier_sync(cp, rc != 0 ? NULL : err, rc != 0 ? 0 : errlen);
	if (rc == 0 && src < 0)
		rc = src;
	if (rc == 0) {
		__atomic_add_fetch(&j->done, bytes, __ATOMIC_RELAXED);
		metrics_add(METRIC_RESTORED_BYTES, bytes);
	}
	return rc;
}

/* Restore thread: claims pieces and fills their destinations through its copier. */
static void restore_loop(struct copier *cp)
{
	char err[ERRLEN];

	for (;;) {
		pthread_mutex_lock(&R.lock);
		struct restore_job *j;
		while (!R.stop && (j = pick_locked()) == NULL)
			pthread_cond_wait(&R.work_cv, &R.lock);
		if (R.stop) {
			pthread_mutex_unlock(&R.lock);
			return;
		}
		uint64_t p = j->pieces[j->next_claim];
		const uint8_t *data = j->r.res ? resident_piece(j->r.res, p) : NULL;
		uint8_t *chunk = NULL;
		if (!data) {
			/* Memory first, then the claim (see engine.c): no wait ever holds a piece
			 * that needs memory held by a later one. */
			pthread_mutex_unlock(&R.lock);
			if ((chunk = cache_get(R.cache, -1)) == NULL)
				return;	/* the cache shut down: stopping */
			pthread_mutex_lock(&R.lock);
			if (R.stop || j != pick_locked() || j->pieces[j->next_claim] != p) {
				pthread_mutex_unlock(&R.lock);
				cache_put(R.cache, chunk);
				continue;	/* someone else took it meanwhile: look again */
			}
		}
		uint64_t o = j->next_claim++;
		j->chunk_of[o] = chunk;	/* Ownership: the job's until its last hold goes */
		j->holds[o] = 1;	/* this thread's, until its copies are done */
		j->active++;
		pthread_mutex_unlock(&R.lock);

		int rc = 0;
		if (chunk && (rc = read_piece(j, p, chunk, err, sizeof(err))) == 0)
			data = chunk;
		if (rc == 0)
			rc = fill_piece(cp, j, o, p, data, err, sizeof(err));
		pthread_mutex_lock(&R.lock);
		if (rc < 0)
			fail_locked(j, rc, err);
		unhold_locked(j, o);
		j->active--;
		finish_locked(j);
		pthread_mutex_unlock(&R.lock);
	}
}

/* Thread entry. */
static void *thread_main(void *arg)
{
	restore_loop(arg);
	return NULL;
}

/* Starts n restore threads, each with a copier of its own. */
int restore_start(struct cache *c, unsigned n, restore_cb cb, char *err, size_t errlen)
{
	int rc;

	pthread_mutex_init(&R.lock, NULL);
	pthread_mutex_init(&R.post_lock, NULL);
	pthread_cond_init(&R.work_cv, NULL);
	R.cache = c;
	R.cb = cb;
	if ((rc = uv_async_init(loop, &R.async, on_async)) != 0)
		return seterr(err, errlen, ERR_EIO, "uv_async_init: %s", uv_strerror(rc));
	R.threads = calloc(n, sizeof(*R.threads));
	R.copiers = calloc(n, sizeof(*R.copiers));
	if (!R.threads || !R.copiers) {
		rc = seterr(err, errlen, ERR_ENOMEM, "out of memory");
		goto fail;
	}
	for (unsigned i = 0; i < n; i++) {
		if ((rc = copier_new(&R.copiers[i], err, errlen)) < 0)
			goto fail;
		if ((rc = pthread_create(&R.threads[i], NULL, thread_main, R.copiers[i])) != 0) {
			copier_free(R.copiers[i]);
			R.copiers[i] = NULL;
			rc = seterr(err, errlen, err_from_errno(rc), "pthread_create: %s",
				    strerror(rc));
			goto fail;
		}
		R.nthreads = i + 1;
	}
	return 0;

fail:
	restore_stop();
	return rc;
}

/* Frees what restore_submit allocated (r's pointers stay the caller's). */
static void job_free_own(struct restore_job *j)
{
	for (size_t i = 0; j->hs && i < j->r.n; i++)
		XXH3_freeState(j->hs[i]);
	free(j->hs);
	free(j->hashed);
	free(j->slot);
	free(j->slot0);
	free(j->chunk_of);
	free(j->holds);
	free(j->pieces);
	free(j);
}

/* Lists the pieces that hold a destination, ascending (d sorted by begin); -1 without
 * memory. */
static int plan_pieces(struct restore_job *j)
{
	uint64_t n = 0, last = UINT64_MAX;

	j->pieces = malloc(((j->r.data_len + j->chunk - 1) / j->chunk + 1) * sizeof(uint64_t));
	if (!j->pieces)
		return -1;
	for (size_t i = 0; i < j->r.n; i++) {
		const struct restore_dst *d = &j->r.d[i];
		if (d->end == d->begin)
			continue;
		for (uint64_t p = d->begin / j->chunk; p <= (d->end - 1) / j->chunk; p++) {
			if (last != UINT64_MAX && p <= last)
				continue;
			j->pieces[n++] = last = p;
		}
	}
	j->npieces = n;
	return 0;
}

/* Makes the per-piece holds and the per-destination slots of parts left for later (one per
 * piece a destination spans); -1 without memory. */
static int plan_slots(struct restore_job *j)
{
	uint64_t n = 0;

	j->chunk_of = calloc(j->npieces ? j->npieces : 1, sizeof(*j->chunk_of));
	j->holds = calloc(j->npieces ? j->npieces : 1, sizeof(*j->holds));
	j->slot0 = calloc(j->r.n ? j->r.n : 1, sizeof(*j->slot0));
	if (!j->chunk_of || !j->holds || !j->slot0)
		return -1;
	for (size_t i = 0; i < j->r.n; i++) {
		const struct restore_dst *d = &j->r.d[i];
		j->slot0[i] = n;
		if (d->end > d->begin)
			n += (d->end - 1) / j->chunk - d->begin / j->chunk + 1;
	}
	j->slot = calloc(n ? n : 1, sizeof(*j->slot));
	return j->slot ? 0 : -1;
}

/* Queues a job; on failure nothing of r is taken. Empty destinations are checked here. */
int restore_submit(struct restore_req *r, struct restore_job **out, char *err, size_t errlen)
{
	struct restore_job *j = calloc(1, sizeof(*j));

	if (!j)
		return seterr(err, errlen, ERR_ENOMEM, "out of memory queueing the load");
	j->r = *r;
	j->chunk = cache_chunk(R.cache);
	j->hashed = calloc(r->n ? r->n : 1, sizeof(*j->hashed));
	j->hs = calloc(r->n ? r->n : 1, sizeof(*j->hs));
	if (!j->hashed || !j->hs || plan_pieces(j) < 0 || plan_slots(j) < 0)
		goto nomem;
	for (size_t i = 0; i < r->n; i++) {
		const struct restore_dst *d = &r->d[i];
		if (!d->has_xxh3)
			continue;
		if (d->end == d->begin && XXH3_64bits(NULL, 0) != d->xxh3) {
			job_free_own(j);
			return seterr(err, errlen, ERR_ECHECKSUM, "%s: tensor '%s' does not match "
				      "its checksum", r->path, d->name);
		}
		if (d->end > d->begin) {
			if (!(j->hs[i] = XXH3_createState()))
				goto nomem;
			XXH3_64bits_reset(j->hs[i]);
		}
	}
	pthread_mutex_lock(&R.lock);
	j->next = R.jobs;
	R.jobs = j;
	finish_locked(j);	/* nothing to read: done at once */
	pthread_cond_broadcast(&R.work_cv);
	pthread_mutex_unlock(&R.lock);
	*out = j;
	return 0;

nomem:
	job_free_own(j);
	return seterr(err, errlen, ERR_ENOMEM, "out of memory queueing the load");
}

/* Destination bytes in place so far. */
uint64_t restore_progress(struct restore_job *j)
{
	return __atomic_load_n(&j->done, __ATOMIC_RELAXED);
}

/* Stops a job early: nothing more is claimed; its final event follows once the pieces in
 * progress are done. */
void restore_cancel(struct restore_job *j, int code, const char *why)
{
	pthread_mutex_lock(&R.lock);
	if (!j->finished) {
		fail_locked(j, code, why);
		finish_locked(j);
	}
	pthread_mutex_unlock(&R.lock);
}

/* Frees a finished job and everything its request owned. */
void restore_job_free(struct restore_job *j)
{
	for (size_t i = 0; i < j->r.n; i++)
		if (j->r.d[i].dst)
			source_unref(j->r.d[i].dst);
	free(j->r.d);
	if (j->r.fd >= 0)
		close(j->r.fd);
	if (j->r.dfd >= 0)
		close(j->r.dfd);
	if (j->r.res)
		resident_unpin(j->r.res);
	if (j->r.fence)
		copier_fence_free(j->r.fence);
	job_free_own(j);
}

/* Stops and joins the threads; every job must have finished. */
void restore_stop(void)
{
	pthread_mutex_lock(&R.lock);
	R.stop = 1;
	pthread_cond_broadcast(&R.work_cv);
	pthread_mutex_unlock(&R.lock);
	for (unsigned i = 0; i < R.nthreads; i++)
		pthread_join(R.threads[i], NULL);
	for (unsigned i = 0; R.copiers && i < R.nthreads; i++)
		copier_free(R.copiers[i]);
	free(R.threads);
	free(R.copiers);
	R.threads = NULL;
	R.copiers = NULL;
	R.nthreads = 0;
	on_async(&R.async);	/* deliver what finished last */
	uv_close((uv_handle_t *)&R.async, NULL);
}
