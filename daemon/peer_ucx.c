/*
 * peer_ucx.c — the daemons' links to each other over UCX's ucp API (issue 35 item 2): RDMA
 * where the fabric has it, TCP or shared memory elsewhere, as UCX picks (UCX_TLS and
 * UCX_NET_DEVICES in the environment narrow it). Messages are tagged sends: the tag is the
 * message's type, and large ones go by UCX's rendezvous protocol (zero-copy on RDMA), which
 * is what UCX recommends for large buffers.
 *
 * Threads: a listener thread (peer_listen.c) progresses the listener's worker; each
 * connection it is offered gets a thread of its own with a worker of its own (UCX lets a
 * connection request be accepted on another worker), on which the caller's serve function
 * runs blocking calls. A connecting
 * side's link likewise has its own worker, used by one thread at a time. So every worker has
 * one thread and no lock is needed around UCX; the context is shared (mt_workers_shared).
 * net->lock guards the pending requests, the count of connection threads and their cond; the
 * stop flag is atomic. None of it runs on the loop thread.
 *
 * Every blocking call waits at most the link's timeout; past it, or when the other side fails
 * or the net stops, the endpoint is closed at once (UCX completes what was in flight with an
 * error) and the call returns a negative errno. Progress sleeps on the worker's event fd.
 * Several operations may be in flight on a link (peer_post_send/recv, for peer_window.c),
 * each waited for once.
 */
#include "peer_ucx_int.h"

#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One operation in flight (peer_post_send, peer_post_recv); completed by UCX's callback on
 * the link's thread, freed by peer_op_wait. */
struct peer_op {
	int done;
	int cancelled;
	int adoptable;                     /* buf is malloc'd: the link may take it */
	ucs_status_t st;
	ucp_tag_t tag;
	size_t len;
	void *req;
	void *buf;
	struct peer_op *next;              /* the link's orphans */
};

/* How long an operation may go on after its link broke and it was cancelled (a rendezvous
 * whose other side vanished may never end; UCX releases it with the worker). */
#define PEER_GRACE_S 2.0

/* A negative errno for a UCX status. */
int peer_errno(ucs_status_t st)
{
	switch (st) {
	case UCS_OK:
		return 0;
	case UCS_ERR_NO_MEMORY:
		return -ENOMEM;
	case UCS_ERR_MESSAGE_TRUNCATED:
		return -EMSGSIZE;
	case UCS_ERR_TIMED_OUT:
		return -ETIMEDOUT;
	case UCS_ERR_UNREACHABLE:
	case UCS_ERR_REJECTED:
	case UCS_ERR_NOT_CONNECTED:
		return -ECONNREFUSED;
	case UCS_ERR_CANCELED:
	case UCS_ERR_CONNECTION_RESET:
	case UCS_ERR_ENDPOINT_TIMEOUT:
		return -ECONNRESET;
	default:
		return -EIO;
	}
}

/* Opens the UCX context every link of the daemon shares; 0 or a negative errno with err. */
int peer_net_open(double timeout_s, struct peer_net **out, char *err, size_t errlen)
{
	struct peer_net *n = calloc(1, sizeof(*n));
	ucp_params_t params = { 0 };
	ucp_config_t *config;
	ucs_status_t st;

	if (n == NULL)
		return -ENOMEM;
	n->timeout_s = timeout_s;
	pthread_mutex_init(&n->lock, NULL);
	pthread_cond_init(&n->idle, NULL);
	/* A restarted daemon takes its port back while the old connections linger (TIME_WAIT),
	 * unless UCX's environment says otherwise. ucp_config_modify does not reach the TCP
	 * connection manager's keys: the environment does. peer_net_open runs at start-up,
	 * before the daemon's threads, so setenv races no getenv. */
	setenv("UCX_TCP_CM_REUSEADDR", "y", 0);
	if ((st = ucp_config_read(NULL, NULL, &config)) != UCS_OK) {
		snprintf(err, errlen, "UCX configuration: %s", ucs_status_string(st));
		goto fail;
	}
	params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
	params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
	params.mt_workers_shared = 1;
	st = ucp_init(&params, config, &n->ctx);
	ucp_config_release(config);
	if (st != UCS_OK) {
		snprintf(err, errlen, "UCX: %s (ucx_info -d lists the transports)",
			 ucs_status_string(st));
		goto fail;
	}
	*out = n;
	return 0;

fail:
	pthread_cond_destroy(&n->idle);
	pthread_mutex_destroy(&n->lock);
	free(n);
	return peer_errno(st);
}

/* Makes a worker of its own for a link, with its event fd; 0 or a negative errno. */
int peer_link_new(struct peer_net *n, double timeout_s, struct peer_link **out)
{
	ucp_worker_params_t wp = { 0 };
	struct peer_link *l = calloc(1, sizeof(*l));
	ucs_status_t st;

	if (l == NULL)
		return -ENOMEM;
	l->net = n;
	l->timeout_s = timeout_s;
	wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
	wp.thread_mode = UCS_THREAD_MODE_SINGLE;
	if ((st = ucp_worker_create(n->ctx, &wp, &l->worker)) != UCS_OK) {
		free(l);
		return peer_errno(st);
	}
	if ((st = ucp_worker_get_efd(l->worker, &l->efd)) != UCS_OK) {
		ucp_worker_destroy(l->worker);
		free(l);
		return peer_errno(st);
	}
	*out = l;
	return 0;
}

/* UCX: the other side of a link failed (reset, gone); on the link's thread. */
void peer_link_error(void *arg, ucp_ep_h ep, ucs_status_t st)
{
	struct peer_link *l = arg;

	l->failed = 1;
}

/* Closes the link's endpoint at once; what was in flight completes with an error. */
static void peer_link_break(struct peer_link *l)
{
	ucp_request_param_t p = { 0 };

	if (l->ep == NULL)
		return;
	p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
	p.flags = UCP_EP_CLOSE_FLAG_FORCE;
	l->close_req = ucp_ep_close_nbx(l->ep, &p);
	if (UCS_PTR_IS_ERR(l->close_req))
		l->close_req = NULL;
	l->ep = NULL;
}

/* Breaks a link at once: every operation in flight on it completes with an error, and
 * every later call fails. */
void peer_link_abort(struct peer_link *l)
{
	peer_link_break(l);
}

/* Sleeps on the worker's event fd until it may have work (a tenth of a second at most). */
static void peer_link_sleep(struct peer_link *l)
{
	struct pollfd p = { .fd = l->efd, .events = POLLIN };

	if (ucp_worker_arm(l->worker) == UCS_ERR_BUSY)
		return;
	poll(&p, 1, 100);
}

/* Waits until op completes: past the link's timeout, on the other side's failure or when
 * the net stops, the link is broken first (what else is in flight then fails too: sends with
 * the endpoint, receives, which are the worker's, cancelled as they are waited for). Frees
 * op; 0, or a negative errno (-ECONNRESET for a receive cancelled; -ECANCELED: a posted
 * operation that still had not ended PEER_GRACE_S after its link broke, left with its buffer
 * to the link, which frees both after its worker). */
int peer_op_wait(struct peer_link *l, struct peer_op *op, uint64_t *tag, size_t *len)
{
	double deadline = now_mono() + l->timeout_s;
	int rc;

	while (!op->done) {
		if (ucp_worker_progress(l->worker))
			continue;
		if (l->ep && (l->failed || atomic_load(&l->net->stopping) ||
			      now_mono() > deadline)) {
			l->timed_out = !l->failed && now_mono() > deadline;
			peer_link_break(l);
		}
		if (l->ep == NULL && !op->cancelled) {
			op->cancelled = 1;
			ucp_request_cancel(l->worker, op->req);
			deadline = now_mono() + PEER_GRACE_S;
			continue;
		}
		if (l->ep == NULL && op->adoptable && now_mono() > deadline) {
			op->next = l->orphans;  /* its buffer too: freed once the worker is */
			l->orphans = op;
			return -ECANCELED;
		}
		peer_link_sleep(l);
	}
	ucp_request_free(op->req);
	rc = op->st != UCS_OK && l->timed_out ? -ETIMEDOUT : peer_errno(op->st);
	if (rc == 0 && tag)
		*tag = op->tag;
	if (rc == 0 && len)
		*len = op->len;
	free(op);
	return rc;
}

/* Asks UCX to cancel op, a receive that matched no message yet (it then completes with an
 * error); one that matched completes as it would. */
void peer_op_cancel(struct peer_link *l, struct peer_op *op)
{
	if (!op->done && !op->cancelled) {
		op->cancelled = 1;
		ucp_request_cancel(l->worker, op->req);
	}
}

/* UCX: a send completed. */
static void peer_sent(void *req, ucs_status_t st, void *user)
{
	struct peer_op *op = user;

	op->st = st;
	op->done = 1;
}

/* UCX: a receive completed. */
static void peer_received(void *req, ucs_status_t st, const ucp_tag_recv_info_t *info,
			  void *user)
{
	struct peer_op *op = user;

	op->st = st;
	if (st == UCS_OK) {
		op->tag = info->sender_tag;
		op->len = info->length;
	}
	op->done = 1;
}

/* Takes a posted operation's request into op (or frees op when UCX refused it); 0 with *out,
 * or a negative errno. */
static int peer_op_start(struct peer_link *l, struct peer_op *op, void *req,
			 struct peer_op **out)
{
	if (UCS_PTR_IS_ERR(req)) {
		free(op);
		return peer_errno(UCS_PTR_STATUS(req));
	}
	op->req = req;
	*out = op;
	return 0;
}

/* Posts a send (recv 0) of len bytes of buf as a message of type tag, or a receive of the
 * next message into buf (cap len); adoptable: buf is malloc'd and may be left to the link
 * (peer_op_wait). 0 with *out, or a negative errno. */
static int peer_post(struct peer_link *l, int recv, uint64_t tag, void *buf, size_t len,
		     int adoptable, struct peer_op **out)
{
	struct peer_op *op = NULL;
	ucp_request_param_t p = { 0 };
	void *req;

	if (l->ep == NULL)
		return l->timed_out ? -ETIMEDOUT : -ECONNRESET;
	if ((op = calloc(1, sizeof(*op))) == NULL)
		return -ENOMEM;
	op->adoptable = adoptable;
	op->buf = buf;
	p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
			 UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
	p.user_data = op;
	if (recv) {
		p.cb.recv = peer_received;
		req = ucp_tag_recv_nbx(l->worker, buf, len, 0, 0, &p);
	} else {
		p.cb.send = peer_sent;
		req = ucp_tag_send_nbx(l->ep, buf, len, tag, &p);
	}
	return peer_op_start(l, op, req, out);
}

/* Posts a send of len bytes of buf (malloc'd: see peer_op_wait) as a message of type tag,
 * in flight (buf untouched) until peer_op_wait; 0 with *out, or a negative errno. Messages
 * go in the order posted. */
int peer_post_send(struct peer_link *l, uint64_t tag, const void *buf, size_t len,
		   struct peer_op **out)
{
	return peer_post(l, 0, tag, (void *)buf, len, 1, out);
}

/* Posts a receive of the next message, of any type, into buf (cap bytes, malloc'd: see
 * peer_op_wait); receives posted take the messages in the order they were posted. 0 with
 * *out, or a negative errno. */
int peer_post_recv(struct peer_link *l, void *buf, size_t cap, struct peer_op **out)
{
	return peer_post(l, 1, 0, buf, cap, 1, out);
}

/* Sends len bytes of buf as a message of type tag; 0 or a negative errno. */
int peer_send(struct peer_link *l, uint64_t tag, const void *buf, size_t len)
{
	struct peer_op *op = NULL;
	int rc = peer_post(l, 0, tag, (void *)buf, len, 0, &op);

	return rc ? rc : peer_op_wait(l, op, NULL, NULL);
}

/* Receives the next message, of any type, into buf (cap bytes): its type into *tag and
 * length into *len; 0 or a negative errno (-EMSGSIZE: longer than cap). */
int peer_recv(struct peer_link *l, uint64_t *tag, void *buf, size_t cap, size_t *len)
{
	struct peer_op *op = NULL;
	int rc = peer_post(l, 1, 0, buf, cap, 0, &op);

	return rc ? rc : peer_op_wait(l, op, tag, len);
}

/* The other side's address, for messages. */
const char *peer_link_who(const struct peer_link *l)
{
	return l->who;
}

/* Sets how long each blocking call of l may wait. */
void peer_link_set_timeout(struct peer_link *l, double seconds)
{
	l->timeout_s = seconds;
}

/* Closes a link: its endpoint (politely when it is still up, so that what was sent arrives
 * first), then its worker. NULL is fine. */
void peer_link_close(struct peer_link *l)
{
	ucp_request_param_t p = { 0 };

	if (l == NULL)
		return;
	if (l->ep) {
		double deadline = now_mono() + 2;
		l->close_req = ucp_ep_close_nbx(l->ep, &p);
		if (UCS_PTR_IS_ERR(l->close_req))
			l->close_req = NULL;
		l->ep = NULL;
		while (l->close_req && ucp_request_check_status(l->close_req) == UCS_INPROGRESS &&
		       now_mono() < deadline)
			if (!ucp_worker_progress(l->worker))
				peer_link_sleep(l);
		if (l->close_req && ucp_request_check_status(l->close_req) == UCS_INPROGRESS) {
			ucp_request_free(l->close_req);
			l->close_req = NULL;
		}
	}
	if (l->close_req) {
		while (ucp_request_check_status(l->close_req) == UCS_INPROGRESS)
			if (!ucp_worker_progress(l->worker))
				peer_link_sleep(l);
		ucp_request_free(l->close_req);
	}
	ucp_worker_destroy(l->worker);
	while (l->orphans) {
		struct peer_op *op = l->orphans;
		l->orphans = op->next;
		free(op->buf);
		free(op);
	}
	free(l);
}

/* Connects to host:port (a name resolved as the system does, or an address); the link's
 * calls wait at most timeout_s each. 0 or a negative errno with err; a peer that is down is
 * found by the first call. */
int peer_connect(struct peer_net *n, const char *host, unsigned port, double timeout_s,
		 struct peer_link **out, char *err, size_t errlen)
{
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *ai;
	ucp_ep_params_t ep = { 0 };
	struct peer_link *l;
	char service[16];
	ucs_status_t st;
	int rc;

	snprintf(service, sizeof(service), "%u", port);
	if ((rc = getaddrinfo(host, service, &hints, &ai)) != 0) {
		snprintf(err, errlen, "peer %s: %s", host, gai_strerror(rc));
		return -EHOSTUNREACH;
	}
	if ((rc = peer_link_new(n, timeout_s, &l)) != 0) {
		snprintf(err, errlen, "peer %s: a UCX worker: %s", host, strerror(-rc));
		freeaddrinfo(ai);
		return rc;
	}
	snprintf(l->who, sizeof(l->who), "%s:%u", host, port);
	ep.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
			UCP_EP_PARAM_FIELD_ERR_HANDLER | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
	ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
	ep.err_handler.cb = peer_link_error;
	ep.err_handler.arg = l;
	ep.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
	ep.sockaddr.addr = ai->ai_addr;
	ep.sockaddr.addrlen = ai->ai_addrlen;
	st = ucp_ep_create(l->worker, &ep, &l->ep);
	freeaddrinfo(ai);
	if (st != UCS_OK) {
		snprintf(err, errlen, "peer %s: %s", l->who, ucs_status_string(st));
		l->ep = NULL;
		peer_link_close(l);
		return peer_errno(st);
	}
	*out = l;
	return 0;
}

/* Makes every call in flight on the net's links fail at its next wait, and every later one;
 * any thread. */
void peer_net_stop(struct peer_net *n)
{
	if (n)
		atomic_store(&n->stopping, 1);
}

/* Stops: no new connection, every connection thread's call fails at its next wait and the
 * thread ends; waits for them all, then closes the listener and the context. NULL is fine. */
void peer_net_close(struct peer_net *n)
{
	if (n == NULL)
		return;
	atomic_store(&n->stopping, 1);
	if (n->listening) {
		pthread_join(n->thread, NULL);
		for (unsigned i = 0; i < n->npending; i++)
			ucp_listener_reject(n->listener, n->pending[i]);
		ucp_listener_destroy(n->listener);
	}
	pthread_mutex_lock(&n->lock);
	while (n->active > 0)
		pthread_cond_wait(&n->idle, &n->lock);
	pthread_mutex_unlock(&n->lock);
	if (n->lworker)
		ucp_worker_destroy(n->lworker);
	ucp_cleanup(n->ctx);
	pthread_cond_destroy(&n->idle);
	pthread_mutex_destroy(&n->lock);
	free(n);
}
