/*
 * overwrite.c — which version of a tag a save, a seal and a commit name. A tag whose
 * directory is committed (or whose version in flight the saving rank has sealed already)
 * takes its next version in its staging directory (store_swap.c), committed there and
 * exchanged with the tag in one step; loads read the tag, so the old version until then.
 *
 * A save goes into the tag until the tag is committed or the rank sealed it, then into the
 * staging directory: one version may be in flight beside the committed one (or beside one
 * still in flight in the tag). A seal names the version its rank saved into last, a commit
 * the newest version of its run not yet committed. Loop thread only (it reads the save
 * registry and the seals).
 */
#include "dsckptd.h"

#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Whether path names a directory holding a manifest, or (manifest 0) a directory at all;
 * not following a last link: the request that follows opens it properly. */
static int overwrite_exists(const char *path, int manifest)
{
	char p[PATH_MAX];
	struct stat st;

	snprintf(p, sizeof(p), "%s%s", path, manifest ? "/" FMT_MANIFEST : "");
	return lstat(p, &st) == 0 && (manifest ? S_ISREG(st.st_mode) : S_ISDIR(st.st_mode));
}

/* save_dir_cb: opens the directory (below c's roots) a save of dir by o's rank goes into: the
 * tag, else (committed, or sealed by that rank) its staging directory, whose path then
 * replaces dir. */
int overwrite_save_dir(const struct config *c, char *dir, size_t len, const struct owner *o,
		       struct store_root *root, struct store_dirid *id, char *err,
		       size_t errlen)
{
	char stage[PATH_MAX];
	uid_t uid = o->uid;
	gid_t gid = o->gid;
	const char *job = o->job, *run = o->run;
	unsigned rank = o->rank;
	int jobfd, fd = store_open_dir_job(c, dir, uid, gid, root, &jobfd, err, errlen), rc;

	if (fd < 0)
		return fd;
	if ((rc = store_dir_id(fd, id, err, errlen)) < 0) {
		close(fd);
		close(jobfd);
		return rc;
	}
	if (faccessat(fd, FMT_MANIFEST, F_OK, AT_SYMLINK_NOFOLLOW) < 0 &&
	    !seal_holds(id, uid, job, run, rank)) {
		seal_dirs_keep(uid, dir, fd, jobfd, id);	/* for this rank's SEAL */
		return fd;	/* the version in flight in the tag itself */
	}
	close(fd);
	fd = -1;
	if ((rc = swap_staging_path(dir, stage, len < sizeof(stage) ? len : sizeof(stage), err,
				    errlen)) < 0 ||
	    (rc = fd = swap_open_staging(c, stage, uid, gid, root, err, errlen)) < 0 ||
	    (rc = store_dir_id(fd, id, err, errlen)) < 0)
		goto fail;
	if (faccessat(fd, FMT_MANIFEST, F_OK, AT_SYMLINK_NOFOLLOW) == 0) {
		/* between its manifest and the exchange: an instant */
		rc = err_set(err, errlen, ERR_EBUSY, "%s: its new version is being committed "
			     "right now; save again", dir);
		goto fail;
	}
	if (seal_holds(id, uid, job, run, rank)) {
		rc = err_set(err, errlen, ERR_EBUSY, "rank %u sealed two versions of %s that are "
			     "not committed yet: wait for one (dsckpt_commit) before saving a "
			     "third", rank, dir);
		goto fail;
	}
	snprintf(dir, len, "%s", stage);
	seal_dirs_keep(uid, dir, fd, jobfd, id);	/* the same job directory */
	return fd;
fail:
	if (fd >= 0)
		close(fd);
	close(jobfd);
	return rc;
}

/* The newest save (highest id) of uid's run, of rank (-1: any), into dir or stage that is
 * not committed; whether it went into stage (1), dir (0), or none was found (-1); its
 * directory's identity into *id (NULL: not wanted). */
static int overwrite_last_save(const char *dir, const char *stage, uid_t uid, const char *run,
			       long rank, struct store_dirid *id)
{
	struct save_view v;
	uint64_t best = 0;
	int where = -1;

	for (struct save *s = save_next(NULL); s; s = save_next(s)) {
		save_view(s, &v);
		if (v.uid != uid || strcmp(v.run, run) != 0 || v.level >= LEVEL_COMMITTED ||
		    (rank >= 0 && v.rank != (unsigned)rank) || v.id < best)
			continue;
		if (strcmp(v.dir, stage) == 0 || strcmp(v.dir, dir) == 0) {
			best = v.id;
			where = strcmp(v.dir, stage) == 0;
			if (id)
				*id = v.dirid;
		}
	}
	return where;
}

/* Whether the directory path is uid's and holds a safetensors file (a version's). */
static int overwrite_has_files(const char *path, uid_t uid)
{
	char **names;
	size_t n;
	struct stat st;
	int fd = open(path, STORE_DIR_FLAGS), found = 0;

	if (fd < 0)
		return 0;
	if (fstat(fd, &st) == 0 && st.st_uid == uid && store_list(fd, &names, &n) == 0) {
		for (size_t i = 0; i < n && !found; i++)
			found = store_has_suffix(names[i], FMT_SAFETENSORS);
		store_list_free(names, n);
	}
	close(fd);
	return found;
}

/* Rewrites dir (a SEAL's, normalized) to its staging path when rank's newest save of run
 * into the tag went there, or none is known (long forgotten) and the tag is committed with a
 * staging beside it that holds files. A newest save into the tag itself decides without a
 * name looked up (each is a round trip to a shared filesystem's server, for every rank). */
void overwrite_seal_dir(char *dir, size_t len, uid_t uid, const char *run, unsigned rank)
{
	char stage[PATH_MAX], err[ERRLEN];

	if (swap_staging_path(dir, stage, len < sizeof(stage) ? len : sizeof(stage), err,
			      sizeof(err)) < 0)
		return;
	int where = overwrite_last_save(dir, stage, uid, run, rank, NULL);
	if (where == 0 || !overwrite_exists(stage, 0))
		return;
	if (where == 1 || (overwrite_exists(dir, 1) && overwrite_has_files(stage, uid)))
		snprintf(dir, len, "%s", stage);
}

/* Rewrites dir (a COMMIT's, normalized) to its staging path when a save of uid's run there is
 * newer than any into the tag and not committed yet (1, with that save's directory identity
 * in *id: the daemon may be exchanging it with the tag right now, the old version then
 * under the staging name until it is moved aside). */
int overwrite_commit_dir(char *dir, size_t len, uid_t uid, const char *run,
			 struct store_dirid *id)
{
	char stage[PATH_MAX], err[ERRLEN];

	if (swap_staging_path(dir, stage, len < sizeof(stage) ? len : sizeof(stage), err,
			      sizeof(err)) < 0 || !overwrite_exists(stage, 0) ||
	    overwrite_last_save(dir, stage, uid, run, -1, id) != 1)
		return 0;
	snprintf(dir, len, "%s", stage);
	return 1;
}
