/*
 * pull_peer.c — a tag this node lacks brought into the local tier from other nodes' copies
 * (issue 35 item 6), for pull.c, which asks here before the remote tier. peer_restore.c
 * finds and fetches the copies (checked against the manifest's checksums as they arrive);
 * here they are written exactly as a remote pull writes: only when the copies' manifest
 * names the requesting uid (any for root), each file into <name>.partial owned by the
 * manifest's user, hashed again on the way and checked against the manifest before it is
 * renamed into place, the manifest written last, `latest` moved forward unless it names a
 * later tag. A pull that fails leaves no manifest, so nothing of it is loaded.
 */
#include "dsckptd.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PULL_PEER_PIECE (4u << 20)

/* A copy's file being pulled (pull_read_fn's arg). */
struct pull_peer_src {
	const struct replica *r;
	unsigned i;
	const char *name;
};

/* pull_read_fn over file i of a copy. */
static int pull_peer_read(void *arg, uint64_t off, void *buf, size_t len, char *err,
			  size_t errlen)
{
	struct pull_peer_src *src = arg;
	int rc = replica_read(src->r, src->i, off, buf, len);

	return rc < 0 ? err_set(err, errlen, ERR_EIO, "a peer copy of %s: %s", src->name,
				strerror(-rc)) : 0;
}

/* Writes file i of copy r into dfd (owned by uid/gid), hashed and checked against the
 * manifest before it is renamed into place; 0 or a code with err. */
static int pull_peer_file(const struct config *cfg, const struct replica *r, unsigned i,
			  int dfd, uid_t uid, gid_t gid, uint8_t *buf, char *err, size_t errlen)
{
	const struct manifest_file *f = replica_file(r, i);
	struct pull_peer_src src = { r, i, f->name };
	char what[300];

	snprintf(what, sizeof(what), "a peer copy of %s", f->name);
	return pull_file_write(cfg, dfd, f, uid, gid, pull_peer_read, &src, buf, PULL_PEER_PIECE,
			       what, err, errlen);
}

/* The owner (the manifest's uid; root's when it names none) of the copies' tag, when uid
 * may have it, and its primary group; 0 or a code with err. */
static int pull_peer_owner(const struct peer_restore *pr, uid_t uid, uid_t *owner, gid_t *gid,
			   char *err, size_t errlen)
{
	struct passwd pw, *found = NULL;
	char names[4096], why[256];
	const char *text;
	size_t len;
	unsigned nfiles;
	struct manifest *m;

	replica_id(pr->copies[0], &text, &len, &nfiles);
	if ((m = manifest_parse(text, len, why, sizeof(why))) == NULL)
		return err_set(err, errlen, ERR_EINVAL, "a peer copy's manifest: %s", why);
	*owner = m->uid == MANIFEST_BAD || m->uid >= (uid_t)-1 ? 0 : (uid_t)m->uid;
	manifest_free(m);
	if (uid != 0 && *owner != uid)
		return err_set(err, errlen, ERR_EACCES, "the peers' copies of %s belong to another "
			       "user", pr->tag);
	if (*owner == uid)
		return 0;
	if (getpwuid_r(*owner, &pw, names, sizeof(names), &found) != 0 || !found)
		return err_set(err, errlen, ERR_EINVAL, "uid %u, the tag's owner, has no account "
			       "on this node", (unsigned)*owner);
	*gid = pw.pw_gid;
	return 0;
}

/* Writes every copy's files into dir, the manifest last, then `latest`; undoes the files
 * it made when one fails. */
static int pull_peer_into(const struct config *cfg, const char *dir,
			  const struct peer_restore *pr, uid_t owner, gid_t gid,
			  struct pull_info *info, char *err, size_t errlen)
{
	uint8_t *buf = malloc(PULL_PEER_PIECE);
	int jobfd = -1, rc = 0, made = 0;
	int dfd = buf ? store_open_dir(cfg, dir, owner, gid, NULL, err, errlen) :
		  err_set(err, errlen, ERR_ENOMEM, "out of memory");
	const char *text, *names[4096];
	size_t len;
	unsigned nfiles;

	if (dfd < 0) {
		free(buf);
		return dfd;
	}
	for (unsigned c = 0; c < pr->n && rc == 0; c++) {
		replica_id(pr->copies[c], &text, &len, &nfiles);
		for (unsigned i = 0; i < nfiles && rc == 0; i++) {
			const struct manifest_file *f = replica_file(pr->copies[c], i);
			int fresh = faccessat(dfd, f->name, F_OK, AT_SYMLINK_NOFOLLOW) != 0;
			if ((rc = pull_peer_file(cfg, pr->copies[c], i, dfd, owner, gid, buf, err,
						 errlen)) == 0) {
				if (fresh && made < 4096)
					names[made++] = f->name;
				info->files++;
				info->bytes += f->size;
			}
		}
	}
	replica_id(pr->copies[0], &text, &len, &nfiles);
	if (rc == 0)
		rc = store_write_atomic(dfd, FMT_MANIFEST, text, len, owner, gid, cfg->file_mode,
					err, errlen);
	if (rc == 0 && (jobfd = openat(dfd, "..", STORE_DIR_FLAGS)) >= 0 &&
	    (rc = store_job_lock(jobfd, err, errlen)) == 0) {
		rc = store_latest_advance(cfg, jobfd, pr->tag, pr->created_ns, owner, gid, err,
					  errlen);
		store_job_unlock(jobfd);
	}
	if (rc != 0 && info->files) {	/* nothing of a failed pull is kept */
		for (int i = 0; i < made; i++)
			unlinkat(dfd, names[i], 0);
		info->files = info->bytes = 0;
	}
	if (jobfd >= 0)
		close(jobfd);
	close(dfd);
	free(buf);
	return rc;
}

/* The job (its directory's name, into job) and tag of tag dir <root>/<job>/<tag>; 0 or
 * ERR_EINVAL with err. */
static int pull_peer_names(const char *dir, char *job, size_t joblen, const char **tag,
			   char *err, size_t errlen)
{
	const char *t = strrchr(dir, '/'), *j = t;

	while (j && j > dir && j[-1] != '/')
		j--;
	if (!t || j == t || (size_t)(t - j) >= joblen || !t[1])
		return err_set(err, errlen, ERR_EINVAL, "%s is no tag directory", dir);
	memcpy(job, j, (size_t)(t - j));
	job[t - j] = '\0';
	*tag = t + 1;
	return 0;
}

/* Whether a peer holds a copy of tag dir (see dsckptd.h). */
int pull_peer_check(const struct config *cfg, const char *dir, uid_t uid, char *err,
		    size_t errlen)
{
	struct peer_restore pr;
	const char *tag;
	char job[256];
	int rc = pull_peer_names(dir, job, sizeof(job), &tag, err, errlen);

	return rc ? rc : peer_restore(cfg, dir, job, tag, uid, 0, &pr, err, errlen);
}

/* Brings tag dir (<root>/<job>/<tag>) from the peers' copies into the local tier for uid
 * (see dsckptd.h). */
int pull_peer_tag(const struct config *cfg, const char *dir, uid_t uid, gid_t gid,
		  struct pull_info *info, char *err, size_t errlen)
{
	struct peer_restore pr;
	char job[256];
	const char *tag;
	double t0 = now_mono();
	uid_t owner = 0;
	int rc;

	if ((rc = pull_peer_names(dir, job, sizeof(job), &tag, err, errlen)) != 0 ||
	    (rc = peer_restore(cfg, dir, job, tag, uid, 1, &pr, err, errlen)) != 0)
		return rc;
	if ((rc = pull_peer_owner(&pr, uid, &owner, &gid, err, errlen)) == 0)
		rc = pull_peer_into(cfg, dir, &pr, owner, gid, info, err, errlen);
	if (rc == 0) {
		info->pulled = PULL_PEER;
		metrics_peer_add(METRIC_PEER_RESTORED_BYTES, info->bytes);
		info->created_ns = pr.created_ns;
		info->seconds = now_mono() - t0;
		log_info("pulled %s from %u peer copies: %" PRIu64 " files, %" PRIu64 " bytes in "
			 "%.3f s", dir, pr.n, info->files, info->bytes, info->seconds);
	}
	peer_restore_free(&pr);
	return rc;
}

/* The newest tag of jobdir the peers hold (see dsckptd.h). */
int pull_peer_latest(const struct config *cfg, const char *jobdir, uid_t uid, char *tag,
		     size_t taglen, uint64_t *created_ns, char *err, size_t errlen)
{
	struct peer_restore pr;
	const char *job = strrchr(jobdir, '/');
	int rc;

	if (!job || !job[1])
		return err_set(err, errlen, ERR_EINVAL, "%s is no job directory", jobdir);
	if ((rc = peer_restore(cfg, jobdir, job + 1, "", uid, 0, &pr, err, errlen)) != 0)
		return rc;
	snprintf(tag, taglen, "%s", pr.tag);
	*created_ns = pr.created_ns;
	return 0;
}
