/*
 * store_latest.c — the job directory as a whole: its lock, its `latest`, and the repair of
 * what an interrupted commit left (a whole MANIFEST.json.partial, a `latest` behind).
 *
 * Commits of one job are serialized by an exclusive flock on the job directory, held from the
 * manifest through `latest` to retention; recovery takes it too. Under it, `latest` only moves
 * forward: it is pointed at a tag only when that tag's manifest is newer than the one `latest`
 * names now, so it always names an existing committed tag once one exists. A job directory
 * holding STORE_NO_LATEST gets no `latest` at all (the Lightning plugin's dirpath, where
 * Lightning resumes by its own names and users expect only their checkpoints).
 */
#include "dsckptd.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define STORE_NO_LATEST ".dsckpt-no-latest" /* in a job directory: no `latest` there */

/*
 * Takes the job directory's commit lock, waiting up to wait_ms for another commit of the job.
 * The directory is its owner's, who may hold a lock on it forever: the wait is bounded so
 * that no commit, seal or recovery (nor the shutdown that waits for them) hangs.
 */
static int store_job_lock_within(int jobfd, long wait_ms, char *err, size_t errlen)
{
	struct timespec nap = {0, 1000000};
	long waited_ms = 0;

	while (flock(jobfd, LOCK_EX | LOCK_NB) < 0) {
		if (errno == EINTR)
			continue;
		if (errno != EWOULDBLOCK)
			return err_set(err, errlen, err_from_errno(errno), "locking the job "
				       "directory: %s", strerror(errno));
		if (waited_ms >= wait_ms)
			return err_set(err, errlen, ERR_EBUSY, "the job directory stayed locked "
				       "for %ld s (by another commit, or by a process of its owner)",
				       wait_ms / 1000);
		nanosleep(&nap, NULL);
		waited_ms += nap.tv_nsec / 1000000;
		if (nap.tv_nsec < 64000000)
			nap.tv_nsec *= 2;
	}
	return 0;
}

/* Takes the job directory's commit lock, waiting up to STORE_LOCK_WAIT_MS. */
int store_job_lock(int jobfd, char *err, size_t errlen)
{
	return store_job_lock_within(jobfd, STORE_LOCK_WAIT_MS, err, errlen);
}

/* Takes the job directory's commit lock if it is free now (recovery); 0 or ERR_EBUSY. */
int store_job_trylock(int jobfd, char *err, size_t errlen)
{
	return store_job_lock_within(jobfd, 0, err, errlen);
}

/* Lets the job directory's commit lock go. */
void store_job_unlock(int jobfd)
{
	flock(jobfd, LOCK_UN);
}

/* Whether the job directory jobfd opts out of `latest` (holds STORE_NO_LATEST). */
static int store_job_no_latest(int jobfd)
{
	struct stat st;

	return fstatat(jobfd, STORE_NO_LATEST, &st, AT_SYMLINK_NOFOLLOW) == 0;
}

/* Points `latest` at tag (committed at ns) unless it names a tag committed later already, or
 * the job opts out; the tag latest names then into named (len bytes; "" when none), for the
 * retention that follows, which need not read it again. 0 (also when left), or a negative
 * ERR_E* with err. The job lock is held. */
int store_latest_advance_to(const struct config *cfg, int jobfd, const char *tag, uint64_t ns,
			    uid_t uid, gid_t gid, char *named, size_t len, char *err,
			    size_t errlen)
{
	char now[NAME_MAX + 1];
	uint64_t now_ns;
	int rc;

	if (store_job_no_latest(jobfd)) {
		store_latest_get(jobfd, named, len);	/* not ours to move, kept all the same */
		return 0;
	}
	now_ns = store_latest_get(jobfd, now, sizeof(now));
	snprintf(named, len, "%s", now);
	if (now_ns > ns && strcmp(now, tag) != 0) {
		log_info("latest stays at %s, committed after %s", now, tag);
		return 0;
	}
	if (now_ns && strcmp(now, tag) == 0)
		return 0;
	rc = store_write_atomic(jobfd, FMT_LATEST, tag, strlen(tag), uid, gid, cfg->file_mode,
			       err, errlen);
	if (rc == 0)
		snprintf(named, len, "%s", tag);
	return rc;
}

/* store_latest_advance_to, what latest names then not wanted. */
int store_latest_advance(const struct config *cfg, int jobfd, const char *tag, uint64_t ns,
			 uid_t uid, gid_t gid, char *err, size_t errlen)
{
	char named[NAME_MAX + 1];

	return store_latest_advance_to(cfg, jobfd, tag, ns, uid, gid, named, sizeof(named), err,
				       errlen);
}

/*
 * Finishes an interrupted commit of the tag dirfd (at path): a MANIFEST.json.partial that
 * parses whole and whose every file is there with its size is renamed into place. Returns 1
 * when the tag is committed now, else 0 (the partial stays for recovery to judge).
 */
int store_finish_manifest(int dirfd, const char *path, struct store_budget *b)
{
	int ok;
	struct manifest *m = store_manifest_read(dirfd, FMT_MANIFEST FMT_PARTIAL, b);

	if (!m)
		return 0;
	ok = m->nfiles > 0;
	for (size_t i = 0; ok && i < m->nfiles; i++) {
		struct stat st;
		const char *name = m->files[i].name;
		ok = name && !strchr(name, '/') &&
		     fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode) &&
		     (uint64_t)st.st_size == m->files[i].size;
	}
	manifest_free(m);
	if (!ok)
		return 0;
	if (renameat(dirfd, FMT_MANIFEST FMT_PARTIAL, dirfd, FMT_MANIFEST) < 0 || fsync(dirfd) < 0) {
		log_warn("recovery: cannot finish the commit of %s", path);
		return 0;
	}
	log_warnx("recovery: finished the interrupted commit of %s (its manifest was whole)",
		  path);
	return 1;
}

/*
 * Repairs the job directory jobfd (at path) after a crash, under its lock if it is free:
 * `latest` is pointed at the newest committed tag when it is behind (or missing, or names a
 * deleted tag) unless the job opts out (STORE_NO_LATEST), and keep_last is applied again (an
 * interrupted retention completes). Owner and group of a written `latest` are the job
 * directory's, set on its descriptor; only tags of that owner count. Entries listed and
 * manifests read are charged to b.
 */
void store_job_repair(const struct config *cfg, int jobfd, const char *path,
		      struct store_budget *b)
{
	char err[ERRLEN], best[NAME_MAX + 1] = "", now[NAME_MAX + 1], **names;
	const char *remote = NULL;
	uint64_t best_ns = 0;
	struct stat st, ts;
	size_t n;

	if (fstat(jobfd, &st) < 0)
		return;
	/* Not waited for: locked at start-up, the job is another node's commit's (which moves
	 * latest itself) or its owner's, and start-up is not held up for either. */
	if (store_job_lock_within(jobfd, 0, err, sizeof(err)) < 0) {
		log_warnx("recovery: %s left as it is: its lock is held", path);
		return;
	}
	if (store_list_within(jobfd, b, &names, &n) < 0)
		goto out;
	for (size_t i = 0; i < n; i++) {
		char tag[NAME_MAX + 1];
		if (fstatat(jobfd, names[i], &ts, AT_SYMLINK_NOFOLLOW) < 0 ||
		    !S_ISDIR(ts.st_mode) || ts.st_uid != st.st_uid ||
		    store_tag_version(names[i], tag, sizeof(tag)))
			continue;	/* a staging directory is no tag of its own */
		uint64_t ns = store_tag_committed_within(jobfd, names[i], b);
		if (ns > best_ns || (ns && ns == best_ns && strcmp(names[i], best) > 0)) {
			best_ns = ns;
			snprintf(best, sizeof(best), "%s", names[i]);
		}
	}
	store_list_free(names, n);
	uint64_t now_ns = store_latest_within(jobfd, now, sizeof(now), b);
	if (!best_ns || (b && b->spent))
		goto out;	/* over budget: what was not read may be newer */
	if ((now_ns < best_ns || !now_ns) && !store_job_no_latest(jobfd)) {
		if (store_write_atomic(jobfd, FMT_LATEST, best, strlen(best), st.st_uid, st.st_gid,
				       cfg->file_mode, err, sizeof(err)) < 0)
			log_warnx("recovery: cannot point %s/latest at %s: %s", path, best, err);
		else
			log_warnx("recovery: %s/latest now names %s, its newest committed tag "
				  "(it named %s)", path, best, now[0] ? now : "nothing");
	}
	if (cfg->keep_last > 0)
		retention_keep(jobfd, path, best, best_ns, now_ns < best_ns ? best : now,
			       st.st_uid, cfg->keep_last, b,
			       config_root_of(cfg, path, &remote) >= 0 && remote, NULL);
out:
	store_job_unlock(jobfd);
}
