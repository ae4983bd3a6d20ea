/*
 * save_gc.c — forgetting finished saves (save.c's registry, through its functions): a minute
 * (LINGER_S) after its last change a finished save nobody waits on goes, unless it finished
 * well (DURABLE or above), its client is still connected and it is among that client's
 * KEEP_PER_CLIENT newest: then it is slimmed to its levels and counts (its tensor list, whose
 * charge goes back to its user, blobs and header freed) and kept, so that a WAIT long after
 * (a commit some long steps later) is answered, not told ENOENT; dsckptctl pending no longer
 * lists it. A client that leaves takes its saves not yet ended with it; ended ones go on
 * without it, forgotten a minute after they finish. Loop thread only.
 */
#include "save_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <uv.h>

#define LINGER_S 60.0          /* finished saves stay listed this long */
#define KEEP_PER_CLIENT 64     /* then a connected client's newest stay answerable */

static uv_timer_t *gc_timer;

/* Whether finished save s is kept past LINGER_S: not FAILED (a seal of its tag would take
 * it for the rank's latest try), its client connected, and among that client's
 * KEEP_PER_CLIENT newest saves (the registry is newest first). */
static int save_kept(const struct save *s)
{
	unsigned newer = 0;

	if (s->level == LEVEL_FAILED || s->gone)
		return 0;
	for (const struct save *t = save_next(NULL); t != s && newer < KEEP_PER_CLIENT;
	     t = save_next(t))
		newer += t->client == s->client;
	return newer < KEEP_PER_CLIENT;
}

/* Frees what a kept save no longer needs (its tensor list's charge goes back to its user). */
static void save_slim(struct save *s)
{
	s->bytes = tensors_bytes(s->tl);
	save_unshare(s);
	tensors_unref(s->tl);
	blobs_free(s->blobs);
	free(s->hdr);
	s->tl = NULL;
	s->blobs = NULL;
	s->hdr = NULL;
	s->hdr_len = 0;
	s->slim = 1;
}

/* Drops finished saves nobody waits on after LINGER_S, but those kept (slimmed instead). */
static void on_gc(uv_timer_t *t)
{
	double now = now_mono();
	struct save *s = save_next(NULL), *next;

	for (; s; s = next) {
		next = save_next(s);
		int done = s->level == LEVEL_FAILED || s->level >= LEVEL_DURABLE;
		if (!done || s->holds || now - s->t_change <= LINGER_S)
			continue;
		if (!save_kept(s))
			save_drop(s);
		else if (!s->slim)
			save_slim(s);
	}
}

/* Frees a closed handle that was malloc'd on its own. */
static void handle_free(uv_handle_t *h)
{
	free(h);
}

/* Starts the timer that forgets finished saves (every 10 s). */
int save_gc_start(const struct daemon *d, char *err, size_t errlen)
{
	if (!(gc_timer = malloc(sizeof(*gc_timer)))) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	uv_timer_init(d->loop, gc_timer);
	uv_timer_start(gc_timer, on_gc, 10000, 10000);
	uv_unref((uv_handle_t *)gc_timer);
	return 0;
}

/* Stops it (shutdown). */
void save_gc_stop(void)
{
	if (gc_timer) {
		uv_close((uv_handle_t *)gc_timer, handle_free);
		gc_timer = NULL;
	}
}

/* A departed client's saves not yet ended are dropped; ended ones go on without it (and are
 * not kept past LINGER_S once finished). */
void save_client_gone(uint64_t client)
{
	struct save *s = save_next(NULL), *next;

	for (; s; s = next) {
		next = save_next(s);
		if (s->client == client && s->level == LEVEL_NONE) {
			log_debug("save %llu dropped: client left before SAVE_END",
				  (unsigned long long)s->id);
			save_drop(s);
		} else if (s->client == client) {
			s->gone = 1;	/* forgotten a minute after it finishes */
		}
	}
}
