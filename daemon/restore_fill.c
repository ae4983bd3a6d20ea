/*
 * restore_fill.c — a claimed unit of a restore job filled, piece after piece: each piece from
 * the job's pinned resident copy, or read from the file (from the page cache when it is there,
 * else with O_DIRECT), written out through the thread's copier and hashed, each tensor's
 * checksum chained across pieces and threads and compared at its end; and, at the job's end,
 * the destinations that checksum themselves checked where they lie.
 *
 * restore.c's opening comment says how a job is cut into pieces and units, how the checksum
 * chains and the pieces' holds work, why nothing deadlocks and in which order locks are
 * taken: everything here runs on a restore thread under that argument, with pool.lock (the
 * job's sh->lock) guarding the job fields marked (L) in restore_int.h. Nothing here calls
 * back into restore.c.
 */
#include "dsckptd.h"
#include "restore_int.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>
#include <xxh_x86dispatch.h>  /* XXH3 with the CPU's widest vectors (AVX2, AVX-512) */

#define DIRECT_ALIGN 4096
#define STEP (1u << 20)         /* bytes of a cached piece read and hashed at a time (L2) */

/* Records a job's first error (pool.lock held). */
void restore_fill_fail_locked(struct restore_job *j, int code, const char *error)
{
	if (!j->failed) {
		j->failed = 1;
		j->code = code < 0 ? code : ERR_EIO;
		snprintf(j->error, sizeof(j->error), "%s", error);
		pthread_cond_broadcast(&j->sh->held_cv);
	}
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
			if (r > 0)
				__atomic_add_fetch(&j->read_direct, (uint64_t)r, __ATOMIC_RELAXED);
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
size_t restore_fill_first_dst(const struct restore_job *j, uint64_t start)
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
		cache_put(j->sh->cache, j->chunk_of[o]);
		j->chunk_of[o] = NULL;
	} else if (j->holds[o] == 1 && j->chunk_of[o]) {
		pthread_cond_broadcast(&j->sh->held_cv);
	}
}

/* Hashes destination i from part pt on, then every part left for it that follows (pool.lock
 * held on entry and on return, dropped while hashing); a mismatch at its end fails the job. */
static void hash_chain_locked(struct restore_job *j, size_t i, struct part pt)
{
	const struct restore_dst *d = &j->r.d[i];
	char why[ERRLEN];

	while (pt.p) {
		pthread_mutex_unlock(&j->sh->lock);
		XXH3_64bits_update(j->hs[i], pt.p, pt.b - pt.a);
		uint64_t h = pt.b == d->end ? XXH3_64bits_digest(j->hs[i]) : 0;
		pthread_mutex_lock(&j->sh->lock);
		j->hashed[i] = pt.b - d->begin;
		unhold_locked(j, pt.ord);
		if (pt.b == d->end) {
			if (h != d->xxh3) {
				snprintf(why, sizeof(why), "%s: tensor '%s' does not match its checksum "
					 "(the file's bytes are corrupted)", j->r.path, d->name);
				restore_fill_fail_locked(j, ERR_ECHECKSUM, why);
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
		pthread_mutex_unlock(&j->sh->lock);
		XXH3_64bits_update(j->hs[i], base + (at - start), to - at);
		pthread_mutex_lock(&j->sh->lock);
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
	size_t first = restore_fill_first_dst(j, s), i;
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
	pthread_mutex_lock(&j->sh->lock);
	for (i = first; i < j->r.n && j->r.d[i].begin < e && rc == 0; i++)
		if (j->r.d[i].end > j->r.d[i].begin && j->hs[i])
			hash_step_locked(j, i, start, end, s, e, base, o);
	pthread_mutex_unlock(&j->sh->lock);
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
	double t0 = now_mono(), t = t0;
	for (uint64_t s = 0, n; s < len && rc == 0; s += n) {
		n = len - s < step ? len - s : step;
		if (!data) {
			/* A step none of whose pages is cached: O_DIRECT, starting no readahead. */
			int hit = cached && (j->r.dfd < 0 || n == len ||
					     any_cached(j->r.fd, j->r.data_start + start + s, n) != 0);
			rc = read_range(j, start + s, n, chunk + s, hit, err, errlen);
			t = restore_time(j, RP_READ, t);
			if (rc == 1) {
				step = len;	/* the disk again: the rest in one O_DIRECT read */
				rc = 0;
			}
		}
		if (rc == 0)
			rc = fill_step(cp, j, o, start, start + len, start + s, start + s + n,
				       data ? data : chunk, &bytes, err, errlen);
		t = restore_time(j, RP_WRITE, t);
	}
	int src = copier_sync(cp, rc != 0 ? NULL : err, rc != 0 ? 0 : errlen);
	t = restore_time(j, RP_SYNC, t);
	pthread_mutex_lock(&j->sh->lock);
	if (t - t0 > j->slowest) {	/* a one-time cost shows as a slow first piece */
		j->slowest = t - t0;
		j->slowest_at = o;
	}
	pthread_mutex_unlock(&j->sh->lock);
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

	pthread_mutex_lock(&j->sh->lock);
	if (j->holds[o] > 1 && !j->failed) {
		pthread_mutex_unlock(&j->sh->lock);
		uint8_t *fresh = cache_tryget(j->sh->cache, -1);
		pthread_mutex_lock(&j->sh->lock);
		if (fresh) {
			unhold_locked(j, o);
			pthread_mutex_unlock(&j->sh->lock);
			return fresh;
		}
		while (j->holds[o] > 1 && !j->failed)
			pthread_cond_wait(&j->sh->held_cv, &j->sh->lock);
	}
	if (j->holds[o] > 1) {
		unhold_locked(j, o);
		c = NULL;
	} else {
		c = j->chunk_of[o];
		j->chunk_of[o] = NULL;
		j->holds[o] = 0;
	}
	pthread_mutex_unlock(&j->sh->lock);
	return c;
}

/* Fills claimed unit u's pieces in order through *chunk (NULL when all are resident), which
 * goes from piece to piece; on return *chunk is the thread's to give back (or NULL: the last
 * piece's, the job's until its holds go). 0, or a negative ERR_E* with err. */
int restore_fill_unit(struct copier *cp, struct restore_job *j, uint64_t u, uint8_t **chunk,
		     char *err, size_t errlen)
{
	int rc = 0;

	for (uint64_t o = j->units[u]; o < j->units[u + 1] && rc == 0; o++) {
		uint64_t p = j->pieces[o];
		const uint8_t *data = j->r.res ? resident_piece(j->r.res, p) : NULL;
		pthread_mutex_lock(&j->sh->lock);
		if (j->failed) {
			pthread_mutex_unlock(&j->sh->lock);
			break;
		}
		j->chunk_of[o] = data ? NULL : *chunk;	/* Ownership: shared with the job */
		j->holds[o] = 1;	/* this thread's, until its copies are done */
		pthread_mutex_unlock(&j->sh->lock);
		rc = fill_piece(cp, j, o, p, data, *chunk, err, errlen);
		if (!data && rc == 0 && o + 1 < j->units[u + 1]) {
			double t = now_mono();
			*chunk = take_back(j, o);
			restore_time(j, RP_CHUNK, t);
			if (!*chunk)
				break;	/* the job failed */
			continue;
		}
		pthread_mutex_lock(&j->sh->lock);
		unhold_locked(j, o);
		pthread_mutex_unlock(&j->sh->lock);
		if (!data)
			*chunk = NULL;	/* the job's now */
	}
	return rc;
}

/* Has the sources of the destinations that checksum themselves do so, every copy synced, and
 * compares; 0, or a negative ERR_E* with err (ERR_ECHECKSUM naming a mismatch). */
int restore_fill_check_ondev(struct restore_job *j, char *err, size_t errlen)
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
