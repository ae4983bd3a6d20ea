/*
 * save.c — one file being saved: where each tensor's bytes come from (a dsckpt_host_alloc
 * block without a copy or GPU memory through its own transport (entries.c), else a copy in a
 * staging arena (stage.c)), and the SAVE_BEGIN / SAVE_ADD / SAVE_END / WAIT requests. A
 * save's GPU tensors are all on one GPU: SAVE_END carries one event.
 *
 * add_tensor validates a tensor, places its bytes and encodes its SAVE_ADD entry; add_blob
 * holds small blobs (BLOB_HELD in all) for the last request; save_end sends the encoded
 * entries in as few SAVE_ADD frames as fit and then SAVE_END with the rest (entries.c), so
 * that a save costs two round trips and a copy of the encoded entries. A deferred save
 * (DSCKPT_SAVE_DEFER) sends its SAVE_BEGIN only when a frame needs the save's id; when
 * everything fits one frame, that SAVE_BEGIN ends the save too: one round trip. An early save
 * (DSCKPT_SAVE_EARLY) posts its SAVE_BEGIN at once and reads the reply at save_end (or with
 * the connection's next request), so the daemon makes the directory and the file while the
 * caller adds tensors; save_end then sends one SAVE_END. Arguments
 * are checked first (check.c), and each tensor or blob name is allowed once (names.c).
 * Waiting for a level is save_wait.c's.
 */
#include "save_int.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BLOB_PIECE ((size_t)4 << 20)
#define BLOB_HELD ((size_t)1 << 20)   /* blob bytes held for the last request */

/* Save serials are unique in the process. */
static _Atomic uint64_t next_serial = 1;

/* Packs SAVE_BEGIN's dir and file into o, a map of extra more keys. */
static void pack_begin(struct proto_out *o, const char *dir, const char *file, uint32_t extra)
{
	msgpack_pack_map(&o->pk, 2 + extra);
	proto_kv_str(&o->pk, "dir", dir);
	proto_kv_str(&o->pk, "file", file);
}

/* Sends SAVE_BEGIN for dir/file and reads the save's id (lock held). */
static int send_begin(dsckpt_conn_t *c, const char *dir, const char *file, uint64_t *id)
{
	struct proto_out o;
	struct lib_reply r;
	int e;

	lib_conn_frame(c, &o, PROTO_SAVE_BEGIN);
	pack_begin(&o, dir, file, 0);
	if ((e = lib_conn_call(c, &o, NULL, 0, &r)) < 0)
		return e;
	proto_get_u64(&r.m, "save", UINT64_MAX, id, 1);
	return lib_reply_end(c, &r, "SAVE_BEGIN");
}

/* Takes a posted SAVE_BEGIN's reply: the save's id, or the failure, kept for the save's
 * next call. */
static void took_begin(dsckpt_conn_t *c, int e, struct lib_reply *r, void *arg)
{
	dsckpt_save_t *s = arg;

	s->early = 0;
	if (e == 0) {
		proto_get_u64(&r->m, "save", UINT64_MAX, &s->id, 1);
		e = lib_reply_end(c, r, "SAVE_BEGIN");
	}
	if (e < 0) {
		s->state = SAVE_BROKEN;
		s->refused = e;
		s->refusal = strdup(lib_conn_error(c));
	}
}

/* Posts SAVE_BEGIN for s (lock held): its reply is read later (took_begin). */
static int post_begin(dsckpt_conn_t *c, const char *dir, const char *file, dsckpt_save_t *s)
{
	struct proto_out o;

	lib_conn_frame(c, &o, PROTO_SAVE_BEGIN);
	pack_begin(&o, dir, file, 0);
	int e = lib_conn_post(c, &o, took_begin, s);
	s->early = e == 0;
	return e;
}

/* Opens a save of dir/file (SAVE_BEGIN now, posted now, or with the first request when
 * deferred). */
int dsckpt_save_begin_flags(dsckpt_conn_t *c, const char *dir, const char *file,
			    unsigned flags, dsckpt_save_t **out)
{
	dsckpt_save_t *s;
	int e;

	if (!c || !out)
		return DSCKPT_EINVAL;
	*out = NULL;
	if ((flags & ~(DSCKPT_SAVE_DEFER | DSCKPT_SAVE_EARLY)) ||
	    flags == (DSCKPT_SAVE_DEFER | DSCKPT_SAVE_EARLY)) {
		lib_conn_lock(c);
		e = lib_conn_fail(c, DSCKPT_EINVAL, "save flags 0x%x: DSCKPT_SAVE_DEFER or "
				  "DSCKPT_SAVE_EARLY, not both and nothing else", flags);
		lib_conn_unlock(c);
		return e;
	}
	s = calloc(1, sizeof(*s));
	if (!s)
		return DSCKPT_ENOMEM;
	s->serial = atomic_fetch_add(&next_serial, 1);
	lib_conn_lock(c);
	if ((e = lib_check_dir(c, dir)) < 0 || (e = lib_check_file(c, file)) < 0)
		goto fail;
	if (lib_conn_world(c) == 0) {
		e = lib_conn_fail(c, DSCKPT_ESTATE, "dsckpt_identify must come before saving");
		goto fail;
	}
	if (flags & DSCKPT_SAVE_DEFER) {
		if (!(s->dir = strdup(dir)) || !(s->file = strdup(file))) {
			e = lib_conn_fail(c, DSCKPT_ENOMEM, "out of memory");
			goto fail;
		}
	} else if (flags & DSCKPT_SAVE_EARLY) {
		if ((e = post_begin(c, dir, file, s)) < 0)
			goto fail;
	} else if ((e = send_begin(c, dir, file, &s->id)) < 0) {
		goto fail;
	}
	lib_entries_init(&s->es);
	msgpack_sbuffer_init(&s->held);
	msgpack_packer_init(&s->hpk, &s->held, msgpack_sbuffer_write);
	s->c = c;
	lib_conn_unlock(c);
	lib_conn_ref(c);
	*out = s;
	return 0;

fail:
	lib_conn_unlock(c);
	free(s->dir);
	free(s->file);
	free(s);
	return e;
}

/* Opens a save of dir/file (SAVE_BEGIN). */
int dsckpt_save_begin(dsckpt_conn_t *c, const char *dir, const char *file,
		      dsckpt_save_t **out)
{
	return dsckpt_save_begin_flags(c, dir, file, 0, out);
}

/* Sends a deferred save's SAVE_BEGIN, if not sent yet (lock held); a refusal breaks the
 * save. */
static int save_begun(dsckpt_save_t *s)
{
	if (!s->dir)
		return 0;
	int e = send_begin(s->c, s->dir, s->file, &s->id);
	free(s->dir);
	free(s->file);
	s->dir = s->file = NULL;
	if (e < 0)
		s->state = SAVE_BROKEN;
	return e;
}

/* Fails a call on a save that is not open. */
static int save_not_open(dsckpt_save_t *s)
{
	if (s->refusal)		/* an early SAVE_BEGIN's refusal, told each time */
		return lib_conn_fail(s->c, s->refused, "%s", s->refusal);
	return lib_conn_fail(s->c, DSCKPT_ESTATE, s->state == SAVE_ENDED
			     ? "the save has already ended" : "the save failed earlier");
}

/* Takes the connection's lock for a call that needs the save open; DSCKPT_ESTATE if it is
 * not (the lock is held either way). */
static int save_enter(dsckpt_save_t *s)
{
	lib_conn_lock(s->c);
	return s->state == SAVE_OPEN ? 0 : save_not_open(s);
}

/*
 * Adds one tensor by reference (lock held): validated, its bytes placed, and its SAVE_ADD
 * entry encoded now, so that save_end only has to frame the encoded entries.
 */
static int save_add_one(dsckpt_save_t *s, const dsckpt_tensor_t *t)
{
	char why[LIB_ERRLEN];
	uint64_t region = 0, offset = 0;
	int e;

	if (s->state != SAVE_OPEN)
		return save_not_open(s);
	if ((e = lib_check_tensor(t->name, t->dtype, t->shape, t->ndim, t->ptr, t->nbytes, why,
				  sizeof(why))) < 0)
		return lib_conn_fail(s->c, e, "%s", why);
	if (lib_names_has(&s->tnames, t->name))
		return lib_conn_fail(s->c, DSCKPT_EEXIST, "tensor %s is already in the save",
				     t->name);
	if ((e = lib_conn_check_tensors(s->c, "a save", s->es.n + 1)) < 0)
		return e;
	if ((e = lib_entries_place(s->c, &s->es, t->ptr, t->nbytes, NULL, &region,
				   &offset)) < 0)
		return e;
	if (e == 0 &&
	    (e = lib_stage_copy(s->c, &s->stages, t->ptr, t->nbytes, &region, &offset)) < 0)
		return e;
	if (!lib_names_add(&s->tnames, t->name))
		return lib_conn_fail(s->c, DSCKPT_ENOMEM, "out of memory");
	return lib_entries_add(s->c, &s->es, t, region, offset);
}

/* Adds a tensor by reference. */
int dsckpt_add_tensor(dsckpt_save_t *s, const char *name, const char *dtype,
		      const int64_t *shape, int ndim, const void *ptr, size_t nbytes)
{
	dsckpt_tensor_t t = {name, dtype, shape, ndim, ptr, nbytes};
	int e;

	if (!s)
		return DSCKPT_EINVAL;
	lib_conn_lock(s->c);
	e = save_add_one(s, &t);
	lib_conn_unlock(s->c);
	return e;
}

/* Adds n tensors under one lock; stops at the first that fails. */
int dsckpt_add_tensors(dsckpt_save_t *s, const dsckpt_tensor_t *tensors, size_t n,
		       size_t *added)
{
	size_t i = 0;
	int e = 0;

	if (added)
		*added = 0;
	if (!s || (!tensors && n))
		return DSCKPT_EINVAL;
	lib_conn_lock(s->c);
	/* More than the daemon takes: refused before any is staged or sent. */
	if (s->state == SAVE_OPEN)
		e = lib_conn_check_tensors(s->c, "a save", s->es.n + n);
	for (; i < n && e == 0; i++)
		e = save_add_one(s, &tensors[i]);
	lib_conn_unlock(s->c);
	if (added)
		*added = e < 0 && i ? i - 1 : i;
	return e;
}

/* Adds a plan's tensors: the plan is checked (and sent anew when memory changed under it)
 * now; its id goes with the save's first frame at save_end. */
int dsckpt_add_plan(dsckpt_save_t *s, dsckpt_plan_t *p)
{
	int e;

	if (!s || !p)
		return DSCKPT_EINVAL;
	if ((e = save_enter(s)) < 0)
		goto out;
	if (lib_plan_conn(p) != s->c)
		e = lib_conn_fail(s->c, DSCKPT_EINVAL, "the plan belongs to another connection");
	else if (s->plan)
		e = lib_conn_fail(s->c, DSCKPT_EEXIST, "the save has a plan already");
	else
		e = lib_plan_use(p, &s->es, s->serial, &s->plan);
out:
	lib_conn_unlock(s->c);
	return e;
}

/* Starts the driver queries of dsckpt_add_plan(s, p) on a thread of the library. */
int dsckpt_plan_prepare(dsckpt_save_t *s, dsckpt_plan_t *p)
{
	int e;

	if (!s || !p)
		return DSCKPT_EINVAL;
	if ((e = save_enter(s)) == 0) {
		if (lib_plan_conn(p) != s->c)
			e = lib_conn_fail(s->c, DSCKPT_EINVAL, "the plan belongs to another "
					  "connection");
		else if (!s->plan)
			lib_plan_prepare(p, s->serial);
	}
	lib_conn_unlock(s->c);
	return e;
}

/* Packs one blob map {name, data} (a piece of it) into pk. */
static void pack_blob(msgpack_packer *pk, const char *name, const void *data, size_t len)
{
	msgpack_pack_map(pk, 2);
	proto_kv_str(pk, "name", name);
	proto_kv_bin(pk, "data", len ? data : (const void *)"", len);
}

/* Sends the held blobs in a SAVE_ADD of their own (lock held, the save begun). */
static int send_held(dsckpt_save_t *s)
{
	struct proto_out o;

	if (s->nheld == 0)
		return 0;
	lib_conn_frame(s->c, &o, PROTO_SAVE_ADD);
	msgpack_pack_map(&o.pk, 2);
	proto_kv_u64(&o.pk, "save", s->id);
	proto_key(&o.pk, "blobs");
	msgpack_pack_array(&o.pk, s->nheld);
	msgpack_sbuffer_write(&o.sb, s->held.data, s->held.size);
	s->nheld = 0;
	s->held.size = 0;
	return lib_entries_call(s->c, &o, "SAVE_ADD");
}

/* Attaches a named blob: held for the last request when small enough, else sent now (after
 * the held ones, keeping their order), in pieces of at most BLOB_PIECE bytes. */
int dsckpt_add_blob(dsckpt_save_t *s, const char *name, const void *data, size_t len)
{
	char why[LIB_ERRLEN];
	size_t off = 0;
	int e;

	if (!s)
		return DSCKPT_EINVAL;
	if ((e = save_enter(s)) < 0)
		goto out;
	if ((e = lib_check_blob(name, data, len, why, sizeof(why))) < 0) {
		lib_conn_fail(s->c, e, "%s", why);
		goto out;
	}
	if (lib_names_has(&s->bnames, name)) {
		e = lib_conn_fail(s->c, DSCKPT_EEXIST, "blob %s is already in the save", name);
		goto out;
	}
	if (!lib_names_add(&s->bnames, name)) {
		e = lib_conn_fail(s->c, DSCKPT_ENOMEM, "out of memory");
		goto out;
	}
	if (s->held.size + len <= BLOB_HELD) {
		pack_blob(&s->hpk, name, data, len);
		s->nheld++;
		goto out;
	}
	if ((e = save_begun(s)) < 0)
		goto out;
	if ((e = send_held(s)) < 0) {
		s->state = SAVE_BROKEN;   /* the daemon may hold some of the blobs */
		goto out;
	}
	do {
		struct proto_out o;
		size_t n = len - off < BLOB_PIECE ? len - off : BLOB_PIECE;
		lib_conn_frame(s->c, &o, PROTO_SAVE_ADD);
		msgpack_pack_map(&o.pk, 2);
		proto_kv_u64(&o.pk, "save", s->id);
		proto_key(&o.pk, "blobs");
		msgpack_pack_array(&o.pk, 1);
		pack_blob(&o.pk, name, (const uint8_t *)data + off, n);
		if ((e = lib_entries_call(s->c, &o, "SAVE_ADD")) < 0) {
			s->state = SAVE_BROKEN;   /* the daemon may hold part of the blob */
			goto out;
		}
		off += n;
	} while (off < len);
out:
	lib_conn_unlock(s->c);
	return e;
}

/* Names the stream whose work writes the save's GPU tensors. */
int dsckpt_save_set_stream(dsckpt_save_t *s, void *stream)
{
	if (!s)
		return DSCKPT_EINVAL;
	int e = save_enter(s);
	if (e == 0)
		s->stream = stream;
	lib_conn_unlock(s->c);
	return e;
}

/* Sends the plan ahead of the tensors when they need SAVE_ADD frames of their own, so that
 * the daemon takes the plan's tensors first (lock held). */
static int save_send_plan(dsckpt_save_t *s)
{
	struct proto_out o;

	if (!s->plan || lib_entries_fit(&s->es))
		return 0;
	lib_conn_frame(s->c, &o, PROTO_SAVE_ADD);
	msgpack_pack_map(&o.pk, 2);
	proto_kv_u64(&o.pk, "save", s->id);
	proto_kv_u64(&o.pk, "plan", s->plan);
	int e = lib_entries_call(s->c, &o, "SAVE_ADD");
	s->plan = 0;
	return e;
}

/* Packs the held blobs, when there are any, into o. */
static void pack_held(const dsckpt_save_t *s, struct proto_out *o)
{
	if (s->nheld == 0)
		return;
	proto_key(&o->pk, "blobs");
	msgpack_pack_array(&o->pk, s->nheld);
	msgpack_sbuffer_write(&o->sb, s->held.data, s->held.size);
}

/*
 * Hands the save to the daemon: the buffered tensors, then SAVE_END (or, for a deferred save
 * that fits one frame, SAVE_BEGIN with end) with the rest of them and the held blobs, and the
 * event recorded on the save's stream right before it when the save has GPU tensors.
 */
int dsckpt_save_end(dsckpt_save_t *s)
{
	uint8_t event[64], uuid[16];
	struct proto_out o;
	struct lib_reply r;
	int64_t level = 0;
	size_t last = 0;
	int e;

	if (!s)
		return DSCKPT_EINVAL;
	lib_conn_lock(s->c);
	if (s->early)
		lib_conn_settle(s->c);
	if (s->state != SAVE_OPEN) {
		e = save_not_open(s);
		goto out;
	}
	int whole = s->dir && lib_entries_fit(&s->es);   /* one SAVE_BEGIN does it all */
	if ((e = lib_conn_sweep(s->c)) < 0 || (!whole && (e = save_begun(s)) < 0) ||
	    (!whole && (e = save_send_plan(s)) < 0) ||
	    (!whole && (e = lib_entries_send(s->c, &s->es, PROTO_SAVE_ADD, "save", s->id,
					     &last)) < 0))
		goto fail;
	if (s->es.gpu >= 0 && (e = lib_cuda_record(s->c, s->es.gpu, s->es.gpu_ctx, s->stream,
						   event, uuid)) < 0)
		goto fail;
	uint32_t keys = (s->es.gpu >= 0 ? 2 : 0) + (last < s->es.n) + (s->plan != 0) +
		(s->nheld != 0);
	if (whole) {
		lib_conn_frame(s->c, &o, PROTO_SAVE_BEGIN);
		pack_begin(&o, s->dir, s->file, keys + 1);
		proto_kv_bool(&o.pk, "end", 1);
	} else {
		lib_conn_frame(s->c, &o, PROTO_SAVE_END);
		msgpack_pack_map(&o.pk, keys + 1);
		proto_kv_u64(&o.pk, "save", s->id);
	}
	if (s->plan)
		proto_kv_u64(&o.pk, "plan", s->plan);
	lib_entries_pack_rest(&s->es, &o, last);
	pack_held(s, &o);
	if (s->es.gpu >= 0) {
		proto_kv_bin(&o.pk, "event", event, sizeof(event));
		proto_kv_bin(&o.pk, "uuid", uuid, sizeof(uuid));
	}
	if ((e = lib_conn_call(s->c, &o, NULL, 0, &r)) < 0)
		goto fail;
	if (whole)
		proto_get_u64(&r.m, "save", UINT64_MAX, &s->id, 1);
	proto_get_i64(&r.m, "level", DSCKPT_FAILED, DSCKPT_COMMITTED, &level, 1);
	if ((e = lib_reply_end(s->c, &r, whole ? "SAVE_BEGIN" : "SAVE_END")) < 0)
		goto fail;
	s->state = SAVE_ENDED;
	goto out;
fail:
	s->state = SAVE_BROKEN;
out:
	if (s->dir && s->state != SAVE_OPEN) {   /* a deferred save whose request went */
		free(s->dir);
		free(s->file);
		s->dir = s->file = NULL;
	}
	lib_conn_unlock(s->c);
	return e;
}

/* Frees the handle and its staging arenas; the daemon keeps going. */
void dsckpt_save_free(dsckpt_save_t *s)
{
	if (!s)
		return;
	lib_conn_lock(s->c);
	if (s->early)
		lib_conn_settle(s->c);
	if (s->state == SAVE_OPEN && !s->dir && lib_conn_alive(s->c)) {
		/* Never handed over: let the daemon forget it now rather than at disconnect. */
		struct proto_out o;
		lib_conn_frame(s->c, &o, PROTO_SAVE_ABORT);
		msgpack_pack_map(&o.pk, 1);
		proto_kv_u64(&o.pk, "save", s->id);
		lib_conn_call_empty(s->c, &o, NULL, 0, "SAVE_ABORT");
	}
	lib_stage_free(s->c, &s->stages);	/* none left once a reply said SNAPSHOT */
	lib_conn_unlock(s->c);
	lib_conn_unref(s->c);
	lib_entries_free(&s->es);
	lib_names_free(&s->tnames);
	lib_names_free(&s->bnames);
	msgpack_sbuffer_destroy(&s->held);
	free(s->dir);
	free(s->file);
	free(s->refusal);
	free(s);
}
