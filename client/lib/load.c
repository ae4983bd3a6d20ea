/*
 * load.c — one file being loaded (restored) into the caller's tensors: where each destination
 * lies for the daemon (a dsckpt_host_alloc block or GPU memory as is (entries.c), else a
 * staging arena (stage.c) the daemon writes into and dsckpt_load_wait copies out), and the
 * LOAD_BEGIN / LOAD_ADD / LOAD_END / LOAD_WAIT / LOAD_ABORT requests.
 *
 * add_tensors validates each destination (check.c), places it and encodes its LOAD_ADD entry;
 * load_end sends the entries in as few LOAD_ADD frames as fit and then LOAD_END, as save_end
 * does. Names, dtypes and shapes are the daemon's to compare with the file: it reports every
 * mismatch at LOAD_END, before writing a byte. Like a save, a load needs dsckpt_identify.
 *
 * States: OPEN (adding) -> ENDED (the daemon fills the destinations) -> LOADED or FAILED,
 * final: the daemon forgets the load once it has reported either, so later waits repeat
 * the outcome kept here. BROKEN: a request of the open load failed and the daemon dropped it.
 * Every field is guarded by the connection's lock.
 */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SOURCE_MAX 7

enum load_state { LOAD_OPEN, LOAD_ENDED, LOAD_LOADED, LOAD_FAILED, LOAD_BROKEN };

/* A staged destination: n bytes at src (in an arena) go to dst once the load is LOADED. */
struct load_out {
	void *dst;
	const void *src;
	size_t n;
	size_t entry;     /* the index of its LOAD_ADD entry */
};

struct dsckpt_load {
	dsckpt_conn_t *c;          /* holds a reference */
	uint64_t id;               /* the daemon's load id */
	enum load_state state;
	char source[SOURCE_MAX + 1];   /* "cache" or "file", from LOAD_BEGIN */
	struct lib_entries es;     /* the LOAD_ADD tensor entries */
	struct lib_stages stages;  /* destinations the library did not allocate, staged */
	struct load_out *outs;
	size_t nouts, capouts;
	void *stream;              /* from dsckpt_load_set_stream, when has_stream */
	int has_stream;
	uint64_t total, done;      /* bytes the load fills, and in place as last reported */
	int cause;                 /* FAILED: the daemon's code */
	char error[LIB_ERRLEN];    /* FAILED: the daemon's words */
};

/* Reads LOAD_BEGIN's reply into l: its id and source (the file's totals are not kept). */
static int load_begin_reply(dsckpt_load_t *l, struct lib_reply *r)
{
	uint64_t tensors, bytes, cached;

	proto_get_u64(&r->m, "load", UINT64_MAX, &l->id, 1);
	proto_get_str(&r->m, "source", l->source, SOURCE_MAX, 1);
	proto_get_u64(&r->m, "tensors", UINT64_MAX, &tensors, 1);
	proto_get_u64(&r->m, "bytes", UINT64_MAX, &bytes, 1);
	proto_get_u64(&r->m, "bytes_cached", UINT64_MAX, &cached, 1);
	if (!r->m.err && strcmp(l->source, "cache") != 0 && strcmp(l->source, "file") != 0 &&
	    strcmp(l->source, "remote") != 0 && strcmp(l->source, "peer") != 0)
		proto_map_fail(&r->m, "source '%s' is not cache, file, remote or peer", l->source);
	return lib_reply_end(l->c, r, "LOAD_BEGIN");
}

/* Opens a load of dir/file (LOAD_BEGIN). */
int dsckpt_load_begin(dsckpt_conn_t *c, const char *dir, const char *file,
		      dsckpt_load_t **out)
{
	struct proto_out o;
	struct lib_reply r;
	dsckpt_load_t *l;
	int e;

	if (!c || !out)
		return DSCKPT_EINVAL;
	*out = NULL;
	l = calloc(1, sizeof(*l));
	if (!l)
		return DSCKPT_ENOMEM;
	l->c = c;
	lib_conn_lock(c);
	if ((e = lib_check_dir(c, dir)) < 0 || (e = lib_check_file(c, file)) < 0)
		goto fail;
	if (lib_conn_world(c) == 0) {
		e = lib_conn_fail(c, DSCKPT_ESTATE, "dsckpt_identify must come before loading");
		goto fail;
	}
	lib_conn_frame(c, &o, PROTO_LOAD_BEGIN);
	msgpack_pack_map(&o.pk, 2);
	proto_kv_str(&o.pk, "dir", dir);
	proto_kv_str(&o.pk, "file", file);
	if ((e = lib_conn_call(c, &o, NULL, 0, &r)) < 0 || (e = load_begin_reply(l, &r)) < 0)
		goto fail;
	lib_conn_unlock(c);
	lib_conn_ref(c);
	lib_entries_init(&l->es);
	*out = l;
	return 0;

fail:
	lib_conn_unlock(c);
	free(l);
	return e;
}

/* Where the daemon takes the bytes from. */
const char *dsckpt_load_source(const dsckpt_load_t *l)
{
	return l ? l->source : "file";
}

/* Fails a call that needs the load open (lock held). */
static int load_not_open(dsckpt_load_t *l)
{
	return lib_conn_fail(l->c, DSCKPT_ESTATE, l->state == LOAD_BROKEN
			     ? "the load failed earlier" : "the load has already ended");
}

/* Places a destination the library did not allocate in a staging arena (*at), with room
 * kept for its copy-out record (lock held). */
static int load_stage(dsckpt_load_t *l, const dsckpt_tensor_t *t, uint64_t *region,
		      uint64_t *offset, void **at)
{
	struct load_out *outs = lib_grow(l->outs, &l->capouts, l->nouts, sizeof(*outs));

	if (!outs)
		return lib_conn_fail(l->c, DSCKPT_ENOMEM, "out of memory");
	l->outs = outs;
	return lib_stage_alloc(l->c, &l->stages, t->nbytes, region, offset, at);
}

/*
 * Names one destination (lock held): validated, placed, its LOAD_ADD entry encoded. A staged
 * one is recorded for the copy-out only once its entry is, so that a failed add never has
 * the arena's bytes copied over the caller's memory.
 */
static int load_add_one(dsckpt_load_t *l, const dsckpt_tensor_t *t)
{
	char why[LIB_ERRLEN];
	uint64_t region = 0, offset = 0;
	void *at = NULL;
	int e;

	if (l->state != LOAD_OPEN)
		return load_not_open(l);
	if ((e = lib_check_tensor(t->name, t->dtype, t->shape, t->ndim, t->ptr, t->nbytes, why,
				  sizeof(why))) < 0)
		return lib_conn_fail(l->c, e, "%s", why);
	if ((e = lib_entries_place(l->c, &l->es, t->ptr, t->nbytes, NULL, &region,
				   &offset)) < 0)
		return e;
	if (e == 0 && (e = load_stage(l, t, &region, &offset, &at)) < 0)
		return e;
	if ((e = lib_entries_add(l->c, &l->es, t, region, offset)) < 0)
		return e;
	if (at && t->nbytes > 0)
		l->outs[l->nouts++] = (struct load_out){(void *)t->ptr, at, t->nbytes, l->es.n - 1};
	l->total += t->nbytes;
	return 0;
}

/* Undoes the last n tensors added, t: their entries, copy-outs and bytes (lock held). */
static void load_undo(dsckpt_load_t *l, const dsckpt_tensor_t *t, size_t n)
{
	size_t keep = l->es.n - n;

	lib_entries_truncate(&l->es, keep);
	while (l->nouts > 0 && l->outs[l->nouts - 1].entry >= keep)
		l->nouts--;
	for (size_t i = 0; i < n; i++)
		l->total -= t[i].nbytes;
}

/*
 * Names where n tensors of the file go, under one lock; stops at the first that fails. The
 * REGION_ADDs of new destinations are posted in one batch and their replies read at the
 * end: when the daemon refused one, the tensors from the first that needed it on are undone
 * and that one is reported, by name.
 */
int dsckpt_load_add_tensors(dsckpt_load_t *l, const dsckpt_tensor_t *tensors, size_t n,
			    size_t *added)
{
	char why[LIB_ERRLEN];
	struct lib_batch b;
	size_t i = 0;
	int e = 0;

	if (added)
		*added = 0;
	if (!l || (!tensors && n))
		return DSCKPT_EINVAL;
	lib_conn_lock(l->c);
	lib_conn_batch_open(l->c, &b);
	for (; i < n && e == 0 && !b.failed; i++) {
		b.tag = i;
		e = load_add_one(l, &tensors[i]);
	}
	size_t ok = e < 0 ? i - 1 : i;
	int refused = lib_conn_batch_close(l->c, &b);
	if (refused < 0) {
		load_undo(l, tensors + b.err_tag, ok - b.err_tag);
		snprintf(why, sizeof(why), "%s", lib_conn_error(l->c));
		e = lib_conn_fail(l->c, refused, "tensor %s: %s", tensors[b.err_tag].name, why);
		ok = b.err_tag;
	}
	lib_conn_unlock(l->c);
	if (added)
		*added = ok;
	return e;
}

/* Names the stream whose queued work still uses the GPU destinations. */
int dsckpt_load_set_stream(dsckpt_load_t *l, void *stream)
{
	if (!l)
		return DSCKPT_EINVAL;
	lib_conn_lock(l->c);
	int e = l->state == LOAD_OPEN ? 0 : load_not_open(l);
	if (e == 0) {
		l->stream = stream;
		l->has_stream = 1;
	}
	lib_conn_unlock(l->c);
	return e;
}

/*
 * Starts the load: the encoded destinations, then LOAD_END, with the event recorded on the
 * load's stream right before it when it has one and GPU destinations. A refusal (every
 * mismatch named in the daemon's message) leaves the load BROKEN: the daemon dropped it.
 */
int dsckpt_load_end(dsckpt_load_t *l)
{
	uint8_t event[64], uuid[16];
	struct proto_out o;
	struct lib_reply r;
	int64_t level = 0;
	size_t last = 0;
	int ev, e;

	if (!l)
		return DSCKPT_EINVAL;
	lib_conn_lock(l->c);
	if (l->state != LOAD_OPEN) {
		e = load_not_open(l);
		goto out;
	}
	ev = l->has_stream && l->es.gpu >= 0;
	if ((e = lib_conn_sweep(l->c)) < 0 ||
	    (e = lib_entries_send(l->c, &l->es, PROTO_LOAD_ADD, "load", l->id, &last)) < 0)
		goto fail;
	if (ev && (e = lib_cuda_record(l->c, l->es.gpu, l->es.gpu_ctx, l->stream, event,
				       uuid)) < 0)
		goto fail;
	lib_conn_frame(l->c, &o, PROTO_LOAD_END);
	msgpack_pack_map(&o.pk, (ev ? 3 : 1) + (last < l->es.n));
	proto_kv_u64(&o.pk, "load", l->id);
	lib_entries_pack_rest(&l->es, &o, last);
	if (ev) {
		proto_kv_bin(&o.pk, "event", event, sizeof(event));
		proto_kv_bin(&o.pk, "uuid", uuid, sizeof(uuid));
	}
	if ((e = lib_conn_call(l->c, &o, NULL, 0, &r)) < 0)
		goto fail;
	proto_get_i64(&r.m, "level", DSCKPT_ACCEPTED, DSCKPT_ACCEPTED, &level, 1);
	if ((e = lib_reply_end(l->c, &r, "LOAD_END")) < 0)
		goto fail;
	l->state = LOAD_ENDED;
	goto out;
fail:
	l->state = LOAD_BROKEN;
out:
	lib_conn_unlock(l->c);
	return e;
}

/* Sends LOAD_WAIT {load, timeout_ms}; the level reached in *level, the progress and, for a
 * FAILED load, the daemon's reason kept in l (lock held). */
static int load_query(dsckpt_load_t *l, int timeout_ms, int64_t *level)
{
	char source[SOURCE_MAX + 1], error[PROTO_MAX_STR + 1] = "";
	struct proto_out o;
	struct lib_reply r;
	uint64_t id = 0, total = 0, done = 0;
	int64_t cause = 0;
	int e;

	lib_conn_frame(l->c, &o, PROTO_LOAD_WAIT);
	msgpack_pack_map(&o.pk, 2);
	proto_kv_u64(&o.pk, "load", l->id);
	proto_kv_i64(&o.pk, "timeout_ms", timeout_ms < 0 ? -1 : timeout_ms);
	if ((e = lib_conn_call(l->c, &o, NULL, 0, &r)) < 0)
		return e;
	proto_get_u64(&r.m, "load", UINT64_MAX, &id, 1);
	proto_get_i64(&r.m, "level", DSCKPT_FAILED, DSCKPT_LOADED, level, 1);
	proto_get_str(&r.m, "source", source, SOURCE_MAX, 1);
	proto_get_u64(&r.m, "bytes_total", UINT64_MAX, &total, 1);
	proto_get_u64(&r.m, "bytes_done", UINT64_MAX, &done, 1);
	proto_get_i64(&r.m, "code", INT32_MIN, 0, &cause, 0);
	proto_get_str(&r.m, "error", error, PROTO_MAX_STR, 0);
	if (id != l->id)
		proto_map_fail(&r.m, "reply names load %" PRIu64 ", not %" PRIu64, id, l->id);
	if (*level == DSCKPT_NONE)
		proto_map_fail(&r.m, "level 0 for a load that has ended");
	if ((e = lib_reply_end(l->c, &r, "LOAD_WAIT")) < 0)
		return e;
	l->total = total;
	l->done = done;
	l->cause = (int)cause;
	snprintf(l->error, sizeof(l->error), "%s", error);
	return 0;
}

/* Repeats the outcome of a FAILED load for dsckpt_last_error and dsckpt_last_cause. */
static int load_failed(dsckpt_load_t *l)
{
	lib_conn_fail(l->c, DSCKPT_EFAILED, "%s", *l->error ? l->error : "load failed");
	lib_conn_set_cause(l->c, l->cause);
	return DSCKPT_EFAILED;
}

/* Copies the staged destinations out (the load is LOADED) and lets go of the arenas. */
static void load_finish(dsckpt_load_t *l, enum load_state state)
{
	if (state == LOAD_LOADED)
		for (size_t i = 0; i < l->nouts; i++)
			memcpy(l->outs[i].dst, l->outs[i].src, l->outs[i].n);
	lib_stage_free(l->c, &l->stages);
	l->state = state;
}

/*
 * Waits until the load is LOADED or FAILED, or timeout_ms passes. Staged destinations are
 * copied out here, under the connection's lock, before DSCKPT_LOADED is returned.
 */
int dsckpt_load_wait(dsckpt_load_t *l, int timeout_ms)
{
	int64_t level = 0;
	struct lib_wait w;
	int e, last = 1, again;

	if (!l)
		return DSCKPT_EINVAL;
	lib_wait_start(&w, timeout_ms);
	do {
		again = 0;
		lib_conn_lock(l->c);
		if (l->state == LOAD_OPEN)
			e = lib_conn_fail(l->c, DSCKPT_ESTATE, "dsckpt_load_end must come first");
		else if (l->state == LOAD_BROKEN)
			e = lib_conn_fail(l->c, DSCKPT_ESTATE, "the load failed before it started");
		else if (l->state == LOAD_ENDED &&
			 (e = load_query(l, lib_wait_slice(&w, &last), &level)) < 0)
			;
		else if (l->state == LOAD_ENDED && level == DSCKPT_ACCEPTED && !last)
			again = 1;
		else if (l->state == LOAD_ENDED && level == DSCKPT_ACCEPTED)
			e = lib_conn_fail(l->c, DSCKPT_ETIMEDOUT, "load still running after %d ms: %"
					  PRIu64 " of %" PRIu64 " bytes in place", timeout_ms,
					  l->done, l->total);
		else {
			if (l->state == LOAD_ENDED)
				load_finish(l, level == DSCKPT_LOADED ? LOAD_LOADED : LOAD_FAILED);
			e = l->state == LOAD_LOADED ? DSCKPT_LOADED : load_failed(l);
		}
		lib_conn_unlock(l->c);
	} while (again);
	return e;
}

/* Bytes the load fills and in place, as last reported. */
void dsckpt_load_progress(const dsckpt_load_t *l, uint64_t *total, uint64_t *done)
{
	uint64_t t = 0, d = 0;

	if (l) {
		lib_conn_lock(l->c);
		t = l->total;
		d = l->state == LOAD_LOADED ? l->total : l->done;
		lib_conn_unlock(l->c);
	}
	if (total)
		*total = t;
	if (done)
		*done = d;
}

/* Frees the handle and its staging arenas; a load never ended is aborted. */
void dsckpt_load_free(dsckpt_load_t *l)
{
	if (!l)
		return;
	lib_conn_lock(l->c);
	if (l->state == LOAD_OPEN && lib_conn_alive(l->c)) {
		/* Never started: let the daemon forget it now rather than at disconnect. */
		struct proto_out o;
		lib_conn_frame(l->c, &o, PROTO_LOAD_ABORT);
		msgpack_pack_map(&o.pk, 1);
		proto_kv_u64(&o.pk, "load", l->id);
		lib_conn_call_empty(l->c, &o, NULL, 0, "LOAD_ABORT");
	}
	lib_stage_free(l->c, &l->stages);
	lib_conn_unlock(l->c);
	lib_conn_unref(l->c);
	lib_entries_free(&l->es);
	free(l->outs);
	free(l);
}
