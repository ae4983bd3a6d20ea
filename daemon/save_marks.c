/*
 * save_marks.c — the levels the saves into one tag directory reach together, through save.c's
 * registry: COMMITTED once the tag's manifest is written (commit.c, seal.c), REMOTE once it is
 * in the root's remote tier (upload.c; never, with why, once a newer version replaced it
 * first), REPLICATED once `replicas` peers hold the node's files
 * (peer.c; after REMOTE where the root has a remote tier, so that each level implies those
 * below), and the state a commit checks first. A directory is its identity (store_dirid), as
 * SAVE_BEGIN opened it. Loop thread only.
 */
#include "dsckptd.h"

#include <string.h>

static const struct daemon *daemon_ctx;  /* save_marks_init's */

/* Hands the module the daemon whose configuration says which roots have a remote tier. */
void save_marks_init(const struct daemon *d)
{
	daemon_ctx = d;
}

/* Whether v is a save of run into the directory id by uid. */
static int save_of(const struct save_view *v, const struct store_dirid *id, uid_t uid,
		   const char *run)
{
	return v->uid == uid && store_dirid_eq(&v->dirid, id) && strcmp(v->run, run) == 0;
}

/* The state of uid's saves of run into the directory id: the first failed one (or NULL), and
 * whether any (ended or still open) is not yet DURABLE. */
struct save *save_dir_state(const struct store_dirid *id, uid_t uid, const char *run,
			    int *pending)
{
	struct save *bad = NULL;
	struct save_view v;

	*pending = 0;
	for (struct save *s = save_next(NULL); s; s = save_next(s)) {
		save_view(s, &v);
		if (!save_of(&v, id, uid, run))
			continue;
		if (v.level == LEVEL_FAILED && !bad)
			bad = s;
		else if (v.level < LEVEL_DURABLE)
			*pending = 1;
	}
	return bad;
}

/* Marks uid's DURABLE saves of run into the directory id COMMITTED (its manifest is
 * written). */
void save_mark_committed(const struct store_dirid *id, uid_t uid, const char *run)
{
	struct save_view v;

	for (struct save *s = save_next(NULL); s; s = save_next(s)) {
		save_view(s, &v);
		if (v.level == LEVEL_DURABLE && save_of(&v, id, uid, run))
			save_set_level(s, LEVEL_COMMITTED);
	}
}

/* Marks the COMMITTED saves into the directory id REMOTE (upload.c: the tag, its manifest
 * and latest are in the remote tier), and on to REPLICATED those whose copies are held. */
void save_mark_remote(const struct store_dirid *id)
{
	struct save_view v;

	for (struct save *s = save_next(NULL); s; s = save_next(s)) {
		save_view(s, &v);
		if (v.level != LEVEL_COMMITTED || !store_dirid_eq(&v.dirid, id))
			continue;
		save_set_level(s, LEVEL_REMOTE);
		if (v.settled && v.copies >= v.replicas)
			save_set_level(s, LEVEL_REPLICATED);
	}
}

/* The COMMITTED saves into the directory id will never be REMOTE (upload.c: a newer version
 * of the tag replaced theirs before its upload ended): each records why, and every wait on it
 * (for REMOTE, or REPLICATED, which comes after REMOTE on such a root) ends now. */
void save_mark_replaced(const struct store_dirid *id, const char *why)
{
	struct save_view v;

	for (struct save *s = save_next(NULL); s; s = save_next(s)) {
		save_view(s, &v);
		if (v.level != LEVEL_COMMITTED || v.remote_why || !store_dirid_eq(&v.dirid, id))
			continue;
		save_set_remote_why(s, why);
		waiter_settle(WAITER_SAVE, v.id, v.level);
	}
}

/* Records on the COMMITTED (or REMOTE) saves into the directory id that copies of replicas
 * peers hold this node's files of the tag (peer.c, once it tried the placement's nodes; why:
 * why no more, when fewer): each moves to REPLICATED when all are held (after REMOTE where
 * its root has a remote tier); a wait for REPLICATED on one left short ends now. */
void save_mark_replicated(const struct store_dirid *id, unsigned copies, unsigned replicas,
			  const char *why)
{
	const char *remote = NULL;
	struct save_view v;

	for (struct save *s = save_next(NULL); s; s = save_next(s)) {
		save_view(s, &v);
		if (v.level < LEVEL_COMMITTED || v.settled || !store_dirid_eq(&v.dirid, id))
			continue;
		save_set_copies(s, copies, replicas, why);
		if (copies < replicas)
			waiter_settle(WAITER_SAVE, v.id, v.level);
		else if (v.level == LEVEL_REMOTE ||
			 config_root_of(daemon_ctx->config, v.dir, &remote) < 0 || !remote)
			save_set_level(s, LEVEL_REPLICATED);
	}
}
