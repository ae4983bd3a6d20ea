/*
 * store_latest.c — the job directory as a whole: its lock, its `latest`, and the repair of
 * what an interrupted commit left (a whole MANIFEST.json.partial, a `latest` behind).
 *
 * Commits of one job are serialized by an exclusive flock on the job directory, held from the
 * manifest through `latest` to retention; recovery takes it too. Under it, `latest` only moves
 * forward: it is pointed at a tag only when that tag's manifest is newer than the one `latest`
 * names now, so it always names an existing committed tag once one exists.
 */
#include "dsckptd.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

/* Takes the job directory's commit lock (waits for another commit of the job). */
int store_job_lock(int jobfd, char *err, size_t errlen)
{
	while (flock(jobfd, LOCK_EX) < 0) {
		if (errno != EINTR)
			return seterr(err, errlen, err_from_errno(errno), "locking the job "
				      "directory: %s", strerror(errno));
	}
	return 0;
}

/* Lets the job directory's commit lock go. */
void store_job_unlock(int jobfd)
{
	flock(jobfd, LOCK_UN);
}

/* When jobfd/tag was committed (its manifest's created_ns, else the manifest's mtime); 0 if
 * it is not a directory holding a manifest of ours. */
uint64_t store_tag_committed(int jobfd, const char *tag)
{
	char why[300];
	struct stat st;
	int present, fd = openat(jobfd, tag, STORE_DIR_FLAGS);

	if (fd < 0)
		return 0;
	struct manifest *m = manifest_load(fd, &present, why, sizeof(why));
	uint64_t ns = m ? m->created_ns : 0;
	if (m && ns == 0 && fstatat(fd, FMT_MANIFEST, &st, AT_SYMLINK_NOFOLLOW) == 0)
		ns = (uint64_t)st.st_mtim.tv_sec * 1000000000u + (uint64_t)st.st_mtim.tv_nsec;
	if (m && ns == 0)
		ns = 1;	/* committed, time unknown: older than any other */
	manifest_free(m);
	close(fd);
	return ns;
}

/* The tag `latest` names (into tag, when it fits a name) and when that tag was committed;
 * 0 when latest is missing or names no committed tag. */
uint64_t store_latest_get(int jobfd, char *tag, size_t len)
{
	char buf[NAME_MAX + 2];
	int fd = openat(jobfd, FMT_LATEST, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);

	tag[0] = '\0';
	if (fd < 0)
		return 0;
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0 || n > NAME_MAX)
		return 0;
	buf[n] = '\0';
	buf[strcspn(buf, "\n")] = '\0';
	if (!buf[0] || strchr(buf, '/') || !strcmp(buf, ".") || !strcmp(buf, ".."))
		return 0;
	snprintf(tag, len, "%s", buf);
	return store_tag_committed(jobfd, buf);
}

/* Points `latest` at tag (committed at ns) unless it names a tag committed later already;
 * 0 (also when left), or a negative ERR_E* with err. The job lock is held. */
int store_latest_advance(const struct config *cfg, int jobfd, const char *tag, uint64_t ns,
			 uid_t uid, gid_t gid, char *err, size_t errlen)
{
	char now[NAME_MAX + 1];
	uint64_t now_ns = store_latest_get(jobfd, now, sizeof(now));

	if (now_ns > ns && strcmp(now, tag) != 0) {
		log_info("latest stays at %s, committed after %s", now, tag);
		return 0;
	}
	if (now_ns && strcmp(now, tag) == 0)
		return 0;
	return store_write_atomic(jobfd, FMT_LATEST, tag, strlen(tag), uid, gid, cfg->file_mode,
				  err, errlen);
}

/*
 * Finishes an interrupted commit of the tag dirfd (at path): a MANIFEST.json.partial that
 * parses whole and whose every file is there with its size is renamed into place. Returns 1
 * when the tag is committed now, else 0 (the partial stays for recovery to judge).
 */
int store_finish_manifest(int dirfd, const char *path)
{
	char why[300];
	int present, ok;
	struct manifest *m = manifest_load_at(dirfd, FMT_MANIFEST FMT_PARTIAL, &present, why,
					      sizeof(why));

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
 * Repairs the job directory jobfd (at path) after a crash, under its lock: `latest` is
 * pointed at the newest committed tag when it is behind (or missing, or names a deleted tag),
 * and keep_last is applied again (an interrupted retention completes). Owner and group of a
 * written `latest` are the job directory's.
 */
void store_job_repair(const struct config *cfg, int jobfd, const char *path)
{
	char err[ERRLEN], best[NAME_MAX + 1] = "", now[NAME_MAX + 1], **names;
	uint64_t best_ns = 0;
	struct stat st;
	size_t n;

	if (fstat(jobfd, &st) < 0 || store_job_lock(jobfd, err, sizeof(err)) < 0)
		return;
	if (store_list(jobfd, &names, &n) < 0)
		goto out;
	for (size_t i = 0; i < n; i++) {
		uint64_t ns = store_tag_committed(jobfd, names[i]);
		if (ns > best_ns || (ns && ns == best_ns && strcmp(names[i], best) > 0)) {
			best_ns = ns;
			snprintf(best, sizeof(best), "%s", names[i]);
		}
	}
	store_list_free(names, n);
	if (!best_ns)
		goto out;
	uint64_t now_ns = store_latest_get(jobfd, now, sizeof(now));
	if (now_ns < best_ns || !now_ns) {
		if (store_write_atomic(jobfd, FMT_LATEST, best, strlen(best), st.st_uid, st.st_gid,
				       cfg->file_mode, err, sizeof(err)) < 0)
			log_warnx("recovery: cannot point %s/latest at %s: %s", path, best, err);
		else
			log_warnx("recovery: %s/latest now names %s, its newest committed tag "
				  "(it named %s)", path, best, now[0] ? now : "nothing");
	}
	if (cfg->keep_last > 0)
		retention_apply(jobfd, path, best, best_ns, st.st_uid, cfg->keep_last);
out:
	store_job_unlock(jobfd);
}
