/*
 * peer_window.c — several messages in flight on one peer link (issue 35 item 2: copies
 * stream, pipelined): a file's chunks are sent or received through a window of buffers, so
 * that the sender reads and hashes the next chunk while the link carries the ones before,
 * and the receiver has the next receives posted while it checks and stores the last one.
 *
 * A window is a ring of PEER_WINDOW_BYTES of buffers (at least 2, at most PEER_WINDOW_MAX,
 * of the chunk's size: two 4 MiB pieces; on bench-peer's veth four cost the sender more CPU
 * per GB, its buffers no longer in the CPU's caches, for no more throughput), each with its operation (peer_ucx.c's peer_post_send/recv), oldest
 * first. A sending window hands out the next free buffer (waiting for its send to complete
 * when every one is in flight) and posts it; a receiving one keeps a receive posted in every
 * buffer but the one the caller reads, and hands out the oldest once complete: UCX matches a
 * link's posted receives to its messages in the order both were posted, so messages come out
 * in the order they were sent whatever order their transfers end in. A receiving window is
 * ended when the other side sends nothing more before an answer: its receives still posted
 * are cancelled, and one that took a message after all means the other side broke the
 * protocol (-EPROTO). The first error sticks; ending a window after one breaks the link, so
 * that no transfer can touch a buffer once it is freed (one whose transfer never ends is left
 * to the link, freed after its worker). One thread, the link's.
 */
#include "dsckptd.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define PEER_WINDOW_BYTES (8u << 20)
#define PEER_WINDOW_MAX 8

/* One buffer and its operation. */
struct peer_slot {
	uint8_t *buf;
	struct peer_op *op;      /* in flight; NULL when free */
};

struct peer_window {
	struct peer_link *l;
	int recv;                /* a receiving window */
	size_t cap;              /* bytes of each buffer */
	unsigned depth;          /* buffers */
	unsigned head, n;        /* the oldest in flight, and how many are */
	int rc;                  /* the first error */
	struct peer_slot s[PEER_WINDOW_MAX];
};

/* Opens a window of buffers of cap bytes on l, sending (recv 0) or receiving; 0 or
 * -ENOMEM. */
int peer_window_open(struct peer_link *l, int recv, size_t cap, struct peer_window **out)
{
	struct peer_window *w = calloc(1, sizeof(*w));
	unsigned depth = cap ? (unsigned)(PEER_WINDOW_BYTES / cap) : PEER_WINDOW_MAX;

	if (w == NULL)
		return -ENOMEM;
	w->l = l;
	w->recv = recv;
	w->cap = cap;
	w->depth = depth < 2 ? 2 : depth > PEER_WINDOW_MAX ? PEER_WINDOW_MAX : depth;
	for (unsigned i = 0; i < w->depth; i++)
		if ((w->s[i].buf = malloc(cap)) == NULL) {
			peer_window_end(w);
			return -ENOMEM;
		}
	*out = w;
	return 0;
}

/* Waits for the oldest operation in flight; its result (kept when the first error) and, for
 * a receive, its type and length. */
static int peer_window_pop(struct peer_window *w, uint64_t *tag, size_t *len)
{
	struct peer_slot *s = &w->s[w->head];
	int rc = peer_op_wait(w->l, s->op, tag, len);

	s->op = NULL;
	if (rc == -ECANCELED)
		s->buf = NULL;  /* the link's now */
	w->head = (w->head + 1) % w->depth;
	w->n--;
	if (rc != 0 && w->rc == 0)
		w->rc = rc;
	return rc;
}

/* Sending: the next free buffer (cap bytes) into *buf, once its last send completed; 0 or
 * the window's error. */
int peer_window_next(struct peer_window *w, void **buf)
{
	if (w->rc == 0 && w->n == w->depth)
		peer_window_pop(w, NULL, NULL);
	*buf = w->s[(w->head + w->n) % w->depth].buf;
	return w->rc;
}

/* Sending: posts len bytes of the buffer peer_window_next gave as a message of type tag. */
int peer_window_send(struct peer_window *w, uint64_t tag, size_t len)
{
	struct peer_slot *s = &w->s[(w->head + w->n) % w->depth];
	int rc;

	if (w->rc != 0)
		return w->rc;
	if (w->n == w->depth)  /* no peer_window_next */
		return w->rc = -EINVAL;
	if ((rc = peer_post_send(w->l, tag, s->buf, len, &s->op)) != 0)
		return w->rc = rc;
	w->n++;
	return 0;
}

/* Sending: posts a message of len bytes copied from msg (NULL when len is 0) in the next
 * buffer; 0 or the window's error. */
int peer_window_post(struct peer_window *w, uint64_t tag, const void *msg, size_t len)
{
	void *buf;
	int rc = peer_window_next(w, &buf);

	if (rc == 0 && len)
		memcpy(buf, msg, len);
	return rc ? rc : peer_window_send(w, tag, len);
}

/* Makes rc (a failure of the caller's, e.g. a read) the window's error, unless it has one;
 * the window's error. */
int peer_window_fail(struct peer_window *w, int rc)
{
	if (w->rc == 0)
		w->rc = rc;
	return w->rc;
}

/* Sending: waits until every send posted completed; 0 or the window's error. */
int peer_window_flush(struct peer_window *w)
{
	while (w->rc == 0 && w->n > 0)
		peer_window_pop(w, NULL, NULL);
	return w->rc;
}

/* Receiving: the next message (its type, its bytes in a buffer of the window until the next
 * call, its length); first a receive is posted into every buffer not in flight (the one the
 * last call gave among them). 0 or the window's error. */
int peer_window_recv(struct peer_window *w, uint64_t *tag, void **buf, size_t *len)
{
	while (w->rc == 0 && w->n < w->depth) {
		struct peer_slot *s = &w->s[(w->head + w->n) % w->depth];
		int rc = peer_post_recv(w->l, s->buf, w->cap, &s->op);
		if (rc != 0)
			w->rc = rc;
		else
			w->n++;
	}
	if (w->rc != 0)
		return w->rc;
	*buf = w->s[w->head].buf;
	return peer_window_pop(w, tag, len);
}

/* Ends a window: a sending one's sends waited for, a receiving one's receives still posted
 * cancelled; after an error the link is broken first. Frees w; 0, the window's error, or
 * -EPROTO when a receive cancelled had taken a message. */
int peer_window_end(struct peer_window *w)
{
	int rc;

	if (w->rc != 0 && w->n > 0)
		peer_link_abort(w->l);
	for (unsigned i = 0; w->recv && w->rc == 0 && i < w->n; i++)
		peer_op_cancel(w->l, w->s[(w->head + i) % w->depth].op);
	while (w->n > 0) {
		int was = w->rc;
		rc = peer_window_pop(w, NULL, NULL);
		if (w->recv && was == 0 && rc == 0)
			w->rc = -EPROTO;  /* a message past the end */
		else if (w->recv && was == 0)
			w->rc = 0;        /* cancelled, as asked */
	}
	rc = w->rc;
	for (unsigned i = 0; i < w->depth; i++)
		free(w->s[i].buf);
	free(w);
	return rc;
}
