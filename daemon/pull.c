/*
 * pull.c — a committed tag of a root's remote tier brought into the local tier (DESIGN.md §7,
 * §9), for loads of a tag the node does not hold and for PREFETCH. The remote layout mirrors
 * the local one: <root>/<job>/<tag>/<file> is <remote>/<job>/<tag>/<file>, the tag committed
 * remotely exactly when its MANIFEST.json is there, and <remote>/<job>/latest names the newest.
 *
 * A pull reads the remote manifest first and goes on only when it names the requesting user's
 * uid (root may pull any), as a local load opens only the user's own files; nothing is
 * created before that. A load's pull (pull_tag_file) reads only the file it names, a whole
 * pull (pull_tag: PREFETCH) every file; a tag saved again has its files below the
 * manifest's "remote_dir" (upload_version.c). Each file is read in windows of
 * upload_concurrency ranges of upload_part_size (remote_get's parallel ranged GETs) into
 * <name>.partial, owned by the manifest's user, hashed on the way and checked against the
 * manifest's checksum (a safetensors file's data region, a .meta file whole) before it is
 * renamed into place; the manifest is written last, once every file of the tag is here, as a
 * commit writes it, and `latest` moves to the tag unless it names a later one. A failed pull
 * leaves no manifest, so the tag stays uncommitted here and nothing of it is loaded. Keys
 * come only from the validated directory (store_open_dir's rules, names of [A-Za-z0-9._-])
 * and the manifest's file names (store_valid_file).
 *
 * With peer copies on, a tag (or a job's latest) is asked of other nodes' daemons first
 * (pull_peer.c), and the remote tier is the fallback when no peer holds it whole.
 *
 * Threads: pull_tag blocks (libuv's threadpool runs it); two pulls of one directory do not run
 * at once (the second waits, then finds the tag local).
 */
#include "dsckptd.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define PULL_WINDOW_MAX (512u << 20)  /* the most bytes one file's reads keep in memory */
#define PULL_MANIFEST_MAX (256u << 20) /* larger remote manifests are refused */
#define PULL_LATEST_MAX 4096

/* A directory being pulled (pulls of one directory run one after the other). */
struct pulling {
	char dir[PULL_DIR_MAX];
	struct pulling *next;
};

static pthread_mutex_t busy_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t busy_cond = PTHREAD_COND_INITIALIZER;
static struct pulling *busy;

/* Waits until no pull of dir runs, then marks p (dir) as running. */
static void busy_enter(struct pulling *p)
{
	pthread_mutex_lock(&busy_lock);
	for (;;) {
		struct pulling *o = busy;
		while (o && strcmp(o->dir, p->dir) != 0)
			o = o->next;
		if (!o)
			break;
		pthread_cond_wait(&busy_cond, &busy_lock);
	}
	p->next = busy;
	busy = p;
	pthread_mutex_unlock(&busy_lock);
}

/* Unmarks p and wakes the pulls waiting for its directory. */
static void busy_leave(struct pulling *p)
{
	pthread_mutex_lock(&busy_lock);
	for (struct pulling **q = &busy; *q; q = &(*q)->next) {
		if (*q == p) {
			*q = p->next;
			break;
		}
	}
	pthread_cond_broadcast(&busy_cond);
	pthread_mutex_unlock(&busy_lock);
}

/* Whether s is a name of [A-Za-z0-9._-], not "." or "..". */
static int name_ok(const char *s, size_t n)
{
	if (n == 0 || n > 255 || (n == 1 && s[0] == '.') || (n == 2 && s[0] == '.' && s[1] == '.'))
		return 0;
	for (size_t i = 0; i < n; i++)
		if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
		      (s[i] >= '0' && s[i] <= '9') || s[i] == '.' || s[i] == '_' || s[i] == '-'))
			return 0;
	return 1;
}

/* The remote of dir's allowed root (the longest that dir lies below) and dir's path below it
 * (*rel; "job/tag"), when dir is names of [A-Za-z0-9._-] at least depth deep; NULL else. */
static const char *remote_of(const struct config *cfg, const char *dir, unsigned depth,
			     const char **rel)
{
	const char *url = NULL;
	size_t best = 0;

	for (size_t i = 0; cfg->root_remotes && i < cfg->n_roots; i++) {
		const char *r = cfg->allowed_roots[i];
		size_t n = strlen(r);
		while (n > 0 && r[n - 1] == '/')
			n--;
		if (strncmp(dir, r, n) == 0 && dir[n] == '/' && (!url || n > best)) {
			url = cfg->root_remotes[i];
			best = n;
			*rel = dir + n + 1;
		}
	}
	if (!url)
		return NULL;
	unsigned segs = 0;
	for (const char *c = *rel;; segs++) {
		const char *e = strchrnul(c, '/');
		if (!name_ok(c, (size_t)(e - c)))
			return NULL;
		if (!*e)
			break;
		c = e + 1;
	}
	return segs + 1 >= depth ? url : NULL;
}

/* Whether dir (a tag directory: <root>/<job>/<tag>) lies below a root with a remote tier. */
int pull_has_remote(const struct config *cfg, const char *dir)
{
	const char *rel;

	return remote_of(cfg, dir, 2, &rel) != NULL;
}

/* Whether a tag dir missing here could be pulled: from peer copies, or a remote tier. */
int pull_has_source(const struct config *cfg, const char *dir)
{
	return peer_on() || pull_has_remote(cfg, dir);
}

/* Reads key (at most max bytes) into a malloc'd, NUL-terminated buffer (*len bytes), charged
 * to uid as QUOTA_HELD (the caller gives *len + 1 back); 0 or a code. */
static int get_small(struct remote *r, const char *key, uint64_t max, uid_t uid, char **out,
		     size_t *len, char *err, size_t errlen)
{
	uint64_t size;
	char why[ERRLEN];
	int rc;

	*out = NULL;
	if ((rc = remote_head(r, key, &size, NULL, err, errlen)) < 0)
		return rc;
	if (size > max)
		return err_set(err, errlen, ERR_ELIMIT, "remote %s: %" PRIu64 " bytes, more than "
			       "the %" PRIu64 " read", key, size, max);
	if ((rc = quota_take(uid, QUOTA_HELD, size + 1, why, sizeof(why))) < 0)
		return err_set(err, errlen, rc, "remote %s: %s", key, why);
	if (!(*out = malloc(size + 1))) {
		quota_give(uid, QUOTA_HELD, size + 1);
		return err_set(err, errlen, ERR_ENOMEM, "out of memory");
	}
	if ((rc = remote_get(r, key, 0, *out, size, err, errlen)) < 0) {
		free(*out);
		*out = NULL;
		quota_give(uid, QUOTA_HELD, size + 1);
		return rc;
	}
	(*out)[size] = '\0';
	*len = size;
	return 0;
}

/* Reads and checks the remote manifest of rel (job/tag) for uid: a sound manifest of tag,
 * naming uid (any for root), its files' names and checksums readable. */
static int get_manifest(struct remote *r, const char *rel, const char *tag, uid_t uid,
			char **text, size_t *len, struct manifest **m, char *err, size_t errlen)
{
	char key[PULL_DIR_MAX + 32], why[300];
	uint64_t h;
	int rc;

	snprintf(key, sizeof(key), "%s/%s", rel, FMT_MANIFEST);
	if ((rc = get_small(r, key, PULL_MANIFEST_MAX, uid, text, len, err, errlen)) < 0)
		return rc == ERR_ENOENT ? err_set(err, errlen, ERR_ENOENT, "%s is not committed in "
						  "the remote tier (no %s there)", rel,
						  FMT_MANIFEST) : rc;
	if (!(*m = manifest_parse(*text, *len, why, sizeof(why))))
		return err_set(err, errlen, ERR_EINVAL, "remote %s: %s", key, why);
	if ((*m)->uid != MANIFEST_BAD && (*m)->uid >= (uid_t)-1)
		return err_set(err, errlen, ERR_EINVAL, "remote %s: uid %" PRIu64 " is no uid", key,
			       (*m)->uid);
	if (uid != 0 && ((*m)->uid == MANIFEST_BAD || (*m)->uid != uid))
		return err_set(err, errlen, ERR_EACCES, "remote %s belongs to another user", rel);
	if (!(*m)->tag || strcmp((*m)->tag, tag) != 0)
		return err_set(err, errlen, ERR_EINVAL, "remote %s names another tag", key);
	if ((*m)->remote_dir && !remote_version_name((*m)->remote_dir))
		return err_set(err, errlen, ERR_EINVAL, "remote %s: remote_dir is no version "
			       "directory", key);
	for (size_t i = 0; i < (*m)->nfiles; i++) {
		const struct manifest_file *f = &(*m)->files[i];
		int st = f->kind && strcmp(f->kind, MANIFEST_KIND_ST) == 0;
		if (!f->name || !store_valid_file(f->name) || f->size == MANIFEST_BAD ||
		    checksum_parse(st ? f->data_xxh3 : f->xxh3, &h) < 0 ||
		    (st && (f->header_len == MANIFEST_BAD || f->header_len > f->size)))
			return err_set(err, errlen, ERR_EINVAL, "remote %s: file %zu is not "
				       "described whole (name, size, checksum)", key, i);
	}
	return 0;
}

/* A remote object being pulled (pull_read_fn's arg). */
struct pull_src {
	struct remote *r;
	const char *key;
};

/* pull_read_fn over a remote object: ranged reads. */
static int pull_read_remote(void *arg, uint64_t off, void *buf, size_t len, char *err,
			    size_t errlen)
{
	struct pull_src *src = arg;

	return remote_get(src->r, src->key, off, buf, len, err, errlen);
}

/* Reads remote file f of rel into dfd (owned by uid/gid), its checksum checked before it is
 * renamed into place; buf holds cap bytes. 0 or a code (nothing of the file left then). */
static int pull_file(const struct config *cfg, struct remote *r, const char *rel, int dfd,
		     const struct manifest_file *f, uid_t uid, gid_t gid, uint8_t *buf,
		     size_t cap, char *err, size_t errlen)
{
	char key[PULL_DIR_MAX + 160], what[PULL_DIR_MAX + 200];
	struct pull_src src = { r, key };
	uint64_t size;
	int rc;

	snprintf(key, sizeof(key), "%s/%s", rel, f->name);
	snprintf(what, sizeof(what), "remote %s", key);
	if ((rc = remote_head(r, key, &size, NULL, err, errlen)) < 0)
		return rc;
	if (size != f->size)
		return err_set(err, errlen, ERR_ECHECKSUM, "remote %s is %" PRIu64 " bytes, its "
			       "manifest says %" PRIu64, key, size, f->size);
	return pull_file_write(cfg, dfd, f, uid, gid, pull_read_remote, &src, buf, cap, what,
			       err, errlen);
}

/* The primary group of uid, for files a root request pulls for that user; 0 or ERR_EINVAL. */
static int group_of(uid_t uid, gid_t *gid, char *err, size_t errlen)
{
	struct passwd pw, *found = NULL;
	char names[4096];

	if (getpwuid_r(uid, &pw, names, sizeof(names), &found) != 0 || !found)
		return err_set(err, errlen, ERR_EINVAL, "uid %u, the tag's owner, has no account "
			       "on this node", (unsigned)uid);
	*gid = pw.pw_gid;
	return 0;
}

/* Whether the tag dir is committed here (its manifest there, the directory of owner). */
int pull_committed_here(const struct config *cfg, const char *dir, uid_t owner, gid_t gid)
{
	char why[ERRLEN];
	int jobfd = -1, dfd = store_open_tag(cfg, dir, owner, gid, &jobfd, why, sizeof(why));
	int yes = dfd >= 0 && faccessat(dfd, FMT_MANIFEST, F_OK, AT_SYMLINK_NOFOLLOW) == 0;

	if (dfd >= 0)
		close(dfd);
	if (jobfd >= 0)
		close(jobfd);
	return yes;
}

/* The read window of a pull of m: upload_concurrency ranges of upload_part_size (all in
 * flight at once), at most PULL_WINDOW_MAX and the largest file, charged to uid as
 * QUOTA_HELD (else one part): into *buf and *cap; 0 or a code with err. */
static int window_of(const struct config *cfg, const struct manifest *m, uid_t uid,
		     uint8_t **buf, size_t *cap, char *err, size_t errlen)
{
	uint64_t w = (uint64_t)cfg->upload_concurrency * cfg->upload_part_bytes, big = 1;
	int rc;

	for (size_t i = 0; i < m->nfiles; i++)
		big = m->files[i].size > big ? m->files[i].size : big;
	w = w < PULL_WINDOW_MAX ? w : PULL_WINDOW_MAX;
	w = w > big ? big : w ? w : 1;
	if (quota_take(uid, QUOTA_HELD, w, err, errlen) < 0) {
		w = cfg->upload_part_bytes < w ? cfg->upload_part_bytes : w;
		if ((rc = quota_take(uid, QUOTA_HELD, w, err, errlen)) < 0)
			return rc;
	}
	if (!(*buf = malloc(w))) {
		quota_give(uid, QUOTA_HELD, w);
		return err_set(err, errlen, ERR_ENOMEM, "out of memory");
	}
	*cap = (size_t)w;
	return 0;
}

/* Marks a pulled tag as in its remote tier (REMOTE.json, upload.c's mark): keep_last may
 * drop it, and no restart uploads it again; a failure only costs that upload. */
static void pull_mark_remote(int dfd, struct remote *r, const char *rel, uid_t owner,
			     gid_t gid, unsigned mode)
{
	char text[2400], err[ERRLEN];
	int n = snprintf(text, sizeof(text), "{\"remote\": \"%s\", \"key\": \"%s\", "
			 "\"pulled\": %lld}\n", remote_url(r), rel, (long long)time(NULL));
	if (n > 0 && (size_t)n < sizeof(text) &&
	    store_write_atomic(dfd, FMT_REMOTE, text, (size_t)n, owner, gid, mode, err,
			       sizeof(err)) < 0)
		log_warnx("pull of %s: %s", rel, err);
}

/* Whether the manifest's file name is one of the stem only's (NULL: every file is). */
static int wanted(const char *name, const char *only)
{
	size_t n = only ? strlen(only) : 0;

	return !only || (strncmp(name, only, n) == 0 && (strcmp(name + n, FMT_SAFETENSORS) == 0 ||
							 strcmp(name + n, FMT_META) == 0));
}

/* Whether f is in dfd already: a regular file of its size (pulled for an earlier load). */
static int present(int dfd, const struct manifest_file *f)
{
	struct stat st;

	return fstatat(dfd, f->name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode) &&
	       (uint64_t)st.st_size == f->size;
}

/* Writes the pulled tag's files (read through buf, cap bytes) — only those of the stem only
 * when not NULL — then, once every file of the tag is here, its manifest (text, len bytes)
 * and `latest`; until then the tag stays uncommitted here. */
static int pull_into(const struct config *cfg, struct remote *r, const char *dir,
		     const char *rel, const char *tag, const char *only, const struct manifest *m,
		     const char *text, size_t len, uid_t owner, gid_t gid, uint8_t *buf,
		     size_t cap, struct pull_info *info, char *err, size_t errlen)
{
	int jobfd = -1, rc, whole = 1;
	size_t reached = 0;
	uint8_t *made = calloc(m->nfiles ? m->nfiles : 1, 1);	/* files not here before */
	int dfd = made ? store_open_dir(cfg, dir, owner, gid, NULL, err, errlen) :
		  err_set(err, errlen, ERR_ENOMEM, "out of memory");

	if (dfd < 0) {
		free(made);
		return dfd;
	}
	char at[PULL_DIR_MAX + 32];	/* a tag saved again: its files below its version */
	snprintf(at, sizeof(at), "%s%s%s", rel, m->remote_dir ? "/" : "",
		 m->remote_dir ? m->remote_dir : "");
	for (size_t i = 0; i < m->nfiles; i++) {
		reached = i;
		made[i] = faccessat(dfd, m->files[i].name, F_OK, AT_SYMLINK_NOFOLLOW) != 0;
		if (!wanted(m->files[i].name, only)) {
			whole &= present(dfd, &m->files[i]);
			continue;
		}
		if ((rc = pull_file(cfg, r, at, dfd, &m->files[i], owner, gid, buf, cap, err,
				    errlen)) < 0)
			goto undo;
		info->files++;
		info->bytes += m->files[i].size;
		metrics_add(METRIC_PULLED_BYTES, m->files[i].size);
	}
	reached = m->nfiles;
	if (!whole) {	/* the other ranks' files come with their loads, or a whole pull */
		rc = 0;
		goto out;
	}
	if ((rc = store_write_atomic(dfd, FMT_MANIFEST, text, len, owner, gid, cfg->file_mode,
				     err, errlen)) < 0)
		goto undo;
	pull_mark_remote(dfd, r, rel, owner, gid, cfg->file_mode);
	close(dfd);
	if ((dfd = store_open_tag(cfg, dir, owner, gid, &jobfd, err, errlen)) < 0) {
		rc = dfd;
		goto out;
	}
	if ((rc = store_job_lock(jobfd, err, errlen)) == 0) {
		rc = store_latest_advance(cfg, jobfd, tag, m->created_ns, owner, gid, err, errlen);
		store_job_unlock(jobfd);
	}
out:
	free(made);
	if (jobfd >= 0)
		close(jobfd);
	if (dfd >= 0)
		close(dfd);
	return rc;
undo:	/* nothing of a failed pull is kept: the files it made go (one it replaced holds the
	 * manifest's bytes, checked), then the directory when nothing else is there */
	for (size_t i = 0; i < reached; i++)
		if (made[i] && wanted(m->files[i].name, only))
			unlinkat(dfd, m->files[i].name, 0);
	if ((jobfd = openat(dfd, "..", STORE_DIR_FLAGS)) >= 0)
		unlinkat(jobfd, tag, AT_REMOVEDIR);	/* only when empty */
	info->files = info->bytes = 0;
	goto out;
}

/* Brings the committed remote tag dir (only the files of the stem only, when not NULL) into
 * the local tier for uid. */
static int pull_some(const struct config *cfg, const char *dir, const char *only, uid_t uid,
		     gid_t gid, struct pull_info *info, char *err, size_t errlen)
{
	struct pulling me;
	struct remote *r = NULL;
	struct manifest *m = NULL;
	const char *rel, *url = remote_of(cfg, dir, 2, &rel);
	char *text = NULL;
	size_t len = 0, cap = 0;
	uint8_t *buf = NULL;
	struct timespec t0, t1;
	int rc, from_remote = 0;

	memset(info, 0, sizeof(*info));
	if (!url && !peer_on())
		return err_set(err, errlen, ERR_ENOENT, "%s is not on this node, and its root has "
			       "no remote tier it could come from", dir);
	if (strlen(dir) >= sizeof(me.dir))
		return err_set(err, errlen, ERR_ENAMETOOLONG, "%s: too long", dir);
	snprintf(info->tag, sizeof(info->tag), "%s", strrchr(dir, '/') + 1);
	snprintf(me.dir, sizeof(me.dir), "%s", dir);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	busy_enter(&me);
	if (peer_on()) {	/* other nodes' copies first, at the network's speed */
		if (pull_committed_here(cfg, dir, uid, gid)) {
			rc = 0;	/* here already: a file it lacks is not pulled */
			goto out;
		}
		rc = pull_peer_tag(cfg, dir, uid, gid, info, err, errlen);
		if (rc == 0 || rc == ERR_EACCES || !url)
			goto out;
		log_info("%s not pulled from peer copies (%s); from the remote tier", dir, err);
		memset(info, 0, sizeof(*info));
		snprintf(info->tag, sizeof(info->tag), "%s", strrchr(dir, '/') + 1);
	}
	const char *tag = strrchr(rel, '/') + 1;
	from_remote = 1;
	if ((rc = remote_open(cfg, url, &r, err, errlen)) < 0)
		goto out;
	if ((rc = get_manifest(r, rel, tag, uid, &text, &len, &m, err, errlen)) < 0)
		goto out;
	uid_t owner = m->uid == MANIFEST_BAD ? 0 : (uid_t)m->uid;	/* older: root's */
	info->created_ns = m->created_ns;
	if (owner != uid && (rc = group_of(owner, &gid, err, errlen)) < 0)
		goto out;
	if (pull_committed_here(cfg, dir, owner, gid))
		goto out;	/* here already (an earlier pull, or never gone) */
	if ((rc = window_of(cfg, m, uid, &buf, &cap, err, errlen)) < 0)
		goto out;
	rc = pull_into(cfg, r, dir, rel, tag, only, m, text, len, owner, gid, buf, cap, info,
		       err, errlen);
	free(buf);
	quota_give(uid, QUOTA_HELD, cap);
	if (rc == 0) {
		info->pulled = PULL_REMOTE;
		clock_gettime(CLOCK_MONOTONIC, &t1);
		info->seconds = (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
		metrics_observe(METRIC_PULL_S, info->seconds);
		log_info("pulled %s from %s: %" PRIu64 " files, %" PRIu64 " bytes in %.3f s", dir,
			 remote_url(r), info->files, info->bytes, info->seconds);
	}
out:
	busy_leave(&me);
	if (rc < 0 && from_remote)
		metrics_fail(METRIC_PULLS_FAILED, rc);
	if (text)
		quota_give(uid, QUOTA_HELD, len + 1);
	free(text);
	manifest_free(m);
	remote_close(r);
	return rc;
}

/* Brings the committed remote tag dir into the local tier for uid (see dsckptd.h). */
int pull_tag(const struct config *cfg, const char *dir, uid_t uid, gid_t gid,
	     struct pull_info *info, char *err, size_t errlen)
{
	return pull_some(cfg, dir, NULL, uid, gid, info, err, errlen);
}

/* Brings the files of dir's stem file from the remote tier for uid (see dsckptd.h). */
int pull_tag_file(const struct config *cfg, const char *dir, const char *file, uid_t uid,
		  gid_t gid, struct pull_info *info, char *err, size_t errlen)
{
	return pull_some(cfg, dir, file, uid, gid, info, err, errlen);
}

/* Whether the peers' copies (asked first) or the remote tier hold the tag dir committed, for
 * uid: 0, or a code (ENOENT: not committed there, EACCES: another user's). */
int pull_check(const struct config *cfg, const char *dir, uid_t uid, char *err, size_t errlen)
{
	struct remote *r = NULL;
	struct manifest *m = NULL;
	const char *rel, *url = remote_of(cfg, dir, 2, &rel);
	char *text = NULL;
	size_t len = 0;
	int rc;

	if (peer_on() && ((rc = pull_peer_check(cfg, dir, uid, err, errlen)) == 0 || !url))
		return rc;	/* a tag the peers hold */
	if (!url)
		return err_set(err, errlen, ERR_ENOENT, "%s: its root has no remote tier", dir);
	if ((rc = remote_open(cfg, url, &r, err, errlen)) == 0)
		rc = get_manifest(r, rel, strrchr(rel, '/') + 1, uid, &text, &len, &m, err,
				  errlen);
	if (text)
		quota_give(uid, QUOTA_HELD, len + 1);
	free(text);
	manifest_free(m);
	remote_close(r);
	return rc;
}

/* The tag the remote `latest` of jobdir names, when it is committed there for uid. */
int pull_latest(const struct config *cfg, const char *jobdir, uid_t uid, char *tag,
		size_t taglen, uint64_t *created_ns, char *err, size_t errlen)
{
	struct remote *r = NULL;
	struct manifest *m = NULL;
	const char *rel, *url = remote_of(cfg, jobdir, 1, &rel);
	char key[PULL_DIR_MAX + 16], *name = NULL, *text = NULL, relt[PULL_DIR_MAX + 300];
	size_t len = 0, held = 0, tlen = 0;
	int rc;

	if (peer_on() && ((rc = pull_peer_latest(cfg, jobdir, uid, tag, taglen, created_ns, err,
						 errlen)) == 0 || !url))
		return rc;	/* the newest commit other nodes' copies hold */
	if (!url)
		return err_set(err, errlen, ERR_ENOENT, "%s has no committed tag on this node, and "
			       "its root has no remote tier", jobdir);
	snprintf(key, sizeof(key), "%s/latest", rel);
	if ((rc = remote_open(cfg, url, &r, err, errlen)) < 0)
		goto out;
	if ((rc = get_small(r, key, PULL_LATEST_MAX, uid, &name, &len, err, errlen)) < 0) {
		if (rc == ERR_ENOENT)
			rc = err_set(err, errlen, ERR_ENOENT, "%s has no committed tag, here or in "
				     "the remote tier", jobdir);
		goto out;
	}
	held = len + 1;
	while (len > 0 && (name[len - 1] == '\n' || name[len - 1] == ' '))
		name[--len] = '\0';
	if (!name_ok(name, len) || len >= taglen) {
		rc = err_set(err, errlen, ERR_EINVAL, "remote %s does not name a tag", key);
		goto out;
	}
	snprintf(relt, sizeof(relt), "%s/%s", rel, name);
	if ((rc = get_manifest(r, relt, name, uid, &text, &tlen, &m, err, errlen)) < 0)
		goto out;
	snprintf(tag, taglen, "%s", name);
	*created_ns = m->created_ns;
out:
	if (name)
		quota_give(uid, QUOTA_HELD, held);
	if (text)
		quota_give(uid, QUOTA_HELD, tlen + 1);
	free(name);
	free(text);
	manifest_free(m);
	remote_close(r);
	return rc;
}
