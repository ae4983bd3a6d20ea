/*
 * upload_replace.c — a tag committed again (issue 31's fixed tags, "last") before the version
 * uploading reached REMOTE: what that version's saves hear, so that no wait for REMOTE (or
 * REPLICATED after it) on them lasts until its timeout for a version that will never go up.
 *
 * The version replaced is gone locally (the newer one was exchanged with it), so it never
 * reaches the remote but in one case: a worker was finishing it (its files up, the remote
 * manifest and latest being written) when the newer commit came. Then its saves wait for
 * that step: REMOTE when the finish moved the remote latest to it, else replaced. Otherwise
 * they hear at once that a newer version replaced theirs before its upload ended (a wait on
 * them ends with EINCOMPLETE and that message). A finish that saw the directory exchanged
 * before the loop saw the newer commit leaves its version's mark on the tag: that commit
 * then marks the old version's saves REMOTE. The files of a version given up that went up
 * below its own version directory, which no manifest will name, are deleted before the next
 * plan (upload_version.c).
 *
 * upload.c calls in with its lock held (uptag_replace on the loop, uptag_step_ended on a
 * worker) or dropped (uptag_tell_saves, uptag_verdict: the save marks, loop thread).
 */
#include "upload.h"

#include <stdlib.h>
#include <time.h>

/* What became of a version replaced while a worker finished it, for the loop. */
struct verdict {
	struct workq_item wi;
	struct store_dirid id;    /* its saves' directory */
	int remote;               /* REMOTE; else never (why) */
	char why[ERRLEN];
};

/* Why the saves of t's committed version will never be REMOTE, now that v's save of a newer
 * version is COMMITTED (the newer one is uploaded instead). */
static void replaced_why(const struct uptag *t, const struct save_view *v, char *why,
			 size_t len)
{
	char when[32];
	struct tm tm;
	time_t now = time(NULL);

	strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&now, &tm));
	snprintf(why, len, "%.600s was committed again (a newer version%s%.128s%s, at %s) before "
		 "this version's upload to %.200s ended; the newer version goes there instead",
		 t->dir, v->run[0] ? ", run '" : "", v->run, v->run[0] ? "'" : "", when,
		 remote_url(t->r));
}

/* Loop, lock held: t's committed version is replaced by the newer one of v's save; *old and
 * why for uptag_tell_saves: 0 (a finish in flight decides, or no version to tell), 1 replaced,
 * 2 REMOTE (a finish got it there before the loop saw this commit). */
int uptag_replace(struct uptag *t, const struct save_view *v, struct store_dirid *old,
		  char *why, size_t len)
{
	int how = 0;

	*old = t->dirid;
	replaced_why(t, v, why, len);
	if (t->has_dirid && t->has_reached && store_dirid_eq(&t->reached_id, old)) {
		how = 2;
	} else if (t->has_dirid && t->finishing && store_dirid_eq(&t->fin_id, old)) {
		t->held = *old;
		t->has_held = 1;
		snprintf(t->held_why, sizeof(t->held_why), "%s", why);
	} else if (t->has_dirid) {
		how = 1;
	}
	t->has_reached = 0;
	return how;
}

/* Loop, lock dropped: tells the saves of the replaced version old what uptag_replace said. */
void uptag_tell_saves(int how, const struct store_dirid *old, const char *why)
{
	if (how == 2) {
		save_mark_remote(old);
	} else if (how == 1) {
		log_info("upload: %s", why);
		save_mark_replaced(old, why);
	}
}

/* Worker, lock held, after t's step: a version replaced while it was finished here is REMOTE
 * when the finish moved the remote latest to it, else replaced (pushed to the loop through
 * q); one the finish got there but saw exchanged before the loop saw the newer commit is kept
 * for uptag_replace. */
void uptag_step_ended(struct uptag *t, int finishing, int rc, struct workq *q)
{
	int reached = finishing && (rc == 0 || t->reached);

	t->finishing = 0;
	if (t->has_held) {
		t->has_held = 0;
		struct verdict *vd = calloc(1, sizeof(*vd));
		if (!vd) {
			log_warnx("upload of %s: out of memory: the replaced version's waits end at "
				  "their timeout", t->dir);
			return;
		}
		vd->id = t->held;
		vd->remote = reached;
		snprintf(vd->why, sizeof(vd->why), "%s", t->held_why);
		workq_push(q, &vd->wi, UP_VERDICT);
	} else if (reached && rc != 0 && t->has_dirid && store_dirid_eq(&t->fin_id, &t->dirid)) {
		t->has_reached = 1;
		t->reached_id = t->fin_id;
	}
}

/* Worker, lock held, t to be planned again: copies of this node's files of the version given
 * up that went up below its version directory (v<ns>) while no manifest could name them; NULL
 * when none (or without memory: they stay). */
struct upfile *uptag_abandoned(const struct uptag *t, size_t *n)
{
	struct upfile *gone = NULL;

	*n = 0;
	if (t->recorded || t->reached)
		return NULL;	/* another node may write its manifest, or did */
	for (size_t i = 0; i < t->nfiles; i++) {
		if (t->files[i].state != UPF_DONE || t->files[i].loc[0] != 'v')
			continue;
		struct upfile *g = realloc(gone, (*n + 1) * sizeof(*g));
		if (!g)
			break;
		gone = g;
		gone[(*n)++] = t->files[i];
	}
	return gone;
}

/* Loop: a verdict pushed with UP_VERDICT reaches its saves, and is freed. */
void uptag_verdict(struct workq_item *it)
{
	struct verdict *vd = (struct verdict *)((char *)it - offsetof(struct verdict, wi));

	if (vd->remote)
		save_mark_remote(&vd->id);
	else
		uptag_tell_saves(1, &vd->id, vd->why);
	free(vd);
}
