/*
 * request_load.c — the load messages (LOAD_BEGIN … LOAD_ABORT, PREFETCH, NODES): decoded and
 * checked here, acted on by load.c (NODES: told to peer_nodes.c), answered through reply.c. As
 * for saves, a malformed frame closes the connection and a refused destination abandons the
 * load with an error reply.
 */
#include "request.h"

#include <fcntl.h>
#include <sys/stat.h>

/* LOAD_BEGIN: opens the file and tells what it holds and where its bytes will come from. */
void request_load_begin(struct session *c, const struct proto_hdr *h, struct proto_map *m)
{
	char dir[PROTO_MAX_STR + 1], file[PROTO_MAX_NAME + 1], err[ERRLEN];

	proto_get_str(m, "dir", dir, PROTO_MAX_STR, 1);
	proto_get_str(m, "file", file, PROTO_MAX_NAME, 1);
	if (proto_map_end(m) < 0)
		return request_malformed(c, h, m->why);
	struct owner o = request_owner(c);
	int rc = auth_check(c, AUTH_LOAD, err, sizeof(err));
	if (rc == 0)
		rc = load_begin(&o, h->id, dir, file, err, sizeof(err));
	if (rc < 0)
		return request_error(c, h, rc, "%s", err);
	/* Answered by load.c once the header is parsed. */
}

/* Reads the optional "tensors" of LOAD_ADD/LOAD_END into l; 0, or ERR_EPROTO (m->err set)
 * or a refusal in err (the load abandoned). */
static int add_entries(struct session *c, struct load *l, struct proto_map *m, char *err,
		       size_t errlen)
{
	const msgpack_object_array *tensors = NULL;
	struct proto_tensor t;
	int rc = 0;

	proto_get_array(m, "tensors", &tensors, REQUEST_MAX_ENTRIES, 0);
	for (uint32_t i = 0; !m->err && tensors && i < tensors->size && rc == 0; i++) {
		struct source *dst;
		rc = request_tensor(c, m, &tensors->ptr[i], &t, &dst, err, errlen);
		if (rc == 0)
			rc = load_add_tensor(l, t.name, t.dtype, t.shape, t.ndim, dst, t.offset,
					     t.nbytes, err, errlen);
	}
	if (m->err)
		return ERR_EPROTO;
	return rc;
}

/* Finds the open load id and adds the frame's destinations, ending the map; NULL once
 * answered (malformed frame, unknown load, a refused destination). */
static struct load *open_load_add(struct session *c, const struct proto_hdr *h,
				  struct proto_map *m, uint64_t id)
{
	char err[ERRLEN] = "";

	if (m->err) {
		request_malformed(c, h, m->why);
		return NULL;
	}
	struct load *l = load_find_open(session_id(c), id);
	if (!l) {
		if (proto_map_end(m) < 0)
			request_malformed(c, h, m->why);
		else
			request_error(c, h, ERR_ENOENT, "no open load %llu on this connection",
				      (unsigned long long)id);
		return NULL;
	}
	int rc = add_entries(c, l, m, err, sizeof(err));
	if (m->err || proto_map_end(m) < 0) {
		load_drop(l);
		request_malformed(c, h, m->why);
		return NULL;
	}
	if (rc < 0) {
		load_drop(l);
		request_error(c, h, rc, "%s (load %llu abandoned)", err, (unsigned long long)id);
		return NULL;
	}
	return l;
}

/* LOAD_ADD: destinations. */
void request_load_add(struct session *c, const struct proto_hdr *h, struct proto_map *m)
{
	uint64_t id = 0, n, bytes;

	proto_get_u64(m, "load", UINT64_MAX, &id, 1);
	struct load *l = open_load_add(c, h, m, id);
	if (!l)
		return;
	load_totals(l, &n, &bytes);
	reply_save_totals(session_id(c), h->id, n, bytes);
}

/* LOAD_END: the last destinations, then the load starts (after the client's event). */
void request_load_end(struct session *c, const struct proto_hdr *h, struct proto_map *m)
{
	uint64_t id = 0;
	char err[ERRLEN];
	const void *event = NULL, *uuid = NULL;
	struct cuda_fence *fence = NULL;

	proto_get_u64(m, "load", UINT64_MAX, &id, 1);
	request_fence(m, &event, &uuid);
	struct load *l = open_load_add(c, h, m, id);
	if (!l)
		return;
	int rc;
	if (event &&
	    (rc = cuda_fence_import(session_id(c), uuid, event, &fence, err, sizeof(err))) < 0) {
		load_drop(l);
		return request_error(c, h, rc, "%s (load %llu abandoned)", err,
				     (unsigned long long)id);
	}
	if ((rc = load_end(l, fence, err, sizeof(err))) < 0)
		return request_error(c, h, rc, "%s", err);
	reply_save_accepted(session_id(c), h->id);
}

/* LOAD_WAIT: answered when the load is done, fails or time is up. */
void request_load_wait(struct session *c, const struct proto_hdr *h, struct proto_map *m)
{
	uint64_t id = 0;
	int64_t timeout = -1;

	proto_get_u64(m, "load", UINT64_MAX, &id, 1);
	proto_get_i64(m, "timeout_ms", INT32_MIN, INT32_MAX, &timeout, 1);
	if (proto_map_end(m) < 0)
		return request_malformed(c, h, m->why);
	struct load *l = load_find(session_id(c), id);
	if (!l || load_find_open(session_id(c), id))
		return request_error(c, h, l ? ERR_ESTATE : ERR_ENOENT,
				     l ? "load %llu was not ended" : "no load %llu on this connection",
				     (unsigned long long)id);
	load_wait(l, h->id, timeout);
}

/* LOAD_ABORT: forgets a load that was never ended. */
void request_load_abort(struct session *c, const struct proto_hdr *h, struct proto_map *m)
{
	uint64_t id = 0;

	proto_get_u64(m, "load", UINT64_MAX, &id, 1);
	if (proto_map_end(m) < 0)
		return request_malformed(c, h, m->why);
	struct load *l = load_find_open(session_id(c), id);
	if (!l)
		return request_error(c, h, ERR_ENOENT, "no open load %llu on this connection",
				     (unsigned long long)id);
	load_drop(l);
	reply_empty(session_id(c), h->id);
}

static void request_nodes(struct session *c, const struct proto_hdr *h, struct proto_map *m,
			  const struct config *cfg);

/* PREFETCH: a tag (or a job's latest) into the local tier and the cache; answered by
 * prefetch.c once the tag is known, or once it is in place when the client waits. NODES
 * comes here too (request.c's one line for both; cfg is for its path). */
void request_prefetch(struct session *c, const struct proto_hdr *h, struct proto_map *m,
		      const struct config *cfg)
{
	char dir[PROTO_MAX_STR + 1], tag[PROTO_MAX_NAME + 1] = "", err[ERRLEN];
	int wait = 0;

	if (h->type == PROTO_NODES)
		return request_nodes(c, h, m, cfg);

	proto_get_str(m, "dir", dir, PROTO_MAX_STR, 1);
	proto_get_str(m, "tag", tag, PROTO_MAX_NAME, 0);
	proto_get_bool(m, "wait", &wait, 0);
	if (proto_map_end(m) < 0)
		return request_malformed(c, h, m->why);
	struct owner o = request_owner(c);
	int rc = auth_check(c, AUTH_LOAD, err, sizeof(err));
	if (rc == 0)
		rc = prefetch_begin(&o, h->id, dir, tag[0] ? tag : NULL, wait, err, sizeof(err));
	if (rc < 0)
		return request_error(c, h, rc, "%s", err);
}

/* Whether uid may tell the nodes of job directory dir, below an allowed root: it is uid's (or
 * uid is root), or it is not on this node (a replacement's empty disk) and its parent is not
 * another user's (root's is everyone's); 0, or ERR_EACCES / ERR_EINVAL with err. The telling
 * vouches only for uid's own files either way: this answers a user who names another's. The
 * path is walked from its root as a save's is (store_owner_below): nothing outside the
 * allowed roots is looked at, no link followed. */
static int request_nodes_owner(const struct config *cfg, const char *dir, uid_t uid, char *err,
			       size_t errlen)
{
	unsigned missing;
	uid_t owner;
	int rc = store_owner_below(cfg, dir, &owner, &missing, err, errlen);

	if (rc < 0 || uid == 0 || missing > 1 || owner == uid || (missing == 1 && owner == 0))
		return rc;
	return err_set(err, errlen, ERR_EACCES, "%s is another user's directory, or in one: a "
		       "user tells the nodes of its own jobs only", dir);
}

/* NODES: the job of a job directory runs on these daemons' hosts, and this node's ranks of
 * it are these (peer_nodes.c); answered at once. */
static void request_nodes(struct session *c, const struct proto_hdr *h, struct proto_map *m,
			  const struct config *cfg)
{
	char dir[PROTO_MAX_STR + 1], err[ERRLEN] = "";
	const msgpack_object_array *hosts = NULL, *ranks = NULL;
	const char **names = NULL;
	unsigned mine[PEER_NODES_MAX_RANKS], n = 0;
	int rc;

	proto_get_str(m, "dir", dir, PROTO_MAX_STR, 1);
	proto_get_array(m, "nodes", &hosts, PEER_NODES_MAX, 1);
	proto_get_array(m, "ranks", &ranks, PEER_NODES_MAX_RANKS, 1);
	if (!m->err && (names = calloc(hosts->size + 1, sizeof(*names))) == NULL)
		proto_map_fail(m, "out of memory");
	for (uint32_t i = 0; !m->err && i < hosts->size; i++, n++) {
		const msgpack_object *o = &hosts->ptr[i];
		if (o->type != MSGPACK_OBJECT_STR || o->via.str.size == 0 ||
		    o->via.str.size >= STORE_HOST_MAX ||
		    memchr(o->via.str.ptr, '\0', o->via.str.size))
			proto_map_fail(m, "nodes: a host name of 1 to %d bytes", STORE_HOST_MAX - 1);
		else if ((names[i] = strndup(o->via.str.ptr, o->via.str.size)) == NULL)
			proto_map_fail(m, "out of memory");
	}
	for (uint32_t i = 0; !m->err && i < ranks->size; i++) {
		const msgpack_object *o = &ranks->ptr[i];
		if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER || o->via.u64 > UINT32_MAX)
			proto_map_fail(m, "ranks: unsigned integers");
		else
			mine[i] = (unsigned)o->via.u64;
	}
	const char *job = strrchr(dir, '/');
	int bad = proto_map_end(m) < 0;
	if (bad)
		rc = 0;
	else if ((rc = auth_check(c, AUTH_LOAD, err, sizeof(err))) == 0 && !peer_on())
		rc = err_set(err, sizeof(err), ERR_ENOTSUP, "peer copies are off on this node "
			     "(no peer_secret_file)");
	else if (rc == 0 && (dir[0] != '/' || !job || !job[1]))
		rc = err_set(err, sizeof(err), ERR_EINVAL, "%s: not a job directory", dir);
	else if (rc == 0 && (rc = request_nodes_owner(cfg, dir, session_uid(c), err,
							 sizeof(err))) == 0)
		rc = peer_nodes_tell(job + 1, session_uid(c), names, n, mine, ranks->size, err,
				     sizeof(err));
	for (unsigned i = 0; names && i < n; i++)
		free((char *)names[i]);
	free(names);
	if (bad)
		request_malformed(c, h, m->why);
	else if (rc == 0)
		reply_empty(session_id(c), h->id);
	else
		request_error(c, h, rc, "%s", err);
}
