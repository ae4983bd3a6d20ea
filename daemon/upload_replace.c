/*
 * upload_replace.c — a tag committed again (issue 31's fixed tags, "last") before the version
 * uploading reached REMOTE: which version goes up, and what the others' saves hear, so that
 * a job saving a fixed tag more often than one upload takes still gets a recent version into
 * the remote, and no wait for REMOTE (or REPLICATED after it) lasts until its timeout.
 *
 * A version's upload is in flight from its plan, which opens every file of this node that
 * its manifest lists (upload_tag.c): the descriptors keep the files readable after the
 * exchange with a newer version removed the directory, so the version pinned so goes up to
 * its end (its saves REMOTE), at most one older version per tag kept so on disk, and nothing
 * of it once the daemon is gone (a restart uploads the tag's version then; the next remote
 * manifest written deletes the older version directories). Of the versions committed
 * meanwhile only the newest is planned once the pinned one ends: the saves of each one
 * skipped hear at once that a newer version replaced theirs before its upload (a wait on
 * them ends with EINCOMPLETE and that message). A version replaced before its plan (or whose
 * pinned upload is given up: the remote changed under it, a later version is there, or it
 * was deleted with its tag: then its saves hear that instead) is
 * uploaded no further: the file of it going up gives up, and its files that went up below
 * its own version directory, which no manifest will name, are deleted before the next plan
 * (upload_version.c).
 *
 * upload.c calls in with its lock held (uptag_replace on the loop, uptag_pin_ended on a
 * worker) or dropped (uptag_tell_saves, uptag_verdict: the save marks, loop thread).
 */
#include "upload.h"

#include <stdlib.h>
#include <time.h>

/* What became of a pinned version replaced while it went up, for the loop. */
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

/* Loop, lock held: t's committed version *old is replaced by the newer one of v's save,
 * now t's: 1 when its saves hear why now, 0 when not (the pinned version's wait for its
 * outcome; none to tell). */
int uptag_replace(struct uptag *t, const struct save_view *v, struct store_dirid *old,
		  char *why, size_t len)
{
	int how = t->has_dirid;

	*old = t->dirid;
	replaced_why(t, v, why, len);
	if (t->pinned && !t->stuck) {
		/* The version in flight goes on; the newer one is planned once it ends. */
		if (t->has_dirid && store_dirid_eq(&t->pin_id, old) && !t->has_held) {
			t->held = *old;
			t->has_held = 1;
			snprintf(t->held_why, sizeof(t->held_why), "%s", why);
			how = 0;
		}
		t->newer |= !store_dirid_eq(&t->pin_id, &v->dirid);  /* not the one planned */
	} else {
		/* Nothing of it pinned (or stuck behind a later remote version): the newer
		 * version is planned at once, the old one's file going up gives up. */
		t->replan = 1;
		t->stuck = 0;
		__atomic_store_n(&t->cancel, 1, __ATOMIC_RELAXED);
	}
	t->dirid = v->dirid;
	t->has_dirid = 1;
	return how;
}

/* Loop, lock dropped: tells the saves of the replaced version old why, when how is 1. */
void uptag_tell_saves(int how, const struct store_dirid *old, const char *why)
{
	if (how == 1) {
		log_info("upload: %s", why);
		save_mark_replaced(old, why);
	}
}

/* Worker, lock held: t's pinned version's upload ended (reached: in the remote); when a
 * newer version replaced it, or it was deleted, its saves hear so through q: REMOTE, or why
 * not. */
void uptag_pin_ended(struct uptag *t, int reached, struct workq *q)
{
	if (t->gone && t->pinned) {	/* deleted: its saves hear it whether replaced or not */
		if (!t->has_held && t->has_dirid && store_dirid_eq(&t->dirid, &t->pin_id)) {
			t->held = t->dirid;
			t->has_held = 1;
		}
		snprintf(t->held_why, sizeof(t->held_why), "%.600s was deleted before this "
			 "version's upload to %.200s ended", t->dir, remote_url(t->r));
	}
	t->gone = 0;
	t->pinned = 0;
	if (!t->has_held)
		return;
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
