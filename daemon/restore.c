/*
 * restore.c — the restore threads: a load's pieces, from the resident copy or the file, are
 * checked and written into the client's tensors.
 *
 * Two files share the work: this one owns the threads, the jobs, their plans (pieces, units,
 * slots) and their claims; restore_fill.c fills a claimed unit (each piece read, written out
 * and hashed). One lock, pool.lock (restore_int.h's struct restore_shared), guards a job's
 * claims, its pieces' holds and its checksum chains together in both, and the no-deadlock
 * argument below spans them.
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
 *
 * Timing: each thread adds what it spends per phase (chunk waits, reads, copies queued and
 * hashed, copies synced, device checksums) to its job, which notes its slowest piece too; at
 * log_level debug the loop logs one line per finished job (log_timing), so that a slow load,
 * such as the first one after the daemon's start, says where its time went.
 */
#include "dsckptd.h"
#include "restore_int.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxh_x86dispatch.h>  /* XXH3 with the CPU's widest vectors (AVX2, AVX-512) */

#define UNIT_MAX 4              /* pieces in a unit at most: 256 MiB at 64 MiB chunks */
#define DIGEST_MIN 4096         /* shorter destinations are hashed here even on a GPU */

/* The pool of restore threads: their jobs and the lock over both. */
static struct {
	struct restore_shared sh;  /* pool.lock, held_cv, the cache: every job points here */
	pthread_cond_t work_cv;    /* a job has a unit to claim, or stop */
	struct restore_job *jobs;  /* (L) active jobs, served round robin */
	struct restore_job *rr;    /* (L) */
	int stop;                  /* (L) */
	pthread_t *threads;
	struct copier **copiers;
	unsigned nthreads;
	restore_cb cb;
	struct workq *finished;    /* finished jobs, to the loop */
	uint64_t submitted;        /* (L) jobs submitted since start (the debug line's number) */
} pool;

/* The debug line of a finished job: where its time went, so that a first load after the
 * daemon's start can be told from the later ones phase by phase (issue 34). */
static void log_timing(const struct restore_job *j)
{
	const uint64_t *ns = j->ns;
	uint64_t direct = __atomic_load_n(&j->read_direct, __ATOMIC_RELAXED);

	log_debug("restore %llu of %s: %.1f ms, %.2f GB in %llu units (first claimed after "
		  "%.1f ms); over %u threads: chunk waits %.1f ms, reads %.1f ms (%.2f GB with "
		  "O_DIRECT), copies queued and hashed %.1f ms, copies synced %.1f ms, device "
		  "checksums %.1f ms; slowest piece %.1f ms (the %llu. of %llu)",
		  (unsigned long long)j->number, j->r.path,
		  (j->t_end - j->t_submit) * 1e3,
		  (double)__atomic_load_n(&j->done, __ATOMIC_RELAXED) / 1e9,
		  (unsigned long long)j->nunits, j->t_first ? (j->t_first - j->t_submit) * 1e3 : 0.0,
		  pool.nthreads, ns[RP_CHUNK] / 1e6, ns[RP_READ] / 1e6, (double)direct / 1e9,
		  ns[RP_WRITE] / 1e6, ns[RP_SYNC] / 1e6, ns[RP_DIGEST] / 1e6, j->slowest * 1e3,
		  (unsigned long long)j->slowest_at + 1, (unsigned long long)j->npieces);
}

/* Loop side: hands a finished job to the callback (which frees it). */
static void on_finished(struct workq_item *it, unsigned events)
{
	struct restore_job *j =
		(struct restore_job *)((char *)it - offsetof(struct restore_job, end));
	char why[ERRLEN];

	(void)events;	/* one: the end */
	log_timing(j);
	snprintf(why, sizeof(why), "%s", j->error);
	pool.cb(j->r.owner, j, j->code, j->code < 0 ? why : NULL);
}

/* Ends a job whose units are all done or given up (pool.lock held): off the list, posted. */
static void finish_locked(struct restore_job *j)
{
	if (j->finished || j->active > 0 || (!j->failed && j->next_unit < j->nunits))
		return;
	j->finished = 1;
	j->t_end = now_mono();
	/* After a failure, parts left unhashed still hold their pieces' chunks. */
	for (uint64_t o = 0; o < j->npieces; o++)
		if (j->chunk_of[o]) {
			cache_put(pool.sh.cache, j->chunk_of[o]);
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


/* Restore thread: claims units and fills their destinations through its copier. */
static void restore_loop(struct copier *cp)
{
	char err[ERRLEN];

	for (;;) {
		pthread_mutex_lock(&pool.sh.lock);
		struct restore_job *j;
		while (!pool.stop && (j = pick_locked()) == NULL)
			pthread_cond_wait(&pool.work_cv, &pool.sh.lock);
		if (pool.stop) {
			pthread_mutex_unlock(&pool.sh.lock);
			return;
		}
		uint64_t u = j->next_unit;
		uint8_t *chunk = NULL;
		if (unit_cold_locked(j, u)) {
			/* Memory first, then the claim (see engine.c and the top of this file). */
			pthread_mutex_unlock(&pool.sh.lock);
			double t = now_mono();
			if ((chunk = cache_get(pool.sh.cache, -1)) == NULL)
				return;	/* the cache shut down: stopping */
			pthread_mutex_lock(&pool.sh.lock);
			if (pool.stop || !still_next_locked(j, u)) {
				pthread_mutex_unlock(&pool.sh.lock);
				cache_put(pool.sh.cache, chunk);
				continue;	/* someone else took it meanwhile: look again */
			}
			restore_time(j, RP_CHUNK, t);	/* j is alive: still listed */
		}
		if (j->t_first == 0)
			j->t_first = now_mono();
		j->next_unit++;
		j->active++;
		pthread_mutex_unlock(&pool.sh.lock);

		int rc = restore_fill_unit(cp, j, u, &chunk, err, sizeof(err));
		if (chunk)
			cache_put(pool.sh.cache, chunk);
		pthread_mutex_lock(&pool.sh.lock);
		if (rc < 0)
			restore_fill_fail_locked(j, rc, err);
		if (j->nondev > 0 && !j->failed && j->active == 1 && j->next_unit == j->nunits) {
			/* The last unit: every other is done, its copies synced. */
			pthread_mutex_unlock(&pool.sh.lock);
			double t = now_mono();
			rc = restore_fill_check_ondev(j, err, sizeof(err));
			restore_time(j, RP_DIGEST, t);
			pthread_mutex_lock(&pool.sh.lock);
			if (rc < 0)
				restore_fill_fail_locked(j, rc, err);
		}
		j->active--;
		finish_locked(j);
		pthread_mutex_unlock(&pool.sh.lock);
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

	pthread_mutex_init(&pool.sh.lock, NULL);
	pthread_cond_init(&pool.work_cv, NULL);
	pthread_cond_init(&pool.sh.held_cv, NULL);
	pool.sh.cache = c;
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
	size_t i = restore_fill_first_dst(j, at);

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
	j->sh = &pool.sh;
	j->chunk = cache_chunk(pool.sh.cache);
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
	pthread_mutex_lock(&pool.sh.lock);
	j->t_submit = now_mono();
	j->number = ++pool.submitted;
	j->next = pool.jobs;
	pool.jobs = j;
	finish_locked(j);	/* nothing to read: done at once */
	pthread_cond_broadcast(&pool.work_cv);
	pthread_mutex_unlock(&pool.sh.lock);
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
	pthread_mutex_lock(&pool.sh.lock);
	if (!j->finished) {
		restore_fill_fail_locked(j, code, why);
		finish_locked(j);
	}
	pthread_mutex_unlock(&pool.sh.lock);
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
	pthread_mutex_lock(&pool.sh.lock);
	pool.stop = 1;
	pthread_cond_broadcast(&pool.work_cv);
	pthread_mutex_unlock(&pool.sh.lock);
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
