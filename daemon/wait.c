/*
 * wait.c — WAITs: a client asked to hear when a save reaches a level. Loop thread only. A
 * WAIT not answered at once parks in waiter.c by its save's id (save.c publishes each level
 * there) and holds its save (save_hold) so that the save is not forgotten under it; when the
 * level is reached, the save fails or settles below it (peer copies held by fewer peers than
 * `replicas`; a version replaced before it reached the remote tier), or its time is up, wait_end answers it through reply.c, and a WAIT dropped
 * (its client left) only lets its save go.
 */
#include "dsckptd.h"

/* Answers a WAIT for s now (reached, failed, not ended, no time to wait, REPLICATED asked
 * of a save whose copies were sent to fewer peers, or REMOTE or above of one that a newer
 * version replaced before its upload ended) or later. */
void wait_add(uint64_t conn, uint64_t req, struct save *s, int level, int64_t timeout_ms)
{
	int now = save_level(s);
	struct save_view v;

	save_view(s, &v);
	if (now == LEVEL_FAILED || now >= level || timeout_ms == 0 || now == LEVEL_NONE ||
	    (level == LEVEL_REPLICATED && v.copies_why) ||
	    (level >= LEVEL_REMOTE && v.remote_why)) {
		reply_save_state(conn, req, &v);
		return;
	}
	struct waiter_on on = {.tag = WAITER_SAVE, .key = save_id(s), .level = level};
	if (waiter_add(conn, req, &on, timeout_ms) < 0) {
		reply_error(conn, req, ERR_ENOMEM, "out of memory");
		return;
	}
	save_hold(s);
}

/* waiter_fn of WAITER_SAVE: answers with the level reached so far (unless dropped) and lets
 * the save go. */
void wait_end(const struct waiter_end *e)
{
	struct save *s = save_find(e->conn, e->on.key);	/* held: still there */
	struct save_view v;

	if (e->how != WAITER_DROPPED) {
		save_view(s, &v);
		reply_save_state(e->conn, e->req, &v);
	}
	save_release(s);
}
