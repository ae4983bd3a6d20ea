/* harness_frames.c — raw protocol frames to the test daemon. */
#include "harness_frames.h"

#include <check.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
