/* harness_frames.c — raw protocol frames to the test daemon, asserting and not. */
#include "harness_frames.h"

#include <check.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

/* Request id of the next raw frame. */
uint64_t raw_next_id = 1;
/* What the raw exchange in progress tries. */
const char *raw_step = "";

/* Starts a frame of type whose body is a map of nkeys entries. */
void out_map(struct proto_out *o, unsigned type, uint32_t nkeys)
{
	proto_out_init(o, type, raw_next_id++);
	msgpack_pack_map(&o->pk, nkeys);
}

/* Finishes o announcing nfds descriptors, sends it with fds[0..nsend) attached, frees it. */
int raw_send(int fd, struct proto_out *o, unsigned nfds, const int *fds, unsigned nsend)
{
	size_t n = proto_out_finish(o, nfds);
	int rc = proto_send(fd, o->sb.data, n, fds, nsend);
	proto_out_free(o);
	return rc;
}

/* ---- the test process's side: these fail the test ---- */

/* Connects a plain socket to the test daemon. */
int raw_connect(void)
{
	int fd = h_connect(D->socket);
	ck_assert_msg(fd >= 0, "connect: %s", strerror(-fd));
	return fd;
}

/* Reads one frame; returns its type, or a negative errno (-EPIPE: closed). */
int raw_recv(int fd, struct reply *r, int timeout_ms)
{
	int fds[PROTO_MAX_FDS];
	unsigned nfds = 0;
	char why[160] = "";

	memset(r, 0, sizeof(*r));
	int rc = proto_recv(fd, &r->h, &r->body, fds, &nfds, timeout_ms, why, sizeof(why));
	if (rc < 0)
		return rc;
	for (unsigned i = 0; i < nfds; i++)
		close(fds[i]);
	ck_assert_msg(nfds == 0, "the daemon sent descriptors");
	ck_assert_msg(proto_in_parse(&r->in, r->body, r->h.length, why, sizeof(why)) == 0,
		      "reply body: %s", why);
	proto_map_init(&r->m, r->in.root);
	return r->h.type;
}

/* Frees a frame read by raw_recv. */
void reply_free(struct reply *r)
{
	proto_in_free(&r->in);
	free(r->body);
}

/* Reads a REPLY (failing the test on anything else) and returns u64 key of it (0 if none). */
uint64_t raw_expect_reply(int fd, const char *key)
{
	struct reply r;
	uint64_t v = 0;
	int type = raw_recv(fd, &r, 10000);
	ck_assert_msg(type == PROTO_REPLY, "%s: expected REPLY, got %s", raw_step,
		      type < 0 ? strerror(-type) : proto_type_name((unsigned)type));
	if (key)
		ck_assert_msg(proto_get_u64(&r.m, key, UINT64_MAX, &v, 1) == 1, "reply: %s",
			      r.m.why);
	reply_free(&r);
	return v;
}

/* Adds host region id (a 4096-byte memfd) on fd and expects its REPLY. */
void raw_region(int fd, uint64_t id)
{
	struct proto_out o;
	int mfd = memfd_create("raw", MFD_CLOEXEC | MFD_ALLOW_SEALING);

	ck_assert_int_ge(mfd, 0);
	ck_assert_int_eq(ftruncate(mfd, 4096), 0);
	out_map(&o, PROTO_REGION_ADD, 3);
	proto_kv_u64(&o.pk, "region", id);
	proto_kv_str(&o.pk, "kind", "host");
	proto_kv_u64(&o.pk, "size", 4096);
	ck_assert_int_eq(raw_send(fd, &o, 1, &mfd, 1), 0);
	close(mfd);
	raw_expect_reply(fd, NULL);
}

/* Reads an ERROR reply (failing the test on anything else) and returns its code. */
int raw_expect_error(int fd)
{
	struct reply r;
	int64_t code = 0;
	char msg[4097];
	int type = raw_recv(fd, &r, 5000);
	ck_assert_msg(type == PROTO_ERROR, "%s: expected ERROR, got %s", raw_step,
		      type < 0 ? strerror(-type) : proto_type_name((unsigned)type));
	ck_assert_msg(proto_get_i64(&r.m, "code", INT32_MIN, -1, &code, 1) == 1 &&
			      proto_get_str(&r.m, "message", msg, 4096, 1) == 1,
		      "ERROR body: %s", r.m.why);
	ck_assert_msg(msg[0] != 0, "ERROR without a message");
	reply_free(&r);
	return (int)code;
}

/* Sends a valid trainer HELLO and reads its REPLY. */
void raw_hello(int fd)
{
	struct proto_out o;
	out_map(&o, PROTO_HELLO, 5);
	proto_kv_str(&o.pk, "role", "trainer");
	proto_kv_str(&o.pk, "job", "raw");
	proto_kv_u64(&o.pk, "rank", 0);
	proto_kv_u64(&o.pk, "world", 1);
	proto_kv_u64(&o.pk, "pid", (uint64_t)getpid());
	ck_assert_int_eq(raw_send(fd, &o, 0, NULL, 0), 0);
	raw_expect_reply(fd, "client");
}

/* A new connection says HELLO and gets STATUS: the daemon still serves. */
void check_alive(void)
{
	struct proto_out o;
	int fd = raw_connect();

	out_map(&o, PROTO_HELLO, 2);
	proto_kv_str(&o.pk, "role", "ctl");
	proto_kv_u64(&o.pk, "pid", (uint64_t)getpid());
	ck_assert_int_eq(raw_send(fd, &o, 0, NULL, 0), 0);
	raw_expect_reply(fd, "proto");
	out_map(&o, PROTO_STATUS, 0);
	ck_assert_int_eq(raw_send(fd, &o, 0, NULL, 0), 0);
	ck_assert_uint_gt(raw_expect_reply(fd, "cache_total"), 0);
	close(fd);
}

/* ---- for children: nothing here asserts ---- */


/*
 * Reads one frame into res (key: an integer of a REPLY to keep in res->v). Returns 0 for a
 * REPLY, the code of an ERROR, or DSCKPT_EPIPE / DSCKPT_ETIMEDOUT / DSCKPT_EPROTO when no
 * frame came.
 */
int r_recv(int fd, const char *key, struct res *res, int timeout_ms)
{
	struct proto_hdr h;
	struct proto_in in;
	struct proto_map m;
	uint8_t *body = NULL;
	int fds[PROTO_MAX_FDS];
	unsigned nfds = 0;
	char why[160] = "";
	int64_t code = 0;

	memset(res, 0, sizeof(*res));
	int rc = proto_recv(fd, &h, &body, fds, &nfds, timeout_ms, why, sizeof(why));
	for (unsigned i = 0; i < nfds; i++)
		close(fds[i]);
	if (rc < 0) {
		res->type = rc;
		res->code = rc == -ETIMEDOUT ? DSCKPT_ETIMEDOUT
			    : rc == -EPROTO  ? DSCKPT_EPROTO : DSCKPT_EPIPE;
		snprintf(res->msg, sizeof(res->msg), "%s",
			 rc == -ETIMEDOUT ? "no answer in time"
			 : rc == -EPROTO  ? why : "the daemon closed the connection");
		return res->code;
	}
	res->type = h.type;
	if (proto_in_parse(&in, body, h.length, why, sizeof(why)) < 0) {
		proto_in_free(&in);
		free(body);
		res->code = DSCKPT_EPROTO;
		snprintf(res->msg, sizeof(res->msg), "bad body from the daemon: %s", why);
		return res->code;
	}
	if (h.type == PROTO_ERROR) {
		proto_map_init(&m, in.root);
		proto_get_i64(&m, "code", INT32_MIN, 0, &code, 1);
		proto_map_init(&m, in.root);
		proto_get_str(&m, "message", res->msg, sizeof(res->msg) - 1, 0);
		res->code = code ? (int)code : DSCKPT_EPROTO;
	} else if (key) {
		proto_map_init(&m, in.root);
		proto_get_i64(&m, key, INT64_MIN, INT64_MAX, &res->v, 0);
	}
	proto_in_free(&in);
	free(body);
	return res->code;
}

/* Sends o and reads the answer (see r_recv). */
int r_call(int fd, struct proto_out *o, unsigned nfds, const int *fds, const char *key,
	   struct res *res, int timeout_ms)
{
	int rc = raw_send(fd, o, nfds, fds, nfds);
	if (rc < 0) {
		memset(res, 0, sizeof(*res));
		res->type = rc;
		res->code = DSCKPT_EPIPE;
		snprintf(res->msg, sizeof(res->msg), "send: %s", strerror(-rc));
		return res->code;
	}
	return r_recv(fd, key, res, timeout_ms);
}

/* A connection that said HELLO as a trainer of job (rank 0 of 1); the fd, or a negative code. */
int r_trainer(const char *job, struct res *res)
{
	struct proto_out o;
	int fd = h_connect(D->socket);

	if (fd < 0) {
		memset(res, 0, sizeof(*res));
		res->code = DSCKPT_ECONNREFUSED;
		snprintf(res->msg, sizeof(res->msg), "connect: %s", strerror(-fd));
		return res->code;
	}
	out_map(&o, PROTO_HELLO, 5);
	proto_kv_str(&o.pk, "role", "trainer");
	proto_kv_str(&o.pk, "job", job);
	proto_kv_u64(&o.pk, "rank", 0);
	proto_kv_u64(&o.pk, "world", 1);
	proto_kv_u64(&o.pk, "pid", (uint64_t)getpid());
	int rc = r_call(fd, &o, 0, NULL, NULL, res, 10000);
	if (rc < 0) {
		close(fd);
		return rc;
	}
	return fd;
}

/* REGION_ADD of a host region of size bytes backed by mfd (sent, not closed). */
int r_region(int fd, uint64_t region, int mfd, uint64_t size, struct res *res)
{
	struct proto_out o;
	out_map(&o, PROTO_REGION_ADD, 3);
	proto_kv_u64(&o.pk, "region", region);
	proto_kv_str(&o.pk, "kind", "host");
	proto_kv_u64(&o.pk, "size", size);
	return r_call(fd, &o, 1, &mfd, NULL, res, 10000);
}

/* SAVE_BEGIN of dir/file: the save id, or a negative code. */
int64_t r_begin(int fd, const char *dir, const char *file, struct res *res)
{
	struct proto_out o;
	out_map(&o, PROTO_SAVE_BEGIN, 2);
	proto_kv_str(&o.pk, "dir", dir);
	proto_kv_str(&o.pk, "file", file);
	int rc = r_call(fd, &o, 0, NULL, "save", res, 10000);
	return rc < 0 ? rc : res->v;
}

/* Packs one tensor entry [name, "U8", [n], region, offset, n]. */
void pack_u8(msgpack_packer *pk, const char *name, uint64_t region, uint64_t offset,
	     uint64_t n)
{
	proto_pack_tensor(pk, name, "U8", &n, 1, region, offset, n);
}

/* SAVE_END of save with U8 tensor "t" of n bytes from region 1 and, when blob_len, a blob
 * "b" of that many bytes; 0 or a negative code. */
int r_end(int fd, int64_t save, uint64_t n, size_t blob_len, struct res *res)
{
	struct proto_out o;
	out_map(&o, PROTO_SAVE_END, blob_len ? 3 : 2);
	proto_kv_u64(&o.pk, "save", (uint64_t)save);
	proto_key(&o.pk, "tensors");
	msgpack_pack_array(&o.pk, 1);
	pack_u8(&o.pk, "t", 1, 0, n);
	if (blob_len) {
		uint8_t *b = calloc(1, blob_len);
		proto_key(&o.pk, "blobs");
		msgpack_pack_array(&o.pk, 1);
		msgpack_pack_map(&o.pk, 2);
		proto_kv_str(&o.pk, "name", "b");
		proto_kv_bin(&o.pk, "data", b, blob_len);
		free(b);
	}
	return r_call(fd, &o, 0, NULL, "level", res, 10000);
}

/* WAIT for level: the level reached (res->v), or a negative code. */
int r_wait(int fd, int64_t save, int level, int timeout_ms, struct res *res)
{
	struct proto_out o;
	out_map(&o, PROTO_WAIT, 3);
	proto_kv_u64(&o.pk, "save", (uint64_t)save);
	proto_kv_i64(&o.pk, "level", level);
	proto_kv_i64(&o.pk, "timeout_ms", timeout_ms);
	int rc = r_call(fd, &o, 0, NULL, "level", res, timeout_ms + 10000);
	return rc < 0 ? rc : (int)res->v;
}

/* SAVE_ABORT of save. */
int r_abort(int fd, int64_t save, struct res *res)
{
	struct proto_out o;
	out_map(&o, PROTO_SAVE_ABORT, 1);
	proto_kv_u64(&o.pk, "save", (uint64_t)save);
	return r_call(fd, &o, 0, NULL, NULL, res, 10000);
}

/* Sends COMMIT of dir (world 1) without reading the answer. */
int r_commit_send(int fd, const char *dir)
{
	struct proto_out o;
	out_map(&o, PROTO_COMMIT, 3);
	proto_kv_str(&o.pk, "dir", dir);
	proto_kv_u64(&o.pk, "world", 1);
	proto_kv_i64(&o.pk, "timeout_ms", 30000);
	return raw_send(fd, &o, 0, NULL, 0);
}

/* LOAD_WAIT of load: 0 when LOADED, else a negative code. */
int r_load_wait(int fd, int64_t load, struct res *res)
{
	struct proto_out o;
	int rc;

	out_map(&o, PROTO_LOAD_WAIT, 2);
	proto_kv_u64(&o.pk, "load", (uint64_t)load);
	proto_kv_i64(&o.pk, "timeout_ms", 20000);
	if ((rc = r_call(fd, &o, 0, NULL, "level", res, 30000)) != 0)
		return rc;
	if (res->v != DSCKPT_LOADED)
		snprintf(res->msg, sizeof(res->msg), "level %lld", (long long)res->v);
	return res->v == DSCKPT_LOADED ? 0 : DSCKPT_EFAILED;
}

/* LOAD_BEGIN, LOAD_END of U8 "t" into region 1, LOAD_WAIT: 0, or the refusing step's code. */
int r_load(int fd, const char *dir, const char *file, uint64_t n, struct res *res)
{
	struct proto_out o;

	out_map(&o, PROTO_LOAD_BEGIN, 2);
	proto_kv_str(&o.pk, "dir", dir);
	proto_kv_str(&o.pk, "file", file);
	int rc = r_call(fd, &o, 0, NULL, "load", res, 30000);
	if (rc != 0)
		return rc;
	int64_t load = res->v;
	out_map(&o, PROTO_LOAD_END, 2);
	proto_kv_u64(&o.pk, "load", (uint64_t)load);
	proto_key(&o.pk, "tensors");
	msgpack_pack_array(&o.pk, 1);
	pack_u8(&o.pk, "t", 1, 0, n);
	if ((rc = r_call(fd, &o, 0, NULL, "level", res, 10000)) != 0)
		return rc;
	return r_load_wait(fd, load, res);
}
