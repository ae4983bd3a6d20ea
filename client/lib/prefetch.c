/* prefetch.c — dsckpt_prefetch: the PREFETCH request, a checkpoint read into the daemon's
 * cache (pulled from its remote tier first when only that holds it) before it is loaded; and
 * dsckpt_job_nodes: NODES, the job's nodes told before a load, for restores from peers. */
#include "internal.h"

#include <stdio.h>
#include <string.h>

/* Asks the daemon to read dir (or its tag) ahead of a load (see dsckpt.h). */
int dsckpt_prefetch(dsckpt_conn_t *c, const char *dir, const char *tag, int wait,
		    dsckpt_prefetch_info_t *info)
{
	dsckpt_prefetch_info_t got = {0};
	struct proto_out o;
	struct lib_reply r;
	uint64_t ms = 0;
	int e, old;

	if (!c || !dir)
		return DSCKPT_EINVAL;
	lib_conn_lock(c);
	if ((e = lib_check_dir(c, dir)) < 0)
		goto out;
	lib_conn_frame(c, &o, PROTO_PREFETCH);
	msgpack_pack_map(&o.pk, tag ? 3 : 2);
	proto_kv_str(&o.pk, "dir", dir);
	if (tag)
		proto_kv_str(&o.pk, "tag", tag);
	proto_kv_bool(&o.pk, "wait", wait != 0);
	old = lib_conn_timeout(c, -1);	/* a wait lasts as long as the pull */
	if (!wait)
		lib_conn_timeout(c, old);
	e = lib_conn_call(c, &o, NULL, 0, &r);
	lib_conn_timeout(c, old);
	if (e < 0)
		goto out;
	proto_get_str(&r.m, "dir", got.dir, sizeof(got.dir) - 1, 1);
	proto_get_str(&r.m, "tag", got.tag, sizeof(got.tag) - 1, 1);
	proto_get_u64(&r.m, "bytes_pulled", UINT64_MAX, &got.bytes_pulled, 1);
	proto_get_u64(&r.m, "bytes_cached", UINT64_MAX, &got.bytes_cached, 1);
	proto_get_u64(&r.m, "ms", UINT64_MAX, &ms, 1);
	got.seconds = (double)ms / 1e3;
	if ((e = lib_reply_end(c, &r, "PREFETCH")) == 0 && info)
		*info = got;
out:
	lib_conn_unlock(c);
	return e;
}

/* Tells the daemon the job's nodes and this node's ranks of it (see dsckpt.h). */
int dsckpt_job_nodes(dsckpt_conn_t *c, const char *dir, const char *const *hosts, unsigned n,
		     const unsigned *ranks, unsigned nranks)
{
	struct proto_out o;
	struct lib_reply r;
	int e;

	if (!c || !dir || (n && !hosts) || (nranks && !ranks))
		return DSCKPT_EINVAL;
	for (unsigned i = 0; i < n; i++)
		if (!hosts[i])
			return DSCKPT_EINVAL;
	lib_conn_lock(c);
	if ((e = lib_check_dir(c, dir)) < 0)
		goto out;
	lib_conn_frame(c, &o, PROTO_NODES);
	msgpack_pack_map(&o.pk, 3);
	proto_kv_str(&o.pk, "dir", dir);
	proto_key(&o.pk, "nodes");
	msgpack_pack_array(&o.pk, n);
	for (unsigned i = 0; i < n; i++)
		proto_str(&o.pk, hosts[i]);
	proto_key(&o.pk, "ranks");
	msgpack_pack_array(&o.pk, nranks);
	for (unsigned i = 0; i < nranks; i++)
		msgpack_pack_unsigned_int(&o.pk, ranks[i]);
	if ((e = lib_conn_call(c, &o, NULL, 0, &r)) == 0)
		e = lib_reply_end(c, &r, "NODES");
out:
	lib_conn_unlock(c);
	return e;
}
