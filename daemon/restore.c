/*
 * restore.c — the restore threads: a load's pieces, from the resident copy or the file, are
 * checked and written into the client's tensors.
 *
 * It is over 600 lines on purpose: one lock (pool.lock) guards a job's claims, its pieces'
 * holds and its checksum chains together, and the no-deadlock argument below spans them all;
 * cut into files, those invariants would be read in pieces.
 *
 * A job's data region is cut into cache-chunk-sized pieces at chunk-aligned offsets (the same
 * pieces a save wrote, so a resident copy is indexed the same way); only pieces that hold a
 * destination are visited. restore_submit groups them into units: runs of adjacent pieces with
 * a destination crossing every boundary inside, at most UNIT_MAX long and shorter toward the
 * end (so that a long tensor still spreads over threads and no thread reads a long unit alone
 * at the end; a whole resident copy, hashed from DRAM anyway, has units of one piece). Units
 * are claimed in ascending order, each by one thread that goes through its pieces in order. A
 * piece comes from the job's pinned resident copy when it is still there; otherwise from a
 * cache chunk the thread holds: it takes one before claiming a unit that needs one (so that a
 * claimed unit always owns memory, as in engine.c) and reuses it piece after piece. A
 * piece is read from the page cache when it is there (preadv2 RWF_NOWAIT on the buffered
 * descriptor), else with O_DIRECT (at once, whole, when cachestat says none of it is cached). A
 * cached piece is read STEP bytes at a time, and each step is written out (copier_write: pwrite
 * into a memfd, or a host-to-device copy on the thread's stream) and hashed while it is still
 * in the CPU's cache.
 *
 * Checksums: a tensor's XXH3-64 streams over its bytes in order, but no thread waits for that
 * order. A thread hashes a tensor's bytes in a step when every earlier byte is hashed; a part
 * (a tensor's bytes in one piece) whose earlier bytes are not hashed by its end is left in the
 * tensor's slot for that piece, and whichever thread hashes the part before it goes on with it.
 * Inside a unit every tensor is hashed in order by its own thread; only a tensor coming in from
 * the unit before (at a UNIT_MAX cap, or from the piece before in a resident copy, which holds
 * no chunk) can be left in slots. A piece's chunk is free once its copies are done and its last
 * part is hashed (a count per piece); the unit's thread then takes it back for its next piece,
 * or a free one from the cache if one is free at once, else waits for its own to be free. A
 * tensor whose last part is hashed is compared with the header's checksum.
 *
 * Destinations whose memory checksums itself (GPU memory: source_can_digest) are not hashed
 * here at all: the host's pass over every byte cost a quarter of a file restore's speed on
 * the H200. The thread that finishes a job's last unit, every copy synced, has their sources
 * checksum them (source_digest: on the device) and compares, before the job ends.
 *
 * No deadlock: the only wait for memory holding a claim is that wait for a chunk of the
 * thread's own unit, whose parts left in slots wait only on earlier units. The lowest
 * unfinished unit never leaves a part in a slot (every earlier byte is hashed: earlier units
 * are done, and a part left in a slot is hashed as soon as the part before it is), so its
 * thread never waits; it finishes, and the next unit becomes the lowest.
 *
 * Lock order: pool.lock, then resident.c's lock (resident_piece), the cache's lock (cache_put)
 * or the workq's lock (a finished job is pushed with pool.lock held); nothing here is called
 * with either of the first two held. pool.lock guards the job list, every job field marked (L)
 * and stop. held_cv is told when a piece's holds fall to one and when a job fails. Finished
 * jobs go to the loop through a workq (workq.c), in the order they finished.
 */
#include "dsckptd.h"

#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>
#include <xxh_x86dispatch.h>  /* XXH3 with the CPU's widest vectors (AVX2, AVX-512) */

#define DIRECT_ALIGN 4096
#define UNIT_MAX 4              /* pieces in a unit at most: 256 MiB at 64 MiB chunks */
#define STEP (1u << 20)         /* bytes of a cached piece read and hashed at a time (L2) */
#define DIGEST_MIN 4096         /* shorter destinations are hashed here even on a GPU */

/* A tensor's part in a piece, left for the thread that hashes the part before it. */
struct part {
	const uint8_t *p;          /* the bytes, in a chunk or a resident piece; NULL: none */
	uint64_t a, b;             /* data offsets */
	uint64_t ord;              /* the piece's index in pieces */
};

/* One restore job; pool.lock guards the fields marked (L). */
struct restore_job {
	struct restore_req r;
	uint64_t chunk;
	uint64_t *pieces;          /* the pieces holding a destination, ascending */
	uint64_t npieces;
	uint64_t *units;           /* unit u: pieces[units[u]] to pieces[units[u + 1] - 1] */
	uint64_t nunits;
	uint64_t next_unit;        /* (L) the next unit to claim */
	unsigned active;           /* (L) units claimed and not yet done */
	int failed;                /* (L) */
	int finished;              /* (L) the final event is posted */
	int code;                  /* (L) */
	char error[ERRLEN];        /* (L) */
	uint64_t *hashed;          /* (L) per destination: bytes hashed so far */
	XXH3_state_t **hs;         /* per destination hashed here (NULL otherwise) */
	uint8_t *ondev;            /* per destination: checksummed where it lies (source_digest) */
	size_t nondev;
	struct part *slot;         /* (L) per destination and piece it spans, from slot0[i] */
	uint64_t *slot0;
	void **chunk_of;           /* (L) per claimed piece: its cache chunk (NULL: resident) */
	unsigned *holds;           /* (L) per claimed piece: its copies + its unhashed parts */
	uint64_t done;             /* atomic: destination bytes in place */
	struct restore_job *next;      /* (L) link in the active list */
	struct workq_item end;         /* its end, on its way to the loop */
};

/* The pool of restore threads: their jobs and the lock over both. */
static struct {
	pthread_mutex_t lock;
	pthread_cond_t work_cv;    /* a job has a unit to claim, or stop */
	pthread_cond_t held_cv;    /* a piece's holds fell to one, or a job failed */
	struct restore_job *jobs;  /* (L) active jobs, served round robin */
	struct restore_job *rr;    /* (L) */
	int stop;                  /* (L) */
	struct cache *cache;
	pthread_t *threads;
	struct copier **copiers;
	unsigned nthreads;
	restore_cb cb;
	struct workq *finished;    /* finished jobs, to the loop */
} pool;

/* Loop side: hands a finished job to the callback (which frees it). */
static void on_finished(struct workq_item *it, unsigned events)
{
	struct restore_job *j =
		(struct restore_job *)((char *)it - offsetof(struct restore_job, end));
	char why[ERRLEN];

	(void)events;	/* one: the end */
	snprintf(why, sizeof(why), "%s", j->error);
	pool.cb(j->r.owner, j, j->code, j->code < 0 ? why : NULL);
}

/* Ends a job whose units are all done or given up (pool.lock held): off the list, posted. */
static void finish_locked(struct restore_job *j)
{
	if (j->finished || j->active > 0 || (!j->failed && j->next_unit < j->nunits))
		return;
	j->finished = 1;
	/* After a failure, parts left unhashed still hold their pieces' chunks. */
	for (uint64_t o = 0; o < j->npieces; o++)
		if (j->chunk_of[o]) {
			cache_put(pool.cache, j->chunk_of[o]);
			j->chunk_of[o] = NULL;
		}
	for (struct restore_job **p = &pool.jobs; *p; p = &(*p)->next) {
		if (*p == j) {
			*p = j->next;
			break;
		}
	}
	if (pool.rr == j)
		pool.rr = NULL;
	workq_push(pool.finished, &j->end, 1);
}

/* Records a job's first error (pool.lock held). */
static void fail_locked(struct restore_job *j, int code, const char *error)
{
	if (!j->failed) {
		j->failed = 1;
		j->code = code < 0 ? code : ERR_EIO;
		snprintf(j->error, sizeof(j->error), "%s", error);
		pthread_cond_broadcast(&pool.held_cv);
	}
}

/* The next job with a unit to claim after the round-robin cursor (pool.lock held). */
static struct restore_job *pick_locked(void)
{
	struct restore_job *start = pool.rr && pool.rr->next ? pool.rr->next : pool.jobs;
	struct restore_job *j = start;

	if (!j)
		return NULL;
	do {
		if (!j->failed && j->next_unit < j->nunits)
			return pool.rr = j;
		j = j->next ? j->next : pool.jobs;
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

/* Reads len bytes at data offset at (4096-aligned) into buf (aligned): from the page cache
 * when they are all there (cached: whether to try), else the rest with O_DIRECT; 0, 1 when
 * the disk was read, or a negative ERR_E* with err. */
static int read_range(struct restore_job *j, uint64_t at, uint64_t len, uint8_t *buf,
		      int cached, char *err, size_t errlen)
{
	uint64_t off = j->r.data_start + at;
	ssize_t got = 0;
	int disk = 0;

	if (j->r.dfd >= 0) {
		if (cached)
			got = read_full(j->r.fd, buf, len, off, RWF_NOWAIT);
		if (got < (ssize_t)len) {
			disk = 1;
			/* Not all cached: the rest from the disk, aligned, past the page cache. */
			uint64_t from = got > 0 ? (uint64_t)got & ~(uint64_t)(DIRECT_ALIGN - 1) : 0;
			uint64_t want = (len - from + DIRECT_ALIGN - 1) & ~(uint64_t)(DIRECT_ALIGN - 1);
			ssize_t r = read_full(j->r.dfd, buf + from, want, off + from, 0);
			got = r < 0 ? r : (ssize_t)(from + (uint64_t)r);
		}
	} else {
		got = read_full(j->r.fd, buf, len, off, 0);
	}
	if (got < 0)
		return err_set(err, errlen, err_from_errno((int)-got), "%s: reading byte %llu: %s",
			       j->r.path, (unsigned long long)off, strerror((int)-got));
	if ((uint64_t)got < len)
		return err_set(err, errlen, ERR_EIO, "%s: the file ends at byte %llu, inside its data",
			       j->r.path, (unsigned long long)(off + (uint64_t)got));
	return disk;
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

/* Lets go of one hold on claimed piece o (pool.lock held): the last gives its chunk back; at
 * one left, its unit's thread may be waiting to take the chunk back. */
static void unhold_locked(struct restore_job *j, uint64_t o)
{
	if (--j->holds[o] == 0 && j->chunk_of[o]) {
		cache_put(pool.cache, j->chunk_of[o]);
		j->chunk_of[o] = NULL;
	} else if (j->holds[o] == 1 && j->chunk_of[o]) {
		pthread_cond_broadcast(&pool.held_cv);
	}
}

/* Hashes destination i from part pt on, then every part left for it that follows (pool.lock
 * held on entry and on return, dropped while hashing); a mismatch at its end fails the job. */
static void hash_chain_locked(struct restore_job *j, size_t i, struct part pt)
{
	const struct restore_dst *d = &j->r.d[i];
	char why[ERRLEN];

	while (pt.p) {
		pthread_mutex_unlock(&pool.lock);
		XXH3_64bits_update(j->hs[i], pt.p, pt.b - pt.a);
		uint64_t h = pt.b == d->end ? XXH3_64bits_digest(j->hs[i]) : 0;
		pthread_mutex_lock(&pool.lock);
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
 * are at p (pool.lock held). */
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

/* Hashes destination i's bytes in [s, e) of claimed piece o, which starts at data offset
 * start, ends at end and lies at base, once every byte before them is hashed; at the end of
 * its part, what is not hashed yet is left for the thread that hashes the part before it
 * (pool.lock held, dropped while hashing). */
static void hash_step_locked(struct restore_job *j, size_t i, uint64_t start, uint64_t end,
			     uint64_t s, uint64_t e, const uint8_t *base, uint64_t o)
{
	const struct restore_dst *d = &j->r.d[i];
	uint64_t a = d->begin > start ? d->begin : start, b = d->end < end ? d->end : end;
	uint64_t at = d->begin + j->hashed[i];	/* in [a, s] once it reached this part */
	uint64_t to = b < e ? b : e;

	if (to == b) {
		/* The part's last step: hashed on (and the parts left after it), or left. */
		uint64_t from = at >= a ? at : a;
		j->holds[o]++;
		hash_part_locked(j, i, from, b, base + (from - start), o);
	} else if (!j->failed && at >= a) {
		pthread_mutex_unlock(&pool.lock);
		XXH3_64bits_update(j->hs[i], base + (at - start), to - at);
		pthread_mutex_lock(&pool.lock);
		j->hashed[i] = to - d->begin;
	}
}

/* Writes and hashes the destination bytes in [s, e) of claimed piece o, which starts at data
 * offset start, ends at end and lies at base; adds the bytes queued to *bytes; 0, or a
 * negative ERR_E* with err. */
static int fill_step(struct copier *cp, struct restore_job *j, uint64_t o, uint64_t start,
		     uint64_t end, uint64_t s, uint64_t e, const uint8_t *base, uint64_t *bytes,
		     char *err, size_t errlen)
{
	size_t first = first_dst(j, s), i;
	int rc = 0;

	for (i = first; i < j->r.n && j->r.d[i].begin < e && rc == 0; i++) {
		const struct restore_dst *d = &j->r.d[i];
		uint64_t a = d->begin > s ? d->begin : s, b = d->end < e ? d->end : e;
		if (a < b)
			rc = copier_write(cp, d->dst, d->dst_off + (a - d->begin), base + (a - start),
					  b - a, err, errlen);
		*bytes += b > a ? b - a : 0;
	}
	/* The copies run while the bytes are hashed: both only read the piece. A part left
	 * for later holds the piece until it is hashed, by whoever hashes the part before it. */
	pthread_mutex_lock(&pool.lock);
	for (i = first; i < j->r.n && j->r.d[i].begin < e && rc == 0; i++)
		if (j->r.d[i].end > j->r.d[i].begin && j->hs[i])
			hash_step_locked(j, i, start, end, s, e, base, o);
	pthread_mutex_unlock(&pool.lock);
	return rc;
}

/* Writes and checks every destination part in claimed piece o, piece p: its bytes at data
 * (resident) or read into chunk, a cached piece STEP bytes at a time; 0, or a negative
 * ERR_E* with err. */
static int fill_piece(struct copier *cp, struct restore_job *j, uint64_t o, uint64_t p,
		      const uint8_t *data, uint8_t *chunk, char *err, size_t errlen)
{
	uint64_t start = p * j->chunk, len = piece_len(j, p), step = len, bytes = 0;
	int cached = 1, rc = 0;

	if (!data) {
		cached = j->r.dfd < 0 || any_cached(j->r.fd, j->r.data_start + start, len) != 0;
		step = cached ? STEP : len;	/* a cold piece: one O_DIRECT read */
	}
	copier_fence(cp, j->r.fence);
	for (uint64_t s = 0, n; s < len && rc == 0; s += n) {
		n = len - s < step ? len - s : step;
		if (!data) {
			/* A step none of whose pages is cached: O_DIRECT, starting no readahead. */
			int hit = cached && (j->r.dfd < 0 || n == len ||
					     any_cached(j->r.fd, j->r.data_start + start + s, n) != 0);
			rc = read_range(j, start + s, n, chunk + s, hit, err, errlen);
			if (rc == 1) {
				step = len;	/* the disk again: the rest in one O_DIRECT read */
				rc = 0;
			}
		}
		if (rc == 0)
			rc = fill_step(cp, j, o, start, start + len, start + s, start + s + n,
				       data ? data : chunk, &bytes, err, errlen);
	}
	int src = copier_sync(cp, rc != 0 ? NULL : err, rc != 0 ? 0 : errlen);
	if (rc == 0 && src < 0)
		rc = src;
	if (rc == 0) {
		__atomic_add_fetch(&j->done, bytes, __ATOMIC_RELAXED);
		metrics_add(METRIC_RESTORED_BYTES, bytes);
	}
	return rc;
}

/* The chunk for the next piece of a unit after claimed piece o, whose copies are done: a
 * free one from the cache if there is one now, else o's once its parts are all hashed; NULL
 * when the job failed first (o's chunk stays the job's). */
static uint8_t *take_back(struct restore_job *j, uint64_t o)
{
	uint8_t *c;

	pthread_mutex_lock(&pool.lock);
	if (j->holds[o] > 1 && !j->failed) {
		pthread_mutex_unlock(&pool.lock);
		uint8_t *fresh = cache_tryget(pool.cache, -1);
		pthread_mutex_lock(&pool.lock);
		if (fresh) {
			unhold_locked(j, o);
			pthread_mutex_unlock(&pool.lock);
			return fresh;
		}
		while (j->holds[o] > 1 && !j->failed)
			pthread_cond_wait(&pool.held_cv, &pool.lock);
	}
	if (j->holds[o] > 1) {
		unhold_locked(j, o);
		c = NULL;
	} else {
		c = j->chunk_of[o];
		j->chunk_of[o] = NULL;
		j->holds[o] = 0;
	}
	pthread_mutex_unlock(&pool.lock);
	return c;
}

/* Fills claimed unit u's pieces in order through *chunk (NULL when all are resident), which
 * goes from piece to piece; on return *chunk is the thread's to give back (or NULL: the last
 * piece's, the job's until its holds go). 0, or a negative ERR_E* with err. */
static int fill_unit(struct copier *cp, struct restore_job *j, uint64_t u, uint8_t **chunk,
		     char *err, size_t errlen)
{
	int rc = 0;

	for (uint64_t o = j->units[u]; o < j->units[u + 1] && rc == 0; o++) {
		uint64_t p = j->pieces[o];
		const uint8_t *data = j->r.res ? resident_piece(j->r.res, p) : NULL;
		pthread_mutex_lock(&pool.lock);
		if (j->failed) {
			pthread_mutex_unlock(&pool.lock);
			break;
		}
		j->chunk_of[o] = data ? NULL : *chunk;	/* Ownership: shared with the job */
		j->holds[o] = 1;	/* this thread's, until its copies are done */
		pthread_mutex_unlock(&pool.lock);
		rc = fill_piece(cp, j, o, p, data, *chunk, err, errlen);
		if (!data && rc == 0 && o + 1 < j->units[u + 1]) {
			*chunk = take_back(j, o);
			if (!*chunk)
				break;	/* the job failed */
			continue;
		}
		pthread_mutex_lock(&pool.lock);
		unhold_locked(j, o);
		pthread_mutex_unlock(&pool.lock);
		if (!data)
			*chunk = NULL;	/* the job's now */
	}
	return rc;
}

/* Whether some piece of unit u must be read from the file (pool.lock held). */
static int unit_cold_locked(const struct restore_job *j, uint64_t u)
{
	for (uint64_t o = j->units[u]; o < j->units[u + 1]; o++)
		if (!j->r.res || !resident_piece(j->r.res, j->pieces[o]))
			return 1;
	return 0;
}

/* Whether job j is still on the list with unit u next to claim (pool.lock held). */
static int still_next_locked(const struct restore_job *j, uint64_t u)
{
	for (const struct restore_job *k = pool.jobs; k; k = k->next)
		if (k == j)
			return !j->failed && j->next_unit == u;
	return 0;
}

/* Has the sources of the destinations that checksum themselves do so, every copy synced, and
 * compares; 0, or a negative ERR_E* with err (ERR_ECHECKSUM naming a mismatch). */
static int check_ondev(struct restore_job *j, char *err, size_t errlen)
{
	struct digest *dg = malloc(j->nondev * sizeof(*dg));
	size_t n = 0;
	int rc;

	if (!dg)
		return err_set(err, errlen, ERR_ENOMEM, "out of memory checking a load");
	for (size_t i = 0; i < j->r.n; i++) {
		const struct restore_dst *d = &j->r.d[i];
		if (j->ondev[i])
			dg[n++] = (struct digest){.s = d->dst, .off = d->dst_off,
						  .len = d->end - d->begin, .tag = i};
	}
	rc = source_digest(dg, n, err, errlen);
	for (size_t k = 0; k < n && rc == 0; k++) {
		const struct restore_dst *d = &j->r.d[dg[k].tag];
		if (dg[k].xxh3 != d->xxh3)
			rc = err_set(err, errlen, ERR_ECHECKSUM, "%s: tensor '%s' does not match its "
				     "checksum (the file's bytes are corrupted)", j->r.path, d->name);
	}
	free(dg);
	return rc;
}

/* Restore thread: claims units and fills their destinations through its copier. */
static void restore_loop(struct copier *cp)
{
	char err[ERRLEN];

	for (;;) {
		pthread_mutex_lock(&pool.lock);
		struct restore_job *j;
		while (!pool.stop && (j = pick_locked()) == NULL)
			pthread_cond_wait(&pool.work_cv, &pool.lock);
		if (pool.stop) {
			pthread_mutex_unlock(&pool.lock);
			return;
		}
		uint64_t u = j->next_unit;
		uint8_t *chunk = NULL;
		if (unit_cold_locked(j, u)) {
			/* Memory first, then the claim (see engine.c and the top of this file). */
			pthread_mutex_unlock(&pool.lock);
			if ((chunk = cache_get(pool.cache, -1)) == NULL)
				return;	/* the cache shut down: stopping */
			pthread_mutex_lock(&pool.lock);
			if (pool.stop || !still_next_locked(j, u)) {
				pthread_mutex_unlock(&pool.lock);
				cache_put(pool.cache, chunk);
				continue;	/* someone else took it meanwhile: look again */
			}
		}
		j->next_unit++;
		j->active++;
		pthread_mutex_unlock(&pool.lock);

		int rc = fill_unit(cp, j, u, &chunk, err, sizeof(err));
		if (chunk)
			cache_put(pool.cache, chunk);
		pthread_mutex_lock(&pool.lock);
		if (rc < 0)
			fail_locked(j, rc, err);
		if (j->nondev > 0 && !j->failed && j->active == 1 && j->next_unit == j->nunits) {
			/* The last unit: every other is done, its copies synced. */
			pthread_mutex_unlock(&pool.lock);
			rc = check_ondev(j, err, sizeof(err));
			pthread_mutex_lock(&pool.lock);
			if (rc < 0)
				fail_locked(j, rc, err);
		}
		j->active--;
		finish_locked(j);
		pthread_mutex_unlock(&pool.lock);
	}
}

/* Thread entry. */
static void *thread_main(void *arg)
{
	restore_loop(arg);
	return NULL;
}

/* Starts n restore threads, each with a copier of its own. */
int restore_start(struct uv_loop_s *loop, struct cache *c, unsigned n, restore_cb cb,
		  char *err, size_t errlen)
{
	int rc;

	pthread_mutex_init(&pool.lock, NULL);
	pthread_cond_init(&pool.work_cv, NULL);
	pthread_cond_init(&pool.held_cv, NULL);
	pool.cache = c;
	pool.cb = cb;
	if ((rc = workq_open(&pool.finished, loop, on_finished, err, errlen)) < 0)
		return rc;
	pool.threads = calloc(n, sizeof(*pool.threads));
	pool.copiers = calloc(n, sizeof(*pool.copiers));
	if (!pool.threads || !pool.copiers) {
		rc = err_set(err, errlen, ERR_ENOMEM, "out of memory");
		goto fail;
	}
	for (unsigned i = 0; i < n; i++) {
		if ((rc = copier_new(&pool.copiers[i], err, errlen)) < 0)
			goto fail;
		if ((rc = pthread_create(&pool.threads[i], NULL, thread_main,
					  pool.copiers[i])) != 0) {
			copier_free(pool.copiers[i]);
			pool.copiers[i] = NULL;
			rc = err_set(err, errlen, err_from_errno(rc), "pthread_create: %s",
				     strerror(rc));
			goto fail;
		}
		pool.nthreads = i + 1;
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
	free(j->ondev);
	free(j->hashed);
	free(j->slot);
	free(j->slot0);
	free(j->chunk_of);
	free(j->holds);
	free(j->pieces);
	free(j->units);
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

/* Whether a destination crosses from pieces[o - 1] into pieces[o]. */
static int crossed(const struct restore_job *j, uint64_t o)
{
	uint64_t at = j->pieces[o] * j->chunk;
	size_t i = first_dst(j, at);

	return j->pieces[o] == j->pieces[o - 1] + 1 && i < j->r.n && j->r.d[i].begin < at;
}

/* Cuts pieces into units: runs of adjacent pieces, a destination crossing every boundary
 * inside, shorter toward the end; -1 without memory. A unit started with r pieces left is at
 * most r / threads pieces long (1 to UNIT_MAX): a thread that claims it as the others work
 * through the rest finishes about when they do, instead of reading a long unit alone at the
 * end. So a file of fewer pieces than twice the threads has units of one piece (spread beats
 * hashing in the cache there: a 400 MiB file in two units read 2x slower on the H200 than in
 * seven pieces), and so does a whole resident copy, which is hashed from DRAM anyway. */
static int plan_units(struct restore_job *j)
{
	int whole = j->r.res && resident_held(j->r.res) >= j->r.data_len;
	uint64_t n = 0, cap = 1;

	j->units = malloc((j->npieces + 1) * sizeof(*j->units));
	if (!j->units)
		return -1;
	for (uint64_t o = 0; o < j->npieces; o++) {
		if (o > 0 && o - j->units[n - 1] < cap && crossed(j, o))
			continue;
		uint64_t share = (j->npieces - o) / pool.nthreads;
		cap = whole || share < 1 ? 1 : share > UNIT_MAX ? UNIT_MAX : share;
		j->units[n++] = o;
	}
	j->units[n] = j->npieces;
	j->nunits = n;
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
		return err_set(err, errlen, ERR_ENOMEM, "out of memory queueing the load");
	j->r = *r;
	j->chunk = cache_chunk(pool.cache);
	j->hashed = calloc(r->n ? r->n : 1, sizeof(*j->hashed));
	j->hs = calloc(r->n ? r->n : 1, sizeof(*j->hs));
	j->ondev = calloc(r->n ? r->n : 1, 1);
	if (!j->hashed || !j->hs || !j->ondev || plan_pieces(j) < 0 || plan_units(j) < 0 ||
	    plan_slots(j) < 0)
		goto nomem;
	for (size_t i = 0; i < r->n; i++) {
		const struct restore_dst *d = &r->d[i];
		if (!d->has_xxh3)
			continue;
		if (d->end == d->begin && XXH3_64bits(NULL, 0) != d->xxh3) {
			job_free_own(j);
			return err_set(err, errlen, ERR_ECHECKSUM, "%s: tensor '%s' does not match "
				       "its checksum", r->path, d->name);
		}
		if (r->ondev && d->end - d->begin >= DIGEST_MIN && source_can_digest(d->dst)) {
			j->ondev[i] = 1;
			j->nondev++;
		} else if (d->end > d->begin) {
			if (!(j->hs[i] = XXH3_createState()))
				goto nomem;
			XXH3_64bits_reset(j->hs[i]);
		}
	}
	pthread_mutex_lock(&pool.lock);
	j->next = pool.jobs;
	pool.jobs = j;
	finish_locked(j);	/* nothing to read: done at once */
	pthread_cond_broadcast(&pool.work_cv);
	pthread_mutex_unlock(&pool.lock);
	*out = j;
	return 0;

nomem:
	job_free_own(j);
	return err_set(err, errlen, ERR_ENOMEM, "out of memory queueing the load");
}

/* Destination bytes in place so far. */
uint64_t restore_progress(struct restore_job *j)
{
	return __atomic_load_n(&j->done, __ATOMIC_RELAXED);
}

/* Stops a job early: nothing more is claimed; its final event follows once the units in
 * progress are done. */
void restore_cancel(struct restore_job *j, int code, const char *why)
{
	pthread_mutex_lock(&pool.lock);
	if (!j->finished) {
		fail_locked(j, code, why);
		finish_locked(j);
	}
	pthread_mutex_unlock(&pool.lock);
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
	pthread_mutex_lock(&pool.lock);
	pool.stop = 1;
	pthread_cond_broadcast(&pool.work_cv);
	pthread_mutex_unlock(&pool.lock);
	for (unsigned i = 0; i < pool.nthreads; i++)
		pthread_join(pool.threads[i], NULL);
	for (unsigned i = 0; pool.copiers && i < pool.nthreads; i++)
		copier_free(pool.copiers[i]);
	free(pool.threads);
	free(pool.copiers);
	pool.threads = NULL;
	pool.copiers = NULL;
	pool.nthreads = 0;
	/* Deliver what finished last (cleared first: a callback may stop restores again). */
	struct workq *q = pool.finished;
	pool.finished = NULL;
	workq_close(q);
}
