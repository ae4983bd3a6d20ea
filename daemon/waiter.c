/*
 * waiter.c — requests parked until something happens, in the spirit of Redis's blocked.c: a
 * WAIT until its save reaches a level, a COMMIT until its directory's saves are durable, a
 * LOAD_WAIT until its load ends. Loop thread only.
 *
 * A waiter is a request (connection id, request id), what it waits for (a tag, a key — the
 * save's, load's or commit's id — and the level that ends it) and its deadline. Registries
 * publish their keys' levels here (waiter_publish); a wait ends when its level is reached, a
 * negative level (failed) is published, its key is settled (waiter_settle: it will go no
 * higher), its deadline passes, or its connection goes. Each
 * end goes to its tag's handler (set by main.c's wiring), which answers through reply.c or
 * moves its state machine on; this layer encodes nothing and calls nothing above it.
 *
 * Waiters are owned by one list, in the order they were parked, from waiter_add until their
 * end: a waiter is unlinked before its handler runs, so a handler may park or publish again.
 * One timer serves every deadline: it is due at the earliest one and re-armed after it fires.
 */
#include "dsckptd.h"

#include <stdlib.h>
#include <uv.h>

struct waiter {
	uint64_t conn, req;
	struct waiter_on on;
	uint64_t deadline;        /* on the loop's clock (ms); UINT64_MAX: none */
	struct waiter *prev, *next;
};

/* The handler of each tag, and whether its waits outlive their connection. */
static struct {
	waiter_fn fn;
	int outlive;
} tags[WAITER_TAGS];

static struct waiter *head, *tail;   /* parking order */
static uv_loop_t *wloop;
static uv_timer_t *timer;            /* due at the earliest deadline, if any */
static uint64_t timer_due = UINT64_MAX;

static void timer_arm(void);

/* Unlinks w from the list. */
static void unlink_waiter(struct waiter *w)
{
	if (w->prev)
		w->prev->next = w->next;
	else
		head = w->next;
	if (w->next)
		w->next->prev = w->prev;
	else
		tail = w->prev;
	w->prev = w->next = NULL;
}

/* Ends the waiters of the list ending (linked by next, already unlinked) in order: each goes
 * to its tag's handler with how and level, then is freed. */
static void end_all(struct waiter *ending, enum waiter_how how, int level)
{
	while (ending) {
		struct waiter *w = ending;
		ending = w->next;
		struct waiter_end e = {.conn = w->conn, .req = w->req, .on = w->on, .how = how,
				       .level = level};
		free(w);
		if (tags[e.on.tag].fn)
			tags[e.on.tag].fn(&e);
	}
}

/* Moves every waiter that match accepts out of the list, in order; returns them linked by
 * next (NULL: none). */
static struct waiter *take(int (*match)(const struct waiter *w, const void *arg),
			   const void *arg)
{
	struct waiter *first = NULL, *last = NULL, *w = head, *next;

	for (; w; w = next) {
		next = w->next;
		if (!match(w, arg))
			continue;
		unlink_waiter(w);
		if (last)
			last->next = w;
		else
			first = w;
		last = w;
	}
	return first;
}

/* Whether w's deadline is at or before *arg (the loop's time now). */
static int match_due(const struct waiter *w, const void *arg)
{
	return w->deadline <= *(const uint64_t *)arg;
}

/* Fires at the earliest deadline: ends the waits due (TIMEOUT) and re-arms. */
static void on_timer(uv_timer_t *t)
{
	uint64_t now = uv_now(wloop);

	timer_due = UINT64_MAX;
	end_all(take(match_due, &now), WAITER_TIMEOUT, 0);
	timer_arm();
}

/* Sets the timer for the earliest deadline of the list, or stops it when there is none. */
static void timer_arm(void)
{
	uint64_t due = UINT64_MAX;

	for (struct waiter *w = head; w; w = w->next)
		if (w->deadline < due)
			due = w->deadline;
	if (due == timer_due || !timer)
		return;
	timer_due = due;
	if (due == UINT64_MAX) {
		uv_timer_stop(timer);
		return;
	}
	uint64_t now = uv_now(wloop);
	uv_timer_start(timer, on_timer, due > now ? due - now : 0, 0);
}

/* Frees the timer once libuv has closed it. */
static void timer_closed(uv_handle_t *h)
{
	free(h);
}

/* Makes the layer's timer on loop l; 0, or ERR_ENOMEM. */
int waiter_init(struct uv_loop_s *l)
{
	if (!(timer = malloc(sizeof(*timer))))
		return ERR_ENOMEM;
	wloop = l;
	uv_timer_init(l, timer);
	timer_due = UINT64_MAX;
	return 0;
}

/* Sets tag's handler, and whether its waits outlive their connection. */
void waiter_handle(enum waiter_tag tag, waiter_fn fn, int outlive)
{
	tags[tag].fn = fn;
	tags[tag].outlive = outlive;
}

/* Parks request req of connection conn until on is reached or timeout_ms passes. */
int waiter_add(uint64_t conn, uint64_t req, const struct waiter_on *on, int64_t timeout_ms)
{
	struct waiter *w = calloc(1, sizeof(*w));

	if (!w)
		return ERR_ENOMEM;
	w->conn = conn;
	w->req = req;
	w->on = *on;
	w->deadline = timeout_ms < 0 ? UINT64_MAX : uv_now(wloop) + (uint64_t)timeout_ms;
	w->prev = tail;
	if (tail)
		tail->next = w;
	else
		head = w;
	tail = w;
	if (w->deadline < timer_due)
		timer_arm();
	return 0;
}

/* What waiter_publish ends: tag's waits on key whose level is reached. */
struct published {
	enum waiter_tag tag;
	uint64_t key;
	int level;
};

/* Whether w waits on the published key and its level ends the wait. */
static int match_published(const struct waiter *w, const void *arg)
{
	const struct published *p = arg;

	return w->on.tag == p->tag && w->on.key == p->key &&
	       (p->level < 0 || p->level >= w->on.level);
}

/* A registry's news: key of tag is at level now. */
void waiter_publish(enum waiter_tag tag, uint64_t key, int level)
{
	struct published p = {tag, key, level};
	struct waiter *ending = take(match_published, &p);

	if (ending) {
		end_all(ending, WAITER_REACHED, level);
		timer_arm();
	}
}

/* Whether w waits on the settled key. */
static int match_key(const struct waiter *w, const void *arg)
{
	const struct published *p = arg;

	return w->on.tag == p->tag && w->on.key == p->key;
}

/* A registry's news: key of tag, at level, will go no higher; every wait on it ends now. */
void waiter_settle(enum waiter_tag tag, uint64_t key, int level)
{
	struct published p = {tag, key, level};
	struct waiter *ending = take(match_key, &p);

	if (ending) {
		end_all(ending, WAITER_REACHED, level);
		timer_arm();
	}
}

/* Whether a wait on key of tag is parked. */
int waiter_parked(enum waiter_tag tag, uint64_t key)
{
	for (struct waiter *w = head; w; w = w->next)
		if (w->on.tag == tag && w->on.key == key)
			return 1;
	return 0;
}

/* Whether w is a wait of the departed connection that does not outlive it. */
static int match_conn(const struct waiter *w, const void *arg)
{
	return w->conn == *(const uint64_t *)arg && !tags[w->on.tag].outlive;
}

/* Drops the departed connection's waits (those that outlive it go on). */
void waiter_conn_gone(uint64_t conn)
{
	struct waiter *ending = take(match_conn, &conn);

	if (ending) {
		end_all(ending, WAITER_DROPPED, 0);
		timer_arm();
	}
}

/* Waits parked now. */
unsigned waiter_count(void)
{
	unsigned n = 0;

	for (struct waiter *w = head; w; w = w->next)
		n++;
	return n;
}

/* Matches every waiter. */
static int match_any(const struct waiter *w, const void *arg)
{
	return 1;
}

/* Drops every wait and closes the timer (shutdown). */
void waiter_close(void)
{
	end_all(take(match_any, NULL), WAITER_DROPPED, 0);
	if (timer) {
		uv_close((uv_handle_t *)timer, timer_closed);
		timer = NULL;
	}
	timer_due = UINT64_MAX;
}
