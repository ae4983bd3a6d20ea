/*
 * peer_listen.c — the listening side of peer_ucx.c's links (issue 35 item 2): a listener
 * thread progresses the listener's worker and gives each connection it is offered a link
 * (a worker of its own: UCX lets a connection request be accepted on another worker) and a
 * thread of its own, on which the caller's serve function runs its blocking calls; at most
 * max_conns at once, the others refused. net->lock guards the count of connection threads
 * and their cond (peer_net_close waits on it); the pending requests are the listener
 * thread's. None of it runs on the loop thread.
 */
#include "peer_ucx_int.h"

#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>

/* A connection thread: accepts one request on a worker of its own, serves it, closes it. */
static void *peer_conn_main(void *arg)
{
	struct peer_link *l = arg;
	struct peer_net *n = l->net;

	n->serve(n->arg, l);
	peer_link_close(l);
	pthread_mutex_lock(&n->lock);
	n->active--;
	pthread_cond_broadcast(&n->idle);
	pthread_mutex_unlock(&n->lock);
	return NULL;
}

/* UCX, on the listener thread: a connection request, kept for the loop below. */
static void peer_on_request(ucp_conn_request_h req, void *arg)
{
	struct peer_net *n = arg;

	if (n->npending == PEER_MAX_PENDING)
		ucp_listener_reject(n->listener, req);
	else
		n->pending[n->npending++] = req;
}

/* Gives a connection request a link and a thread, or refuses it (too many, no memory). */
static void peer_accept(struct peer_net *n, ucp_conn_request_h req)
{
	ucp_conn_request_attr_t attr = { .field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR };
	ucp_ep_params_t ep = { 0 };
	struct peer_link *l;
	char host[64] = "?", port[16] = "?";
	pthread_attr_t pa;
	pthread_t t;

	pthread_mutex_lock(&n->lock);
	int full = n->active >= n->max_conns;
	pthread_mutex_unlock(&n->lock);
	if (full || peer_link_new(n, n->timeout_s, &l) != 0) {
		log_warnx("peer: a connection refused (%s)", full ? "too many" : "no memory");
		ucp_listener_reject(n->listener, req);
		return;
	}
	if (ucp_conn_request_query(req, &attr) == UCS_OK)
		getnameinfo((struct sockaddr *)&attr.client_address, sizeof(attr.client_address),
			    host, sizeof(host), port, sizeof(port), NI_NUMERICHOST | NI_NUMERICSERV);
	snprintf(l->who, sizeof(l->who), "%s:%s", host, port);
	ep.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLER |
			UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
	ep.conn_request = req;
	ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
	ep.err_handler.cb = peer_link_error;
	ep.err_handler.arg = l;
	if (ucp_ep_create(l->worker, &ep, &l->ep) != UCS_OK) {
		l->ep = NULL;
		peer_link_close(l);
		return;
	}
	pthread_mutex_lock(&n->lock);
	n->active++;
	pthread_mutex_unlock(&n->lock);
	pthread_attr_init(&pa);
	pthread_attr_setdetachstate(&pa, PTHREAD_CREATE_DETACHED);
	if (pthread_create(&t, &pa, peer_conn_main, l) != 0) {
		pthread_mutex_lock(&n->lock);
		n->active--;
		pthread_mutex_unlock(&n->lock);
		peer_link_abort(l);
		peer_link_close(l);
	}
	pthread_attr_destroy(&pa);
}

/* The listener thread: progresses the listener's worker and hands requests out. */
static void *peer_listen_main(void *arg)
{
	struct peer_net *n = arg;
	int efd = -1;

	ucp_worker_get_efd(n->lworker, &efd);
	while (!atomic_load(&n->stopping)) {
		while (ucp_worker_progress(n->lworker))
			;
		for (unsigned i = 0; i < n->npending; i++)
			peer_accept(n, n->pending[i]);
		n->npending = 0;
		if (ucp_worker_arm(n->lworker) == UCS_OK) {
			struct pollfd p = { .fd = efd, .events = POLLIN };
			poll(&p, 1, 100);
		}
	}
	return NULL;
}

/* Listens on port (every address) and serves each authenticated or not connection with
 * serve(arg, link) on a thread of its own, max_conns at once; 0 or a negative errno with
 * err. */
int peer_listen(struct peer_net *n, unsigned port, unsigned max_conns, peer_serve_fn serve,
		void *arg, char *err, size_t errlen)
{
	struct sockaddr_in6 sa = { .sin6_family = AF_INET6, .sin6_port = htons((uint16_t)port),
				   .sin6_addr = IN6ADDR_ANY_INIT };
	struct sockaddr_in sa4 = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
				   .sin_addr.s_addr = INADDR_ANY };
	ucp_worker_params_t wp = { .field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
				   .thread_mode = UCS_THREAD_MODE_SINGLE };
	ucp_listener_params_t lp = { 0 };
	ucs_status_t st;

	n->serve = serve;
	n->arg = arg;
	n->max_conns = max_conns;
	if ((st = ucp_worker_create(n->ctx, &wp, &n->lworker)) != UCS_OK) {
		snprintf(err, errlen, "peer_port %u: a UCX worker: %s", port,
			 ucs_status_string(st));
		return peer_errno(st);
	}
	lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
	lp.conn_handler.cb = peer_on_request;
	lp.conn_handler.arg = n;
	/* IPv4 first: UCX finds no interface for an IPv4 peer reaching an IPv6 listener (its
	 * ::ffff: address), and refuses it. IPv6 where the node has no IPv4. */
	lp.sockaddr.addr = (struct sockaddr *)&sa4;
	lp.sockaddr.addrlen = sizeof(sa4);
	st = ucp_listener_create(n->lworker, &lp, &n->listener);
	if (st != UCS_OK) {
		lp.sockaddr.addr = (struct sockaddr *)&sa;
		lp.sockaddr.addrlen = sizeof(sa);
		st = ucp_listener_create(n->lworker, &lp, &n->listener);
	}
	if (st != UCS_OK) {
		snprintf(err, errlen, "peer_port %u: UCX cannot listen: %s", port,
			 ucs_status_string(st));
		goto fail_worker;
	}
	if (pthread_create(&n->thread, NULL, peer_listen_main, n) != 0) {
		snprintf(err, errlen, "peer_port %u: no thread", port);
		st = UCS_ERR_NO_RESOURCE;
		goto fail_listener;
	}
	n->listening = 1;
	return 0;

fail_listener:
	ucp_listener_destroy(n->listener);
fail_worker:
	ucp_worker_destroy(n->lworker);
	n->lworker = NULL;
	return peer_errno(st) ? peer_errno(st) : -EIO;
}
