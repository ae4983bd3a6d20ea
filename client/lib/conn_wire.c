/*
 * conn_wire.c — the requests on a connection's wire (the connection's lock held):
 * frames sent with their descriptors, replies read and matched to their request, the daemon's
 * ERROR decoded into the connection's message, a version mismatch or a malformed frame breaking
 * the connection. Requests may be posted instead (lib_conn_post, up to LIB_POST_MAX at once):
 * their replies are then read in order at the next request on the connection, or when their
 * owner settles them, so that the daemon works on them while the caller goes on (an early
 * SAVE_BEGIN, a load's REGION_ADDs). The daemon answers a connection's frames in order, and
 * each reply's id is checked against its request's. Also the waits made of queries in slices
 * (lib_wait_*). The connection itself is conn.c's (conn_int.h).
 */
#include "internal.h"
#include "conn_int.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Marks the connection broken with a message; every later request fails with EPIPE. */
__attribute__((format(printf, 3, 4)))
static int lib_conn_break(dsckpt_conn_t *c, int err, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(c->err, sizeof(c->err), fmt, ap);
	va_end(ap);
	c->refused = 0;
	memcpy(c->dead, c->err, sizeof(c->dead));
	c->broken = 1;
	return err;
}

/* Starts a request frame with the next id. */
void lib_conn_frame(dsckpt_conn_t *c, struct proto_out *o, unsigned type)
{
	c->req_id = c->next_id++;
	c->req_type = type;
	proto_out_init(o, type, c->req_id);
}

/* Frees a decoded reply. */
static void lib_conn_reply_free(struct lib_reply *r)
{
	proto_in_free(&r->in);
	free(r->body);
	r->body = NULL;
}

/* Fails with a protocol version mismatch, naming both versions; the connection is broken. */
static int lib_conn_mismatch(dsckpt_conn_t *c, uint64_t server)
{
	return lib_conn_break(c, DSCKPT_EVERSION, "protocol version mismatch: dsckptd speaks "
			      "protocol %" PRIu64 ", this %s speaks protocol %d", server, c->self,
			      PROTO_VERSION);
}

/* Decodes an ERROR body into the connection's message; returns the daemon's code. A
 * connection-level one (id 0) means the daemon closed the connection. */
static int lib_conn_reply_error(dsckpt_conn_t *c, struct lib_reply *r, uint64_t server,
				int conn_level)
{
	char msg[PROTO_MAX_STR + 1] = "";
	int64_t code = 0;
	uint64_t client = 0;

	proto_get_i64(&r->m, "code", INT32_MIN, -1, &code, 1);
	proto_get_str(&r->m, "message", msg, PROTO_MAX_STR, 1);
	proto_get_u64(&r->m, "server_proto", UINT16_MAX, &server, 0);
	proto_get_u64(&r->m, "client_proto", UINT16_MAX, &client, 0);
	if (proto_map_end(&r->m) < 0) {
		int e = lib_conn_break(c, DSCKPT_EPROTO, "dsckptd answered %s with a malformed "
				       "error: %s", proto_type_name(c->req_type), r->m.why);
		lib_conn_reply_free(r);
		return e;
	}
	lib_conn_reply_free(r);
	if (code == DSCKPT_EVERSION)
		return lib_conn_mismatch(c, server);
	lib_conn_fail(c, (int)code, "%s", msg);
	c->refused = 1;
	/* The daemon closes the connection after these. */
	if (code == DSCKPT_EPROTO || code == DSCKPT_EMSGSIZE || conn_level) {
		c->broken = 1;
		memcpy(c->dead, c->err, sizeof(c->dead));
	}
	return (int)code;
}

/* Sends frame o (freed here) with fds as request c->req_id: 0 with *sent the send's result
 * (a failed send's reason may still come as a reply), or a failure (the connection broken
 * before, the frame too long) with nothing sent. */
static int conn_send(dsckpt_conn_t *c, struct proto_out *o, const int *fds, unsigned nfds,
		     int *sent)
{
	*sent = 0;
	if (c->broken) {
		proto_out_free(o);
		return lib_conn_fail(c, DSCKPT_EPIPE, "%s", c->dead);
	}
	size_t len = proto_out_finish(o, nfds);
	if (len - PROTO_HDR_SIZE > PROTO_MAX_BODY) {
		proto_out_free(o);
		return lib_conn_fail(c, DSCKPT_EMSGSIZE, "request of %zu bytes is too long",
				     len);
	}
	*sent = proto_send(c->fd, o->sb.data, len, fds, nfds);
	proto_out_free(o);
	return 0;
}

/* Reads the reply to request c->req_id, sent with result sent. */
static int conn_recv(dsckpt_conn_t *c, int sent, struct lib_reply *r)
{
	const char *what = proto_type_name(c->req_type);
	struct proto_hdr h;
	char why[160];
	int e;

	/* A daemon that refused the connection at accept may have closed it before the request
	 * arrived; its ERROR of id 0, already here, says why. */
	e = proto_recv(c->fd, &h, &r->body, NULL, NULL, sent < 0 ? 0 : c->timeout_ms, why,
		       sizeof(why));
	if (sent < 0 && (e < 0 || h.type != PROTO_ERROR || h.id != 0)) {
		free(r->body);
		r->body = NULL;
		return lib_conn_break(c, DSCKPT_EPIPE, "sending %s to dsckptd at %s: %s", what,
				      c->path, strerror(-sent));
	}
	if (e == -ETIMEDOUT)
		return lib_conn_break(c, DSCKPT_ETIMEDOUT, "dsckptd at %s did not answer %s within "
				      "%d s", c->path, what, c->timeout_ms / 1000);
	if (e == -EPROTO)
		return lib_conn_break(c, DSCKPT_EPROTO, "malformed reply to %s from dsckptd: %s",
				      what, why);
	if (e == -EPIPE)
		return lib_conn_break(c, DSCKPT_EPIPE, "dsckptd at %s closed the connection "
				      "instead of answering %s", c->path, what);
	if (e < 0)
		return lib_conn_break(c, DSCKPT_EPIPE, "reading the reply to %s from dsckptd: %s",
				      what, strerror(-e));
	/* An ERROR of id 0 is about the connection itself (refused at accept, or closed for a
	 * per-user limit): it answers whatever was asked. */
	int conn_level = h.type == PROTO_ERROR && h.id == 0;
	if ((h.id != c->req_id && !conn_level) ||
	    (h.type != PROTO_REPLY && h.type != PROTO_ERROR)) {
		free(r->body);
		r->body = NULL;
		return lib_conn_break(c, DSCKPT_EPROTO, "dsckptd answered %s (request %" PRIu64
				      ") with a %s frame of request %" PRIu64, what, c->req_id,
				      proto_type_name(h.type), h.id);
	}
	if (proto_in_parse(&r->in, r->body, h.length, why, sizeof(why)) < 0) {
		lib_conn_reply_free(r);
		return lib_conn_break(c, DSCKPT_EPROTO, "malformed reply to %s from dsckptd: %s",
				      what, why);
	}
	proto_map_init(&r->m, r->in.root);
	if (h.type == PROTO_ERROR)
		return lib_conn_reply_error(c, r, h.version, conn_level);
	if (h.version != PROTO_VERSION) {
		lib_conn_reply_free(r);
		return lib_conn_mismatch(c, h.version);
	}
	return 0;
}

/* Reads the oldest posted request's reply and gives it to its owner (a broken connection
 * fails it without reading). */
static void conn_settle_one(dsckpt_conn_t *c)
{
	struct lib_posted p = c->posted[c->posted_head];
	struct lib_reply r;
	int e;

	c->posted_head = (c->posted_head + 1) % LIB_POST_MAX;
	c->nposted--;
	c->posted_fds -= p.nfds;
	uint64_t id = c->req_id;
	unsigned type = c->req_type;
	c->req_id = p.id;
	c->req_type = p.type;
	memset(&r, 0, sizeof(r));
	e = c->broken ? lib_conn_fail(c, DSCKPT_EPIPE, "%s", c->dead) : conn_recv(c, 0, &r);
	p.take(c, e, &r, p.arg);
	c->req_id = id;
	c->req_type = type;
}

/* Reads every posted request's reply, oldest first, each given to its owner. */
void lib_conn_settle(dsckpt_conn_t *c)
{
	while (c->nposted > 0)
		conn_settle_one(c);
}

/* Sends a frame and reads its reply. */
int lib_conn_call(dsckpt_conn_t *c, struct proto_out *o, const int *fds, unsigned nfds,
		  struct lib_reply *r)
{
	int sent, e;

	memset(r, 0, sizeof(r[0]));
	lib_conn_settle(c);
	if ((e = conn_send(c, o, fds, nfds, &sent)) < 0)
		return e;
	return conn_recv(c, sent, r);
}

/* Sends a frame with fds whose reply take gets later (lib_conn_settle); the oldest posted
 * requests are settled first while LIB_POST_MAX are posted or the descriptors would pass
 * LIB_POST_FDS (a request answered has had its descriptors received). */
int lib_conn_post_fds(dsckpt_conn_t *c, struct proto_out *o, const int *fds, unsigned nfds,
		      lib_take_fn take, void *arg)
{
	struct lib_reply r;
	int sent, e;

	while (c->nposted == LIB_POST_MAX || (c->nposted && c->posted_fds + nfds > LIB_POST_FDS))
		conn_settle_one(c);
	if ((e = conn_send(c, o, fds, nfds, &sent)) < 0)
		return e;
	if (sent < 0) {		/* why, at once: the daemon's ERROR of id 0, or the send's */
		uint64_t id = c->req_id;
		unsigned type = c->req_type;
		lib_conn_settle(c);	/* the replies before it come first */
		c->req_id = id;
		c->req_type = type;
		memset(&r, 0, sizeof(r));
		e = conn_recv(c, sent, &r);
		return e < 0 ? e : lib_conn_break(c, DSCKPT_EPIPE, "sending %s to dsckptd at %s "
						  "failed", proto_type_name(type), c->path);
	}
	c->posted[(c->posted_head + c->nposted++) % LIB_POST_MAX] =
		(struct lib_posted){c->req_id, c->req_type, nfds, take, arg};
	c->posted_fds += nfds;
	return 0;
}

/* Sends a frame whose reply take gets later (lib_conn_settle). */
int lib_conn_post(dsckpt_conn_t *c, struct proto_out *o, lib_take_fn take, void *arg)
{
	return lib_conn_post_fds(c, o, NULL, 0, take, arg);
}

/* Checks that the reply was read completely and well, and frees it. */
int lib_reply_end(dsckpt_conn_t *c, struct lib_reply *r, const char *what)
{
	int e = 0;
	if (proto_map_end(&r->m) < 0)
		e = lib_conn_fail(c, DSCKPT_EPROTO, "malformed %s reply from dsckptd: %s", what,
				  r->m.why);
	lib_conn_reply_free(r);
	return e;
}

/* Sends a request whose reply is {}. */
int lib_conn_call_empty(dsckpt_conn_t *c, struct proto_out *o, const int *fds,
			unsigned nfds, const char *what)
{
	struct lib_reply r;
	int e = lib_conn_call(c, o, fds, nfds, &r);
	if (e < 0)
		return e;
	return lib_reply_end(c, &r, what);
}

/* Seconds on CLOCK_MONOTONIC. */
static double conn_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Notes the deadline of a wait of timeout_ms (< 0: none). */
void lib_wait_start(struct lib_wait *w, int timeout_ms)
{
	w->timeout_ms = timeout_ms;
	w->deadline = timeout_ms > 0 ? conn_now() + timeout_ms / 1e3 : 0;
}

/* The next query's timeout: a slice, or what is left of the wait (0 for timeout_ms 0). */
int lib_wait_slice(struct lib_wait *w, int *last)
{
	int ms = LIB_WAIT_SLICE_MS;

	*last = 0;
	if (w->timeout_ms == 0) {
		*last = 1;
		return 0;
	}
	if (w->timeout_ms > 0) {
		double left = (w->deadline - conn_now()) * 1e3;
		if (left <= ms) {
			*last = 1;
			return left > 0 ? (int)left : 0;
		}
	}
	return ms;
}

/* Sends a query of type without arguments and reads its reply. */
int lib_conn_query(dsckpt_conn_t *c, unsigned type, struct lib_reply *r)
{
	struct proto_out o;

	lib_conn_lock(c);
	lib_conn_frame(c, &o, type);
	msgpack_pack_map(&o.pk, 0);
	int e = lib_conn_call(c, &o, NULL, 0, r);
	lib_conn_unlock(c);
	return e;
}

/* Frees a query's reply; DSCKPT_EPROTO if a key read from it was malformed. */
int lib_conn_query_end(dsckpt_conn_t *c, struct lib_reply *r)
{
	int e = 0;

	lib_conn_lock(c);
	if (r->m.err)
		e = lib_conn_fail(c, DSCKPT_EPROTO, "malformed %s reply from dsckptd: %s",
				  proto_type_name(c->req_type), r->m.why);
	lib_conn_reply_free(r);
	lib_conn_unlock(c);
	return e;
}

/* Whether the last failure was the daemon's ERROR reply. */
int lib_conn_refused(dsckpt_conn_t *c)
{
	lib_conn_lock(c);
	int refused = c->refused;
	lib_conn_unlock(c);
	return refused;
}
