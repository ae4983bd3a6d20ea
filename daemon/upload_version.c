/*
 * upload_version.c — which version of a tag an upload writes in the remote tier, so that a
 * tag saved again (issue 31's fixed tags, "last") replaces its remote version safely.
 *
 * The first version of a tag goes under <job>/<tag>/ (the remote mirrors the root), its
 * MANIFEST.json written last with If-None-Match: *. A later version (the remote holds a
 * manifest of another created_ns) goes under <job>/<tag>/v<created_ns>/, files and node
 * records, so the version the remote manifest names stays whole while it uploads; its
 * manifest is the local bytes with "remote_dir": "v<created_ns>" added, written over the old
 * one with If-Match on the etag read (a lost race reads again: the same version found there
 * is done, a later one is never replaced). Then the old version's files and records go. Every
 * node of a version derives the same directory from the same manifest, so the nodes' records
 * meet, and one conditional write wins. A file of a tag not yet committed goes up before the
 * commit only while the remote holds no version of the tag (it would overwrite it). Once a
 * manifest is written, every version directory of an older version goes too: no manifest
 * can name it again (an older version never replaces a newer one), and a daemon killed
 * while it uploaded one (pinned after a newer commit, upload_replace.c) left its files there.
 *
 * Runs on upload workers (upload_tag.c's steps); holds no lock.
 */
#include "upload.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#define VERSION_MANIFEST_MAX (256u << 20)  /* the largest remote manifest read */
#define VERSION_TRIES 16                   /* conditional writes lost in a row */
#define RECORD_PREFIX ".dsckpt-remote."

/* Sets t's version directory loc ("" or "v<ns>"), its files' key and the remote manifest's
 * bytes (the local ones, with "remote_dir" when loc is not ""). */
static int set_version(struct uptag *t, const char *loc, char *err, size_t errlen)
{
	const char *brace = memchr(t->manifest, '{', t->manifest_len);
	size_t at = brace ? (size_t)(brace - t->manifest) + 1 : 0;
	char field[64];
	int n = loc[0] ? snprintf(field, sizeof(field), "\"remote_dir\": \"%s\", ", loc) : 0;

	if (!brace)
		return err_set(err, errlen, ERR_EINVAL, "%s: its manifest is no JSON object",
			       t->dir);
	free(t->rmanifest);
	if ((t->rmanifest = malloc(t->manifest_len + (size_t)n + 1)) == NULL)
		return err_set(err, errlen, ERR_ENOMEM, "out of memory");
	memcpy(t->rmanifest, t->manifest, at);
	memcpy(t->rmanifest + at, field, (size_t)n);
	memcpy(t->rmanifest + at + n, t->manifest + at, t->manifest_len - at);
	t->rmanifest_len = t->manifest_len + (size_t)n;
	snprintf(t->loc, sizeof(t->loc), "%s", loc);
	snprintf(t->fkey, sizeof(t->fkey), "%s%s%s", t->key, loc[0] ? "/" : "", loc);
	return 0;
}

/* Plan: the version directory of t (its local manifest m read): the one the remote manifest
 * names when it is this version, "" when the remote holds none, else v<created_ns>. */
int uptag_version(struct uptag *t, const struct manifest *m, char *err, size_t errlen)
{
	char key[PATH_MAX + 32], loc[32] = "", why[256];
	size_t len;
	int rc;

	if (m->remote_dir) {	/* a tag pulled from the remote: its bytes are the remote's */
		if (!remote_version_name(m->remote_dir))
			return err_set(err, errlen, ERR_EINVAL, "%s: remote_dir '%s' is no version",
				       t->dir, m->remote_dir);
		rc = set_version(t, "", err, errlen);
		snprintf(t->loc, sizeof(t->loc), "%s", m->remote_dir);
		snprintf(t->fkey, sizeof(t->fkey), "%s/%s", t->key, m->remote_dir);
		return rc;
	}
	snprintf(key, sizeof(key), "%s/%s", t->key, FMT_MANIFEST);
	char *there = remote_read_whole(t->r, key, VERSION_MANIFEST_MAX, &len, NULL, &rc, err,
					errlen);
	if (!there && rc != ERR_ENOENT)
		return rc;
	struct manifest *rm = there ? manifest_parse(there, len, why, sizeof(why)) : NULL;
	if (rm && rm->created_ns == m->created_ns && rm->remote_dir &&
	    remote_version_name(rm->remote_dir))
		snprintf(loc, sizeof(loc), "%s", rm->remote_dir);	/* this version, found */
	else if (there && !(rm && rm->created_ns == m->created_ns && !rm->remote_dir))
		snprintf(loc, sizeof(loc), "v%" PRIu64, m->created_ns);	/* another version */
	manifest_free(rm);
	free(there);
	return set_version(t, loc, err, errlen);
}

/* Before t's commit: 0 when a file of it may go up now (the remote holds no version of the
 * tag, so the first version's keys overwrite nothing), 1 when it waits for the plan. */
int uptag_early(struct uptag *t, char *err, size_t errlen)
{
	char key[PATH_MAX + 32];
	uint64_t size;

	snprintf(key, sizeof(key), "%s/%s", t->key, FMT_MANIFEST);
	int rc = remote_head(t->r, key, &size, NULL, err, errlen);
	if (rc == 0)
		snprintf(err, errlen, "waiting for the commit (the remote holds a version of %s)",
			 t->key);
	return rc == ERR_ENOENT ? 0 : rc == 0 ? 1 : rc;
}

/* Deletes the files and node records of the replaced version old (its manifest's text) of
 * t's tag; a failure is logged (the keys stay behind, never named by a manifest). */
static void drop_version(struct uptag *t, const char *old, size_t len)
{
	char why[256], err[ERRLEN], dir[PATH_MAX + 32], key[PATH_MAX + NAME_MAX + 64];
	struct manifest *m = manifest_parse(old, len, why, sizeof(why));
	int rc = 0;

	if (!m || (m->remote_dir && !remote_version_name(m->remote_dir))) {
		log_warnx("upload of %s: the replaced remote version left in place: %s", t->dir,
			  m ? "no version directory" : why);
		manifest_free(m);
		return;
	}
	snprintf(dir, sizeof(dir), "%s%s%s", t->key, m->remote_dir ? "/" : "",
		 m->remote_dir ? m->remote_dir : "");
	if (strcmp(dir, t->fkey) == 0) {
		manifest_free(m);
		return;
	}
	for (size_t i = 0; i < m->nfiles && rc >= 0; i++) {
		if (!m->files[i].name || !store_valid_file(m->files[i].name))
			continue;
		snprintf(key, sizeof(key), "%s/%s", dir, m->files[i].name);
		rc = remote_delete(t->r, key, err, sizeof(err));
	}
	for (size_t i = 0; i < t->nhosts && rc >= 0; i++) {
		snprintf(key, sizeof(key), "%s/" RECORD_PREFIX "%s", dir, t->hosts[i]);
		if ((rc = remote_delete(t->r, key, err, sizeof(err))) == ERR_ENOENT)
			rc = 0;
	}
	if (rc < 0)
		log_warnx("upload of %s: the replaced remote version's keys: %s", t->dir, err);
	else
		log_info("upload of %s: replaced remote version %s (%" PRIu64 ") deleted", t->dir,
			 dir, m->created_ns);
	manifest_free(m);
}

/* The names below a listed prefix, for remote_list. */
struct names {
	char (*name)[NAME_MAX + 1];
	size_t n;
	int nomem;
};

/* remote_list's callback: adds name to the struct names arg. */
static int names_add(void *arg, const char *name)
{
	struct names *l = arg;
	char (*grown)[NAME_MAX + 1] = realloc(l->name, (l->n + 1) * sizeof(*grown));

	if (!grown) {
		l->nomem = 1;
		return 1;
	}
	l->name = grown;
	snprintf(l->name[l->n++], NAME_MAX + 1, "%s", name);
	return 0;
}

/* Deletes every key below each version directory v<ns> of t's tag older than t's version
 * but the one written (t->loc); a failure is logged (the keys stay, named by no manifest). */
static void drop_older(struct uptag *t)
{
	char err[ERRLEN], dir[PATH_MAX + NAME_MAX + 2], key[sizeof(dir) + NAME_MAX + 2];
	struct names vs = {0};
	int rc = remote_list(t->r, t->key, names_add, &vs, err, sizeof(err));

	for (size_t i = 0; i < vs.n && rc >= 0 && !vs.nomem; i++) {
		if (!remote_version_name(vs.name[i]) || strcmp(vs.name[i], t->loc) == 0 ||
		    strtoull(vs.name[i] + 1, NULL, 10) >= t->created_ns)
			continue;
		struct names ks = {0};
		snprintf(dir, sizeof(dir), "%s/%s", t->key, vs.name[i]);
		rc = remote_list(t->r, dir, names_add, &ks, err, sizeof(err));
		for (size_t k = 0; k < ks.n && rc >= 0; k++) {
			snprintf(key, sizeof(key), "%s/%s", dir, ks.name[k]);
			rc = remote_delete(t->r, key, err, sizeof(err));
		}
		if (rc >= 0 && ks.n)
			log_info("upload of %s: older remote version %s deleted (%zu keys named by "
				 "no manifest)", t->dir, dir, ks.n);
		rc = rc >= 0 && ks.nomem ? ERR_ENOMEM : rc;
		free(ks.name);
	}
	if (rc < 0 || vs.nomem)
		log_warnx("upload of %s: older remote version directories left: %s", t->dir,
			  rc < 0 ? err : "out of memory");
	free(vs.name);
}

/* Writes t's remote manifest: the first version's with If-None-Match: * (one there must be
 * the same bytes, another node's), a later one over the version there with If-Match on its
 * etag. 0 done (t->wrote when this node wrote it), 2 when the remote changed under the plan
 * (plan again), or a code (EEXIST: a later version is there). */
int uptag_put_manifest(struct uptag *t, char *err, size_t errlen)
{
	char key[PATH_MAX + 32], etag[REMOTE_ETAG_MAX], why[256];
	size_t len;
	int rc;

	snprintf(key, sizeof(key), "%s/%s", t->key, FMT_MANIFEST);
	t->wrote = 0;
	for (int i = 0; i < VERSION_TRIES; i++) {
		char *there = remote_read_whole(t->r, key, VERSION_MANIFEST_MAX, &len, etag,
						&rc, err, errlen);
		if (!there && rc != ERR_ENOENT)
			return rc;
		if (there && len == t->rmanifest_len && memcmp(there, t->rmanifest, len) == 0) {
			free(there);
			log_info("upload of %s: the remote manifest was written by another node",
				 t->dir);
			return 0;
		}
		struct manifest *rm = there ? manifest_parse(there, len, why, sizeof(why)) : NULL;
		uint64_t ns = rm ? rm->created_ns : 0;
		manifest_free(rm);
		if (there && !t->loc[0] && ns != t->created_ns) {	/* since the plan */
			free(there);
			snprintf(err, errlen, "another version of %s reached the remote; planning "
				 "again", t->key);
			return 2;
		}
		if (there && ns == t->created_ns) {
			free(there);
			return err_set(err, errlen, ERR_EEXIST, "remote '%s' holds another "
				       "copy of this version of %s (its MANIFEST.json differs from "
				       "the local one)", remote_url(t->r), t->key);
		}
		if (there && ns >= t->created_ns) {
			free(there);
			return err_set(err, errlen, ERR_EEXIST, "remote '%s' holds a later version "
				       "of %s than the local one", remote_url(t->r), t->key);
		}
		rc = remote_put(t->r, key, t->rmanifest, t->rmanifest_len,
				there ? REMOTE_REPLACE : REMOTE_CREATE, there ? etag : NULL, NULL,
				err, errlen);
		if (rc == 0) {
			t->wrote = 1;
			log_info("upload of %s: wrote the remote manifest", t->dir);
			if (there)
				drop_version(t, there, len);
			drop_older(t);
		}
		free(there);
		if (rc != ERR_EEXIST)
			return rc;
	}
	return err_set(err, errlen, ERR_EBUSY, "%s: the remote manifest changed %d times in a row",
		       key, VERSION_TRIES);
}

/* Deletes this node's files f[0..n) of a version of t given up, below their version
 * directories, but where the remote manifest names one (a tag pulled from it); a failure is
 * logged (the keys stay behind, named by no manifest). */
void uptag_drop_abandoned(struct uptag *t, const struct upfile *f, size_t n)
{
	char key[PATH_MAX + NAME_MAX + 64], err[ERRLEN], why[256];
	size_t len, dropped = 0;
	int rc;

	if (n == 0)
		return;
	snprintf(key, sizeof(key), "%s/%s", t->key, FMT_MANIFEST);
	char *there = remote_read_whole(t->r, key, VERSION_MANIFEST_MAX, &len, NULL, &rc, err,
					sizeof(err));
	if (!there && rc != ERR_ENOENT) {
		log_warnx("upload of %s: files of the version given up left in the remote: %s",
			  t->dir, err);
		return;
	}
	struct manifest *rm = there ? manifest_parse(there, len, why, sizeof(why)) : NULL;
	for (size_t i = 0; i < n; i++) {
		if (rm && rm->remote_dir && strcmp(rm->remote_dir, f[i].loc) == 0)
			continue;	/* the version the remote holds */
		snprintf(key, sizeof(key), "%s/%s/%s", t->key, f[i].loc, f[i].name);
		if ((rc = remote_delete(t->r, key, err, sizeof(err))) < 0 && rc != ERR_ENOENT) {
			log_warnx("upload of %s: files of the version given up left in the remote: "
				  "%s", t->dir, err);
			break;
		}
		dropped++;
	}
	if (dropped)
		log_info("upload of %s: %zu file%s of the version given up deleted from the remote",
			 t->dir, dropped, dropped == 1 ? "" : "s");
	manifest_free(rm);
	free(there);
}
