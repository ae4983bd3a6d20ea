/*
 * engine.c — the copy engine and the flush threads.
 *
 * A job's data region is cut into cache-chunk-sized pieces at chunk-aligned file offsets.
 * Copy threads take a free cache chunk first (near the NUMA node of the GPU the next piece
 * comes from, when one is free there) and only then claim the next piece of a job (round
 * robin over jobs, so no save starves another), fill it from the job's sources through the
 * thread's own copier (source.c: it hides whether bytes come from CUDA IPC, a VMM mapping or
 * a memfd, and orders device reads after the job's fence) and mark it ready. Flush threads
 * write each job's pieces in file order (so one streaming checksum per tensor suffices;
 * flush_file.c does the file's part), hand the chunk to the job's resident copy (resident.c) or
 * return it to the cache, and finish the file. A save larger than the cache streams through
 * it: pieces are claimed only as chunks free up (or as resident copies give theirs back).
 *
 * Why claim after taking a chunk: a claimed piece always owns memory, so the in-order flush
 * can never wait for a piece that waits for memory held by later pieces (no deadlock).
 *
 * Events: a job posts at most one SNAPSHOT (every piece copied), always before its one final
 * DURABLE or FAILED, as an event bit pushed with its workq item (workq.c: the job's own link,
 * so posting allocates nothing and cannot fail; several events of a job pushed before the
 * loop gets to it arrive in one call). The loop runs them SNAPSHOT first.
 *
 * Lock order: engine.lock, then the cache's own lock (cache_tryget/put take it briefly) or
 * the workq's lock (post is called with engine.lock held). engine.lock guards the job list,
 * the cursors, stop and every job field marked (L); fields marked (loop) are the loop
 * thread's alone. A copier belongs to one copy thread from engine_start to engine_stop.
 * resident.c (keeping a written chunk, and the eviction hook cache_get calls) is only ever
 * called without engine.lock.
 */
#include "dsckptd.h"

#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* One job; engine.lock guards the fields marked (L). */
struct job {
	struct engine_req r;
	uint64_t data_len;         /* bytes of tensor data */
	uint64_t chunk;            /* piece size */
	uint64_t npieces;
	uint64_t next_claim;       /* (L) first unclaimed piece */
	uint64_t next_flush;       /* (L) next piece to write */
	void **ready;              /* (L) npieces slots: the filled chunk, once copied */
	int flushing;              /* (L) a flush thread holds this job */
	int failed;                /* (L) */
	int finishing;             /* (L) the file is being finished: too late to cancel */
	int finished;              /* (L) final event posted; code and error stay as they are */
	int code;                  /* (L) first error's ERR_E* */
	char error[ERRLEN];        /* (L) first error */
	uint64_t copied;           /* (L) pieces copied */
	uint64_t bytes_snapshot;   /* atomic */
	uint64_t bytes_flushed;    /* atomic */
	struct flush_file *ff;     /* the file's header and checksums (flush thread holding it) */
	struct job *next;          /* (L) link in the active list */
	struct workq_item done;    /* its events, on their way to the loop */
	int released;              /* (loop) the sources' references are dropped */
};

/* An event's bit in a job's posted and deliver sets. */
#define EVENT_BIT(event) (1u << (event))

/* The engine: its threads, their jobs and the lock over both. */
static struct {
	pthread_mutex_t lock;
	pthread_cond_t copy_cv;    /* a job has unclaimed pieces */
	pthread_cond_t flush_cv;   /* a job has a piece (or its end) ready to flush */
	struct job *jobs;          /* active jobs, round robin from rr */
	struct job *rr_copy;
	struct job *rr_flush;
	int stop;
	struct cache *cache;
	pthread_t *threads;
	unsigned nthreads;
	struct copier **copiers;   /* one per copy thread, handed to it at its start */
	unsigned ncopiers;
	engine_cb cb;
	struct workq *events;      /* jobs' events, to the loop */
} engine;

/* Hands an event to the loop thread (engine.lock held). */
static void post(struct job *j, int event)
{
	workq_push(engine.events, &j->done, EVENT_BIT(event));
}

/* Loop side: a job's events, SNAPSHOT before the final one (workq.c runs each job once per
 * batch, so a callback that stops the engine delivers nothing twice). */
static void on_events(struct workq_item *it, unsigned ev)
{
	struct job *j = (struct job *)((char *)it - offsetof(struct job, done));

	if (ev & EVENT_BIT(ENGINE_SNAPSHOT))
		engine.cb(j->r.owner, j, ENGINE_SNAPSHOT, 0, NULL);
	/* Ownership: with its final event the job goes to the loop (which frees it). */
	if (ev & EVENT_BIT(ENGINE_DURABLE)) {
		engine.cb(j->r.owner, j, ENGINE_DURABLE, 0, NULL);
	} else if (ev & EVENT_BIT(ENGINE_FAILED)) {
		/* The message outlives the job: the callback may free it first. */
		char why[ERRLEN];
		snprintf(why, sizeof(why), "%s", j->error);
		engine.cb(j->r.owner, j, ENGINE_FAILED, j->code, why);
	}
}

/* Records the first error of a job (engine.lock held). */
static void fail_locked(struct job *j, int code, const char *error)
{
	if (!j->failed) {
		j->failed = 1;
		j->code = code < 0 ? code : ERR_EIO;	/* every failure carries a code */
		snprintf(j->error, sizeof(j->error), "%s", error);
	}
}

/* Removes a job from the active list (engine.lock held). */
static void unlink_locked(struct job *j)
{
	for (struct job **p = &engine.jobs; *p; p = &(*p)->next) {
		if (*p == j) {
			*p = j->next;
			break;
		}
	}
	if (engine.rr_copy == j)
		engine.rr_copy = NULL;
	if (engine.rr_flush == j)
		engine.rr_flush = NULL;
}

/* Picks the next job after cursor that satisfies ok (engine.lock held). */
static struct job *pick(struct job **cursor, int (*ok)(const struct job *))
{
	struct job *start = *cursor && (*cursor)->next ? (*cursor)->next : engine.jobs;
	struct job *j = start;

	if (!j)
		return NULL;
	do {
		if (ok(j)) {
			*cursor = j;
			return j;
		}
		j = j->next ? j->next : engine.jobs;
	} while (j != start);
	return NULL;
}

/* Whether a job has a piece to claim. */
static int can_copy(const struct job *j)
{
	return !j->failed && j->next_claim < j->npieces;
}

/* Whether a job's next flush step can run now. */
static int can_flush(const struct job *j)
{
	if (j->flushing || j->finished)
		return 0;
	if (j->next_flush < j->next_claim)
		return j->ready[j->next_flush] != NULL;
	/* Everything claimed has been flushed: the end, when nothing more will come. */
	return j->failed || j->next_flush == j->npieces;
}

/* Index of a job's first tensor ending after data offset start (tensors are in file order);
 * n when none does. */
static size_t first_tensor(const struct job *j, uint64_t start)
{
	size_t lo = 0, hi = j->r.n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (j->r.t[mid].off + j->r.t[mid].nbytes <= start)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* NUMA node near a piece's bytes: that of its first tensor's source (-1: any node). */
static int piece_node(const struct job *j, uint64_t piece)
{
	size_t i = first_tensor(j, piece * j->chunk);

	return i < j->r.n ? source_node(j->r.t[i].src) : -1;
}

/* Copies one piece of a job from its sources into chunk through cp; 0 or a negative ERR_E*
 * with err. */
static int copy_piece(struct copier *cp, struct job *j, uint64_t piece, uint8_t *chunk,
		      char *err, size_t errlen)
{
	uint64_t start = piece * j->chunk;
	uint64_t end = start + j->chunk < j->data_len ? start + j->chunk : j->data_len;
	int rc;

	/* GPU sources: the copier's device reads wait for the producer's writes. */
	copier_fence(cp, j->r.fence);
	for (size_t i = first_tensor(j, start); i < j->r.n && j->r.t[i].off < end; i++) {
		const struct engine_tensor *t = &j->r.t[i];
		uint64_t a = t->off > start ? t->off : start;
		uint64_t b = t->off + t->nbytes < end ? t->off + t->nbytes : end;
		if (a >= b)
			continue;
		rc = copier_read(cp, t->src, t->src_off + (a - t->off), chunk + (a - start),
				 b - a, err, errlen);
		if (rc < 0) {
			/* Never leave a copy into the chunk behind. */
			copier_sync(cp, NULL, 0);
			return rc;
		}
	}
	/* Device reads are only queued: the piece is in the chunk once they are done. */
	return copier_sync(cp, err, errlen);
}

/* Copy thread: claims pieces as cache chunks free up and fills them through its copier. */
static void copy_loop(struct copier *cp)
{
	char err[ERRLEN];

	for (;;) {
		struct job *next = NULL, *cursor;
		int node = -1;

		pthread_mutex_lock(&engine.lock);
		/* Peek (the cursor stays) at the job whose turn it is, for its NUMA node. */
		for (;;) {
			cursor = engine.rr_copy;
			if (engine.stop || (next = pick(&cursor, can_copy)) != NULL)
				break;
			pthread_cond_wait(&engine.copy_cv, &engine.lock);
		}
		if (next)
			node = piece_node(next, next->next_claim);
		pthread_mutex_unlock(&engine.lock);
		/* A chunk near that node if one is free, else any: a preference, never a wait. */
		void *chunk = cache_get(engine.cache, node);
		if (!chunk)
			return;	/* cache shut down: stopping */
		pthread_mutex_lock(&engine.lock);
		struct job *j = pick(&engine.rr_copy, can_copy);
		if (!j) {
			pthread_mutex_unlock(&engine.lock);
			cache_put(engine.cache, chunk);
			continue;
		}
		uint64_t piece = j->next_claim++;
		pthread_mutex_unlock(&engine.lock);

		int rc = copy_piece(cp, j, piece, chunk, err, sizeof(err));
		uint64_t len = j->chunk;
		if (piece == j->npieces - 1)
			len = j->data_len - piece * j->chunk;

		pthread_mutex_lock(&engine.lock);
		/* Ownership: the chunk now belongs to the job until a flush thread returns it. */
		j->ready[piece] = chunk;
		if (rc < 0) {
			fail_locked(j, rc, err);
		} else {
			__atomic_add_fetch(&j->bytes_snapshot, len, __ATOMIC_RELAXED);
			metrics_add(METRIC_COPIED_BYTES, len);
			if (++j->copied == j->npieces && !j->failed)
				post(j, ENGINE_SNAPSHOT);
		}
		pthread_cond_broadcast(&engine.flush_cv);
		pthread_mutex_unlock(&engine.lock);
	}
}

/* Ends a job's resident copy (the flush thread holding the job, engine.lock not held):
 * durable as the file just finished, or dropped. */
static void end_resident(struct job *j, int durable)
{
	const uint8_t *hdr;
	size_t hdr_len;
	dev_t dev;
	ino_t ino;

	hdr = flush_file_header(j->ff, &hdr_len);
	if (durable && hdr && flush_file_identity(j->ff, &dev, &ino) == 0)
		resident_durable(j->r.res, dev, ino, hdr, hdr_len);
	else
		resident_drop(j->r.res);
	j->r.res = NULL;
}

/* Flush thread: writes ready pieces in order and finishes jobs. */
static void flush_loop(void)
{
	char err[ERRLEN];

	pthread_mutex_lock(&engine.lock);
	for (;;) {
		struct job *j = pick(&engine.rr_flush, can_flush);
		if (!j) {
			if (engine.stop && !engine.jobs)
				break;
			pthread_cond_wait(&engine.flush_cv, &engine.lock);
			continue;
		}
		j->flushing = 1;
		if (!flush_file_started(j->ff) && !j->failed) {
			/* First visit: the header goes first, so that a partial file names its
			 * host ("dsckpt.host") from the start (flush_file.c). */
			pthread_mutex_unlock(&engine.lock);
			int rc = flush_file_begin(j->ff, &j->r, err, sizeof(err));
			pthread_mutex_lock(&engine.lock);
			if (rc < 0)
				fail_locked(j, rc, err);
			j->flushing = 0;
			continue;
		}
		if (j->next_flush < j->next_claim) {
			uint64_t piece = j->next_flush;
			uint8_t *chunk = j->ready[piece];
			int failed = j->failed;
			pthread_mutex_unlock(&engine.lock);
			uint64_t start = piece * j->chunk;
			uint64_t len = start + j->chunk < j->data_len ? j->chunk
								       : j->data_len - start;
			int rc = failed ? 0 : flush_file_piece(j->ff, &j->r, start, chunk, len, err,
							       sizeof(err));
			if (rc == 0 && !failed) {
				__atomic_add_fetch(&j->bytes_flushed, len, __ATOMIC_RELAXED);
				metrics_add(METRIC_FLUSHED_BYTES, len);
			}
			/* Ownership: a written chunk goes to the job's resident copy, or back. */
			if (rc < 0 || failed || !resident_keep(j->r.res, piece, chunk))
				cache_put(engine.cache, chunk);
			pthread_mutex_lock(&engine.lock);
			j->ready[piece] = NULL;
			j->next_flush++;
			if (rc < 0)
				fail_locked(j, rc, err);
			j->flushing = 0;
			pthread_cond_broadcast(&engine.copy_cv);	/* a chunk is free again */
			pthread_cond_broadcast(&engine.flush_cv);
			continue;
		}
		/* The end: every claimed piece is flushed and nothing more will be claimed. */
		int failed = j->failed;
		j->finishing = !failed;
		pthread_mutex_unlock(&engine.lock);
		int rc = failed ? 0 : flush_file_finish(j->ff, &j->r, j->data_len, err,
							sizeof(err));
		if (j->r.res)
			end_resident(j, !failed && rc == 0);
		pthread_mutex_lock(&engine.lock);
		if (rc < 0)
			fail_locked(j, rc, err);
		if (j->failed && j->r.file) {
			store_file_abort(j->r.file);
			j->r.file = NULL;
		}
		j->finished = 1;
		j->flushing = 0;
		unlink_locked(j);
		/* Ownership: the job goes back to the loop with its final event. */
		post(j, j->failed ? ENGINE_FAILED : ENGINE_DURABLE);
		pthread_cond_broadcast(&engine.flush_cv);
	}
	pthread_mutex_unlock(&engine.lock);
}

/* Thread entry: a copy thread gets its copier, a flush thread NULL. */
static void *thread_main(void *arg)
{
	if (arg)
		copy_loop(arg);
	else
		flush_loop();
	return NULL;
}

/* Starts the worker threads, each copy thread with a copier of its own. */
int engine_start(struct uv_loop_s *loop, struct cache *c, unsigned copy_threads,
		 unsigned flush_threads, engine_cb cb, char *err, size_t errlen)
{
	int rc;

	pthread_mutex_init(&engine.lock, NULL);
	pthread_cond_init(&engine.copy_cv, NULL);
	pthread_cond_init(&engine.flush_cv, NULL);
	engine.cache = c;
	engine.cb = cb;
	if ((rc = workq_open(&engine.events, loop, on_events, err, errlen)) < 0)
		return rc;
	engine.threads = calloc(copy_threads + flush_threads, sizeof(pthread_t));
	engine.copiers = calloc(copy_threads ? copy_threads : 1, sizeof(*engine.copiers));
	if (!engine.threads || !engine.copiers) {
		rc = err_set(err, errlen, ERR_ENOMEM, "out of memory");
		goto fail;
	}
	for (engine.ncopiers = 0; engine.ncopiers < copy_threads; engine.ncopiers++) {
		if ((rc = copier_new(&engine.copiers[engine.ncopiers], err, errlen)) < 0)
			goto fail;
	}
	for (unsigned i = 0; i < copy_threads + flush_threads; i++) {
		rc = pthread_create(&engine.threads[i], NULL, thread_main,
				    i < copy_threads ? engine.copiers[i] : NULL);
		if (rc != 0) {
			rc = err_set(err, errlen, err_from_errno(rc), "pthread_create: %s",
				     strerror(rc));
			goto fail;
		}
		engine.nthreads = i + 1;
	}
	return 0;

fail:
	engine_stop();
	return rc;
}

/* Frees what engine_submit allocated for a job (r's pointers stay the caller's). */
static void job_free_own(struct job *j)
{
	free(j->ready);
	flush_file_free(j->ff);
	free(j);
}

/* Queues a job; on failure nothing of r is taken. */
int engine_submit(struct engine_req *r, struct job **out, char *err, size_t errlen)
{
	struct job *j = calloc(1, sizeof(*j));
	if (!j)
		return err_set(err, errlen, ERR_ENOMEM, "out of memory queueing the save");
	j->r = *r;
	j->chunk = cache_chunk(engine.cache);
	if (r->n)	/* the tensors are in data order */
		j->data_len = r->t[r->n - 1].off + r->t[r->n - 1].nbytes;
	j->npieces = (j->data_len + j->chunk - 1) / j->chunk;
	j->ready = calloc(j->npieces ? j->npieces : 1, sizeof(void *));
	j->ff = flush_file_new(r->n);
	if (!j->ready || !j->ff) {
		job_free_own(j);
		return err_set(err, errlen, ERR_ENOMEM, "out of memory queueing the save");
	}
	pthread_mutex_lock(&engine.lock);
	j->next = engine.jobs;
	engine.jobs = j;
	if (j->npieces == 0)
		post(j, ENGINE_SNAPSHOT);
	/* A copy thread per piece and one flush thread (the header): each thread woken costs
	 * the loop thread, which answers the save next, a system call's worth. */
	if (j->npieces >= engine.ncopiers)
		pthread_cond_broadcast(&engine.copy_cv);
	else
		for (uint64_t k = 0; k < j->npieces; k++)
			pthread_cond_signal(&engine.copy_cv);
	pthread_cond_signal(&engine.flush_cv);
	pthread_mutex_unlock(&engine.lock);
	metrics_add(METRIC_SAVES_STARTED, 1);
	*out = j;
	return 0;
}

/* Fails an unfinished job: nothing more is claimed and the flush side ends it FAILED. A job
 * already finishing its file (or finished) goes on as it would have. */
void engine_cancel(struct job *j, int code, const char *why)
{
	pthread_mutex_lock(&engine.lock);
	if (!j->finished && !j->finishing)
		fail_locked(j, code, why);
	pthread_cond_broadcast(&engine.flush_cv);
	pthread_mutex_unlock(&engine.lock);
}

/* Bytes copied and written so far. */
void engine_progress(struct job *j, uint64_t *snapshot, uint64_t *flushed)
{
	*snapshot = __atomic_load_n(&j->bytes_snapshot, __ATOMIC_RELAXED);
	*flushed = __atomic_load_n(&j->bytes_flushed, __ATOMIC_RELAXED);
}

/* Per-tensor checksums once durable. */
const uint64_t *engine_checksums(struct job *j)
{
	return flush_file_checksums(j->ff);
}

/* The finished file's header as written (its first *len bytes, checksums filled), and the
 * file's size; NULL when no header was laid out. */
const uint8_t *engine_header(struct job *j, size_t *len, uint64_t *size)
{
	const uint8_t *h = flush_file_header(j->ff, len);
	*size = *len + j->data_len;
	return h;
}

/* Drops the sources of a job past SNAPSHOT (loop thread): every piece is copied. */
void engine_release_sources(struct job *j)
{
	if (j->released || j->r.n == 0 || !j->r.t)
		return;
	j->released = 1;
	if (j->r.lent)
		j->r.lent_drop(j->r.lent, j->r.n, 1);
	else
		source_refs(&j->r.t[0].src, j->r.n, sizeof(j->r.t[0]), 0);
}

/* Frees a finished job and everything its request owned. */
void engine_job_free(struct job *j)
{
	engine_release_sources(j);
	if (j->r.lent)
		j->r.lent_drop(j->r.lent, j->r.n, 0);
	else
		free(j->r.t);
	if (j->r.file)
		store_file_abort(j->r.file);
	if (j->r.dirfd >= 0)
		close(j->r.dirfd);
	free(j->r.meta_name);
	free(j->r.meta_bytes);
	if (j->r.fence)
		copier_fence_free(j->r.fence);
	resident_drop(j->r.res);	/* only a job that never finished still has one */
	job_free_own(j);
}

/* Stops and joins every thread. */
void engine_stop(void)
{
	pthread_mutex_lock(&engine.lock);
	engine.stop = 1;
	pthread_cond_broadcast(&engine.copy_cv);
	pthread_cond_broadcast(&engine.flush_cv);
	pthread_mutex_unlock(&engine.lock);
	cache_shutdown(engine.cache);
	for (unsigned i = 0; i < engine.nthreads; i++)
		pthread_join(engine.threads[i], NULL);
	free(engine.threads);
	engine.threads = NULL;
	engine.nthreads = 0;
	/* Ownership: the copiers come back from their joined threads. */
	for (unsigned i = 0; i < engine.ncopiers; i++)
		copier_free(engine.copiers[i]);
	free(engine.copiers);
	engine.copiers = NULL;
	engine.ncopiers = 0;
	/* Run what the workers posted last; engine.events is cleared first, as a final event's
	 * callback may stop the engine again from inside this. */
	struct workq *q = engine.events;
	engine.events = NULL;
	workq_close(q);
}
