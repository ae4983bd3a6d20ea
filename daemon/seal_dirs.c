/*
 * seal_dirs.c — the tag directories SAVE_BEGINs opened, kept for the SEALs of their ranks. A
 * SAVE_BEGIN walks its directory's path from the allowed root, one component at a time, its
 * owner checked at each (store_path.c); the SEAL of the same path by the same user that
 * follows takes the directory and its job directory from here instead of walking the path
 * again: on a shared filesystem that walk is a round trip to its metadata server per
 * component, for every rank of every node. What is kept is the user's own: found by the
 * user and the path the save named (as overwrite.c rewrote it), it is the directory the
 * user's saves went into, checked then, whatever has been renamed since; one removed since,
 * or that no save of the user not yet committed is in any more, is not taken, and its SEAL
 * walks the path.
 *
 * A directory is kept until the last save of its user in it ends (seal_dirs_release), and
 * SEAL_DIRS_KEEP_S after the last SAVE_BEGIN into it at most, SEAL_DIRS_PER_USER per user and
 * SEAL_DIRS_MAX in all (the oldest go first). Loop thread only.
 */
#include "dsckptd.h"
#include "../proto/proto.h"

#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SEAL_DIRS_MAX 1024       /* directories kept in all */
#define SEAL_DIRS_PER_USER 64    /* and per user */
#define SEAL_DIRS_KEEP_S 600.0   /* since the last SAVE_BEGIN into one */

struct seal_dir {
	uid_t uid;
	char dir[PROTO_MAX_STR + 1];  /* the path the saves named; "" while free */
	struct store_dirid id;
	int dfd, jobfd;
	double last;                  /* now_mono() of its last SAVE_BEGIN */
};

static struct seal_dir dirs[SEAL_DIRS_MAX];

/* Closes a kept directory and frees its slot. */
static void seal_dir_drop(struct seal_dir *d)
{
	close(d->dfd);
	close(d->jobfd);
	d->dir[0] = '\0';
}

/* Drops what was kept too long; the slot of uid's dir (or a free one, or the oldest to make
 * room for one, of uid's when it holds SEAL_DIRS_PER_USER). */
static struct seal_dir *seal_dir_slot(uid_t uid, const char *dir)
{
	struct seal_dir *same = NULL, *free_slot = NULL, *oldest = NULL, *oldest_own = NULL;
	unsigned own = 0;
	double now = now_mono();

	for (size_t i = 0; i < SEAL_DIRS_MAX; i++) {
		struct seal_dir *d = &dirs[i];
		if (d->dir[0] && now - d->last > SEAL_DIRS_KEEP_S)
			seal_dir_drop(d);
		if (!d->dir[0]) {
			free_slot = free_slot ? free_slot : d;
			continue;
		}
		if (d->uid == uid && strcmp(d->dir, dir) == 0)
			same = d;
		if (d->uid == uid && ++own && (!oldest_own || d->last < oldest_own->last))
			oldest_own = d;
		if (!oldest || d->last < oldest->last)
			oldest = d;
	}
	struct seal_dir *d = same ? same : own >= SEAL_DIRS_PER_USER ? oldest_own :
				      free_slot ? free_slot : oldest;
	if (d->dir[0])
		seal_dir_drop(d);
	return d;
}

/* SAVE_BEGIN: keeps dir (normalized, as the save names it) of uid, open as dfd (duplicated:
 * the save keeps its own) with its identity id, and its job directory jobfd (taken: closed
 * here when it cannot be kept). */
void seal_dirs_keep(uid_t uid, const char *dir, int dfd, int jobfd,
		    const struct store_dirid *id)
{
	struct seal_dir *d = seal_dir_slot(uid, dir);
	int fd = fcntl(dfd, F_DUPFD_CLOEXEC, 0);

	if (fd < 0 || strlen(dir) >= sizeof(d->dir)) {
		if (fd >= 0)
			close(fd);
		close(jobfd);
		return;
	}
	*d = (struct seal_dir){.uid = uid, .id = *id, .dfd = fd, .jobfd = jobfd,
			       .last = now_mono()};
	snprintf(d->dir, sizeof(d->dir), "%s", dir);
}

/* Whether uid has a save into the directory id not yet COMMITTED (nor FAILED): it is still
 * the version in flight it was when kept (a version committed may have been exchanged with its
 * tag since); *pending (when o is given, o's user being uid): whether one of them is o's
 * rank's, of its run (the tag was not committed with it when this daemon last heard). */
static int seal_dirs_live(uid_t uid, const struct owner *o, const struct store_dirid *id,
			  int *pending)
{
	struct save_view v;
	int live = 0;

	*pending = 0;
	for (struct save *s = save_next(NULL); s; s = save_next(s)) {
		save_view(s, &v);
		if (v.uid != uid || !store_dirid_eq(&v.dirid, id) || v.level == LEVEL_FAILED ||
		    v.level >= LEVEL_COMMITTED)
			continue;
		live = 1;
		*pending |= o && v.rank == o->rank && strcmp(v.run, o->run) == 0;
	}
	return live;
}

/* A save of uid into the directory id ended (COMMITTED, or failed: FAILED or dropped): once
 * none of uid's is left in flight there, the directory is no longer kept (nor its filesystem
 * held busy: an administrator's umount after a failed save must not find the daemon in it).
 * A staging directory a failed save leaves empty goes too, rather than at the next start: a
 * save of this daemon made again opens it again (on the loop thread, as this runs). */
void seal_dirs_release(uid_t uid, const struct store_dirid *id, int failed)
{
	int pending;

	for (size_t i = 0; i < SEAL_DIRS_MAX; i++) {
		struct seal_dir *d = &dirs[i];
		if (!d->dir[0] || d->uid != uid || !store_dirid_eq(&d->id, id) ||
		    seal_dirs_live(uid, NULL, id, &pending))
			continue;
		if (failed)
			swap_remove_empty(d->jobfd, d->dir, d->dfd);
		seal_dir_drop(d);
	}
}

/* A save of uid into id dropped before its SAVE_END (save_drop_cb): a failed one. */
void seal_dirs_dropped(uid_t uid, const struct store_dirid *id)
{
	seal_dirs_release(uid, id, 1);
}

/* Whether the directory dfd was removed (or can no longer be looked at). */
int seal_dirs_gone(int dfd)
{
	struct stat st;
	return fstat(dfd, &st) < 0 || st.st_nlink == 0;
}

/* SEAL of dir (normalized, as overwrite.c rewrote it) by o: the directory a SAVE_BEGIN of o's
 * user opened there, duplicated into *dfd with its job directory's into *jobfd and its
 * identity in *id, and no name looked up. 1 when o's rank has a save of its run there not
 * yet committed, else 0; -1 when none is kept, or none that a save of the user not yet
 * committed is in (or no descriptor is left). */
static int seal_dirs_take(const struct owner *o, const char *dir, int *dfd, int *jobfd,
			  struct store_dirid *id)
{
	for (size_t i = 0; i < SEAL_DIRS_MAX; i++) {
		struct seal_dir *d = &dirs[i];
		int pending;
		if (!d->dir[0] || d->uid != o->uid || strcmp(d->dir, dir) != 0)
			continue;
		if (seal_dirs_gone(d->dfd)) {
			seal_dir_drop(d);	/* removed: the path may name a new one */
			return -1;
		}
		if (!seal_dirs_live(o->uid, o, &d->id, &pending))
			return -1;
		if ((*dfd = fcntl(d->dfd, F_DUPFD_CLOEXEC, 0)) < 0)
			return -1;
		if ((*jobfd = fcntl(d->jobfd, F_DUPFD_CLOEXEC, 0)) < 0) {
			close(*dfd);
			return -1;
		}
		*id = d->id;
		return pending;
	}
	return -1;
}

/* Opens the existing tag dir of uid/gid by its path, walked from its allowed root (cfg's), and
 * its job directory into *jobfd, its identity in *id: the fd, or a negative ERR_E* with err. */
int seal_dirs_walk(const struct config *cfg, const char *dir, uid_t uid, gid_t gid, int *jobfd,
		   struct store_dirid *id, char *err, size_t errlen)
{
	int rc, dfd = store_open_tag(cfg, dir, uid, gid, jobfd, err, errlen);

	if (dfd >= 0 && (rc = store_dir_id(dfd, id, err, errlen)) < 0) {
		close(dfd);
		close(*jobfd);
		return rc;
	}
	return dfd;
}

/* SEAL of dir by o: the directory kept (seal_dirs_take), else the path walked (seal_dirs_walk)
 * into *dfd, *jobfd and *id. 1 when o's rank has a save of its run there not yet committed,
 * 0 otherwise, or a negative ERR_E* with err. */
int seal_dirs_open(const struct config *cfg, const struct owner *o, const char *dir, int *dfd,
		   int *jobfd, struct store_dirid *id, char *err, size_t errlen)
{
	int pending = seal_dirs_take(o, dir, dfd, jobfd, id);

	if (pending >= 0)
		return pending;
	*dfd = seal_dirs_walk(cfg, dir, o->uid, o->gid, jobfd, id, err, errlen);
	return *dfd < 0 ? *dfd : 0;
}

/* Closes every directory kept (shutdown). */
void seal_dirs_free_all(void)
{
	for (size_t i = 0; i < SEAL_DIRS_MAX; i++)
		if (dirs[i].dir[0])
			seal_dir_drop(&dirs[i]);
}
