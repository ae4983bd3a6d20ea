/*
 * seal.c — seals, and the commits the daemons make of them. A rank seals a tag (SEAL): it will
 * save nothing more into it. Once every rank this daemon saw seal has its saves into the tag
 * DURABLE, the daemon writes its node's seal record (store_seal.c, seal_files.c: their files),
 * once per node where it can (it waits 1 s at most for a rank that saved here to seal). The
 * node that rank 0 sealed through collects: it takes the records in by their telling names
 * (format/seal_name.c: each once, the names inotify gives, or listing the directory when its
 * mtime changed; opened only where a name is plain) and, when they name every rank, commits the
 * tag from them under the same lock (store_commit_held: manifest, latest, retention), with no
 * trainer left alive if need be, dated by the newest seal, so that a job's tags order by step
 * however late each commit lands. The others only write their record and watch for the manifest
 * (seal_watch.c), marking their saves COMMITTED when it commits their run: two metadata
 * operations per node; they look at the records only every 30 s (the collector may have died).
 * Every look runs under the job directory's lock. An incomplete tag is looked at for an hour.
 *
 * A tag is one directory of one user, sealed by one run of one job: it is keyed by the
 * directory's identity (st_dev, st_ino of the descriptor its save or SEAL validated, held open
 * with its job directory's while the tag is followed, so that it cannot name another directory
 * and no look walks its path again) and its owner, never by its path. A directory removed is
 * forgotten with its seals; one made again under the same name is a new tag. A seal of a newer
 * run (HELLO's run) takes the tag over from an older run's that never committed: records,
 * files and saves of one run never combine with another's, and no reply names what another
 * user sealed.
 *
 * Loop thread only, but for seal_work (libuv's threadpool), which touches only the tag's
 * work fields while busy. A tag is owned by the list from its first seal until it lingers
 * out after its end (committed or failed).
 */
#include "dsckptd.h"
#include "../proto/proto.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#define SEAL_TRIES 126         /* looks at the other nodes' records after ours: */
#define SEAL_BACKOFF_MAX 30000 /* 1, 2, 4, ... 16 s, then every 30 s: about an hour */
#define SEAL_LINGER_MS 60000   /* an ended tag is forgotten this long after */
#define SEAL_WRITE_WAIT_MS 1000 /* our record waits this long at most for a rank saving here */

struct seal_tag {
	char dir[PROTO_MAX_STR + 1];  /* the path the seals named (logs; the commit's names) */
	struct store_dirid dirid;     /* the directory sealed */
	int dfd;                      /* held open while followed: the identity stays its */
	int jobfd;                    /* its job directory, as SEAL opened it (its lock) */
	char job[PROTO_MAX_NAME + 1];
	char run[PROTO_MAX_RUN + 1];
	unsigned world;
	uid_t uid;
	gid_t gid;
	uint8_t *sealed;            /* world entries: ranks sealed through this daemon */
	unsigned nsealed;
	uint64_t sealed_ns;         /* when the newest of them sealed (the record's sealed_ns) */
	uint64_t written_ns;        /* sealed_ns as of written */
	unsigned written;           /* nsealed as of our record's last write (seal_work's) */
	unsigned tries;             /* looks left at the others' records */
	int busy;                   /* seal_work runs */
	int deferred;               /* ready for seal_work, behind another tag of its user */
	int ended;                  /* committed, or failed for good */
	int gone;                   /* forgotten while busy: seal_after frees it */
	uv_timer_t timer;
	struct seal_watch *watch;   /* for the manifest (collecting: and the others' records) */
	int again;                  /* the watch saw something while busy: look once more */
	int write_wait;             /* our record waits for a rank saving here to seal */
	int write_due;              /* that wait is over: write what is sealed */
	/* seal_work's: in (cfg, write) and out */
	uv_work_t work;
	struct config *cfg;         /* a reference, while busy */
	int write;                  /* write our record (written ranks) before looking */
	int check;                  /* look whether committed already (seal_watch_committed) */
	unsigned *ranks;            /* the ranks to write */
	struct seal_files files;    /* the files of their saves here, described in the record */
	int rc;                     /* < 0 failed; 1 committed; 2 committed by another; 0 not yet */
	int look;                   /* read the records (collecting, or the slow timer's look) */
	int listed;                 /* a look listed the directory since the watch started */
	int by_name;                /* this look reads names, the records the watch saw come */
	int current;                /* and kept is the directory now (seal_watch_names) */
	struct seal_listing kept;   /* the names of the last listing, and records come since */
	struct seal_names names;
	uint8_t *have_map;          /* world entries: the ranks the records read so far name */
	struct seal_seen seen;      /* the records read so far */
	int have;                   /* ranks the records name; -2: not looked */
	uint64_t newest;            /* the newest seal they record: the commit's date */
	int mine;                   /* rc 2: the manifest found commits this tag's run */
	char err[ERRLEN];
	struct store_commit_info info;
	struct seal_tag *next;
};

static const struct daemon *daemon_ctx;  /* seal_init's: its loop, the config of the moment */
static struct seal_tag *tags;

static void seal_check(struct seal_tag *t);

/* Frees a tag once its timer is closed, giving back its user's charge. */
static void seal_closed(uv_handle_t *h)
{
	struct seal_tag *t = h->data;
	quota_give(t->uid, QUOTA_SEALS, 1);
	close(t->dfd);
	close(t->jobfd);
	seal_files_free(&t->files);
	seal_names_free(&t->names);
	free(t->sealed);
	free(t->ranks);
	free(t->have_map);
	store_seal_listing_names_free(&t->kept);
	store_seal_seen_free(&t->seen);
	free(t);
}

/* Unlinks and frees a tag. */
static void seal_free(struct seal_tag *t)
{
	for (struct seal_tag **p = &tags; *p; p = &(*p)->next) {
		if (*p == t) {
			*p = t->next;
			break;
		}
	}
	seal_watch_stop(t->watch);
	uv_timer_stop(&t->timer);
	uv_close((uv_handle_t *)&t->timer, seal_closed);
}

/* Forgets a tag now, or once its seal_work is back. */
static void seal_forget(struct seal_tag *t)
{
	if (t->busy)
		t->gone = 1;
	else
		seal_free(t);
}

/* Forgets uid's tags whose directory was removed: their seals block nothing any more. */
static void seal_sweep(uid_t uid)
{
	struct seal_tag *t = tags, *next;

	for (; t; t = next) {
		next = t->next;
		if (t->uid == uid && !t->gone && seal_dirs_gone(t->dfd)) {
			log_debug("seal of %s: the directory was removed; forgotten", t->dir);
			seal_forget(t);
		}
	}
}

/* Timer: another look at the records, or an ended tag's linger is over. */
static void on_seal_timer(uv_timer_t *h)
{
	struct seal_tag *t = h->data;

	if (t->ended || seal_dirs_gone(t->dfd)) {
		seal_free(t);
	} else {
		t->look = 1;	/* a node not collecting looks too, now and then */
		t->listed = 0;	/* and lists the directory: the watch may have missed one */
		seal_check(t);
	}
}

/* Ends a tag (committed, or failed for good); it is forgotten after SEAL_LINGER_MS. */
static void seal_end(struct seal_tag *t)
{
	t->ended = 1;
	seal_watch_stop(t->watch);
	t->watch = NULL;
	uv_timer_start(&t->timer, on_seal_timer, SEAL_LINGER_MS, 0);
}

/* Threadpool: writes our record (when asked), reads everyone's, commits when complete, from
 * the directories SEAL opened (no path walked). A look that lists lists first: the listing
 * says whether a manifest is there, and our record written after it is not read back; the
 * commit takes it, or the last one and the records come since (seal_watch_names: 1). */
static void seal_work(uv_work_t *w)
{
	struct seal_tag *t = w->data;
	const char *tag = strrchr(t->dir, '/') ? strrchr(t->dir, '/') + 1 : t->dir;
	struct seal_listing l = {0};

	t->rc = 0;
	t->have = -2;
	if (seal_dirs_gone(t->dfd)) {
		t->rc = err_set(t->err, sizeof(t->err), ERR_ENOENT, "the directory was removed");
		return;
	}
	/* Our record, the look at everyone's and the commit happen under the job's lock: of
	 * two nodes writing at once, the second sees the first's record. */
	if ((t->rc = store_job_lock(t->jobfd, t->err, sizeof(t->err))) < 0)
		return;
	/* Committed meanwhile (by a COMMIT, or another node): no record to add beside the
	 * manifest. A look at the records alone needs no such check: a commit makes its own. */
	struct seal_record r = {store_host(), t->job, t->world, t->ranks, t->written, t->run,
				t->written_ns, NULL, 0, NULL};
	int listing = t->look && !t->by_name;
	int listed = listing && store_seal_list(t->dfd, &t->seen, &l) == 0;
	if (t->check && seal_watch_committed(t->dfd, t->jobfd, tag, t->run, t->world,
					     listed ? &l : NULL, &t->mine))
		t->rc = 2;	/* or a new version exchanged with its tag, committed */
	else if (t->write)
		t->rc = seal_files_write(t->cfg, t->dfd, &r, &t->files, t->uid, t->gid, t->dir,
					 t->have_map, &t->newest, t->look ? &t->seen : NULL,
					 t->err, sizeof(t->err));
	/* Only the collecting node reads the others' records (each about once): the others
	 * learn the outcome from the manifest (seal_watch.c). */
	if (t->rc == 0 && t->look && t->by_name)
		t->have = store_seal_scan_names(t->dfd, t->names.v, t->names.n, t->job, t->run,
						t->world, t->have_map, &t->newest, &t->seen);
	else if (t->rc == 0 && listed)
		t->have = store_seal_read_listed(t->dfd, &l, t->write, t->job, t->run, t->world,
						 t->have_map, &t->newest, &t->seen);
	else if (t->rc == 0 && listing)
		t->have = -1;	/* cannot list */
	store_seal_listing_free(&l, &t->seen, listing ? &t->kept : NULL);
	int current = listed || (t->current && store_seal_listing_add(&t->kept, t->names.v,
								      t->names.n) == 0);
	/* Complete: committed from the directories held, under the same lock. */
	if (t->rc == 0 && t->have == (int)t->world) {
		if ((t->rc = store_commit_held(t->cfg, t->dir, t->jobfd, t->dfd, t->world, t->run,
					       t->uid, t->gid, t->newest, &t->seen,
					       current ? t->kept.names : NULL, t->kept.nnames,
					       &t->info, t->err, sizeof(t->err))) == 0)
			t->rc = 1;
	}
	store_job_unlock(t->jobfd);
}

/* seal_watch_cb: a manifest (or, collecting, a record) appeared in the tag's directory; a
 * look decides whose it is, or whether the records are complete now. */
static void seal_on_manifest(void *arg)
{
	struct seal_tag *t = arg;

	if (t->busy)
		t->again = 1;
	else
		seal_check(t);
}

/* Whether this node collects the tag's records: the node its rank 0 sealed through, which
 * the records themselves name, so that one node reads N records rather than N nodes each. */
static int seal_collects(const struct seal_tag *t)
{
	return t->sealed[0];
}

/* Starts uid's next tag waiting for its turn (seal_user_busy), if any: the one sealed first
 * (the list is newest first), so that a job's steps commit in their order where they can. */
static void seal_next(uid_t uid)
{
	struct seal_tag *first = NULL;

	for (struct seal_tag *o = tags; o; o = o->next)
		if (o->deferred && o->uid == uid)
			first = o;
	if (first) {
		first->deferred = 0;
		seal_check(first);
	}
}

/* Loop: what seal_work found. */
static void seal_after(uv_work_t *w, int status)
{
	struct seal_tag *t = w->data;

	t->busy = 0;
	t->listed = t->have >= 0 && (t->listed || !t->by_name);
	seal_names_free(&t->names);
	t->write = 0;
	t->look = 0;
	config_unref(t->cfg);
	t->cfg = NULL;
	if (t->gone) {
		uid_t uid = t->uid;
		seal_free(t);
		seal_next(uid);
		return;
	}
	if (t->rc < 0) {
		log_warnx("seal of %s: %s", t->dir, t->err);
		seal_end(t);
	} else if (t->rc == 2 && !t->mine) {
		log_debug("seal of %s: committed already, not by this run", t->dir);
		seal_end(t);
	} else if (t->rc == 1 || t->rc == 2) {
		/* Ours, or another node's commit of this run: this node's saves are committed. */
		if (t->rc == 2)
			log_info("committed %s: by another node (job %s)", t->dir, t->job);
		else
			log_info("committed %s: every rank of job %s sealed (%u files, %llu bytes "
				 "here; %u seal records of other nodes named)", t->dir, t->job,
				 t->info.files, (unsigned long long)t->info.bytes, t->info.records);
		t->rc = 1;
		save_mark_committed(&t->dirid, t->uid, t->run);
		resident_committed(t->dir);
		seal_end(t);
	} else if (t->written != t->nsealed || t->again) {
		t->again = 0;
		seal_check(t);	/* more ranks sealed meanwhile, or records came */
	} else if (t->tries > 0) {
		int collect = seal_collects(t);
		log_debug("seal of %s: %d of %u ranks sealed so far (-2: not looked, the node of "
			  "rank 0 collects)", t->dir, t->have, t->world);
		t->watch = seal_watch_keep(t->watch, daemon_ctx->loop, t->dir, t->dfd, collect,
					   seal_on_manifest, t);
		unsigned k = SEAL_TRIES - t->tries;
		uv_timer_start(&t->timer, on_seal_timer,
			       collect && k < 5 ? 1000u << k : SEAL_BACKOFF_MAX, 0);
		t->tries--;
	} else {
		log_info("seal of %s: %d of %u ranks sealed after an hour; no longer followed "
			 "(a new seal or a restart looks again)", t->dir, t->have, t->world);
		seal_end(t);
	}
	seal_next(t->uid);
}

/* Whether a seal_work of uid runs: one at a time per user, so that one user's many tags
 * never hold every threadpool thread against other users' seals and commits. */
static int seal_user_busy(uid_t uid)
{
	for (struct seal_tag *t = tags; t; t = t->next)
		if (t->busy && t->uid == uid)
			return 1;
	return 0;
}

/* Timer: our record waited long enough for the ranks saving here; it is written now. */
static void on_write_timer(uv_timer_t *h)
{
	struct seal_tag *t = h->data;

	t->write_wait = 0;
	t->write_due = 1;
	seal_check(t);
}

/* Moves a tag on: waits for its sealed ranks' saves, then writes our record and looks. */
static void seal_check(struct seal_tag *t)
{
	struct seal_scope scope = {t->uid, t->dirid, t->job, t->run, t->world, t->sealed};
	struct save_view v;

	if (t->busy || t->ended || t->gone)
		return;
	for (struct save *s = save_next(NULL); s; s = save_next(s)) {
		save_view(s, &v);
		if (!seal_files_sealed(&scope, &v))
			continue;
		if (v.level == LEVEL_FAILED) {
			log_warnx("seal of %s: the save of %s (rank %u) failed, so the tag will not be "
				  "committed: %s", t->dir, v.file, v.rank, v.error);
			seal_end(t);
			return;
		}
		if (v.level < LEVEL_DURABLE)
			return;	/* seal_on_save calls again */
	}
	/* A write asked for stays asked for until a seal_work has done it, even while the tag
	 * waits behind another of its user's (seal_user_busy). */
	if (t->written != t->nsealed && !t->write_due && seal_files_unsealed(&scope)) {
		/* One record per node where it can be: while a rank that saved here has not
		 * sealed yet, the write waits for it (SEAL_WRITE_WAIT_MS at most). */
		if (!t->write_wait)
			uv_timer_start(&t->timer, on_write_timer, SEAL_WRITE_WAIT_MS, 0);
		t->write_wait = 1;
		return;
	}
	if (t->written != t->nsealed) {
		t->write = 1;
		t->write_wait = t->write_due = 0;
		unsigned k = 0;
		for (unsigned r = 0; r < t->world; r++)
			if (t->sealed[r])
				t->ranks[k++] = r;
		seal_files_gather(&t->files, &scope);
		t->written = t->nsealed;
		t->written_ns = t->sealed_ns;
		t->tries = SEAL_TRIES;
	}
	/* Under the lock, the manifest (does it commit this run?) and the tag's name are looked
	 * at as the collecting node writes its record, and by a look of a node not collecting,
	 * but not as such a node writes one: no commit of its ranks comes before that record,
	 * and the watch, started first, sees the one after (each look at a name is a round trip
	 * to a shared filesystem's server). */
	int collect = seal_collects(t);
	t->check = t->write ? collect : !collect;
	if (collect || t->write)
		t->watch = seal_watch_keep(t->watch, daemon_ctx->loop, t->dir, t->dfd, collect,
					   seal_on_manifest, t);
	t->look |= collect;
	uv_timer_stop(&t->timer);
	if (seal_user_busy(t->uid)) {
		t->deferred = 1;
		return;
	}
	/* A look reads the records the watch saw come since the directory was last listed; the
	 * first lists it (the watch started before), as does one the watch cannot vouch for. */
	int names = t->look ? seal_watch_names(t->watch, &t->names, t->listed) : -1;
	t->by_name = names >= 0;
	t->current = names == 1;
	t->busy = 1;
	t->cfg = config_ref(daemon_ctx->config);
	t->work.data = t;
	uv_queue_work(daemon_ctx->loop, &t->work, seal_work, seal_after);
}

/* uid's tag of the directory id, or NULL. */
static struct seal_tag *seal_find(const struct store_dirid *id, uid_t uid)
{
	for (struct seal_tag *t = tags; t; t = t->next)
		if (!t->gone && t->uid == uid && store_dirid_eq(&t->dirid, id))
			return t;
	return NULL;
}

/* A new tag of dir (the directory dfd, whose identity is id, in the job directory jobfd; the
 * tag takes both) of job and run (world ranks) owned by uid/gid, charged to uid's
 * max_seals_per_user until it is freed; NULL with a negative ERR_E* in *code and err
 * (ELIMIT, ENOMEM), dfd and jobfd closed. */
static struct seal_tag *seal_new(const char *dir, int dfd, int jobfd,
				 const struct store_dirid *id, const char *job, const char *run,
				 unsigned world, uid_t uid, gid_t gid, int *code, char *err,
				 size_t errlen)
{
	struct seal_tag *t = NULL;

	if ((*code = quota_take(uid, QUOTA_SEALS, 1, err, errlen)) < 0)
		goto fail;
	if (!(t = calloc(1, sizeof(*t))) || !(t->sealed = calloc(world, 1)) ||
	    !(t->ranks = calloc(world, sizeof(unsigned))) || !(t->have_map = calloc(world, 1))) {
		quota_give(uid, QUOTA_SEALS, 1);
		*code = err_set(err, errlen, ERR_ENOMEM, "out of memory");
		goto fail;
	}
	snprintf(t->dir, sizeof(t->dir), "%s", dir);
	t->dirid = *id;
	t->dfd = dfd;
	t->jobfd = jobfd;
	snprintf(t->job, sizeof(t->job), "%s", job);
	snprintf(t->run, sizeof(t->run), "%s", run);
	t->world = world;
	t->uid = uid;
	t->gid = gid;
	uv_timer_init(daemon_ctx->loop, &t->timer);
	t->timer.data = t;
	t->next = tags;
	tags = t;
	return t;
fail:
	if (t) {
		free(t->sealed);
		free(t->ranks);
		free(t);
	}
	close(dfd);
	close(jobfd);
	return NULL;
}

/* Hands the module the daemon it seals for (start-up, before recovery resumes seals). */
void seal_init(const struct daemon *d)
{
	daemon_ctx = d;
}

/* Handles SEAL of dir by o (an identified trainer, auth_check'ed by the caller). */
void seal_request(const struct owner *o, uint64_t req, const char *dir)
{
	char d[PROTO_MAX_STR + 1], err[ERRLEN];
	unsigned rank = o->rank, world = o->world;
	uid_t uid = o->uid;
	struct store_dirid id;
	int jobfd, rc;

	store_norm_dir(d, sizeof(d), dir);
	/* The directory this user's SAVE_BEGIN opened there (else the path walked); a save of
	 * the rank's there not committed yet says the tag was not, as far as this daemon knows:
	 * no name is looked up (the commit's own look at the manifest says the rest). */
	int dfd, pending = seal_dirs_open(daemon_ctx->config, o, d, &dfd, &jobfd, &id, err,
					  sizeof(err));
	if (pending < 0)
		return reply_error(o->conn, req, pending, "%s", err);
	int committed = !pending && faccessat(dfd, FMT_MANIFEST, F_OK, AT_SYMLINK_NOFOLLOW) == 0;
	seal_sweep(uid);
	struct seal_tag *t = seal_find(&id, uid);
	if (t && !committed && strcmp(t->run, o->run) != 0 &&
	    !(t->ended && t->rc == 1)) {
		log_info("seal of %s: run '%s' of job %s takes the tag over from run '%s', which "
			 "did not commit it", d, o->run, o->job, t->run);
		seal_forget(t);
		t = NULL;
	}
	if (t && (t->world != world || strcmp(t->job, o->job) != 0)) {
		close(dfd);
		close(jobfd);
		return reply_error(o->conn, req, ERR_EBUSY, "%s is sealed by job %s of %u "
				   "ranks", d, t->job, t->world);
	}
	if (committed || t) {
		close(dfd);
		close(jobfd);
	} else if (!(t = seal_new(d, dfd, jobfd, &id, o->job, o->run, world, uid, o->gid, &rc,
				  err, sizeof(err))))
		return reply_error(o->conn, req, rc, "%s", err);
	if (t && !t->sealed[rank]) {
		t->sealed[rank] = 1;
		t->nsealed++;
		t->sealed_ns = seal_files_now_ns();
		log_debug("rank %u of job %s sealed %s (%u of %u here)", rank, t->job, d,
			  t->nsealed, world);
	}
	reply_sealed(o->conn, req, committed || (t && t->ended && t->rc == 1));
	if (t)
		seal_check(t);
}

/* Whether rank of uid's job and run has sealed the directory id through this daemon. */
int seal_holds(const struct store_dirid *id, uid_t uid, const char *job, const char *run,
	       unsigned rank)
{
	struct seal_tag *t = seal_find(id, uid);
	return t && strcmp(t->job, job) == 0 && strcmp(t->run, run) == 0 && rank < t->world &&
	       t->sealed[rank];
}

/* save_change_cb: a save becoming DURABLE or failing may let its tag go on; one ending
 * (COMMITTED or FAILED) may let its directory go (seal_dirs.c). */
void seal_on_save(struct save *s)
{
	int level = save_level(s);
	struct save_view v;

	if (level != LEVEL_DURABLE && level != LEVEL_FAILED && level != LEVEL_COMMITTED)
		return;
	save_view(s, &v);
	if (level != LEVEL_DURABLE)
		seal_dirs_release(v.uid, &v.dirid, level == LEVEL_FAILED);
	if (level == LEVEL_COMMITTED)
		return;
	struct seal_tag *t = seal_find(&v.dirid, v.uid);
	if (t)
		seal_check(t);
}

/* Takes up a tag this node sealed before a restart: its record r is on disk already, so the
 * daemons' look at the records (and the commit, if complete) goes on where it stopped. */
void seal_resume(const char *dir, const struct seal_record *r, uid_t uid, gid_t gid)
{
	struct store_dirid id;
	char err[ERRLEN];
	int jobfd, rc;
	int dfd = seal_dirs_walk(daemon_ctx->config, dir, uid, gid, &jobfd, &id, err, sizeof(err));

	if (dfd < 0) {
		log_warnx("not resuming the seals of %s: %s", dir, err);
		return;
	}
	if (seal_find(&id, uid)) {
		close(dfd);
		close(jobfd);
		return;
	}
	struct seal_tag *t = seal_new(dir, dfd, jobfd, &id, r->job, r->run, r->world, uid, gid,
				      &rc, err, sizeof(err));
	if (!t) {
		log_warnx("not resuming the seals of %s: %s", dir, err);
		return;
	}
	for (unsigned i = 0; i < r->nranks; i++) {
		t->nsealed += !t->sealed[r->ranks[i]];
		t->sealed[r->ranks[i]] = 1;
	}
	t->written = t->nsealed;
	t->sealed_ns = t->written_ns = r->sealed_ns;
	t->tries = SEAL_TRIES;
	log_info("resuming the seals of %s: %u of %u ranks sealed here", dir, t->nsealed,
		 t->world);
	seal_check(t);
}

/* Seals at work in the threadpool now. */
unsigned seal_running(void)
{
	unsigned n = 0;
	for (struct seal_tag *t = tags; t; t = t->next)
		n += t->busy;
	return n;
}

/* Forgets every tag (shutdown, nothing running). */
void seal_free_all(void)
{
	while (tags)
		seal_free(tags);
	seal_dirs_free_all();
}
