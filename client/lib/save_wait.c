/*
 * save_wait.c — a save's levels after SAVE_END: WAIT asked a slice at a time (so that other
 * threads' requests on the connection get their turn), its progress, and why a wait ends
 * short: for REPLICATED, how many peers hold the node's files; for REMOTE (or above), a newer
 * version of the tag that replaced this one before its upload ended.
 */
#include "save_int.h"

#include <inttypes.h>

/* What a WAIT's reply says beyond the progress: how many peers hold the node's copies of a
 * save's tag, once the daemon sent them (copies, replicas and copies_error), and a code and
 * error beside a level that is not FAILED (why the save will never go above it). */
struct save_extra {
	uint64_t copies, replicas;    /* replicas 0: not sent yet */
	char why[PROTO_MAX_STR + 1];  /* copies < replicas: why no more */
	int short_code;               /* not FAILED, yet never a level above it: the code (a */
	char short_why[PROTO_MAX_STR + 1];  /* newer version replaced it first), and why */
};

/* Sends WAIT {save, level, timeout_ms} and decodes the progress, the copies held and why a
 * save not FAILED stops short (lock held). */
static int save_query(dsckpt_save_t *s, int level, int timeout_ms, dsckpt_progress_t *p,
		      struct save_extra *cp)
{
	char error[PROTO_MAX_STR + 1] = "";
	struct proto_out o;
	struct lib_reply r;
	uint64_t id = 0;
	int64_t reached = 0, cause = 0;
	int e;

	if (s->state != SAVE_ENDED)
		return lib_conn_fail(s->c, DSCKPT_ESTATE, s->state == SAVE_OPEN
				     ? "dsckpt_save_end must come first"
				     : "the save failed before it was handed over");
	lib_conn_frame(s->c, &o, PROTO_WAIT);
	msgpack_pack_map(&o.pk, 3);
	proto_kv_u64(&o.pk, "save", s->id);
	proto_kv_i64(&o.pk, "level", level);
	proto_kv_i64(&o.pk, "timeout_ms", timeout_ms < 0 ? -1 : timeout_ms);
	if ((e = lib_conn_call(s->c, &o, NULL, 0, &r)) < 0)
		return e;
	proto_get_u64(&r.m, "save", UINT64_MAX, &id, 1);
	proto_get_i64(&r.m, "level", DSCKPT_FAILED, DSCKPT_REPLICATED, &reached, 1);
	proto_get_u64(&r.m, "bytes_total", UINT64_MAX, &p->bytes_total, 1);
	proto_get_u64(&r.m, "bytes_snapshot", UINT64_MAX, &p->bytes_snapshot, 1);
	proto_get_u64(&r.m, "bytes_flushed", UINT64_MAX, &p->bytes_flushed, 1);
	proto_get_str(&r.m, "error", error, PROTO_MAX_STR, 0);
	proto_get_i64(&r.m, "code", INT32_MIN, 0, &cause, 0);
	*cp = (struct save_extra){0};
	proto_get_u64(&r.m, "copies", UINT32_MAX, &cp->copies, 0);
	proto_get_u64(&r.m, "replicas", UINT32_MAX, &cp->replicas, 0);
	proto_get_str(&r.m, "copies_error", cp->why, PROTO_MAX_STR, 0);
	if (id != s->id)
		proto_map_fail(&r.m, "reply names save %" PRIu64 ", not %" PRIu64, id, s->id);
	if ((e = lib_reply_end(s->c, &r, "WAIT")) < 0)
		return e;
	p->level = (int)reached;
	/* From SNAPSHOT the daemon reads its staging memory no more: the next save may. */
	if (reached >= DSCKPT_SNAPSHOT)
		lib_stage_keep(s->c, &s->stages);
	if (reached == DSCKPT_FAILED) {
		lib_conn_fail(s->c, DSCKPT_EFAILED, "%s", *error ? error : "save failed");
		lib_conn_set_cause(s->c, (int)cause);
	} else if (cause < 0) {
		cp->short_code = (int)cause;
		snprintf(cp->short_why, sizeof(cp->short_why), "%s", error);
	}
	return 0;
}

/* Waits until the save reaches level, holding the connection's lock a slice at a time. */
int dsckpt_wait(dsckpt_save_t *s, int level, int timeout_ms)
{
	struct save_extra cp;
	dsckpt_progress_t p;
	struct lib_wait w;
	int e, last, again;

	if (!s)
		return DSCKPT_EINVAL;
	lib_wait_start(&w, timeout_ms);
	do {
		again = 0;
		lib_conn_lock(s->c);
		if (level < DSCKPT_NONE || level > DSCKPT_REPLICATED)
			e = lib_conn_fail(s->c, DSCKPT_EINVAL, "level %d is not in 0..%d", level,
					  DSCKPT_REPLICATED);
		else if ((e = save_query(s, level, lib_wait_slice(&w, &last), &p, &cp)) < 0)
			;
		else if (p.level == DSCKPT_FAILED)
			e = DSCKPT_EFAILED;
		else if (level == DSCKPT_REPLICATED && p.level < level && cp.copies < cp.replicas)
			e = lib_conn_fail(s->c, DSCKPT_EINCOMPLETE, "the save is %s, its node's "
					  "files held by %" PRIu64 " of %" PRIu64 " peers (replicas): %s",
					  dsckpt_level_name(p.level), cp.copies, cp.replicas, cp.why);
		else if (p.level < level && cp.short_code)
			e = lib_conn_fail(s->c, cp.short_code, "the save is %s and will never be %s: "
					  "%s", dsckpt_level_name(p.level), dsckpt_level_name(level),
					  cp.short_why);
		else if (p.level < level && !last)
			again = 1;
		else if (p.level < level)
			e = lib_conn_fail(s->c, DSCKPT_ETIMEDOUT, "save is %s after %d ms, not %s",
					  dsckpt_level_name(p.level), timeout_ms,
					  dsckpt_level_name(level));
		else
			e = p.level;
		lib_conn_unlock(s->c);
	} while (again);
	return e;
}

/* Asks the daemon for the save's progress without waiting (a FAILED save reports -1). */
int dsckpt_save_progress(dsckpt_save_t *s, dsckpt_progress_t *out)
{
	if (!s || !out)
		return DSCKPT_EINVAL;
	lib_conn_lock(s->c);
	struct save_extra cp;
	int e = save_query(s, DSCKPT_NONE, 0, out, &cp);
	lib_conn_unlock(s->c);
	return e;
}
