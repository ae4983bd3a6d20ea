/*
 * workq.c — the worker → loop completion queue that engine.c and restore.c share: worker
 * threads push completions, and the loop thread runs them, through one uv_async_t.
 *
 * The pattern of libuv's own uv__work_done: a worker links its item into a queue under the
 * queue's lock and calls uv_async_send; the loop takes the whole queue at once under the lock
 * and runs the items' callback outside it, in push order. uv_async_send coalesces: several
 * sends before the loop gets to the handle make one callback, which is why it takes every
 * item queued so far rather than one per send.
 *
 * An item is embedded in what it completes (a job), so pushing allocates nothing and cannot
 * fail. It carries event bits: a push ORs its events in and links the item only when it is
 * not queued already, so an item is queued once however many events it collects, and its
 * callback gets them all in one call. The loop moves taken items into a run list it alone
 * owns and takes each off that list before its callback runs: a callback that frees the item,
 * or runs the queue again (a stop from within a completion: workq_close), never sees an item
 * twice; the inner run carries on with the rest of the list.
 *
 * Lock order: the queue's lock is the innermost of its users' locks (engine.lock and
 * restore.c's pool.lock are held while pushing); nothing is called with it held.
 */
#include "dsckptd.h"

#include <pthread.h>
#include <stdlib.h>
#include <uv.h>

struct workq {
	pthread_mutex_t lock;
	struct workq_item *head;       /* (lock) items with events pushed, in push order */
	struct workq_item **tail;      /* (lock) */
	struct workq_item *run_head;   /* (loop) items taken, their callbacks not yet run */
	struct workq_item **run_tail;  /* (loop) */
	workq_fn fn;
	uv_async_t async;
};

/* The async handle's callback: runs what the workers pushed. */
static void on_async(uv_async_t *a)
{
	workq_run(a->data);
}

/* Makes a queue whose items run fn on loop's thread; 0 or a negative ERR_E* with err. */
int workq_open(struct workq **out, struct uv_loop_s *l, workq_fn fn, char *err, size_t errlen)
{
	struct workq *q = calloc(1, sizeof(*q));
	int rc;

	*out = NULL;
	if (!q)
		return err_set(err, errlen, ERR_ENOMEM, "out of memory");
	if ((rc = uv_async_init(l, &q->async, on_async)) != 0) {
		free(q);
		return err_set(err, errlen, ERR_EIO, "uv_async_init: %s", uv_strerror(rc));
	}
	pthread_mutex_init(&q->lock, NULL);
	q->tail = &q->head;
	q->run_tail = &q->run_head;
	q->fn = fn;
	q->async.data = q;
	*out = q;
	return 0;
}

/* Any thread: ORs events (non-zero) into it, queues it unless queued, and wakes the loop. */
void workq_push(struct workq *q, struct workq_item *it, unsigned events)
{
	pthread_mutex_lock(&q->lock);
	if (it->posted == 0) {
		it->next = NULL;
		*q->tail = it;
		q->tail = &it->next;
	}
	it->posted |= events;
	pthread_mutex_unlock(&q->lock);
	uv_async_send(&q->async);	/* sends coalesce: workq_run takes the whole queue */
}

/* Loop thread: takes the queue under the lock into the run list, then runs each item's
 * callback outside it, the item off the list first (callbacks may free it or run this). */
void workq_run(struct workq *q)
{
	struct workq_item *it;

	pthread_mutex_lock(&q->lock);
	for (it = q->head; it; it = it->next) {
		if (it->taken == 0) {
			it->run_next = NULL;
			*q->run_tail = it;
			q->run_tail = &it->run_next;
		}
		it->taken |= it->posted;
		it->posted = 0;
	}
	q->head = NULL;
	q->tail = &q->head;
	pthread_mutex_unlock(&q->lock);
	while ((it = q->run_head) != NULL) {
		unsigned events = it->taken;
		q->run_head = it->run_next;
		if (q->run_head == NULL)
			q->run_tail = &q->run_head;
		it->taken = 0;
		q->fn(it, events);
	}
}

/* Frees the queue once its handle is closed. */
static void on_closed(uv_handle_t *h)
{
	struct workq *q = h->data;

	pthread_mutex_destroy(&q->lock);
	free(q);
}

/* Loop thread, no worker left to push: runs what is pending and closes the handle; the queue
 * is freed by the loop's next turn (its close callback). NULL is fine. */
void workq_close(struct workq *q)
{
	if (!q)
		return;
	workq_run(q);
	uv_close((uv_handle_t *)&q->async, on_closed);
}
