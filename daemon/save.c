/*
 * save.c — the registry of saves: validation of what a client adds, the plan handed to the
 * engine, and each save's level (ACCEPTED → SNAPSHOT → DURABLE → COMMITTED → REMOTE →
 * REPLICATED, or FAILED with a code and a reason; REMOTE only where the root has a remote
 * tier, REPLICATED only with peer copies on and once `replicas` peers hold the node's files). Everything here runs on the loop thread. It encodes no
 * reply and knows no connection: saves name their client by id, and every change of level
 * is published to waiter.c (the WAITs parked there) and then told to the observers
 * registered with save_observe (commits, seals, uploads, metrics; main.c wires them), which
 * act on it. A SAVE_BEGIN opens its directory through the opener registered with
 * save_open_with (overwrite.c's: a committed or sealed tag's next version goes into its
 * staging directory).
 *
 * A save is owned by the registry from SAVE_BEGIN until it is forgotten: a minute after its
 * last change once finished and no longer held (a WAIT holds it), or at once when its client
 * leaves before SAVE_END; one that finished well stays longer (save_gc.c). SAVE_BEGIN makes the file's .partial (unlinked if the save is
 * dropped before its end), so that SAVE_END, which the trainer waits for, does not. From
 * SAVE_END to its final event its job and the file belong to the engine; the save keeps only
 * the handle.
 */
#include "save_int.h"
#include "../proto/proto.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#define MAX_OBSERVERS 8


static const struct daemon *daemon_ctx;  /* save_engine_start's */
static struct save *saves;
static uint64_t next_save_id = 1;
static save_change_cb observers[MAX_OBSERVERS];
static unsigned nobservers;
static save_dir_cb open_dir;
static save_drop_cb dropped;  /* told of a save dropped before its SAVE_END */

/* Gives back what the save holds of its user's limits (at DURABLE or FAILED, or when it is
 * forgotten before that). */
static void save_uncharge(struct save *s)
{
	if (s->blobs)
		blobs_uncharge(s->blobs);
	if (s->counted)
		quota_give(s->uid, QUOTA_SAVES, 1);
	s->counted = 0;
}

/* Drops the references a save sharing a plan's list holds to its sources (save_int.h). */
void save_unshare(struct save *s)
{
	if (s->shared_n)
		tensors_sources_ref(s->tl, s->shared_n, 0);
	s->shared_n = 0;
}

/* After an addition: a list copied on write holds its sources, the save's own go. */
static void save_added(struct save *s, const struct tensors *before)
{
	if (s->tl != before)
		save_unshare(s);
}

/* Frees a save's client-side description. */
static void save_free(struct save *s)
{
	save_uncharge(s);
	save_unshare(s);
	tensors_unref(s->tl);
	blobs_free(s->blobs);
	free(s->hdr);
	if (s->out)
		store_file_abort(s->out);
	if (s->dirfd >= 0)
		close(s->dirfd);
	if (s->job)
		engine_job_free(s->job);
	if (s->level == LEVEL_NONE && dropped)	/* its file gone, its directory may go */
		dropped(s->uid, &s->dirid);
	free(s);
}

/* Unlinks and frees a save (one still open for adding: abandoned, a bad SAVE_ADD). */
void save_drop(struct save *s)
{
	for (struct save **p = &saves; *p; p = &(*p)->next) {
		if (*p == s) {
			*p = s->next;
			break;
		}
	}
	save_free(s);
}

/* Registers a function told of every change of a save's level (loop thread, at start-up). */
void save_observe(save_change_cb cb)
{
	if (nobservers == MAX_OBSERVERS) {
		log_error("save_observe: more than %d observers", MAX_OBSERVERS);
		abort();	/* a broken invariant of the wiring in main.c */
	}
	observers[nobservers++] = cb;
}

/* Registers what opens a SAVE_BEGIN's directory, and whom a save dropped unended tells. */
void save_open_with(save_dir_cb cb, save_drop_cb drop)
{
	open_dir = cb;
	dropped = drop;
}

/* Moves s to level (or FAILED with code and error) and tells the observers. */
static void set_level(struct save *s, int level, int code, const char *error)
{
	if (s->level == LEVEL_FAILED)
		return;
	s->level = level;
	s->t_change = now_mono();
	if (level == LEVEL_FAILED || level >= LEVEL_DURABLE)
		save_uncharge(s);
	if (level == LEVEL_FAILED) {
		s->code = code < 0 ? code : ERR_EFAILED;
		snprintf(s->error, sizeof(s->error), "%s", error ? error : "unknown error");
		log_warnx("save %llu (%s/%s, rank %u) failed: %s", (unsigned long long)s->id,
			  s->dir, s->file, s->rank, s->error);
	} else {
		log_debug("save %llu (%s/%s) %s", (unsigned long long)s->id, s->dir, s->file,
			  level_name(level));
	}
	waiter_publish(WAITER_SAVE, s->id, level);
	for (unsigned i = 0; i < nobservers; i++)
		observers[i](s);
}

/* Engine events, on the loop thread. */
static void on_engine(void *owner, struct job *j, int event, int code, const char *error)
{
	struct save *s = owner;

	switch (event) {
	case ENGINE_SNAPSHOT:
		engine_release_sources(j);	/* a source its client let go of closes now */
		if (s->level == LEVEL_ACCEPTED)
			set_level(s, LEVEL_SNAPSHOT, 0, NULL);
		return;
	case ENGINE_DURABLE:
	case ENGINE_FAILED:
		engine_progress(j, &s->snap, &s->flushed);
		const uint8_t *hdr = event == ENGINE_DURABLE ?
			engine_header(j, &s->hdr_len, &s->size) : NULL;
		if (hdr && (s->hdr = malloc(s->hdr_len)))
			memcpy(s->hdr, hdr, s->hdr_len);
		s->job = NULL;
		engine_job_free(j);
		if (event == ENGINE_DURABLE) {
			log_info("save %llu durable: %s/%s.safetensors, %llu bytes in %.3f s",
				 (unsigned long long)s->id, s->dir, s->file,
				 (unsigned long long)tensors_bytes(s->tl), now_mono() - s->t_accept);
			set_level(s, LEVEL_DURABLE, 0, NULL);
		} else {
			set_level(s, LEVEL_FAILED, code, error);
		}
		return;
	}
}

/* Starts the engine with this module's event handler. */
int save_engine_start(const struct daemon *d, char *err, size_t errlen)
{
	daemon_ctx = d;
	return engine_start(d->loop, d->cache, d->config->copy_threads, d->config->flush_threads,
			    on_engine, err, errlen);
}

/* Opens a save for o (auth_check'ed for AUTH_SAVE by the caller). */
int64_t save_begin(const struct owner *o, const char *dir, const char *file, char *err,
		   size_t errlen)
{
	char d[PROTO_MAX_STR + 1];

	if (!store_valid_file(file)) {
		snprintf(err, errlen,
			 "file name '%s' must be 1-128 characters of [A-Za-z0-9._-], not "
			 "starting with '.'", file);
		return ERR_EINVAL;
	}
	store_norm_dir(d, sizeof(d), dir);
	int rc = quota_take(o->uid, QUOTA_SAVES, 1, err, errlen);
	if (rc < 0)
		return rc;
	struct store_root root;
	struct store_dirid id;
	/* The tag, or another version of it (overwrite.c: its staging directory). */
	const struct config *c = daemon_ctx->config;
	int fd = open_dir ? open_dir(c, d, sizeof(d), o, &root, &id, err, errlen) :
			    store_open_dir(c, d, o->uid, o->gid, &root, err, errlen);
	if (!open_dir && fd >= 0 && (rc = store_dir_id(fd, &id, err, errlen)) < 0) {
		close(fd);
		fd = rc;
	}
	/* Saves in flight and seals are this directory's (its identity, not its name): a
	 * directory removed and made again is a new one, whatever was left in the old. */
	for (struct save *s = fd >= 0 ? saves : NULL; s; s = s->next) {
		int busy = s->level == LEVEL_NONE || s->level == LEVEL_ACCEPTED ||
			   s->level == LEVEL_SNAPSHOT;
		if (busy && store_dirid_eq(&s->dirid, &id) && strcmp(s->file, file) == 0) {
			close(fd);
			fd = err_set(err, errlen, ERR_EBUSY, "%s/%s is already being saved (a "
				     "tag's next version begins after this rank's seal of it: seal, "
				     "or wait for that save, first)", d, file);
			break;
		}
	}
	char name[160];
	struct store_file *out = NULL;
	snprintf(name, sizeof(name), "%s.safetensors", file);
	if (fd >= 0 && (rc = store_file_create(fd, name, o->uid, o->gid, c->file_mode,
					       c->o_direct, &out, err, errlen)) < 0) {
		close(fd);
		fd = rc;
	}
	if (fd < 0) {
		quota_give(o->uid, QUOTA_SAVES, 1);
		return fd;
	}
	struct save *s = calloc(1, sizeof(*s));
	if (s && (!(s->blobs = blobs_new(o->uid)) || !(s->tl = tensors_new(o->uid)))) {
		blobs_free(s->blobs);
		free(s);
		s = NULL;
	}
	if (!s) {
		store_file_abort(out);
		quota_give(o->uid, QUOTA_SAVES, 1);
		close(fd);
		return err_set(err, errlen, ERR_ENOMEM, "out of memory");
	}
	s->out = out;
	s->counted = 1;
	s->id = next_save_id++;
	s->client = o->conn;
	s->pid = o->pid;
	s->uid = o->uid;
	s->gid = o->gid;
	snprintf(s->jobname, sizeof(s->jobname), "%s", o->job);
	s->rank = o->rank;
	s->world = o->world;
	snprintf(s->run, sizeof(s->run), "%s", o->run);
	snprintf(s->dir, sizeof(s->dir), "%s", d);
	s->dirid = id;
	snprintf(s->file, sizeof(s->file), "%s", file);
	s->dirfd = fd;
	s->root = root;
	s->t_change = now_mono();
	s->next = saves;
	saves = s;
	return (int64_t)s->id;
}

/* Finds a save of this client (a connection id) by id. */
struct save *save_find(uint64_t client, uint64_t id)
{
	for (struct save *s = saves; s; s = s->next)
		if (s->id == id && s->client == client)
			return s;
	return NULL;
}

/* Finds a save of this client still open for adding. */
struct save *save_find_open(uint64_t client, uint64_t id)
{
	struct save *s = save_find(client, id);
	return s && s->level == LEVEL_NONE ? s : NULL;
}

/* Adds a tensor to an open save. */
int save_add_tensor(struct save *s, const char *name, const char *dtype,
		    const uint64_t *shape, unsigned ndim, struct source *src, uint64_t off,
		    uint64_t nbytes, char *err, size_t errlen)
{
	const struct tensors *before = s->tl;
	int rc = tensors_add(&s->tl, name, dtype, shape, ndim, src, off, nbytes, err, errlen);

	save_added(s, before);
	return rc;
}

/* Makes room for n more tensors at once (best effort). */
void save_reserve(struct save *s, size_t n)
{
	const struct tensors *before = s->tl;

	tensors_reserve(&s->tl, n);
	save_added(s, before);
}

/* Adds a plan's tensors to an open save (the first ones: by sharing its list). */
int save_add_plan(struct save *s, struct tensors *plan, char *err, size_t errlen)
{
	const struct tensors *before = s->tl;
	int shared, rc = tensors_append(&s->tl, plan, &shared, err, errlen);

	if (shared)
		s->shared_n = tensors_count(plan);
	else
		save_added(s, before);
	return rc;
}

/* Appends to a named blob. */
int save_add_blob(struct save *s, const char *name, const void *data, size_t len, char *err,
		  size_t errlen)
{
	return blobs_add(s->blobs, name, data, len, err, errlen);
}

/* Totals so far. */
void save_totals(struct save *s, uint64_t *tensors, uint64_t *bytes)
{
	*tensors = tensors_count(s->tl);
	*bytes = tensors_bytes(s->tl);
}

/* Drops what a request the engine did not take holds of its tensors' description. */
static void req_drop_tensors(struct engine_req *r)
{
	if (r->lent) {
		tensors_lent_drop(r->lent, r->n, 1);
		tensors_lent_drop(r->lent, r->n, 0);
	} else if (r->t) {
		source_refs(&r->t[0].src, r->n, sizeof(r->t[0]), 0);
		free(r->t);
	}
}

/* Plans the file and submits it to the engine; the header is laid out by a flush thread. */
int save_end(struct save *s, struct cuda_fence *fence, char *err, size_t errlen)
{
	size_t n = tensors_count(s->tl);
	struct engine_req r = {.n = n, .dirfd = -1, .uid = s->uid, .gid = s->gid,
			       .mode = daemon_ctx->config->file_mode, .root = s->root,
			       .fence = fence, .owner = s};
	char name[160];
	int rc = ERR_ENOMEM;

	if ((rc = store_dir_within(s->dirfd, &s->root, err, errlen)) < 0)
		goto fail;
	rc = ERR_ENOMEM;
	if (blobs_count(s->blobs) > 0) {
		snprintf(name, sizeof(name), "%s" FMT_META, s->file);
		if (!(r.meta_name = strdup(name)) ||
		    blobs_pack(s->blobs, &r.meta_bytes, &r.meta_len) < 0) {
			err_set(err, errlen, rc, "out of memory");
			goto fail;
		}
		r.meta_xxh3 = s->origin.meta_xxh3;
	}
	s->origin = (struct st_origin){.version = DSCKPTD_VERSION, .job = s->jobname,
				       .host = store_host(), .run = s->run};
	r.nmeta = st_origin_pairs(&s->origin, s->rank, s->world,
				  r.meta_name ? (int64_t)r.meta_len : -1);
	r.meta = s->origin.pairs;
	r.st = tensors_header(s->tl);	/* lent to the job: the save keeps the list */
	if (s->shared_n && (r.t = tensors_lend(s->tl))) {	/* a plan's list does not change */
		r.lent = s->tl;
		r.lent_drop = tensors_lent_drop;
	} else if ((r.t = malloc((n ? n : 1) * sizeof(*r.t))))
		tensors_give(s->tl, r.t);
	if (!r.st || !r.t) {
		err_set(err, errlen, rc, "out of memory");
		goto fail;
	}
	r.file = s->out;	/* made at SAVE_BEGIN */
	s->out = NULL;
	r.dirfd = s->dirfd;
	r.res = resident_begin(s->dir, s->file, s->uid, tensors_bytes(s->tl));
	if ((rc = engine_submit(&r, &s->job, err, errlen)) < 0) {
		store_file_abort(r.file);
		resident_drop(r.res);
		goto fail;
	}
	/* Ownership: sources, file, directory, fence and resident copy went to the engine. */
	save_unshare(s);
	tensors_release(s->tl);
	s->dirfd = -1;
	s->t_accept = now_mono();
	s->level = LEVEL_ACCEPTED;
	s->t_change = s->t_accept;
	blobs_clear(s->blobs);	/* their bytes went to the engine as the .meta file's */
	log_debug("save %llu accepted: %s/%s, %zu tensors, %llu bytes",
		  (unsigned long long)s->id, s->dir, s->file, n,
		  (unsigned long long)tensors_bytes(s->tl));
	return 0;
fail:
	if (fence)
		cuda_fence_free(fence);
	req_drop_tensors(&r);
	free(r.meta_name);
	free(r.meta_bytes);
	return rc;
}

/* A save's id, level, directory and client. */
uint64_t save_id(const struct save *s) { return s->id; }
int save_level(const struct save *s) { return s->level; }
const char *save_dir(const struct save *s) { return s->dir; }
uint64_t save_client(const struct save *s) { return s->client; }

/* Keeps s from being forgotten until save_release (a WAIT in progress). */
void save_hold(struct save *s)
{
	s->holds++;
}

/* Undoes one save_hold. */
void save_release(struct save *s)
{
	s->holds--;
}

/* Fills v with what a reply or a listing shows of s, progress as of now. */
void save_view(const struct save *s, struct save_view *v)
{
	double now = now_mono();

	v->id = s->id;
	v->client = s->client;
	v->pid = s->pid;
	v->uid = s->uid;
	v->job = s->jobname;
	v->run = s->run;
	v->rank = s->rank;
	v->dir = s->dir;
	v->dirid = s->dirid;
	v->file = s->file;
	v->hdr = s->hdr;
	v->hdr_len = s->hdr_len;
	v->size = s->size;
	v->level = s->level;
	v->code = s->level == LEVEL_FAILED ? s->code : 0;
	v->error = s->level == LEVEL_FAILED ? s->error : NULL;
	v->bytes_total = s->slim ? s->bytes : tensors_bytes(s->tl);
	v->kept = s->slim;
	v->bytes_snapshot = s->snap;
	v->bytes_flushed = s->flushed;
	if (s->job)
		engine_progress(s->job, &v->bytes_snapshot, &v->bytes_flushed);
	v->settled = s->settled;
	v->copies = s->copies;
	v->replicas = s->replicas;
	v->copies_why = s->settled && s->copies < s->replicas ? s->copies_why : NULL;
	v->remote_why = s->remote_why[0] ? s->remote_why : NULL;
	v->age_s = now - s->t_accept;
	v->busy_s = (s->job ? now : s->t_change) - s->t_accept;
}

/* The save after s in the registry (the first for NULL); NULL at the end. */
struct save *save_next(const struct save *s)
{
	return s ? s->next : saves;
}

/* Saves in flight (accepted, not yet durable or failed). */
unsigned save_inflight(void)
{
	unsigned n = 0;
	for (struct save *s = saves; s; s = s->next)
		n += s->job != NULL;
	return n;
}

/* Moves s to level, a level it reaches (save_marks.c: one a directory's saves reach
 * together); a FAILED save stays FAILED. */
void save_set_level(struct save *s, int level)
{
	set_level(s, level, 0, NULL);
}

/* Records on s that copies of replicas peers hold its node's files (why: why no more). */
void save_set_copies(struct save *s, unsigned copies, unsigned replicas, const char *why)
{
	s->settled = 1;
	s->copies = copies;
	s->replicas = replicas;
	snprintf(s->copies_why, sizeof(s->copies_why), "%s", why ? why : "");
}

/* Records on s that it will never be REMOTE, and why (save_marks.c). */
void save_set_remote_why(struct save *s, const char *why)
{
	snprintf(s->remote_why, sizeof(s->remote_why), "%s", why);
}

/* Frees every save (shutdown, once nothing is in flight and nothing holds one). */
void save_free_all(void)
{
	while (saves)
		save_drop(saves);
}
