/*
 * upload_retain.c — keep_last_remote: after a tag of a job reaches REMOTE, the daemon that
 * wrote its remote manifest deletes the job's older remote tags beyond the newest
 * keep_last_remote committed ones. A tag is committed remotely when its MANIFEST.json is
 * there; tags are ordered by its created_ns (ties by name), as retention.c orders local tags.
 * Never deleted: the tag the remote `latest` names, a tag without a remote manifest (another
 * node's upload in progress), a name a local tag could not have. A deletion removes the
 * manifest first (a half-deleted tag is never seen as committed), then every other key of the
 * tag (its files, the nodes' records, and a tag saved again: its version directories').
 * A failure is logged and counted; the next REMOTE of the job tries again.
 *
 * Runs on an upload worker (upload_tag.c's finish) and blocks it; holds no lock.
 */
#include "upload.h"

#include <stdlib.h>
#include <string.h>

#define RETAIN_MANIFEST_MAX (256u << 20)  /* the largest remote manifest read */
#define RETAIN_TAGS_MAX 100000            /* tags of one job considered */

/* A committed remote tag. */
struct rtag {
	char name[NAME_MAX + 1];
	uint64_t created_ns;
};

/* The names listed below a prefix. */
struct rnames {
	char (*v)[NAME_MAX + 1];
	size_t n, cap;
};

/* remote_list's callback: keeps name (over NAME_MAX: skipped). */
static int rnames_add(void *arg, const char *name)
{
	struct rnames *l = arg;

	if (strlen(name) > NAME_MAX)
		return 0;
	if (l->n == l->cap) {
		size_t cap = l->cap ? l->cap * 2 : 16;
		void *v = cap > RETAIN_TAGS_MAX ? NULL : realloc(l->v, cap * sizeof(*l->v));
		if (v == NULL)
			return ERR_ENOMEM;
		l->v = v;
		l->cap = cap;
	}
	snprintf(l->v[l->n++], NAME_MAX + 1, "%s", name);
	return 0;
}

/* When tag of jobkey was committed remotely (its manifest's created_ns): 0 when it has no
 * manifest or one that does not parse (the tag is kept), or a negative code. */
static int64_t retain_committed(struct remote *r, const char *jobkey, const char *tag,
				char *err, size_t errlen)
{
	char key[PATH_MAX + NAME_MAX + 32], why[256];
	size_t len;
	int rc;

	snprintf(key, sizeof(key), "%s/%s/%s", jobkey, tag, FMT_MANIFEST);
	char *text = remote_read_whole(r, key, RETAIN_MANIFEST_MAX, &len, NULL, &rc, err,
				       errlen);
	if (text == NULL)
		return rc == ERR_ENOENT ? 0 : rc;
	struct manifest *m = manifest_parse(text, len, why, sizeof(why));
	uint64_t ns = m ? m->created_ns : 0;
	if (m == NULL)
		log_debug("keep_last_remote: kept %s: %s", key, why);
	manifest_free(m);
	free(text);
	return ns > INT64_MAX ? INT64_MAX : (int64_t)ns;
}

/* Orders tags newest first (ties by name, descending). */
static int rtag_cmp(const void *a, const void *b)
{
	const struct rtag *x = a, *y = b;

	if (x->created_ns != y->created_ns)
		return x->created_ns < y->created_ns ? 1 : -1;
	return -strcmp(x->name, y->name);
}

/* Deletes every key directly below prefix (a version directory of a tag saved again). */
static int retain_delete_below(struct remote *r, const char *prefix, char *err,
			       size_t errlen)
{
	char key[PATH_MAX + 3 * NAME_MAX + 16];
	struct rnames keys = { 0 };
	int rc = remote_list(r, prefix, rnames_add, &keys, err, errlen);

	for (size_t i = 0; rc == 0 && i < keys.n; i++) {
		snprintf(key, sizeof(key), "%s/%s", prefix, keys.v[i]);
		rc = remote_delete(r, key, err, errlen);
	}
	free(keys.v);
	return rc;
}

/* Deletes the remote tag jobkey/tag: its manifest first, then every other key of it (those
 * of its version directories too). */
static int retain_delete(struct remote *r, const char *jobkey, const char *tag, char *err,
			 size_t errlen)
{
	char key[PATH_MAX + 2 * NAME_MAX + 8];
	struct rnames keys = { 0 };
	int rc;

	snprintf(key, sizeof(key), "%s/%s/%s", jobkey, tag, FMT_MANIFEST);
	if ((rc = remote_delete(r, key, err, errlen)) < 0)
		return rc;
	snprintf(key, sizeof(key), "%s/%s", jobkey, tag);
	rc = remote_list(r, key, rnames_add, &keys, err, errlen);
	for (size_t i = 0; rc == 0 && i < keys.n; i++) {
		snprintf(key, sizeof(key), "%s/%s/%s", jobkey, tag, keys.v[i]);
		rc = remote_version_name(keys.v[i]) ? retain_delete_below(r, key, err, errlen) :
		     remote_delete(r, key, err, errlen);
	}
	free(keys.v);
	if (rc == ERR_ENOMEM)
		err_set(err, errlen, rc, "out of memory");
	return rc;
}

/* Deletes jobkey's committed remote tags of r beyond the newest keep (0: all kept), never
 * the one the remote latest names. 0 or a code with err. */
int upload_retain(struct remote *r, const char *jobkey, unsigned keep, char *err,
		  size_t errlen)
{
	char key[PATH_MAX + 16], latest[NAME_MAX + 1] = "";
	struct rnames names = { 0 };
	struct rtag *tags = NULL;
	size_t k = 0, len;
	int rc;

	if (keep == 0)
		return 0;
	snprintf(key, sizeof(key), "%s/%s", jobkey, FMT_LATEST);
	char *cur = remote_read_whole(r, key, NAME_MAX, &len, NULL, &rc, err, errlen);
	if (cur == NULL && rc != ERR_ENOENT)
		return rc;
	if (cur)
		snprintf(latest, sizeof(latest), "%s", cur);
	free(cur);
	if ((rc = remote_list(r, jobkey, rnames_add, &names, err, errlen)) == ERR_ENOMEM)
		err_set(err, errlen, rc, "out of memory");
	if (rc == 0 && (tags = calloc(names.n ? names.n : 1, sizeof(*tags))) == NULL)
		rc = err_set(err, errlen, ERR_ENOMEM, "out of memory");
	for (size_t i = 0; rc == 0 && i < names.n; i++) {
		/* A tag is named as a local one is: no leading '.', not latest. */
		if (names.v[i][0] == '.' || strcmp(names.v[i], FMT_LATEST) == 0)
			continue;
		int64_t ns = retain_committed(r, jobkey, names.v[i], err, errlen);
		if (ns < 0)
			rc = (int)ns;
		else if (ns > 0) {
			tags[k].created_ns = (uint64_t)ns;
			memcpy(tags[k++].name, names.v[i], sizeof(tags->name));
		}
	}
	qsort(tags, rc == 0 ? k : 0, sizeof(*tags), rtag_cmp);
	for (size_t i = keep; rc == 0 && i < k; i++) {
		if (strcmp(tags[i].name, latest) == 0)
			continue;
		if ((rc = retain_delete(r, jobkey, tags[i].name, err, errlen)) == 0)
			log_info("keep_last_remote: deleted remote checkpoint %s/%s of '%s'",
				 jobkey, tags[i].name, remote_url(r));
	}
	free(tags);
	free(names.v);
	return rc;
}

/* Applies keep_last_remote to t's job once t is REMOTE, when this node wrote t's manifest. */
void uptag_retain(struct uptag *t)
{
	char err[ERRLEN];
	int rc;

	if (!t->wrote || t->cfg->keep_last_remote == 0)
		return;
	rc = upload_retain(t->r, t->jobkey, t->cfg->keep_last_remote, err, sizeof(err));
	if (rc < 0) {
		log_warnx("keep_last_remote of %s in '%s': %s (tried again at the job's next "
			  "upload)", t->jobkey, remote_url(t->r), err);
		metrics_fail(METRIC_UPLOADS_FAILED, rc);
	}
}
