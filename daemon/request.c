/*
 * request.c — the request layer: the connection layer's dispatch and disconnect callbacks.
 * Decodes each request with the typed getters and a final end check, checks it with auth.c, and
 * hands it to the state machines (save.c, wait.c, commit.c) or the client's regions
 * (session.c); every answer goes out through reply.c. A malformed frame gets one EPROTO error
 * and closes its connection; one that cannot be served gets an error reply.
 */
#include "dsckptd.h"
#include "request.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

static const struct daemon *daemon_ctx;  /* request_init's */

/* Hands the layer the daemon it serves (start-up, before the first frame). */
void request_init(const struct daemon *d)
{
	daemon_ctx = d;
}

/* Closes descriptors nobody took. */
static void request_close_fds(int *fds, unsigned nfds)
{
	for (unsigned i = 0; i < nfds; i++)
		if (fds[i] >= 0)
			close(fds[i]);
}

/* HELLO: identifies the client. */
static void on_hello(struct session *c, const struct proto_hdr *h, struct proto_map *m)
{
	char role[16] = "", job[PROTO_MAX_NAME + 1] = "", run[PROTO_MAX_RUN + 1] = "";
	uint64_t rank = 0, world = 1, pid = 0;
	char err[ERRLEN];

	proto_get_str(m, "role", role, sizeof(role) - 1, 1);
	proto_get_str(m, "job", job, PROTO_MAX_NAME, 0);
	proto_get_str(m, "run", run, PROTO_MAX_RUN, 0);
	proto_get_u64(m, "rank", 65535, &rank, 0);
	proto_get_u64(m, "world", 65536, &world, 0);
	proto_get_u64(m, "pid", UINT32_MAX, &pid, 1);
	if (!m->err && strcmp(role, "trainer") != 0 && strcmp(role, "ctl") != 0)
		proto_map_fail(m, "role must be \"trainer\" or \"ctl\"");
	if (!m->err && strcmp(role, "trainer") == 0 && (!*job || world == 0 || rank >= world))
		proto_map_fail(m, "a trainer needs a job name and rank < world");
	for (const char *p = run; !m->err && *p; p++)
		if (*p < 0x20 || *p > 0x7e)
			proto_map_fail(m, "run must be printable ASCII");
	if (proto_map_end(m) < 0)
		return request_malformed(c, h, m->why);
	int rc = auth_check(c, AUTH_HELLO, err, sizeof(err));
	if (rc < 0)
		return request_error(c, h, rc, "%s", err);
	session_set_identity(c, strcmp(role, "trainer") == 0 ? SESSION_TRAINER : SESSION_CTL, job,
			    (unsigned)rank, (unsigned)world, run);
	log_debug("client %llu is %s %s rank %llu/%llu, run '%s' (pid %d, says %llu)",
		  (unsigned long long)session_id(c), role, job, (unsigned long long)rank,
		  (unsigned long long)world, run, (int)session_pid(c), (unsigned long long)pid);
	reply_hello(session_id(c), h->id, daemon_ctx->config->max_tensors_per_save);
}

/* REGION_ADD of a cuda_vmm range: the first frame creates it, later ones continue it. */
static void region_add_vmm(struct session *c, const struct proto_hdr *h, struct proto_map *m,
			   uint64_t region, uint64_t size, const uint8_t *uuid, int *fds,
			   unsigned nfds)
{
	const msgpack_object_array *maps = NULL;
	uint64_t at = 0, sizes[PROTO_MAX_FDS];
	struct source *s;
	char err[ERRLEN];
	int rc;

	proto_get_u64(m, "at", UINT64_MAX, &at, 1);
	proto_get_array(m, "maps", &maps, PROTO_MAX_FDS, 1);
	for (uint32_t i = 0; !m->err && i < maps->size; i++) {
		if (maps->ptr[i].type != MSGPACK_OBJECT_POSITIVE_INTEGER)
			proto_map_fail(m, "maps entries must be unsigned integers");
		else
			sizes[i] = maps->ptr[i].via.u64;
	}
	if (!m->err && (maps->size == 0 || maps->size != nfds))
		proto_map_fail(m, "%u maps need as many descriptors (got %u)", maps->size, nfds);
	if (proto_map_end(m) < 0) {
		request_close_fds(fds, nfds);
		return request_malformed(c, h, m->why);
	}
	s = session_region(c, region);
	if (at == 0) {
		if (s) {
			request_close_fds(fds, nfds);
			return request_error(c, h, ERR_EEXIST,
					  "region %llu already registered",
					  (unsigned long long)region);
		}
		if ((rc = source_cuda_vmm_open(uuid, size, &s, err, sizeof(err))) < 0) {
			request_close_fds(fds, nfds);
			return request_error(c, h, rc, "region %llu: %s",
					  (unsigned long long)region, err);
		}
		if ((rc = session_region_add(c, region, s, err, sizeof(err))) < 0) {
			source_unref(s);
			request_close_fds(fds, nfds);
			return request_error(c, h, rc, "region %llu: %s",
					  (unsigned long long)region, err);
		}
	} else if (!s) {
		request_close_fds(fds, nfds);
		return request_error(c, h, ERR_ENOENT, "no region %llu to continue",
				  (unsigned long long)region);
	}
	/* Ownership: the descriptors go to the source, which closes them on every path. */
	rc = source_cuda_vmm_map(s, uuid, size, at, fds, sizes, nfds, err, sizeof(err));
	if (rc < 0) {
		session_region_del(c, region);	/* a half-mapped range is never used */
		return request_error(c, h, rc, "region %llu: %s", (unsigned long long)region,
				  err);
	}
	reply_empty(session_id(c), h->id);
}

/* REGION_ADD: registers a source of bytes (host memfd, CUDA IPC handle, CUDA VMM fds). */
static void on_region_add(struct session *c, const struct proto_hdr *h, struct proto_map *m,
			  int *fds, unsigned nfds)
{
	uint64_t region = 0, size = 0;
	char kind[16] = "", err[ERRLEN];
	const void *uuid = NULL, *handle = NULL;
	size_t uuid_len = 0, handle_len = 0;
	struct source *s = NULL;
	int rc;

	proto_get_u64(m, "region", UINT64_MAX, &region, 1);
	proto_get_str(m, "kind", kind, sizeof(kind) - 1, 1);
	proto_get_u64(m, "size", UINT64_MAX, &size, 1);
	if (!m->err && strcmp(kind, "host") != 0) {
		proto_get_bin(m, "uuid", &uuid, &uuid_len, 16, 1);
		if (!m->err && uuid_len != 16)
			proto_map_fail(m, "uuid must be 16 bytes");
	}
	if (!m->err && strcmp(kind, "cuda_vmm") == 0)
		return region_add_vmm(c, h, m, region, size, uuid, fds, nfds);
	if (!m->err && strcmp(kind, "cuda_ipc") == 0) {
		proto_get_bin(m, "handle", &handle, &handle_len, 64, 1);
		if (!m->err && handle_len != 64)
			proto_map_fail(m, "handle must be 64 bytes");
		if (!m->err && nfds != 0)
			proto_map_fail(m, "a cuda_ipc region takes no descriptors");
	} else if (!m->err && strcmp(kind, "host") == 0) {
		if (nfds != 1)
			proto_map_fail(m, "a host region comes with exactly one descriptor");
	} else if (!m->err) {
		proto_map_fail(m, "unknown region kind '%s'", kind);
	}
	if (proto_map_end(m) < 0) {
		request_close_fds(fds, nfds);
		return request_malformed(c, h, m->why);
	}
	if (session_region(c, region)) {
		request_close_fds(fds, nfds);
		return request_error(c, h, ERR_EEXIST, "region %llu already registered",
				  (unsigned long long)region);
	}
	if (strcmp(kind, "host") == 0)
		rc = source_host_open(fds[0], size, &s, err, sizeof(err));
	else
		rc = source_cuda_ipc_open(uuid, handle, size, &s, err, sizeof(err));
	if (rc < 0)
		return request_error(c, h, rc, "region %llu: %s", (unsigned long long)region,
				  err);
	if ((rc = session_region_add(c, region, s, err, sizeof(err))) < 0) {
		source_unref(s);
		return request_error(c, h, rc, "region %llu: %s", (unsigned long long)region,
				  err);
	}
	reply_empty(session_id(c), h->id);
}

/* REGION_DEL: forgets a region (accepted saves keep their reference). */
static void on_region_del(struct session *c, const struct proto_hdr *h, struct proto_map *m)
{
	uint64_t region = 0;

	proto_get_u64(m, "region", UINT64_MAX, &region, 1);
	if (proto_map_end(m) < 0)
		return request_malformed(c, h, m->why);
	struct source *src = session_region(c, region);
	if (!src)
		return request_error(c, h, ERR_ENOENT, "no region %llu",
				  (unsigned long long)region);
	plan_forget(session_id(c), src);
	session_region_del(c, region);
	reply_empty(session_id(c), h->id);
}

/* Decodes one tensor entry and adds it; 0, or -1 (malformed, why in m) / error code. */
static int add_tensor(struct session *c, struct save *s, const msgpack_object *obj,
		      struct proto_map *top, char *err, size_t errlen)
{
	struct proto_tensor t;
	struct source *src;
	int rc = request_tensor(c, top, obj, &t, &src, err, errlen);

	if (rc < 0)
		return rc;
	return save_add_tensor(s, t.name, t.dtype, t.shape, t.ndim, src, t.offset, t.nbytes,
			       err, errlen);
}

/* Decodes one blob piece and appends it. */
static int add_blob(struct save *s, const msgpack_object *obj, struct proto_map *top,
		    char *err, size_t errlen)
{
	struct proto_map m;
	char name[PROTO_MAX_NAME + 1];
	const void *data = NULL;
	size_t len = 0;

	proto_map_init(&m, obj);
	proto_get_str(&m, "name", name, PROTO_MAX_NAME, 1);
	proto_get_bin(&m, "data", &data, &len, PROTO_MAX_BODY, 1);
	if (proto_map_end(&m) < 0) {
		proto_map_fail(top, "blob: %s", m.why);
		return -1;
	}
	return save_add_blob(s, name, data, len, err, errlen);
}

/* Adds the tensors of the client's plan id to s; 0 or an error code with err. */
static int add_plan(struct session *c, struct save *s, uint64_t id, char *err, size_t errlen)
{
	struct plan *p = plan_find(session_id(c), id);

	if (!p)
		return err_set(err, errlen, ERR_ENOENT, "no plan %llu on this connection",
			       (unsigned long long)id);
	return save_add_plan(s, plan_tensors(p), err, errlen);
}

/*
 * Reads the optional "plan", "tensors" and "blobs" of SAVE_ADD or SAVE_END and adds them to
 * s, the plan's tensors first. Returns 0, or an error: m->err set for a malformed body, else
 * err set and save abandoned.
 */
static int add_entries(struct session *c, struct save *s, struct proto_map *m, char *err,
		       size_t errlen)
{
	const msgpack_object_array *tensors = NULL, *blobs = NULL;
	uint64_t plan = 0;
	int rc = 0;

	int has_plan = proto_get_u64(m, "plan", UINT64_MAX, &plan, 0);
	proto_get_array(m, "tensors", &tensors, REQUEST_MAX_ENTRIES, 0);
	proto_get_array(m, "blobs", &blobs, REQUEST_MAX_ENTRIES, 0);
	if (!m->err && has_plan > 0)
		rc = add_plan(c, s, plan, err, errlen);
	if (!m->err && rc == 0 && tensors && tensors->size > 1)
		save_reserve(s, tensors->size);
	for (uint32_t i = 0; !m->err && tensors && i < tensors->size && rc == 0; i++)
		rc = add_tensor(c, s, &tensors->ptr[i], m, err, errlen);
	for (uint32_t i = 0; !m->err && blobs && i < blobs->size && rc == 0; i++)
		rc = add_blob(s, &blobs->ptr[i], m, err, errlen);
	if (m->err)
		return ERR_EPROTO;
	if (rc < 0)	/* a save missing part of what the client meant must never be written */
		save_drop(s);
	return rc;
}

/* Finds the open save id and adds the frame's entries, ending the map; NULL once answered
 * (malformed frame, unknown save, or a refused entry that abandoned the save). */
static struct save *open_save_add(struct session *c, const struct proto_hdr *h,
				  struct proto_map *m, uint64_t id)
{
	char err[ERRLEN] = "";

	if (m->err) {
		request_malformed(c, h, m->why);
		return NULL;
	}
	struct save *s = save_find_open(session_id(c), id);
	if (!s) {
		if (proto_map_end(m) < 0)
			request_malformed(c, h, m->why);
		else
			request_error(c, h, ERR_ENOENT, "no open save %llu on this connection",
				   (unsigned long long)id);
		return NULL;
	}
	int rc = add_entries(c, s, m, err, sizeof(err));
	if (m->err || proto_map_end(m) < 0) {
		request_malformed(c, h, m->why);
		return NULL;
	}
	if (rc < 0) {
		metrics_fail(METRIC_SAVES_REFUSED, rc);
		request_error(c, h, rc, "%s (save %llu abandoned)", err, (unsigned long long)id);
		return NULL;
	}
	return s;
}

/* Ends open save s once the frame's entries are added: hands it to the engine, ordered after
 * the client's event if any; 0, or the error code (answered, s dropped). */
static int end_save(struct session *c, const struct proto_hdr *h, struct save *s,
		    const void *event, const void *uuid)
{
	struct cuda_fence *fence = NULL;
	char err[ERRLEN];
	int rc = 0;

	if (event) {
		rc = cuda_fence_import(session_id(c), uuid, event, &fence, err, sizeof(err));
		if (rc < 0) {
			uint64_t id = save_id(s);
			save_drop(s);
			metrics_fail(METRIC_SAVES_REFUSED, rc);
			request_error(c, h, rc, "%s (save %llu abandoned)", err, (unsigned long long)id);
			return rc;
		}
	}
	rc = save_end(s, fence, err, sizeof(err));
	if (rc < 0) {
		save_drop(s);	/* never written: nothing is left for the client to abort */
		metrics_fail(METRIC_SAVES_REFUSED, rc);
		request_error(c, h, rc, "%s", err);
	}
	return rc;
}

/* SAVE_BEGIN: opens a save of dir/file; with end, also adds the frame's entries and ends it
 * (a whole save in one round trip). */
static void on_save_begin(struct session *c, const struct proto_hdr *h, struct proto_map *m)
{
	char dir[PROTO_MAX_STR + 1], file[PROTO_MAX_NAME + 1], err[ERRLEN];
	const void *event = NULL, *uuid = NULL;
	int end = 0;

	proto_get_str(m, "dir", dir, PROTO_MAX_STR, 1);
	proto_get_str(m, "file", file, PROTO_MAX_NAME, 1);
	proto_get_bool(m, "end", &end, 0);
	if (end)
		request_fence(m, &event, &uuid);
	if (m->err || (!end && proto_map_end(m) < 0))
		return request_malformed(c, h, m->why);
	struct owner o = request_owner(c);
	int64_t id = auth_check(c, AUTH_SAVE, err, sizeof(err));
	if (id == 0)
		id = save_begin(&o, dir, file, err, sizeof(err));
	if (id < 0) {
		metrics_fail(METRIC_SAVES_REFUSED, (int)id);
		return request_error(c, h, (int)id, "%s", err);
	}
	if (!end)
		return reply_save_begun(session_id(c), h->id, (uint64_t)id);
	/* A malformed rest is fatal: the connection and with it the save go. */
	struct save *s = open_save_add(c, h, m, (uint64_t)id);
	if (s && end_save(c, h, s, event, uuid) == 0)
		reply_save_ended(session_id(c), h->id, (uint64_t)id);
}

/* SAVE_ADD: tensors and blob pieces. */
static void on_save_add(struct session *c, const struct proto_hdr *h, struct proto_map *m)
{
	uint64_t id = 0, nt, nbytes;

	proto_get_u64(m, "save", UINT64_MAX, &id, 1);
	struct save *s = open_save_add(c, h, m, id);
	if (!s)
		return;
	save_totals(s, &nt, &nbytes);
	reply_save_totals(session_id(c), h->id, nt, nbytes);
}

/* SAVE_END: hands the save to the engine, ordered after the client's event if any. */
static void on_save_end(struct session *c, const struct proto_hdr *h, struct proto_map *m)
{
	uint64_t id = 0;
	const void *event = NULL, *uuid = NULL;

	proto_get_u64(m, "save", UINT64_MAX, &id, 1);
	request_fence(m, &event, &uuid);
	/* The last batch of tensors may come with SAVE_END itself. */
	struct save *s = open_save_add(c, h, m, id);
	if (s && end_save(c, h, s, event, uuid) == 0)
		reply_save_accepted(session_id(c), h->id);
}

/* SAVE_ABORT: forgets a save that was never ended. */
static void on_save_abort(struct session *c, const struct proto_hdr *h, struct proto_map *m)
{
	uint64_t id = 0;

	proto_get_u64(m, "save", UINT64_MAX, &id, 1);
	if (proto_map_end(m) < 0)
		return request_malformed(c, h, m->why);
	struct save *s = save_find_open(session_id(c), id);
	if (!s)
		return request_error(c, h, ERR_ENOENT, "no open save %llu on this connection",
				  (unsigned long long)id);
	save_drop(s);
	reply_empty(session_id(c), h->id);
}

/* WAIT: answers when the level is reached, the save fails or time is up. */
static void on_wait(struct session *c, const struct proto_hdr *h, struct proto_map *m)
{
	uint64_t id = 0;
	int64_t level = 0, timeout = -1;

	proto_get_u64(m, "save", UINT64_MAX, &id, 1);
	proto_get_i64(m, "level", 0, LEVEL_REPLICATED, &level, 1);
	proto_get_i64(m, "timeout_ms", INT32_MIN, INT32_MAX, &timeout, 1);
	if (proto_map_end(m) < 0)
		return request_malformed(c, h, m->why);
	struct save *s = save_find(session_id(c), id);
	if (!s)
		return request_error(c, h, ERR_ENOENT, "no save %llu on this connection",
				     (unsigned long long)id);
	const char *remote = NULL;
	if (level == LEVEL_REMOTE &&
	    (config_root_of(daemon_ctx->config, save_dir(s), &remote) < 0 || !remote))
		return request_error(c, h, ERR_ENOTSUP, "%s is under a root without a remote tier "
				     "(allowed_roots' \"remote\"): it never reaches REMOTE",
				     save_dir(s));
	if (level == LEVEL_REPLICATED && !peer_on())
		return request_error(c, h, ERR_ENOTSUP, "peer copies are off on this node (no "
				     "peer_secret_file, or replicas 0): no save reaches REPLICATED");
	wait_add(session_id(c), h->id, s, (int)level, level == 0 ? 0 : timeout);
}

/* COMMIT: commits a checkpoint directory once its saves are durable. */
static void on_commit(struct session *c, const struct proto_hdr *h, struct proto_map *m)
{
	char dir[PROTO_MAX_STR + 1], err[ERRLEN];
	uint64_t world = 0;
	int64_t timeout = -1;

	proto_get_str(m, "dir", dir, PROTO_MAX_STR, 1);
	proto_get_u64(m, "world", 65536, &world, 1);
	proto_get_i64(m, "timeout_ms", INT32_MIN, INT32_MAX, &timeout, 1);
	if (!m->err && world == 0)
		proto_map_fail(m, "world must be at least 1");
	if (proto_map_end(m) < 0)
		return request_malformed(c, h, m->why);
	int rc = auth_check(c, AUTH_COMMIT, err, sizeof(err));
	if (rc < 0)
		return request_error(c, h, rc, "%s", err);
	struct owner o = request_owner(c);
	char d[PROTO_MAX_STR + 1];
	store_norm_dir(d, sizeof(d), dir);
	struct store_dirid version;	/* a new version's, in flight */
	int staged = overwrite_commit_dir(d, sizeof(d), o.uid, o.run, &version);
	commit_request(&o, h->id, d, (unsigned)world, timeout, staged ? &version : NULL);
}

/* SEAL: this rank saves nothing more into dir; the daemons commit dir once every rank has. */
static void on_seal(struct session *c, const struct proto_hdr *h, struct proto_map *m)
{
	char dir[PROTO_MAX_STR + 1], err[ERRLEN];

	proto_get_str(m, "dir", dir, PROTO_MAX_STR, 1);
	if (proto_map_end(m) < 0)
		return request_malformed(c, h, m->why);
	int rc = auth_check(c, AUTH_SEAL, err, sizeof(err));
	if (rc < 0)
		return request_error(c, h, rc, "%s", err);
	struct owner o = request_owner(c);
	char d[PROTO_MAX_STR + 1];
	store_norm_dir(d, sizeof(d), dir);
	overwrite_seal_dir(d, sizeof(d), o.uid, o.run, o.rank);	/* the version it saved last */
	seal_request(&o, h->id, d);
}

/* STATUS: the daemon at a glance (resident files: this client's user's, all for root). */
static void on_status(struct session *c, const struct proto_hdr *h, struct proto_map *m)
{
	if (proto_map_end(m) < 0)
		return request_malformed(c, h, m->why);
	struct query_status q;
	query_status(&q, session_uid(c));
	reply_status(session_id(c), h->id, &q);
	query_status_free(&q);
}

/* PENDING: the saves the daemon still knows, of this client's user (all of them for root). */
static void on_pending(struct session *c, const struct proto_hdr *h, struct proto_map *m)
{
	if (proto_map_end(m) < 0)
		return request_malformed(c, h, m->why);
	struct query_pending q;
	if (query_pending(&q, session_uid(c)) < 0)
		return request_error(c, h, ERR_ENOMEM, "out of memory listing the saves");
	reply_pending(session_id(c), h->id, &q);
	query_pending_free(&q);
}

/* METRICS: node-wide counters, which name no path or user: any client may read them. */
static void on_metrics(struct session *c, const struct proto_hdr *h, struct proto_map *m)
{
	if (proto_map_end(m) < 0)
		return request_malformed(c, h, m->why);
	struct query_metrics q;
	query_metrics(&q);
	reply_metrics(session_id(c), h->id, &q);
}

/* Handles one frame of a client. */
static void request_handle(struct session *c, const struct proto_hdr *h, const uint8_t *body,
			   int *fds, unsigned nfds)
{
	struct proto_in in;
	struct proto_map m;
	char why[160], err[ERRLEN];
	double t0 = now_mono();

	if (proto_in_parse(&in, body, h->length, why, sizeof(why)) < 0) {
		proto_in_free(&in);
		request_close_fds(fds, nfds);
		return request_malformed(c, h, why);
	}
	proto_map_init(&m, in.root);
	if (h->type != PROTO_REGION_ADD && nfds > 0) {
		request_close_fds(fds, nfds);
		nfds = 0;
		proto_map_fail(&m, "descriptors sent with a message that takes none");
	}
	int rc = h->type == PROTO_HELLO ? 0 : auth_check(c, AUTH_REQUEST, err, sizeof(err));
	if (rc < 0) {
		request_close_fds(fds, nfds);
		reply_fatal(session_id(c), h->id, rc, "%s", err);
	} else {
		switch (h->type) {
		case PROTO_HELLO: on_hello(c, h, &m); break;
		case PROTO_REGION_ADD: on_region_add(c, h, &m, fds, nfds); break;
		case PROTO_REGION_DEL: on_region_del(c, h, &m); break;
		case PROTO_SAVE_BEGIN: on_save_begin(c, h, &m); break;
		case PROTO_SAVE_ADD: on_save_add(c, h, &m); break;
		case PROTO_SAVE_END: on_save_end(c, h, &m); break;
		case PROTO_SAVE_ABORT: on_save_abort(c, h, &m); break;
		case PROTO_WAIT: on_wait(c, h, &m); break;
		case PROTO_COMMIT: on_commit(c, h, &m); break;
		case PROTO_SEAL: on_seal(c, h, &m); break;
		case PROTO_STATUS: on_status(c, h, &m); break;
		case PROTO_PENDING: on_pending(c, h, &m); break;
		case PROTO_METRICS: on_metrics(c, h, &m); break;
		case PROTO_LOAD_BEGIN: request_load_begin(c, h, &m); break;
		case PROTO_LOAD_ADD: request_load_add(c, h, &m); break;
		case PROTO_LOAD_END: request_load_end(c, h, &m); break;
		case PROTO_LOAD_WAIT: request_load_wait(c, h, &m); break;
		case PROTO_LOAD_ABORT: request_load_abort(c, h, &m); break;
		case PROTO_PREFETCH: case PROTO_NODES:
			request_prefetch(c, h, &m, daemon_ctx->config); break;
		case PROTO_PLAN_ADD: request_plan_add(c, h, &m); break;
		case PROTO_PLAN_DEL: request_plan_del(c, h, &m); break;
		default:
			request_close_fds(fds, nfds);
			reply_fatal(session_id(c), h->id, ERR_EPROTO, "unknown message type %u",
				    h->type);
		}
	}
	proto_in_free(&in);
	log_debug("client %llu: %s of %u bytes handled in %.3f ms",
		  (unsigned long long)session_id(c), proto_type_name(h->type), h->length,
		  (now_mono() - t0) * 1e3);
}

/* The connection layer's dispatch callback: one complete frame (its descriptors are ours).
 * A client's state is made at its first frame. */
void request_dispatch(struct conn *conn, const struct proto_hdr *h, const uint8_t *body,
		      int *fds, unsigned nfds)
{
	struct session *c = conn_data(conn);

	if (!c) {
		c = session_new(conn_id(conn), conn_pid(conn), conn_uid(conn), conn_gid(conn));
		if (!c) {
			request_close_fds(fds, nfds);
			reply_fatal(conn_id(conn), h->id, ERR_ENOMEM, "out of memory");
			return;
		}
		conn_set_data(conn, c);
	}
	request_handle(c, h, body, fds, nfds);
}

/* The connection layer's disconnect callback: forgets the client's waits, its saves not yet
 * ended, its imported events and its regions; ended saves and commits go on without it. */
void request_conn_gone(struct conn *conn)
{
	uint64_t id = conn_id(conn);

	waiter_conn_gone(id);	/* first: load_client_gone counts on its LOAD_WAIT gone */
	save_client_gone(id);
	load_client_gone(id);
	plan_forget(id, NULL);
	cuda_fence_forget(id);
	session_free(conn_data(conn));
}
