/*
 * upload_tag.c — the remote steps of one tag (upload.c schedules them on its workers), over
 * the objects of the remote tier, which mirror the root: <root>/<job path>/<tag>/<file> is
 * <remote>/<job path>/<tag>/<file>.
 *
 * - plan: the local MANIFEST.json names the tag's files; each safetensors file records the
 *   node that wrote it ("dsckpt.host"); this node uploads its own (a .meta goes with its
 *   safetensors file), and the nodes named are those whose records the manifest waits for.
 * - a file: from its resident copy in the cache where the cache holds it, else the file,
 *   multipart with parts in parallel (remote.c); once planned, through the descriptor the
 *   plan opened, so that the version goes up whole even once a newer one replaced its
 *   directory (upload_replace.c).
 * - finish: this node's record <tag>/.dsckpt-remote.<host> (its files, sizes, checksums)
 *   says its files are up; whichever node then sees every node's record writes the remote
 *   MANIFEST.json by a conditional write, so exactly one write wins and a loser checks that
 *   the winner's bytes are the same (a tag saved again goes under a version directory of its
 *   own and replaces the version there: upload_version.c); then <job path>/latest moves forward
 *   only (If-Match on the version read; a later commit's tag, by its manifest's created_ns,
 *   is never replaced); last the local REMOTE.json, which retention reads (a committed tag
 *   without it is kept) and start-up looks for (a committed tag without it is uploaded);
 *   then, on the node that wrote the manifest, keep_last_remote (upload_retain.c).
 * - start-up: every committed tag without REMOTE.json under a root with a remote is queued
 *   (and upload_orphans.c aborts the uploads this node left open).
 *
 * Every function here runs on an upload worker and blocks it; none holds upload.c's lock.
 */
#include "upload.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MANIFEST_MAX (256u << 20)   /* the largest local manifest uploaded */
#define LATEST_TRIES 16             /* conditional writes of latest lost in a row */
#define SCAN_DEPTH 8                /* directories below a root searched at start-up */
#define RECORD_PREFIX ".dsckpt-remote."

/* An upload's reader: the resident copy's header and pieces where held, else the file. */
struct reader {
	int fd;
	struct resident *res;
	const uint8_t *hdr;
	size_t hdr_len;
	uint64_t chunk;
	struct uptag *t;
	uint64_t counted;       /* added to t->bytes_done */
	int planned;            /* fd is the plan's: its version may be deleted meanwhile */
	int moved;              /* its version was replaced (exchanged out): read to the end */
	int gone;               /* its version was deleted: given up */
};

/* Opens t's tag directory (the daemon's walk below its root, no link followed). */
static int open_tag(struct uptag *t, char *err, size_t errlen)
{
	int jobfd, dfd = store_open_tag(t->cfg, t->dir, 0, 0, &jobfd, err, errlen);
	if (dfd >= 0)
		close(jobfd);
	return dfd;
}

/* What became of the version of the plan's descriptor fd: 0 still linked, 2 replaced (no
 * link left, a newer version in the tag), 1 gone (deleted with its tag, by keep_last or
 * its user): its upload ends. */
static int pin_state(struct uptag *t, int fd)
{
	char err[ERRLEN];
	struct stat st;

	if (fstat(fd, &st) < 0 || st.st_nlink > 0)
		return 0;
	int dfd = open_tag(t, err, sizeof(err));
	if (dfd >= 0)
		close(dfd);
	return dfd >= 0 ? 2 : dfd == ERR_ENOENT;
}

/* remote_src's read: len bytes at off, from the cache where it holds them. */
static int reader_read(void *arg, uint64_t off, void *buf, size_t len)
{
	struct reader *rd = arg;
	uint8_t *out = buf;

	if (__atomic_load_n(rd->t->stop, __ATOMIC_RELAXED))
		return ERR_ESHUTDOWN;
	if (__atomic_load_n(&rd->t->cancel, __ATOMIC_RELAXED))
		return ERR_ESTATE;	/* replaced: uptag_file says so */
	if (rd->planned && !rd->moved) {
		int state = pin_state(rd->t, rd->fd);
		rd->moved = state == 2;
		if ((rd->gone = state == 1))
			return ERR_ENOENT;	/* deleted: uptag_file says so */
	}
	while (len > 0) {
		size_t n = len;
		const uint8_t *from = NULL;
		if (rd->res && off < rd->hdr_len) {
			n = rd->hdr_len - off < len ? rd->hdr_len - off : len;
			from = rd->hdr + off;
		} else if (rd->res) {
			uint64_t d = off - rd->hdr_len, in = d % rd->chunk;
			const uint8_t *p = resident_piece(rd->res, d / rd->chunk);
			n = rd->chunk - in < len ? rd->chunk - in : len;
			from = p ? p + in : NULL;
		}
		if (from) {
			memcpy(out, from, n);
		} else {
			ssize_t got = pread(rd->fd, out, n, (off_t)off);
			if (got <= 0)
				return got < 0 ? err_from_errno(errno) : ERR_EIO;
			n = (size_t)got;
		}
		out += n;
		off += n;
		len -= n;
		__atomic_add_fetch(&rd->t->bytes_done, n, __ATOMIC_RELAXED);
		rd->counted += n;
	}
	return 0;
}

/* Adds host to t's nodes unless there; -1 without memory. */
static int add_host(struct uptag *t, const char *host)
{
	for (size_t i = 0; i < t->nhosts; i++)
		if (strcmp(t->hosts[i], host) == 0)
			return 0;
	char **h = realloc(t->hosts, (t->nhosts + 1) * sizeof(*h));
	if (!h)
		return -1;
	t->hosts = h;
	if (!(h[t->nhosts] = strdup(host)))
		return -1;
	t->nhosts++;
	return 0;
}

/* Adds a file of this node to t's plan; -1 without memory. */
static int add_mine(struct uptag *t, const char *name, const char *stem, uint64_t size)
{
	struct upfile *m = realloc(t->mine, (t->nmine + 1) * sizeof(*m));
	if (!m)
		return -1;
	t->mine = m;
	m = &t->mine[t->nmine++];
	memset(m, 0, sizeof(*m));
	snprintf(m->name, sizeof(m->name), "%s", name);
	snprintf(m->stem, sizeof(m->stem), "%s", stem);
	m->size = size;
	m->fd = -1;
	return 0;
}

/* Opens file name of the tag directory dfd for its upload into *fd: a regular file of the
 * tag's owner (the daemon reads as root) of one link (not another file linked in); 0 or a
 * code with err. */
static int open_file(struct uptag *t, int dfd, const char *name, int *fd, char *err,
		     size_t errlen)
{
	struct stat st, dst;

	*fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	if (*fd < 0 || fstat(*fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		int rc = err_set(err, errlen, *fd < 0 ? err_from_errno(errno) : ERR_EINVAL,
				 "%s/%s: %s", t->dir, name,
				 *fd < 0 ? strerror(errno) : "not a regular file");
		if (*fd >= 0)
			close(*fd);
		*fd = -1;
		return rc;
	}
	if (fstat(dfd, &dst) < 0 || st.st_uid != dst.st_uid || st.st_nlink != 1) {
		close(*fd);
		*fd = -1;
		return err_set(err, errlen, ERR_EACCES, "%s/%s: not uploaded: not a file of the "
			       "tag's owner with one link", t->dir, name);
	}
	return 0;
}

/* The node that wrote dfd/<stem>.safetensors into host (unknown: this one). */
static void file_host(int dfd, const char *stem, char *host, size_t len)
{
	char name[NAME_MAX + sizeof(FMT_SAFETENSORS)];
	snprintf(name, sizeof(name), "%s%s", stem, FMT_SAFETENSORS);
	if (store_st_host(dfd, name, host, len) != 1)
		snprintf(host, len, "%s", store_host());
}

/* Reads t's manifest: the nodes whose files it lists, and this node's files queued. */
int uptag_plan(struct uptag *t, char *err, size_t errlen)
{
	char why[256], host[STORE_HOST_MAX], stem[NAME_MAX + 1];
	int e, rc = 0, dfd = open_tag(t, err, errlen);

	if (dfd < 0)
		return dfd;
	uptag_clear(t);
	t->reached = t->recorded = 0;
	t->manifest = userfile_read(dfd, FMT_MANIFEST, MANIFEST_MAX, USERFILE_ONE_LINK,
				    &t->manifest_len, &e, why, sizeof(why));
	/* The remote copy lists every file (a multi-node commit's records read): it needs no
	 * record, and every node uploads the same bytes. */
	struct manifest *m = t->manifest && manifest_text_expand(dfd, &t->manifest,
								 &t->manifest_len, why,
								 sizeof(why)) == 0 ?
			     manifest_parse(t->manifest, t->manifest_len, why, sizeof(why)) : NULL;
	if (!m) {
		rc = err_set(err, errlen, t->manifest ? ERR_EINVAL : ERR_ENOENT,
			     "%s/%s: %s", t->dir, FMT_MANIFEST, why);
		goto out;
	}
	t->created_ns = m->created_ns;
	if ((rc = store_dir_id(dfd, &t->dir_id, err, errlen)) < 0 ||
	    (rc = uptag_version(t, m, err, errlen)) < 0) {
		manifest_free(m);
		goto out;
	}
	for (size_t i = 0; i < m->nfiles && rc == 0; i++) {
		const struct manifest_file *f = &m->files[i];
		size_t n = f->name ? strlen(f->name) : 0;
		const char *suffix = store_has_suffix(f->name ? f->name : "", FMT_SAFETENSORS)
				     ? FMT_SAFETENSORS : FMT_META;
		if (!f->name || !store_valid_file(f->name) || !store_has_suffix(f->name, suffix)) {
			rc = err_set(err, errlen, ERR_EINVAL, "%s: a file of the manifest is not "
				     "a safetensors or meta file", t->dir);
			break;
		}
		snprintf(stem, sizeof(stem), "%.*s", (int)(n - strlen(suffix)), f->name);
		file_host(dfd, stem, host, sizeof(host));
		if (add_host(t, host) < 0 ||
		    (strcmp(host, store_host()) == 0 &&
		     add_mine(t, f->name, stem, f->size == MANIFEST_BAD ? 0 : f->size) < 0))
			rc = err_set(err, errlen, ERR_ENOMEM, "out of memory");
	}
	manifest_free(m);
	/* The version pinned: its files stay readable whatever replaces the directory. */
	for (size_t i = 0; i < t->nmine && rc == 0; i++)
		rc = open_file(t, dfd, t->mine[i].name, &t->mine[i].fd, err, errlen);
	if (rc == 0)
		t->planned = 1;
out:
	close(dfd);
	return rc;
}

/* Uploads file f of t from its resident copy or the file (planned: the plan's descriptor). */
int uptag_file(struct uptag *t, struct upfile *f, int planned, char *err, size_t errlen)
{
	char key[sizeof(t->fkey) + NAME_MAX + 2];
	struct stat st;
	int rc = 0;
	struct reader rd = {.fd = -1, .chunk = t->cfg->chunk_bytes, .t = t, .planned = planned};

	if (planned) {
		for (size_t i = 0; i < t->nmine && rd.fd < 0; i++)
			if (strcmp(t->mine[i].name, f->name) == 0)
				rd.fd = t->mine[i].fd;
		if (rd.fd < 0)
			return err_set(err, errlen, ERR_ENOENT, "%s/%s: not in its plan", t->dir,
				       f->name);
		if (pin_state(t, rd.fd) == 1) {
			snprintf(err, errlen, "%s was deleted before %s went up", t->dir, f->name);
			return 3;
		}
	} else {	/* only while no version of the tag is in the remote */
		int dfd = open_tag(t, err, errlen);
		if (dfd < 0)
			return dfd;
		if ((rc = uptag_early(t, err, errlen)) == 0)
			rc = open_file(t, dfd, f->name, &rd.fd, err, errlen);
		close(dfd);
		if (rc != 0)
			return rc;
	}
	if (fstat(rd.fd, &st) < 0) {
		rc = err_set(err, errlen, ERR_EIO, "%s/%s: %s", t->dir, f->name, strerror(errno));
		goto out;
	}
	if (store_has_suffix(f->name, FMT_SAFETENSORS) &&
	    (rd.res = resident_pin(t->dir, f->stem, st.st_dev, st.st_ino)) != NULL)
		rd.hdr = resident_header(rd.res, &rd.hdr_len);
	struct remote_src src = {.read = reader_read, .arg = &rd, .size = (uint64_t)st.st_size};
	snprintf(key, sizeof(key), "%s/%s", planned ? t->fkey : t->key, f->name);
	if ((rc = remote_upload(t->r, key, &src, err, errlen)) < 0) {
		__atomic_sub_fetch(&t->bytes_done, rd.counted, __ATOMIC_RELAXED);
		if (__atomic_load_n(&t->cancel, __ATOMIC_RELAXED)) {	/* aborted, not failed */
			snprintf(err, errlen, "the tag was committed again while %s went up",
				 f->name);
			rc = 2;
		} else if (rd.gone) {
			snprintf(err, errlen, "%s was deleted while %s went up", t->dir, f->name);
			rc = 3;
		}
		goto out;
	}
	metrics_add(METRIC_UPLOADED_BYTES, (uint64_t)st.st_size);
	f->dev = st.st_dev;
	f->ino = st.st_ino;
	f->size = (uint64_t)st.st_size;
	snprintf(f->loc, sizeof(f->loc), "%s", planned ? t->loc : "");
out:
	if (rd.res)
		resident_unpin(rd.res);
	if (!planned)
		close(rd.fd);
	return rc;
}

/* This node's record of t: its files, sizes and checksums as the manifest lists them. */
static char *record_text(struct uptag *t, size_t *len)
{
	char why[256];
	struct manifest *m = manifest_parse(t->manifest, t->manifest_len, why, sizeof(why));
	size_t cap = 256, n = 0;
	char *out = malloc(cap);

	if (!m || !out) {
		manifest_free(m);
		free(out);
		return NULL;
	}
	n = (size_t)snprintf(out, cap, "{\"host\": \"%s\", \"tag\": \"%s\", \"files\": [",
			     store_host(), t->tag);
	int first = 1;
	for (size_t i = 0; i < m->nfiles; i++) {
		const struct manifest_file *f = &m->files[i];
		const char *sum = f->data_xxh3 ? f->data_xxh3 : f->xxh3 ? f->xxh3 : "";
		int mine = 0;
		for (size_t k = 0; k < t->nmine && !mine; k++)
			mine = strcmp(t->mine[k].name, f->name) == 0;
		if (!mine || strlen(sum) > 32)
			continue;
		if (n + NAME_MAX + 128 > cap) {
			cap = cap * 2 + NAME_MAX + 128;
			char *grown = realloc(out, cap);
			if (!grown) {
				free(out);
				manifest_free(m);
				return NULL;
			}
			out = grown;
		}
		n += (size_t)snprintf(out + n, cap - n, "%s{\"name\": \"%s\", \"size\": %" PRIu64
				      ", \"xxh3\": \"%s\"}", first ? "" : ", ", f->name,
				      f->size, sum);
		first = 0;
	}
	snprintf(out + n, cap - n, "]}\n");
	*len = n + 3;
	manifest_free(m);
	return out;
}

/* When the remote tag jobkey/tag was committed (its manifest's created_ns); 0 if unknown. */
static uint64_t remote_committed(struct remote *r, const char *jobkey, const char *tag)
{
	char key[PATH_MAX + NAME_MAX + 32], err[ERRLEN], why[256];
	uint64_t size, ns = 0;

	snprintf(key, sizeof(key), "%s/%s/%s", jobkey, tag, FMT_MANIFEST);
	if (remote_head(r, key, &size, NULL, err, sizeof(err)) < 0 || size > MANIFEST_MAX)
		return 0;
	char *text = malloc(size + 1);
	if (text && remote_get(r, key, 0, text, size, err, sizeof(err)) == 0) {
		struct manifest *m = manifest_parse(text, size, why, sizeof(why));
		ns = m ? m->created_ns : 0;
		manifest_free(m);
	}
	free(text);
	return ns;
}

/* Moves <job>/latest to t's tag unless it names a later commit, conditional on the version
 * read (a lost race reads again). */
static int advance_latest(struct uptag *t, char *err, size_t errlen)
{
	struct remote *r = t->r;
	char key[PATH_MAX + 16], etag[REMOTE_ETAG_MAX], cur[NAME_MAX + 1];
	size_t len = strlen(t->tag);
	uint64_t size;

	snprintf(key, sizeof(key), "%s/%s", t->jobkey, FMT_LATEST);
	for (int i = 0; i < LATEST_TRIES; i++) {
		int rc = remote_head(r, key, &size, etag, err, errlen);
		if (rc == ERR_ENOENT) {
			rc = remote_put(r, key, t->tag, len, REMOTE_CREATE, NULL, NULL, err, errlen);
			if (rc != ERR_EEXIST)
				return rc;
			continue;
		}
		if (rc < 0)
			return rc;
		cur[0] = '\0';
		if (size < sizeof(cur) &&
		    (rc = remote_get(r, key, 0, cur, size, err, errlen)) == 0)
			cur[size] = '\0';
		else if (rc < 0 && rc != ERR_ENOENT)
			return rc;
		if (strcmp(cur, t->tag) == 0)
			return 0;
		uint64_t ns = cur[0] ? remote_committed(r, t->jobkey, cur) : 0;
		if (ns > t->created_ns || (ns == t->created_ns && strcmp(cur, t->tag) > 0)) {
			log_debug("upload of %s: remote latest names %s, committed later", t->dir,
				  cur);
			return 0;
		}
		rc = remote_put(r, key, t->tag, len, REMOTE_REPLACE, etag, NULL, err, errlen);
		if (rc != ERR_EEXIST)
			return rc;
	}
	return err_set(err, errlen, ERR_EBUSY, "%s: latest changed %d times in a row", key,
		       LATEST_TRIES);
}

/* Writes REMOTE.json into t's tag, owned as the tag directory is: 2 when the directory is
 * no longer the version planned (another was exchanged with it: its mark is not this one). */
static int mark_local(struct uptag *t, char *err, size_t errlen)
{
	char text[PATH_MAX + 1300];
	struct stat st;
	struct store_dirid id;
	int rc, dfd = open_tag(t, err, errlen);

	if (dfd < 0)
		return dfd;
	if ((rc = store_dir_id(dfd, &id, err, errlen)) < 0 || !store_dirid_eq(&id, &t->dir_id)) {
		close(dfd);
		if (rc == 0)
			snprintf(err, errlen, "%s was saved again while its upload ended", t->dir);
		return rc < 0 ? rc : 2;
	}
	/* On a shared root every node of the tag marks it: the first one's mark stands. */
	if (faccessat(dfd, FMT_REMOTE, F_OK, AT_SYMLINK_NOFOLLOW) == 0) {
		close(dfd);
		return 0;
	}
	int n = snprintf(text, sizeof(text), "{\"remote\": \"%s\", \"key\": \"%s\", "
			 "\"uploaded\": %lld}\n", remote_url(t->r), t->key,
			 (long long)time(NULL));
	if (fstat(dfd, &st) < 0)
		rc = err_set(err, errlen, ERR_EIO, "%s: %s", t->dir, strerror(errno));
	else
		rc = store_write_atomic(dfd, FMT_REMOTE, text, (size_t)n, st.st_uid, st.st_gid,
					t->cfg->file_mode, err, errlen);
	if (rc < 0 && faccessat(dfd, FMT_REMOTE, F_OK, AT_SYMLINK_NOFOLLOW) == 0)
		rc = 0;		/* another node's write, at the same moment, stood */
	close(dfd);
	return rc;
}

/* Once t's files are up: record, then manifest and latest when every node's record is
 * there, then REMOTE.json (in the directory planned only). 0 done, 1 waiting for another
 * node (err says which). */
int uptag_finish(struct uptag *t, char *err, size_t errlen)
{
	struct remote *r = t->r;
	char key[PATH_MAX + STORE_HOST_MAX + 64];
	size_t len;
	int rc;

	/* The version planned, whatever replaced its directory since (its files are held),
	 * unless it was deleted. */
	t->reached = 0;
	if (t->nmine && pin_state(t, t->mine[0].fd) == 1) {
		snprintf(err, errlen, "%s was deleted before its upload ended", t->dir);
		return 3;
	}
	char *rec = record_text(t, &len);
	if (!rec)
		return err_set(err, errlen, ERR_ENOMEM, "%s: cannot make this node's record",
			       t->dir);
	snprintf(key, sizeof(key), "%s/" RECORD_PREFIX "%s", t->fkey, store_host());
	rc = remote_put(r, key, rec, len, REMOTE_ANY, NULL, NULL, err, errlen);
	free(rec);
	if (rc < 0)
		return rc;
	t->recorded = 1;
	for (size_t i = 0; i < t->nhosts; i++) {
		uint64_t size;
		snprintf(key, sizeof(key), "%s/" RECORD_PREFIX "%s", t->fkey, t->hosts[i]);
		rc = remote_head(r, key, &size, NULL, err, errlen);
		if (rc == ERR_ENOENT) {
			snprintf(err, errlen, "waiting for node %s's files", t->hosts[i]);
			return 1;
		}
		if (rc < 0)
			return rc;
	}
	if ((rc = uptag_put_manifest(t, err, errlen)) != 0 ||
	    (rc = advance_latest(t, err, errlen)) < 0)
		return rc;
	t->reached = 1;
	if ((rc = mark_local(t, err, errlen)) != 0)
		return rc;
	uptag_retain(t);
	uptag_clear(t);
	return 0;
}

/* Frees what the worker's steps held. */
void uptag_clear(struct uptag *t)
{
	free(t->manifest);
	t->manifest = NULL;
	free(t->rmanifest);
	t->rmanifest = NULL;
	t->loc[0] = '\0';
	for (size_t i = 0; i < t->nhosts; i++)
		free(t->hosts[i]);
	free(t->hosts);
	t->hosts = NULL;
	t->nhosts = 0;
	for (size_t i = 0; i < t->nmine; i++)
		if (t->mine[i].fd >= 0)
			close(t->mine[i].fd);
	free(t->mine);
	t->mine = NULL;
	t->nmine = 0;
	t->planned = 0;
}

/* Queues each committed tag without REMOTE.json below the directory dfd (path), depth
 * levels deep at most; dfd is closed. */
static void scan_dir(int (*resume)(const char *dir), int dfd, const char *path, int depth)
{
	char **names;
	size_t n;

	if (store_list(dfd, &names, &n) < 0) {
		close(dfd);
		return;
	}
	for (size_t i = 0; i < n; i++) {
		char sub[PATH_MAX];
		int fd;
		if (names[i][0] == '.' ||
		    (fd = openat(dfd, names[i], STORE_DIR_FLAGS)) < 0)
			continue;
		snprintf(sub, sizeof(sub), "%s/%s", path, names[i]);
		if (faccessat(fd, FMT_MANIFEST, F_OK, AT_SYMLINK_NOFOLLOW) == 0) {
			if (faccessat(fd, FMT_REMOTE, F_OK, AT_SYMLINK_NOFOLLOW) != 0 && depth > 0 &&
			    resume(sub) == 0)
				log_info("upload of %s: committed, not yet in the remote tier; "
					 "uploading", sub);
			close(fd);
		} else if (depth < SCAN_DEPTH) {
			scan_dir(resume, fd, sub, depth + 1);
		} else {
			close(fd);
		}
	}
	store_list_free(names, n);
	close(dfd);
}

/* Start-up: queues every committed tag without REMOTE.json under each root with a remote. */
void uptag_startup(const struct config *cfg, struct remote *const *remotes,
		   int (*resume)(const char *dir))
{
	for (unsigned i = 0; i < cfg->n_roots; i++) {
		if (!remotes[i])
			continue;
		int fd = open(cfg->allowed_roots[i], STORE_DIR_FLAGS);
		if (fd >= 0)
			scan_dir(resume, fd, cfg->allowed_roots[i], 0);
	}
}
