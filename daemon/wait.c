/*
 * wait.c — WAITs in progress: a client asked to hear when a save reaches a level. Loop
 * thread only. A waiter names its client by connection id and holds its save (save_hold)
 * so that the save is not forgotten under it; it is answered through reply.c when the level
 * is reached, the save fails, or its time is up, and dropped unanswered when its client
 * leaves.
 */
#include "dsckptd.h"

#include <stdlib.h>
#include <uv.h>

/* A WAIT in progress; owned by the list from wait_add until its timer's close callback. */
struct waiter {
	uint64_t conn;
	uint64_t req;
	int level;
	struct save *save;      /* held until the waiter ends */
	uv_timer_t timer;
	struct waiter *next;
};

static struct waiter *waiters;

/* Frees a waiter once its timer is closed. */
static void waiter_closed(uv_handle_t *h)
{
	free(h->data);
}

/* Unlinks a waiter, answers it (when reply is set) and lets its save go. */
static void waiter_finish(struct waiter *w, int reply)
{
	struct save_view v;

	for (struct waiter **p = &waiters; *p; p = &(*p)->next) {
		if (*p == w) {
			*p = w->next;
			break;
		}
	}
	if (reply) {
		save_view(w->save, &v);
		reply_save_state(w->conn, w->req, &v);
	}
	save_release(w->save);
	uv_timer_stop(&w->timer);
	uv_close((uv_handle_t *)&w->timer, waiter_closed);
}

/* Fires when a WAIT's time is up: answers with the level reached so far. */
static void on_wait_timeout(uv_timer_t *t)
{
	waiter_finish(t->data, 1);
}

/* Answers a WAIT for s now (reached, failed, not ended, or no time to wait) or later. */
void wait_add(uint64_t conn, uint64_t req, struct save *s, int level, int64_t timeout_ms)
{
	int now = save_level(s);
	struct save_view v;

	if (now == LEVEL_FAILED || now >= level || timeout_ms == 0 || now == LEVEL_NONE) {
		save_view(s, &v);
		reply_save_state(conn, req, &v);
		return;
	}
	struct waiter *w = calloc(1, sizeof(*w));
	if (!w) {
		reply_error(conn, req, ERR_ENOMEM, "out of memory");
		return;
	}
	w->conn = conn;
	w->req = req;
	w->level = level;
	w->save = s;
	save_hold(s);
	uv_timer_init(loop, &w->timer);
	w->timer.data = w;
	if (timeout_ms > 0)
		uv_timer_start(&w->timer, on_wait_timeout, (uint64_t)timeout_ms, 0);
	w->next = waiters;
	waiters = w;
}

/* Observer of save levels: answers every waiter of s whose level is reached (all, on
 * failure). */
void wait_on_save(struct save *s)
{
	int level = save_level(s);
	struct waiter *w = waiters, *next;

	for (; w; w = next) {
		next = w->next;
		if (w->save == s && (level == LEVEL_FAILED || level >= w->level))
			waiter_finish(w, 1);
	}
}

/* Drops a departed client's waits unanswered. */
void wait_client_gone(uint64_t conn)
{
	struct waiter *w = waiters, *next;

	for (; w; w = next) {
		next = w->next;
		if (w->conn == conn)
			waiter_finish(w, 0);
	}
}

/* Drops every wait unanswered (shutdown). */
void wait_free_all(void)
{
	while (waiters)
		waiter_finish(waiters, 0);
}
