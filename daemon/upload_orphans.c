/*
 * upload_orphans.c — the uploads this node left open in a remote tier (a daemon killed
 * mid-upload: an S3 multipart upload, a file tier's temporary file), found by listing them
 * at start-up (and again while a remote cannot be listed) and aborted, but those of files
 * this daemon uploads at that moment. An upload is this node's when the local file its key
 * names (<job>/<tag>[/v<ns>]/<name> below the root) was written by this node.
 *
 * Runs on upload worker 0 and blocks it; holds no lock but what busy() takes.
 */
#include "upload.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Uploads left open, as a listing finds them. */
struct open_uploads {
	char **keys, **ids;
	size_t n;
};

/* remote_upload_cb: collects an open upload. */
static int collect_upload(void *arg, const char *key, const char *id)
{
	struct open_uploads *o = arg;
	char **k = realloc(o->keys, (o->n + 1) * sizeof(*k));
	if (k)
		o->keys = k;
	char **d = realloc(o->ids, (o->n + 1) * sizeof(*d));
	if (d)
		o->ids = d;
	if (!k || !d || !(o->keys[o->n] = strdup(key)))
		return ERR_ENOMEM;
	if (!(o->ids[o->n] = strdup(id))) {
		free(o->keys[o->n]);
		return ERR_ENOMEM;
	}
	o->n++;
	return 0;
}

/* Whether the local file of key (<tag>[/v<ns>]/<name>) under root is this node's (a .meta:
 * its safetensors'). */
static int key_ours(const char *root, const char *key)
{
	char path[PATH_MAX], host[STORE_HOST_MAX], stem[NAME_MAX + 1];
	const char *slash = strrchr(key, '/');
	const char *name = slash ? slash + 1 : key;
	size_t n = strlen(name);

	if (!slash || (!store_has_suffix(name, FMT_SAFETENSORS) &&
		       !store_has_suffix(name, FMT_META)))
		return 0;
	int dirlen = (int)(slash - key);
	const char *up = memrchr(key, '/', (size_t)dirlen);
	char seg[NAME_MAX + 1];
	snprintf(seg, sizeof(seg), "%.*s", up ? dirlen - (int)(up - key) - 1 : 0, up ? up + 1 : "");
	if (up && remote_version_name(seg))
		dirlen = (int)(up - key);	/* a later version's file: below its tag */
	snprintf(path, sizeof(path), "%s/%.*s", root, dirlen, key);
	snprintf(stem, sizeof(stem), "%.*s", (int)(n - (store_has_suffix(name, FMT_META) ?
						       strlen(FMT_META) :
						       strlen(FMT_SAFETENSORS))), name);
	int dfd = open(path, STORE_DIR_FLAGS);
	if (dfd < 0)
		return 0;
	char st[NAME_MAX + sizeof(FMT_SAFETENSORS)];
	snprintf(st, sizeof(st), "%s%s", stem, FMT_SAFETENSORS);
	int rc = store_st_host(dfd, st, host, sizeof(host));
	close(dfd);
	return rc == 1 && strcmp(host, store_host()) == 0;
}

/* Aborts the uploads of this node's files left open in root i's remote but those busy(key)
 * says this daemon uploads now; 0, or -1 when the remote could not be listed or a key was
 * busy (to be looked at again). */
static int abort_orphans(const struct config *cfg, unsigned i, struct remote *r,
			 int (*busy)(const char *key), int quiet)
{
	struct open_uploads o = {0};
	char err[ERRLEN];
	unsigned aborted = 0, skipped = 0;

	int rc = remote_list_uploads(r, "", collect_upload, &o, err, sizeof(err));
	for (size_t k = 0; k < o.n; k++) {
		/* A key this daemon uploads now may be its own upload's, or one left open:
		 * looked at again once it is not busy. */
		if (rc >= 0 && key_ours(cfg->allowed_roots[i], o.keys[k]) &&
		    !(busy(o.keys[k]) && ++skipped)) {
			if (remote_abort(r, o.keys[k], o.ids[k], err, sizeof(err)) < 0)
				log_warnx("%s", err);
			else
				aborted++;
		}
		free(o.keys[k]);
		free(o.ids[k]);
	}
	free(o.keys);
	free(o.ids);
	if (aborted)
		log_info("aborted %u upload%s to %s that an interrupted daemon left open",
			 aborted, aborted == 1 ? "" : "s", remote_url(r));
	if (rc < 0 && quiet)
		log_debug("uploads left open in %s: %s", remote_url(r), err);
	else if (rc < 0)
		log_warnx("uploads left open in %s: %s (looked for again every few seconds)",
			  remote_url(r), err);
	return rc < 0 || skipped ? -1 : 0;
}

/* Aborts this node's uploads left open (a daemon killed mid-upload) in the remote of each
 * root i of cfg whose done[i] is 0, setting it once the remote was listed and no key of it
 * was busy (a failure logged at debug level when quiet); how many remain to be looked at. */
unsigned uptag_orphans(const struct config *cfg, struct remote *const *remotes, int *done,
		       int (*busy)(const char *key), int quiet)
{
	unsigned left = 0;
	for (unsigned i = 0; i < cfg->n_roots; i++) {
		if (!remotes[i] || done[i])
			continue;
		if (abort_orphans(cfg, i, remotes[i], busy, quiet) == 0)
			done[i] = 1;
		else
			left++;
	}
	return left;
}
