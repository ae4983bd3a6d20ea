/*
 * store_swap.c — saving a committed tag again: the new version of <job>/<tag> is written into
 * the hidden sibling <job>/.<tag>.dsckpt-next (its staging directory), committed there, then
 * exchanged with the tag in one renameat2(RENAME_EXCHANGE). The old version, now under the
 * staging name, is renamed to <job>/.<tag>.dsckpt-old and removed; then `latest` moves.
 *
 * Every step leaves one whole version named by the tag: before the exchange the old one, after
 * it the new one. Start-up recovery (swap_recover) finishes what a crash interrupted: a
 * staging directory holding a manifest newer than the tag's is exchanged in (rolled forward),
 * an older one (the old version, exchanged out) removed, an uncommitted one removed unless
 * this node's seals in it are newer than the tag's commit (the daemons then commit it), and
 * a .dsckpt-old directory always removed.
 *
 * The job directory is its owner's and may be writable by others: the staging name is
 * opened as every directory below a root is (no link followed, an existing one must be the
 * user's), and whatever else is in the way is moved aside (a directory) or unlinked (anything
 * else), never followed or written into.
 */
#include "dsckptd.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Writes ".<tag><suffix>" into out; -1 when it would not fit a file name. */
static int swap_name(const char *tag, const char *suffix, char *out, size_t len)
{
	int n = snprintf(out, len, ".%s%s", tag, suffix);
	return n < 0 || (size_t)n >= len || n > NAME_MAX ? -1 : 0;
}

/* The staging path of the tag directory dir (no trailing slash) into out; 0, or
 * ERR_ENAMETOOLONG with err. */
int swap_staging_path(const char *dir, char *out, size_t len, char *err, size_t errlen)
{
	const char *slash = strrchr(dir, '/');
	char name[NAME_MAX + 1];

	if (!slash || swap_name(slash + 1, STORE_TAG_NEXT, name, sizeof(name)) < 0 ||
	    (size_t)snprintf(out, len, "%.*s/%s", (int)(slash - dir), dir, name) >= len)
		return err_set(err, errlen, ERR_ENAMETOOLONG, "%s: the tag's name is too long to "
			       "be saved again (its staging directory .<tag>%s must fit %d bytes)",
			       dir, STORE_TAG_NEXT, NAME_MAX);
	return 0;
}

/* Clears the name jobfd/name of what is not uid's directory: a directory is renamed aside
 * (".<name>.<inode>"), anything else unlinked; 1 when something was moved, else 0. */
static int swap_clear(int jobfd, const char *path, const char *name, uid_t uid)
{
	char aside[NAME_MAX + 1];
	struct stat st;

	if (fstatat(jobfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0 ||
	    (S_ISDIR(st.st_mode) && st.st_uid == uid))
		return 0;
	if (S_ISDIR(st.st_mode)) {
		int n = snprintf(aside, sizeof(aside), "%.*s.%llu", NAME_MAX - 24, name,
				 (unsigned long long)st.st_ino);
		if (n < 0 || renameat2(jobfd, name, jobfd, aside, RENAME_NOREPLACE) < 0)
			return 0;
	} else if (unlinkat(jobfd, name, 0) < 0) {
		return 0;
	}
	log_warnx("%s/%s was in the way of a save (uid %u's %s): %s", path, name,
		  (unsigned)st.st_uid, S_ISDIR(st.st_mode) ? "directory" : "entry",
		  S_ISDIR(st.st_mode) ? "moved aside" : "removed");
	return 1;
}

/* Removes the staging directory stage (a path) if it is still the directory dfd, in jobfd,
 * and empty: a new version whose every save here failed or was abandoned leaves nothing
 * behind (rmdir removes nothing that holds a name). */
void swap_remove_empty(int jobfd, const char *stage, int dfd)
{
	const char *name = strrchr(stage, '/') ? strrchr(stage, '/') + 1 : stage;
	char tag[NAME_MAX + 1];

	if (store_tag_version(name, tag, sizeof(tag)) != 1 || !store_dir_at(jobfd, name, dfd))
		return;
	if (unlinkat(jobfd, name, AT_REMOVEDIR) == 0)
		log_info("removed %s: no save of that new version is left", stage);
	else if (errno != ENOTEMPTY && errno != EEXIST && errno != ENOENT)
		log_warn("cannot remove %s", stage);
}

/* Opens (creating) the staging directory stage (a path swap_staging_path made) for uid/gid,
 * as store_open_dir opens a directory; what squats its name is cleared first. */
int swap_open_staging(const struct config *cfg, const char *stage, uid_t uid, gid_t gid,
		      struct store_root *root, char *err, size_t errlen)
{
	char job[PATH_MAX];
	const char *slash = strrchr(stage, '/');
	int fd = store_open_dir(cfg, stage, uid, gid, root, err, errlen);

	if (fd >= 0 || (fd != ERR_EACCES && fd != ERR_EINVAL) || !slash)
		return fd;
	char tag[NAME_MAX + 1], why[ERRLEN];
	int jobfd;
	if (store_tag_version(slash + 1, tag, sizeof(tag)) != 1 ||
	    (size_t)snprintf(job, sizeof(job), "%.*s/%s", (int)(slash - stage), stage, tag) >=
	    sizeof(job))
		return fd;
	int tfd = store_open_tag(cfg, job, uid, gid, &jobfd, why, sizeof(why));
	if (tfd < 0)
		return fd;	/* the job directory opened as the tag's parent, checked alike */
	close(tfd);
	job[slash - stage] = '\0';
	int moved = swap_clear(jobfd, job, slash + 1, uid);
	close(jobfd);
	return moved ? store_open_dir(cfg, stage, uid, gid, root, err, errlen) : fd;
}

/* Puts jobfd/stage in the place of jobfd/tag in one step (an exchange; a rename when the tag
 * is gone) and makes it durable; 0, or a negative ERR_E* with err. */
int swap_exchange(int jobfd, const char *stage, const char *tag, char *err, size_t errlen)
{
	int rc = renameat2(jobfd, stage, jobfd, tag, RENAME_EXCHANGE);

	if (rc < 0 && errno == ENOENT)
		rc = renameat2(jobfd, stage, jobfd, tag, RENAME_NOREPLACE);
	if (rc < 0)
		return err_set(err, errlen, err_from_errno(errno), "exchanging %s with %s: %s",
			       stage, tag, strerror(errno));
	if (fsync(jobfd) < 0)
		return err_set(err, errlen, ERR_EIO, "fsync of the job directory: %s",
			       strerror(errno));
	return 0;
}

/* Removes the directory jobfd/name: its manifest first (it no longer reads as committed),
 * then every other entry but directories, then itself; entries listed charged to b. One that
 * cannot go (a directory its user made in it) is renamed aside (".<name>.<inode>") and left. */
static void swap_rmtree(int jobfd, const char *path, const char *name, struct store_budget *b)
{
	int fd = openat(jobfd, name, STORE_DIR_FLAGS);
	char **names, aside[NAME_MAX + 1];
	struct stat st;
	size_t n;

	if (fd < 0)
		return;
	unlinkat(fd, FMT_MANIFEST, 0);
	if (store_list_within(fd, b, &names, &n) == 0) {
		for (size_t i = 0; i < n; i++) {
			struct stat es;
			if (fstatat(fd, names[i], &es, AT_SYMLINK_NOFOLLOW) == 0 &&
			    !S_ISDIR(es.st_mode) && unlinkat(fd, names[i], 0) < 0)
				log_warn("removing %s/%s/%s", path, name, names[i]);
		}
		store_list_free(names, n);
	}
	int rc = fstat(fd, &st);
	close(fd);
	if (unlinkat(jobfd, name, AT_REMOVEDIR) == 0)
		return;
	log_warn("removing %s/%s", path, name);
	if (rc == 0 && snprintf(aside, sizeof(aside), "%.*s.%llu", NAME_MAX - 24, name,
				(unsigned long long)st.st_ino) > 0 &&
	    renameat2(jobfd, name, jobfd, aside, RENAME_NOREPLACE) == 0)
		log_warnx("%s/%s left as %s", path, name, aside);
}

/* Removes the old version now at jobfd/.<tag>.dsckpt-next (after swap_exchange): renamed to
 * .<tag>.dsckpt-old in one step, so that the staging name is free and nothing of it can read
 * as a version again, then removed. */
void swap_remove_old(int jobfd, const char *path, const char *tag, struct store_budget *b)
{
	char next[NAME_MAX + 1], old[NAME_MAX + 1];

	if (swap_name(tag, STORE_TAG_NEXT, next, sizeof(next)) < 0 ||
	    swap_name(tag, STORE_TAG_OLD, old, sizeof(old)) < 0)
		return;
	if (faccessat(jobfd, old, F_OK, AT_SYMLINK_NOFOLLOW) == 0)
		swap_rmtree(jobfd, path, old, b);	/* an earlier removal's leftover */
	if (renameat2(jobfd, next, jobfd, old, RENAME_NOREPLACE) < 0) {
		if (errno != ENOENT)
			log_warn("cannot move the old version of %s/%s aside", path, tag);
		return;
	}
	if (fsync(jobfd) < 0)
		log_warn("fsync of %s", path);
	swap_rmtree(jobfd, path, old, b);
}

/* The newest modification time (ns) of the seal records in the directory fd, 0 if none. */
static uint64_t swap_newest_seal(int fd, struct store_budget *b)
{
	char **names;
	size_t n;
	uint64_t ns = 0;

	if (store_list_within(fd, b, &names, &n) < 0)
		return UINT64_MAX;	/* not looked at: kept */
	for (size_t i = 0; i < n; i++) {
		struct stat st;
		if (seal_record_name(names[i]) &&
		    fstatat(fd, names[i], &st, AT_SYMLINK_NOFOLLOW) == 0) {
			uint64_t t = (uint64_t)st.st_mtim.tv_sec * 1000000000u +
				     (uint64_t)st.st_mtim.tv_nsec;
			if (t > ns)
				ns = t;
		}
	}
	store_list_free(names, n);
	return ns;
}

/*
 * Start-up recovery of jobfd/name (at path/name), a staging or old directory of the job
 * directory jobfd, under the job's lock (not waited for: left as it is when held). Returns 1
 * when it was dealt with: rolled forward (a committed new version exchanged in), or removed
 * (the old version, an old directory, an uncommitted staging nobody sealed after the tag's
 * commit); 0 when it is a staging to recover as any uncommitted tag (sealed, its seals taken
 * up again), or was left. Only what the job directory's owner owns is acted on.
 */
int swap_recover(int jobfd, const char *path, const char *name, struct store_budget *b)
{
	char tag[NAME_MAX + 1], err[ERRLEN];
	struct stat job, st;
	int kind = store_tag_version(name, tag, sizeof(tag)), done = 0;

	if (!kind || fstat(jobfd, &job) < 0 ||
	    fstatat(jobfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISDIR(st.st_mode) ||
	    st.st_uid != job.st_uid)
		return 0;
	if (store_job_trylock(jobfd, err, sizeof(err)) < 0) {
		log_warnx("recovery: %s/%s left as it is: the job's lock is held", path, name);
		return 1;
	}
	if (kind == 2) {
		swap_rmtree(jobfd, path, name, b);
		log_warnx("recovery: removed %s/%s, an old version being removed", path, name);
		done = 1;
		goto out;
	}
	int fd = openat(jobfd, name, STORE_DIR_FLAGS);
	if (fd < 0)
		goto out;
	char sub[PATH_MAX];
	snprintf(sub, sizeof(sub), "%s/%s", path, name);
	if (faccessat(fd, FMT_MANIFEST, F_OK, AT_SYMLINK_NOFOLLOW) < 0 &&
	    faccessat(fd, FMT_MANIFEST FMT_PARTIAL, F_OK, AT_SYMLINK_NOFOLLOW) == 0)
		store_finish_manifest(fd, sub, b);
	uint64_t stage_ns = store_tag_committed_within(jobfd, name, b);
	uint64_t tag_ns = store_tag_committed_within(jobfd, tag, b);
	if (stage_ns > tag_ns) {
		if (swap_exchange(jobfd, name, tag, err, sizeof(err)) < 0) {
			log_warnx("recovery: cannot roll %s forward: %s", sub, err);
			close(fd);
			goto out;
		}
		log_warnx("recovery: %s/%s is the new version of the tag (its commit was "
			  "interrupted before the exchange)", path, tag);
		swap_remove_old(jobfd, path, tag, b);
		done = 1;
	} else if (stage_ns || (tag_ns && swap_newest_seal(fd, b) < tag_ns)) {
		swap_remove_old(jobfd, path, tag, b);
		log_warnx("recovery: removed %s, %s", sub, stage_ns ? "the tag's old version" :
			  "an uncommitted new version of the tag older than its commit");
		done = 1;
	}
	close(fd);
out:
	store_job_unlock(jobfd);
	return done;
}
