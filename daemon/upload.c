/*
 * upload.c — the remote tier's uploads (DESIGN.md §9, level REMOTE): which tags of this node
 * go to their root's remote, their files, and the worker threads that move them.
 *
 * A save observer (wired in main.c) queues each file of a save into a root with a remote as
 * soon as it is DURABLE (not after the whole tag), and marks its tag committed at COMMITTED;
 * start-up queues the committed tags that have no REMOTE.json yet (upload_tag.c). Worker
 * threads (UPLOAD_THREADS, never the loop) take a waiting file, or a committed tag's step:
 * its plan (this node's files as the manifest lists them, any not queued yet), then, with
 * every file up, its finish (upload_tag.c: node record, remote manifest, latest). A failure
 * is kept on the tag (shown by PENDING, counted by reason, logged when it changes) and the
 * tag is tried again after a backoff (0.25 s doubling to 5 s; 5 s at once for what
 * remote_retryable says needs a person); nothing of the local commit
 * waits for any of it. A finished tag goes back to the loop through a workq: its saves are
 * marked REMOTE and it is forgotten. A tag committed again before its upload ended: the
 * version planned goes on to its end from the files its plan holds open, then the newest
 * version committed meanwhile is planned (upload_replace.c: the saves of each version
 * skipped, or given up, hear it).
 *
 * Threads and ownership: up.lock guards the list of tags and every field upload.h marks
 * (lock); a worker on a tag's step (busy) alone touches the rest of it; a tag is freed on the
 * loop once done, when no worker holds it. up.lock is taken last: nothing is called with it
 * held but log and metrics. The remotes and the config reference are set before the workers
 * start and kept until they are joined.
 */
#include "upload.h"
#include "../proto/proto.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#define UPLOAD_THREADS 2
#define BACKOFF_FIRST_S 0.25
#define BACKOFF_MAX_S 5.0

static struct {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct uptag *tags;        /* (lock) newest first */
	int stop;                  /* (lock) */
	int ready;                 /* (lock) the start-up pass is over */
	pthread_t th[UPLOAD_THREADS];
	unsigned nth;
	struct remote **remotes;   /* per root: open, or NULL */
	size_t nroots;
	struct config *cfg;        /* the config the remotes were opened with (a reference) */
	int *orphans_done;         /* per root: its uploads left open were looked for (worker 0) */
	double orphans_at;         /* when worker 0 looks again for those not done */
	struct workq *finished;
} up = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* Splits dir (the tag, or its staging directory .<tag>.dsckpt-next) into t's key, job key
 * and tag under its root; 0, 1 for a staging directory, or -1 when it is not below a root
 * with a remote. */
static int tag_names(struct uptag *t, const char *dir)
{
	const char *remote;
	int i = config_root_of(up.cfg, dir, &remote);
	char tag[NAME_MAX + 1];
	int staging = 0;

	if (i < 0 || !remote || (size_t)i >= up.nroots || !up.remotes[i])
		return -1;
	size_t rl = strlen(up.cfg->allowed_roots[i]);
	const char *rel = dir + rl + (dir[rl] == '/');
	const char *slash = strrchr(rel, '/');
	if (!slash || slash == rel || !slash[1])
		return -1;
	snprintf(t->jobkey, sizeof(t->jobkey), "%.*s", (int)(slash - rel), rel);
	snprintf(t->tag, sizeof(t->tag), "%s", slash + 1);
	if (store_tag_version(t->tag, tag, sizeof(tag)) == 1) {
		snprintf(t->tag, sizeof(t->tag), "%s", tag);
		staging = 1;
	}
	if (snprintf(t->dir, sizeof(t->dir), "%.*s/%s", (int)(slash - dir), dir, t->tag) >=
	    (int)sizeof(t->dir) ||
	    snprintf(t->key, sizeof(t->key), "%s/%s", t->jobkey, t->tag) >= (int)sizeof(t->key))
		return -1;
	t->root = (unsigned)i;
	t->r = up.remotes[i];
	t->stop = &up.stop;
	t->cfg = up.cfg;
	return staging;
}

/* The tag of dir not yet done, made when new (lock held); NULL when dir's root has no
 * remote, or without memory. *staging: dir is the tag's staging directory. */
static struct uptag *tag_get(const char *dir, int *staging)
{
	struct uptag probe;
	memset(&probe, 0, sizeof(probe));
	int st = tag_names(&probe, dir);

	*staging = st == 1;
	if (st < 0)
		return NULL;
	for (struct uptag *t = up.tags; t; t = t->next)
		if (!t->done && strcmp(t->dir, probe.dir) == 0)
			return t;
	struct uptag *t = malloc(sizeof(*t));
	if (!t) {
		log_warnx("upload of %s: out of memory", probe.dir);
		return NULL;
	}
	*t = probe;
	memset(&t->committed, 0, sizeof(*t) - offsetof(struct uptag, committed));
	t->t_commit = now_mono();
	t->next = up.tags;
	up.tags = t;
	return t;
}

/* Queues the tag of the committed directory dir found at start-up (a worker's). */
static int upload_resume(const char *dir)
{
	int staging;
	struct stat st;

	if (lstat(dir, &st) < 0)
		return -1;
	pthread_mutex_lock(&up.lock);
	struct uptag *t = tag_get(dir, &staging);
	if (t && !staging) {
		t->committed = 1;
		t->uid = st.st_uid;
	}
	pthread_cond_broadcast(&up.cond);
	pthread_mutex_unlock(&up.lock);
	return t ? 0 : -1;
}

/* save_change_cb: a save's file goes up once DURABLE; its tag is finished once COMMITTED. A
 * newer version committed before the one uploading reached REMOTE follows it
 * (upload_replace.c). */
void upload_on_save(struct save *s)
{
	int level = save_level(s), staging, replaced = 0;
	struct save_view v;
	struct store_dirid old;
	char name[NAME_MAX + 1], why[ERRLEN];

	if (!up.nth || (level != LEVEL_DURABLE && level != LEVEL_COMMITTED))
		return;
	save_view(s, &v);
	pthread_mutex_lock(&up.lock);
	struct uptag *t = tag_get(v.dir, &staging);
	if (t && level == LEVEL_DURABLE && !staging) {
		/* A staging directory's files wait for its commit: until then the remote holds
		 * the tag's committed version under the same keys. */
		snprintf(name, sizeof(name), "%s%s", v.file, FMT_SAFETENSORS);
		uptag_queue_file(t, v.dir, name, v.file);
		snprintf(name, sizeof(name), "%s%s", v.file, FMT_META);
		uptag_queue_file(t, v.dir, name, v.file);
	}
	if (t)
		t->uid = v.uid;
	if (t && level == LEVEL_COMMITTED && !t->committed) {
		t->committed = 1;
		t->t_commit = now_mono();
		t->dirid = v.dirid;
		t->has_dirid = 1;
	} else if (t && level == LEVEL_COMMITTED && (!t->has_dirid ||
						    !store_dirid_eq(&t->dirid, &v.dirid))) {
		/* The tag saved again and exchanged before its upload ended. */
		replaced = uptag_replace(t, &v, &old, why, sizeof(why));
	}
	pthread_cond_broadcast(&up.cond);
	pthread_mutex_unlock(&up.lock);
	uptag_tell_saves(replaced, &old, why);
}

/* Records a step's failure on t (lock held): kept for PENDING, counted, logged when it
 * changes, tried again after the backoff. */
static void tag_failed(struct uptag *t, int code, const char *err)
{
	if (up.stop)
		return;		/* shutdown cut it short: the next start resumes it */
	/* What may pass by itself (unreachable, a server error, a full filesystem) is tried
	 * again soon, then less often; what needs a person (credentials, a missing bucket)
	 * every BACKOFF_MAX_S from the first. */
	int soon = remote_retryable(code);
	double wait = soon ? BACKOFF_FIRST_S : BACKOFF_MAX_S;
	for (unsigned i = 0; i < t->fails && wait < BACKOFF_MAX_S; i++)
		wait *= 2;
	t->fails++;
	t->retry_at = now_mono() + (wait < BACKOFF_MAX_S ? wait : BACKOFF_MAX_S);
	if (code < 0)
		metrics_fail(METRIC_UPLOADS_FAILED, code);
	if (t->code != code || strcmp(t->error, err) != 0)
		log_warnx("upload of %s: %s (%s; %s)", t->dir, err, err_name(code),
			  soon ? "trying again" : "needs a fix of the remote or its credentials; "
			  "trying again every 5 s");
	t->code = code;
	snprintf(t->error, sizeof(t->error), "%s", err);
}

/* Clears t's failure after a step that worked (lock held). */
static void tag_ok(struct uptag *t)
{
	if (t->code < 0)
		log_info("upload of %s: going on after %u failed tries", t->dir, t->fails);
	t->code = 0;
	t->error[0] = '\0';
	t->fails = 0;
	t->retry_at = 0;
}

/* Runs file i of t (lock held on entry and exit, dropped while it uploads; t not busy). */
static void run_file(struct uptag *t, size_t i)
{
	char err[ERRLEN];
	struct upfile f = t->files[i];	/* the array may grow, or its plan reorder it */
	int planned = t->planned;

	t->files[i].state = UPF_BUSY;
	pthread_mutex_unlock(&up.lock);
	int rc = uptag_file(t, &f, planned, err, sizeof(err));
	pthread_mutex_lock(&up.lock);
	for (i = 0; i < t->nfiles && strcmp(t->files[i].name, f.name) != 0; i++)
		;
	if (i == t->nfiles)
		return;		/* not reached: a plan keeps the files busy */
	/* Up before a plan made since (or being made: its end looks), under another version
	 * directory than the plan's: it goes up again there. */
	int before = !planned && (t->busy || t->planned);
	if (rc == 0 && before && !t->busy && strcmp(t->loc, f.loc) != 0)
		rc = 2;
	if (rc == 3)		/* the version pinned was deleted: given up */
		t->gone = 1;
	if (rc != 0)
		t->files[i].state = UPF_WAIT;
	if (rc < 0)
		tag_failed(t, rc, err);
	if (rc == 1)		/* the remote holds a version: files wait for the plan */
		t->early_off = 1;
	if (rc == 2 && before)
		return;
	if (rc >= 2) {
		t->replan = 1;
		log_info("upload of %s: %s; planning again", t->dir, err);
	}
	if (rc != 0)
		return;
	if (t->files[i].size != f.size)
		t->bytes_total += f.size - t->files[i].size;
	t->files[i] = f;
	t->files[i].state = UPF_DONE;
	tag_ok(t);
}

/* Runs t's step (lock held on entry and exit): its plan (the version pinned by it), or its
 * finish once every file is up; a finished tag goes to the loop, or, committed again since
 * its plan, plans the newest version next. */
static void run_step(struct uptag *t)
{
	char err[ERRLEN];
	struct upfile *gone = NULL;	/* the files of the version given up that only it names */
	size_t ngone = 0;
	int rc;

	if (t->replan) {	/* no file is busy: each goes up again from the new version */
		uptag_pin_ended(t, 0, up.finished);
		gone = uptag_abandoned(t, &ngone);
		t->replan = 0;
		t->newer = 0;
		t->planned = 0;
		for (size_t i = 0; i < t->nfiles; i++)
			t->files[i].state = UPF_WAIT;
		__atomic_store_n(&t->bytes_done, 0, __ATOMIC_RELAXED);
		__atomic_store_n(&t->cancel, 0, __ATOMIC_RELAXED);
	}
	int finishing = t->planned;	/* t->planned is the worker's while busy */

	t->busy = 1;
	pthread_mutex_unlock(&up.lock);
	uptag_drop_abandoned(t, gone, ngone);
	free(gone);
	if (!finishing)
		rc = uptag_plan(t, err, sizeof(err));
	else
		rc = uptag_finish(t, err, sizeof(err));
	pthread_mutex_lock(&up.lock);
	t->busy = 0;
	if (!finishing && rc == 0 && (rc = uptag_plan_files(t, err, sizeof(err))) == 0 &&
	    !t->replan) {
		t->pinned = 1;	/* replaced from now on, it goes on to its end */
		t->pin_id = t->dir_id;
	}
	if (finishing && (rc == 0 || (rc == 2 && t->reached))) {
		uptag_pin_ended(t, 1, up.finished);	/* in the remote: REMOTE */
		rc = 0;
	}
	if (rc == 0 && finishing && (t->replan || t->newer)) {
		snprintf(err, sizeof(err), "%.900s was committed again: uploading the newer "
			 "version", t->dir);
		rc = 2;		/* a newer version follows the one just finished */
	}
	if (rc == ERR_EEXIST && t->newer)
		rc = 2;		/* a later version remotely: the newer one may pass it */
	if (rc == 3) {		/* the version pinned was deleted: given up */
		t->gone = 1;
		rc = 2;
	}
	if (rc == 2) {
		t->replan = 1;
		t->retry_at = now_mono() + BACKOFF_FIRST_S;
		snprintf(t->error, sizeof(t->error), "%s", err);
	} else if (rc < 0) {
		/* A later version remotely, or a tag gone here: no retry mends them. */
		t->stuck = rc == ERR_EEXIST || (!finishing && rc == ERR_ENOENT);
		tag_failed(t, rc, err);
	} else if (rc == 1) {
		t->retry_at = now_mono() + BACKOFF_MAX_S / 5;
		snprintf(t->error, sizeof(t->error), "%s", err);
	} else if (finishing) {
		tag_ok(t);
		t->done = 1;
		workq_push(up.finished, &t->wi, UP_DONE);
	} else {
		tag_ok(t);
	}
}

/* Finds work (lock held): runs one file or one tag step; 0 when there was none. */
static int run_one(void)
{
	double now = now_mono();

	for (struct uptag *t = up.tags; t; t = t->next) {
		if (t->done || t->stuck || t->busy || now < t->retry_at)
			continue;
		int pending = 0;
		for (size_t i = 0; i < t->nfiles; i++) {
			if (t->files[i].state == UPF_WAIT && !t->replan &&
			    (t->planned || (!t->early_off && !t->committed))) {
				run_file(t, i);
				return 1;
			}
			pending |= t->files[i].state == UPF_BUSY;
		}
		/* A committed tag's plan does not wait for files going up before it (read
		 * through their own descriptors): it pins the version at once. */
		if (t->committed && (!pending || (!t->planned && !t->replan))) {
			run_step(t);
			return 1;
		}
	}
	return 0;
}

/* Whether key is a file this daemon is uploading now (the lock taken). */
static int key_busy(const char *key)
{
	char k[PATH_MAX + NAME_MAX + 40];
	int busy = 0;

	pthread_mutex_lock(&up.lock);
	for (struct uptag *t = up.tags; t && !busy; t = t->next) {
		for (size_t i = 0; i < t->nfiles && !busy; i++) {
			if (t->files[i].state != UPF_BUSY)
				continue;
			/* Beside a busy file only a plan runs: the file started before it,
			 * under the tag's own keys. */
			snprintf(k, sizeof(k), "%s/%s", !t->busy && t->planned ? t->fkey : t->key,
				 t->files[i].name);
			busy = strcmp(k, key) == 0;
		}
	}
	pthread_mutex_unlock(&up.lock);
	return busy;
}

/* Worker 0, lock held: looks again, every BACKOFF_MAX_S, for the uploads left open in the
 * remotes that could not be listed at start (down then); 1 when it did. */
static int orphans_again(void)
{
	if (!up.orphans_at || now_mono() < up.orphans_at)
		return 0;
	pthread_mutex_unlock(&up.lock);
	unsigned left = uptag_orphans(up.cfg, up.remotes, up.orphans_done, key_busy, 1);
	pthread_mutex_lock(&up.lock);
	up.orphans_at = left ? now_mono() + BACKOFF_MAX_S : 0;
	return 1;
}

/* A worker: the first aborts the uploads left open and queues the committed tags not yet
 * REMOTE; then each takes work until stop (the first also looks again for uploads left
 * open where the remote could not be listed). */
static void *worker(void *arg)
{
	if (arg) {
		unsigned left = uptag_orphans(up.cfg, up.remotes, up.orphans_done, key_busy, 0);
		uptag_startup(up.cfg, up.remotes, upload_resume);
		pthread_mutex_lock(&up.lock);
		up.ready = 1;
		up.orphans_at = left ? now_mono() + BACKOFF_MAX_S : 0;
		pthread_cond_broadcast(&up.cond);
		pthread_mutex_unlock(&up.lock);
	}
	pthread_mutex_lock(&up.lock);
	while (!up.stop) {
		if (arg && orphans_again())
			continue;
		if (up.ready && run_one())
			continue;
		double next = now_mono() + 1.0;
		if (arg && up.orphans_at && up.orphans_at < next)
			next = up.orphans_at;
		for (struct uptag *t = up.tags; t; t = t->next)
			if (!t->done && !t->stuck && t->retry_at && t->retry_at < next)
				next = t->retry_at;
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		double wait = next - now_mono();
		if (wait < 0.001)
			wait = 0.001;
		ts.tv_sec += (time_t)wait;
		ts.tv_nsec += (long)((wait - (double)(time_t)wait) * 1e9);
		if (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
		pthread_cond_timedwait(&up.cond, &up.lock, &ts);
	}
	pthread_mutex_unlock(&up.lock);
	return NULL;
}

/* Loop: a tag reached REMOTE: its saves are marked, its time observed, and it is freed; or
 * the verdict on a version replaced while a worker finished it reaches its saves. */
static void on_finished(struct workq_item *it, unsigned events)
{
	if (events == UP_VERDICT) {
		uptag_verdict(it);
		return;
	}
	struct uptag *t = (struct uptag *)((char *)it - offsetof(struct uptag, wi));

	log_info("uploaded %s to %s/%s", t->dir, remote_url(up.remotes[t->root]), t->key);
	metrics_add(METRIC_UPLOADS_DONE, 1);
	metrics_observe(METRIC_UPLOAD_S, now_mono() - t->t_commit);
	if (t->has_dirid)
		save_mark_remote(&t->dirid);
	pthread_mutex_lock(&up.lock);
	for (struct uptag **p = &up.tags; *p; p = &(*p)->next) {
		if (*p == t) {
			*p = t->next;
			break;
		}
	}
	pthread_mutex_unlock(&up.lock);
	uptag_clear(t);
	free(t->files);
	free(t);
}

/* Opens the remote of every root of d's config that has one and starts the workers (none
 * without a remote); 0, or a negative ERR_E* with err. */
int upload_start(const struct daemon *d, char *err, size_t errlen)
{
	struct config *cfg = d->config;
	int rc, any = 0;

	for (size_t i = 0; cfg->root_remotes && i < cfg->n_roots; i++)
		any |= cfg->root_remotes[i] != NULL;
	if (!any)
		return 0;
	if (!(up.remotes = calloc(cfg->n_roots, sizeof(*up.remotes))) ||
	    !(up.orphans_done = calloc(cfg->n_roots, sizeof(*up.orphans_done)))) {
		free(up.remotes);
		up.remotes = NULL;
		return err_set(err, errlen, ERR_ENOMEM, "out of memory");
	}
	up.nroots = cfg->n_roots;
	for (size_t i = 0; i < cfg->n_roots; i++) {
		if (cfg->root_remotes[i] &&
		    (rc = remote_open(cfg, cfg->root_remotes[i], &up.remotes[i], err, errlen)) < 0)
			goto fail_remotes;
	}
	if ((rc = workq_open(&up.finished, d->loop, on_finished, err, errlen)) < 0)
		goto fail_remotes;
	/* The workers' deadlines are on the monotonic clock: so must their condition be. */
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&up.cond, &ca);
	pthread_condattr_destroy(&ca);
	up.cfg = config_ref(cfg);
	for (; up.nth < UPLOAD_THREADS; up.nth++) {
		if ((rc = pthread_create(&up.th[up.nth], NULL, worker,
					 up.nth == 0 ? (void *)1 : NULL)) != 0) {
			upload_stop();
			return err_set(err, errlen, ERR_ENOMEM, "upload threads: %s", strerror(rc));
		}
	}
	return 0;

fail_remotes:
	for (size_t i = 0; i < up.nroots; i++)
		remote_close(up.remotes[i]);
	free(up.remotes);
	free(up.orphans_done);
	up.remotes = NULL;
	up.orphans_done = NULL;
	up.nroots = 0;
	return rc;
}

/* Stops the workers (an upload in flight gives up and is aborted), runs what finished, and
 * frees every tag (shutdown, loop thread). */
void upload_stop(void)
{
	if (!up.cfg)
		return;		/* never started: no root has a remote */
	pthread_mutex_lock(&up.lock);
	__atomic_store_n(&up.stop, 1, __ATOMIC_RELAXED);
	pthread_cond_broadcast(&up.cond);
	pthread_mutex_unlock(&up.lock);
	for (unsigned i = 0; i < up.nth; i++)
		pthread_join(up.th[i], NULL);
	up.nth = 0;
	pthread_cond_destroy(&up.cond);
	workq_close(up.finished);
	up.finished = NULL;
	while (up.tags) {
		struct uptag *t = up.tags;
		up.tags = t->next;
		uptag_clear(t);
		free(t->files);
		free(t);
	}
	for (size_t i = 0; i < up.nroots; i++)
		remote_close(up.remotes[i]);
	free(up.remotes);
	free(up.orphans_done);
	up.remotes = NULL;
	up.orphans_done = NULL;
	up.nroots = 0;
	config_unref(up.cfg);
	up.cfg = NULL;
}

/* Calls fn with a view of each tag not yet REMOTE (loop thread; the lock is held: fn must
 * not call into upload.c). */
void upload_each(void (*fn)(void *arg, const struct upload_view *v), void *arg)
{
	pthread_mutex_lock(&up.lock);
	for (struct uptag *t = up.tags; t; t = t->next) {
		if (t->done)
			continue;
		struct upload_view v = {
			.dir = t->dir, .remote = remote_url(up.remotes[t->root]), .key = t->key,
			.uid = t->uid, .committed = t->committed, .code = t->code,
			.error = t->error[0] ? t->error : NULL,
			.bytes_total = t->bytes_total,
			.bytes_done = __atomic_load_n(&t->bytes_done, __ATOMIC_RELAXED),
			.age_s = now_mono() - t->t_commit,
		};
		for (size_t i = 0; i < t->nfiles; i++)
			v.files_done += t->files[i].state == UPF_DONE;
		v.files = t->nfiles;
		fn(arg, &v);
	}
	pthread_mutex_unlock(&up.lock);
}

/* Tags not yet REMOTE and their bytes not yet uploaded (METRICS's backlog). */
void upload_backlog(uint64_t *tags, uint64_t *bytes)
{
	*tags = *bytes = 0;
	pthread_mutex_lock(&up.lock);
	for (struct uptag *t = up.tags; t; t = t->next) {
		if (t->done)
			continue;
		uint64_t done = __atomic_load_n(&t->bytes_done, __ATOMIC_RELAXED);
		(*tags)++;
		*bytes += t->bytes_total > done ? t->bytes_total - done : 0;
	}
	pthread_mutex_unlock(&up.lock);
}
