/*
 * peer_ucx_int.h — peer_ucx.c's net and links, shared with peer_listen.c (the listener
 * thread, which gives each connection a link and a thread of its own). Nothing else reads
 * them: every other file reaches a link through dsckptd.h's peer_* calls.
 */
#ifndef DSCKPTD_PEER_UCX_INT_H
#define DSCKPTD_PEER_UCX_INT_H

#include "dsckptd.h"

#include <pthread.h>
#include <stdatomic.h>
#include <ucp/api/ucp.h>

#define PEER_MAX_PENDING 64    /* connection requests not yet taken by a thread */

struct peer_net {
	ucp_context_h ctx;
	ucp_worker_h lworker;              /* the listener's; listener thread only */
	ucp_listener_h listener;
	pthread_t thread;
	int listening;
	peer_serve_fn serve;
	void *arg;
	unsigned max_conns;
	double timeout_s;                  /* of the links it accepts */
	atomic_int stopping;
	pthread_mutex_t lock;
	pthread_cond_t idle;               /* signalled when a connection thread ends */
	unsigned active;                   /* connection threads running (lock) */
	ucp_conn_request_h pending[PEER_MAX_PENDING]; /* listener thread only */
	unsigned npending;
};

struct peer_link {
	struct peer_net *net;
	ucp_worker_h worker;
	ucp_ep_h ep;                       /* NULL once broken */
	void *close_req;                   /* the forced close in flight, if any */
	int efd;
	int failed;                        /* the error handler ran */
	int timed_out;
	double timeout_s;
	char who[80];                      /* the other side's address */
	struct peer_op *orphans;           /* operations that never ended: freed at close */
};

/* A negative errno for a UCX status. */
int peer_errno(ucs_status_t st);
/* Makes a link with a worker of its own and its event fd; 0 or a negative errno. */
int peer_link_new(struct peer_net *n, double timeout_s, struct peer_link **out);
/* UCX's error handler of a link's endpoint: the other side failed (on the link's thread). */
void peer_link_error(void *arg, ucp_ep_h ep, ucs_status_t st);

#endif /* DSCKPTD_PEER_UCX_INT_H */
