/*
 * conn.c — the connection layer: non-blocking frame I/O with SCM_RIGHTS descriptors, peer
 * credentials read at accept, and the reply queue. It knows no handler: each complete frame
 * goes to the dispatch callback and a closing connection to the disconnect callback, both set
 * once by conn_init (as tmux's proc.c does). It encodes only its own framing errors.
 *
 * A connection is owned by the connection list from accept until conn_close's handle
 * close callback frees it. Descriptors arrive in a FIFO and each frame claims as many as
 * its header counts; unclaimed ones are closed with the connection. The layer above keeps
 * its per-connection state in conn_data and lets go of it in the disconnect callback; what
 * outlives a frame refers to a connection by its id (conn_find), never by pointer.
 */
#include "dsckptd.h"
#include "../proto/proto.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#define FDQ_MAX 256
#define OUT_MAX (64u << 20)  /* replies a client leaves unread before we drop it */
#define IN_BASE 131072       /* the input buffer between large frames */
#define REFUSED_MAX 64       /* refused sockets kept open until their client has read */
#define REFUSED_MS 2000      /* and for at most this long */

struct conn {
	uv_poll_t poll;
	int fd;
	uint64_t id;
	pid_t pid;
	uid_t uid;
	gid_t gid;
	void *data;             /* the layer above's state (conn_set_data) */
	uint8_t *in;            /* received bytes not yet handled */
	size_t in_len, in_cap;
	int fdq[FDQ_MAX];       /* received descriptors not yet claimed */
	unsigned nfdq;
	uint8_t *out;           /* replies not yet written */
	size_t out_len, out_off, out_cap;
	uint64_t charged;       /* in_cap + out_cap, charged to uid as QUOTA_UNREAD */
	int counted;            /* one QUOTA_CONNS charged to uid */
	int closing;            /* close once out is written */
	int dead;               /* closed; the handle is closing */
	int dispatching;        /* a frame is being handled: closing waits until it returns */
	int close_now;          /* close as soon as the frame's handler returns */
	int events;             /* what poll waits for (UV_READABLE, UV_WRITABLE) */
	struct conn *next;
};

/*
 * A socket refused at accept, kept open (write side shut) until its client has read the
 * ERROR: closed at once with the client's HELLO unread, it would reset the connection and the
 * client would read ECONNRESET instead of the reason. Owned by the refused list until its
 * handles' close callbacks.
 */
struct refused {
	uv_poll_t poll;
	uv_timer_t timer;
	int fd;
	int handles;            /* still open: the refused is freed when both are closed */
	struct refused *next;
};

static struct conn *conns;
static unsigned nconns;
static struct refused *refused_list;
static unsigned nrefused;
static uint64_t next_conn_id = 1;
static conn_dispatch_cb dispatch;
static conn_gone_cb gone;
static struct uv_loop_s *conn_loop;  /* conn_init's */

static void on_poll(uv_poll_t *p, int status, int events);

/* Accessors. */
uint64_t conn_id(const struct conn *c) { return c->id; }
pid_t conn_pid(const struct conn *c) { return c->pid; }
uid_t conn_uid(const struct conn *c) { return c->uid; }
gid_t conn_gid(const struct conn *c) { return c->gid; }
void *conn_data(const struct conn *c) { return c->data; }
void conn_set_data(struct conn *c, void *data) { c->data = data; }

/* Sets the loop and the callbacks every frame and every disconnect go to (before the first
 * accept). */
void conn_init(struct uv_loop_s *loop, conn_dispatch_cb on_frame, conn_gone_cb on_gone)
{
	conn_loop = loop;
	dispatch = on_frame;
	gone = on_gone;
}

/* Number of open connections. */
unsigned conn_count(void)
{
	return nconns;
}

/* The open connection with this id, or NULL once it is gone. */
struct conn *conn_find(uint64_t id)
{
	for (struct conn *c = conns; c; c = c->next)
		if (c->id == id)
			return c;
	return NULL;
}

/* Frees a connection once libuv has closed its handle, giving back what it was charged. */
static void conn_freed(uv_handle_t *h)
{
	struct conn *c = h->data;
	quota_give(c->uid, QUOTA_UNREAD, c->charged);
	if (c->counted)
		quota_give(c->uid, QUOTA_CONNS, 1);
	free(c->in);
	free(c->out);
	free(c);
}

/* Resizes one of c's buffers to cap bytes, charging the growth to its user; 0, or -1 (the
 * user's unread limit, or out of memory) with err. */
static int conn_resize(struct conn *c, uint8_t **buf, size_t *bufcap, size_t cap, char *err,
		       size_t errlen)
{
	size_t grow = cap > *bufcap ? cap - *bufcap : 0;

	if (grow && quota_take(c->uid, QUOTA_UNREAD, grow, err, errlen) < 0)
		return -1;
	uint8_t *p = realloc(*buf, cap);
	if (!p) {
		quota_give(c->uid, QUOTA_UNREAD, grow);
		return grow ? err_set(err, errlen, -1, "out of memory") : 0;
	}
	if (!grow)
		quota_give(c->uid, QUOTA_UNREAD, *bufcap - cap);
	c->charged = c->charged + cap - *bufcap;
	*buf = p;
	*bufcap = cap;
	return 0;
}

/* Closes a connection now; the layer above forgets it in the disconnect callback. */
static void conn_close(struct conn *c)
{
	if (c->dead)
		return;
	if (c->dispatching) {	/* the handler may still use what the gone callback frees */
		c->close_now = 1;
		c->closing = 1;
		return;
	}
	c->dead = 1;
	for (struct conn **p = &conns; *p; p = &(*p)->next) {
		if (*p == c) {
			*p = c->next;
			break;
		}
	}
	nconns--;
	gone(c);
	c->data = NULL;
	for (unsigned i = 0; i < c->nfdq; i++)
		close(c->fdq[i]);
	log_debug("client %llu (pid %d) disconnected", (unsigned long long)c->id, (int)c->pid);
	uv_poll_stop(&c->poll);
	/* uv_close unregisters the descriptor again: closed before, its number may already be
	 * another thread's new socket (a peer link's) */
	uv_close((uv_handle_t *)&c->poll, conn_freed);
	close(c->fd);
}

/* Frees a refused socket's record once both its handles are closed. */
static void refused_closed(uv_handle_t *h)
{
	struct refused *r = h->data;
	if (--r->handles == 0)
		free(r);
}

/* Closes a refused socket for good. */
static void refused_close(struct refused *r)
{
	for (struct refused **p = &refused_list; *p; p = &(*p)->next) {
		if (*p == r) {
			*p = r->next;
			break;
		}
	}
	nrefused--;
	uv_poll_stop(&r->poll);
	uv_timer_stop(&r->timer);
	uv_close((uv_handle_t *)&r->poll, refused_closed);
	uv_close((uv_handle_t *)&r->timer, refused_closed);
	close(r->fd);	/* after uv_close, as conn_close does */
}

/* A refused client sent something (discarded) or left: closes once it has left. */
static void on_refused_poll(uv_poll_t *p, int status, int events)
{
	struct refused *r = p->data;
	char buf[4096];
	ssize_t n = recv(r->fd, buf, sizeof(buf), MSG_DONTWAIT);

	if (status < 0 || n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
		refused_close(r);
}

/* A refused client took too long to leave. */
static void on_refused_timer(uv_timer_t *t)
{
	refused_close(t->data);
}

/* Tells a client refused at accept why, in one ERROR frame, without waiting for it to read;
 * the socket (ours from here) is closed once the client leaves, or after REFUSED_MS. */
static void conn_refuse(int fd, const char *msg)
{
	struct proto_out o;

	proto_pack_error(&o, 0, ERR_ELIMIT, msg, 0);
	size_t len = proto_out_finish(&o, 0);
	if (send(fd, o.sb.data, len, MSG_NOSIGNAL | MSG_DONTWAIT) < 0)
		log_debug("refusing a client: %s", strerror(errno));
	proto_out_free(&o);
	shutdown(fd, SHUT_WR);
	struct refused *r = nrefused < REFUSED_MAX ? calloc(1, sizeof(*r)) : NULL;
	if (!r || uv_poll_init(conn_loop, &r->poll, fd) != 0) {
		free(r);
		close(fd);
		return;
	}
	uv_timer_init(conn_loop, &r->timer);
	r->fd = fd;
	r->handles = 2;
	r->poll.data = r->timer.data = r;
	uv_poll_start(&r->poll, UV_READABLE, on_refused_poll);
	uv_timer_start(&r->timer, on_refused_timer, REFUSED_MS, 0);
	r->next = refused_list;
	refused_list = r;
	nrefused++;
}

/* Takes an accepted socket and reads the peer's credentials. */
void conn_accept(int fd)
{
	char err[ERRLEN];
	struct ucred cred;
	socklen_t len = sizeof(cred);
	struct conn *c = calloc(1, sizeof(*c));

	if (!c) {
		log_warnx("out of memory accepting a client");
		close(fd);
		return;
	}
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0) {
		log_warn("SO_PEERCRED");
		free(c);
		close(fd);
		return;
	}
	c->fd = fd;
	c->id = next_conn_id++;
	c->pid = cred.pid;
	c->uid = cred.uid;
	c->gid = cred.gid;
	if (quota_take(c->uid, QUOTA_CONNS, 1, err, sizeof(err)) < 0) {
		log_warnx("client pid %d uid %u refused: %s", (int)c->pid, (unsigned)c->uid, err);
		free(c);
		conn_refuse(fd, err);	/* Ownership: the descriptor is the refused list's */
		return;
	}
	c->counted = 1;
	if (uv_poll_init(conn_loop, &c->poll, fd) != 0) {
		quota_give(c->uid, QUOTA_CONNS, 1);
		log_warnx("uv_poll_init failed for a client");
		free(c);
		close(fd);
		return;
	}
	c->poll.data = c;
	c->events = UV_READABLE;
	uv_poll_start(&c->poll, c->events, on_poll);
	c->next = conns;
	conns = c;
	nconns++;
	log_debug("client %llu connected: pid %d uid %d gid %d", (unsigned long long)c->id,
		  (int)c->pid, (int)c->uid, (int)c->gid);
}

/* Writes as much queued output as the socket takes; closes when done and closing. */
static void flush_out(struct conn *c)
{
	while (c->out_off < c->out_len) {
		ssize_t n = send(c->fd, c->out + c->out_off, c->out_len - c->out_off,
				 MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n < 0) {
			if (errno == EAGAIN || errno == EINTR)
				break;
			conn_close(c);
			return;
		}
		c->out_off += (size_t)n;
	}
	if (c->out_off == c->out_len) {
		c->out_off = c->out_len = 0;
		if (c->closing) {
			conn_close(c);
			return;
		}
	}
	int ev = c->closing ? 0 : UV_READABLE;
	if (c->out_len)
		ev |= UV_WRITABLE;
	if (ev != c->events) {	/* libuv re-registers the descriptor at every start */
		c->events = ev;
		uv_poll_start(&c->poll, ev, on_poll);
	}
}

/* Queues a finished frame for the client and frees it. */
void conn_send(struct conn *c, struct proto_out *o)
{
	size_t len = proto_out_finish(o, 0);

	if (c->dead || c->close_now) {
		proto_out_free(o);
		return;
	}
	if (c->out_len + len > OUT_MAX) {
		log_warnx("client %llu does not read its replies; dropping it",
			  (unsigned long long)c->id);
		proto_out_free(o);
		conn_close(c);
		return;
	}
	if (c->out_len + len > c->out_cap) {
		size_t cap = c->out_cap ? c->out_cap : 4096;
		char err[ERRLEN];
		while (cap < c->out_len + len)
			cap *= 2;
		if (conn_resize(c, &c->out, &c->out_cap, cap, err, sizeof(err)) < 0) {
			log_warnx("client %llu (uid %u) dropped with its replies unread: %s",
				  (unsigned long long)c->id, (unsigned)c->uid, err);
			proto_out_free(o);
			conn_close(c);
			return;
		}
	}
	memcpy(c->out + c->out_len, o->sb.data, len);
	c->out_len += len;
	proto_out_free(o);
	flush_out(c);
}

/* Closes the connection once its queued replies are written; reads nothing more. */
void conn_close_after(struct conn *c)
{
	c->closing = 1;
	if (!c->dead)
		flush_out(c);
}

/* A framing error of this layer: sends ERROR {code, message} and closes after it. */
static void conn_fail(struct conn *c, uint64_t id, int code, const char *fmt, ...)
{
	struct proto_out o;
	char msg[ERRLEN + 512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	proto_pack_error(&o, id, code, msg, 0);
	c->closing = 1;
	log_warnx("client %llu (pid %d): closing after a bad frame: %s",
		  (unsigned long long)c->id, (int)c->pid, msg);
	conn_send(c, &o);
}

/* Answers a wrong protocol version with both versions and closes. */
static void version_mismatch(struct conn *c, const struct proto_hdr *h)
{
	struct proto_out o;
	char msg[160];

	snprintf(msg, sizeof(msg), "protocol version mismatch: daemon speaks %d, client %u",
		 PROTO_VERSION, h->version);
	proto_pack_error(&o, h->id, ERR_EVERSION, msg, 2);
	proto_kv_u64(&o.pk, "server_proto", PROTO_VERSION);
	proto_kv_u64(&o.pk, "client_proto", h->version);
	c->closing = 1;
	log_warnx("client %llu (pid %d): %s", (unsigned long long)c->id, (int)c->pid, msg);
	conn_send(c, &o);
}

/* Handles every complete frame in the input buffer. */
static void handle_frames(struct conn *c)
{
	size_t off = 0;
	char why[160];

	while (!c->dead && !c->closing && c->in_len - off >= PROTO_HDR_SIZE) {
		struct proto_hdr h;
		if (proto_hdr_unpack(c->in + off, &h, why, sizeof(why)) < 0) {
			int code = h.magic == PROTO_MAGIC && h.length > PROTO_MAX_BODY
					   ? ERR_EMSGSIZE : ERR_EPROTO;
			conn_fail(c, h.id, code, "%s", why);
			break;
		}
		if (h.version != PROTO_VERSION) {
			version_mismatch(c, &h);
			break;
		}
		if (c->in_len - off < PROTO_HDR_SIZE + (size_t)h.length)
			break;	/* body not complete yet */
		if (h.nfds > c->nfdq) {
			conn_fail(c, h.id, ERR_EPROTO, "frame announces %u descriptors but %u arrived", h.nfds, c->nfdq);
			break;
		}
		/* With no byte after this frame, every queued descriptor came with it or before. */
		if (c->nfdq > h.nfds && c->in_len - off == PROTO_HDR_SIZE + (size_t)h.length) {
			conn_fail(c, h.id, ERR_EPROTO, "%u descriptors arrived with a frame that announces %u",
				   c->nfdq, h.nfds);
			break;
		}
		int fds[PROTO_MAX_FDS];
		memcpy(fds, c->fdq, h.nfds * sizeof(int));
		memmove(c->fdq, c->fdq + h.nfds, (c->nfdq - h.nfds) * sizeof(int));
		c->nfdq -= h.nfds;
		/* Ownership: the frame's descriptors now belong to the handler. */
		c->dispatching = 1;
		dispatch(c, &h, c->in + off + PROTO_HDR_SIZE, fds, h.nfds);
		c->dispatching = 0;
		off += PROTO_HDR_SIZE + h.length;
		if (c->close_now) {
			conn_close(c);
			return;
		}
	}
	if (c->dead)
		return;
	memmove(c->in, c->in + off, c->in_len - off);
	c->in_len -= off;
	/* A large frame is handled: give its memory back (to the user's unread limit too). */
	if (c->in_cap > IN_BASE && c->in_len <= IN_BASE / 2)
		conn_resize(c, &c->in, &c->in_cap, IN_BASE, why, sizeof(why));
}

/* Reads what the socket has, collecting descriptors; -1 when the connection ended. */
static int read_some(struct conn *c)
{
	int overflow = 0;

	if (c->in_cap - c->in_len < 65536) {
		size_t cap = c->in_cap ? c->in_cap * 2 : IN_BASE;
		char err[ERRLEN];
		if (cap > PROTO_HDR_SIZE + PROTO_MAX_BODY + IN_BASE)
			cap = PROTO_HDR_SIZE + PROTO_MAX_BODY + IN_BASE;
		if (cap > c->in_cap &&
		    conn_resize(c, &c->in, &c->in_cap, cap, err, sizeof(err)) < 0) {
			conn_fail(c, 0, ERR_ELIMIT, "%s", err);
			return 0;
		}
	}
	ssize_t n = proto_recvmsg(c->fd, c->in + c->in_len, c->in_cap - c->in_len, MSG_DONTWAIT,
				  c->fdq, &c->nfdq, FDQ_MAX, &overflow);
	if (n < 0)
		return n == -EAGAIN || n == -EINTR ? 0 : -1;
	if (overflow) {
		conn_fail(c, 0, ERR_EPROTO, "too many file descriptors sent");
		return 0;
	}
	if (n == 0)
		return -1;
	c->in_len += (size_t)n;
	return 0;
}

/* Poll callback: reads and handles frames, writes pending replies. */
static void on_poll(uv_poll_t *p, int status, int events)
{
	struct conn *c = p->data;

	if (status < 0) {
		conn_close(c);
		return;
	}
	if (events & UV_WRITABLE)
		flush_out(c);
	if (c->dead || !(events & UV_READABLE) || c->closing)
		return;
	if (read_some(c) < 0) {
		conn_close(c);
		return;
	}
	handle_frames(c);
}

/* Closes every connection. */
void conn_close_all(void)
{
	while (conns)
		conn_close(conns);
	while (refused_list)
		refused_close(refused_list);
}
