/* commit.c — dsckpt_seal and dsckpt_commit: the SEAL and COMMIT requests that complete a
 * checkpoint directory for the whole job (a save is save.c's; these name only the directory). */
#include "internal.h"

/* Takes the connection's lock for a request about the directory dir (what: "commit",
 * "seal"); 0, or an error (the lock is let go then). */
static int commit_enter(dsckpt_conn_t *c, const char *dir, const char *what)
{
	int e;

	if (!c)
		return DSCKPT_EINVAL;
	lib_conn_lock(c);
	if ((e = lib_check_dir(c, dir)) == 0 && lib_conn_world(c) == 0)
		e = lib_conn_fail(c, DSCKPT_ESTATE, "dsckpt_identify must come before %s", what);
	if (e < 0)
		lib_conn_unlock(c);
	return e;
}

/* One COMMIT whose wait for durability lasts at most timeout_ms (lock held). */
static int commit_once(dsckpt_conn_t *c, const char *dir, int timeout_ms)
{
	char tag[PROTO_MAX_STR + 1];
	struct proto_out o;
	struct lib_reply r;
	int64_t level;
	uint64_t files, bytes;
	int e;

	lib_conn_frame(c, &o, PROTO_COMMIT);
	msgpack_pack_map(&o.pk, 3);
	proto_kv_str(&o.pk, "dir", dir);
	proto_kv_u64(&o.pk, "world", (uint64_t)lib_conn_world(c));
	proto_kv_i64(&o.pk, "timeout_ms", timeout_ms);
	if ((e = lib_conn_call(c, &o, NULL, 0, &r)) < 0)
		return e;
	proto_get_i64(&r.m, "level", DSCKPT_COMMITTED, DSCKPT_COMMITTED, &level, 1);
	proto_get_str(&r.m, "tag", tag, PROTO_MAX_STR, 1);
	proto_get_u64(&r.m, "files", UINT64_MAX, &files, 1);
	proto_get_u64(&r.m, "bytes", UINT64_MAX, &bytes, 1);
	return lib_reply_end(c, &r, "COMMIT");
}

/*
 * Commits the checkpoint directory (COMMIT), holding the connection a slice at a time as
 * waits do: a COMMIT that timed out waiting for durability wrote nothing (the daemon times a
 * commit out only before it starts writing), so the next slice simply asks again.
 */
int dsckpt_commit(dsckpt_conn_t *c, const char *dir, int timeout_ms)
{
	struct lib_wait w;
	int e, last;

	lib_wait_start(&w, timeout_ms);
	do {
		if ((e = commit_enter(c, dir, "commit")) < 0)
			return e;
		e = commit_once(c, dir, lib_wait_slice(&w, &last));
		lib_conn_unlock(c);
	} while (e == DSCKPT_ETIMEDOUT && !last);
	return e;
}

/* Seals the checkpoint directory for this rank (SEAL): 1 when it is committed already. */
int dsckpt_seal(dsckpt_conn_t *c, const char *dir)
{
	struct proto_out o;
	struct lib_reply r;
	int committed = 0, e;

	if ((e = commit_enter(c, dir, "seal")) < 0)
		return e;
	lib_conn_frame(c, &o, PROTO_SEAL);
	msgpack_pack_map(&o.pk, 1);
	proto_kv_str(&o.pk, "dir", dir);
	if ((e = lib_conn_call(c, &o, NULL, 0, &r)) < 0)
		goto out;
	proto_get_bool(&r.m, "committed", &committed, 1);
	if ((e = lib_reply_end(c, &r, "SEAL")) == 0)
		e = committed != 0;
out:
	lib_conn_unlock(c);
	return e;
}
