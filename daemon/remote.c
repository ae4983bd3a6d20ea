/*
 * remote.c — a root's remote tier (DESIGN.md §9) behind one small interface: it parses the
 * URL, checks every key (only names of [A-Za-z0-9._-] between single '/', so a key can name
 * nothing outside the prefix), holds the upload bandwidth cap shared by all calls, and
 * dispatches to remote_s3.c or remote_file.c.
 *
 * Threads: every call blocks its caller and may run on any thread at once; struct remote is
 * read-only after remote_open (the cap, rate_cap.c, locks itself).
 */
#include "remote_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define REMOTE_KEY_MAX 1024

/* Whether key is non-empty names of [A-Za-z0-9._-] between single '/', none "." or "..",
 * none holding the file tier's temporary marker. */
static int remote_key_ok(const char *key)
{
	const char *seg = key;

	if (strlen(key) > REMOTE_KEY_MAX || strstr(key, ".dsckpt-upload-") != NULL)
		return 0;
	for (const char *p = key;; p++) {
		if (*p == '/' || *p == '\0') {
			size_t n = (size_t)(p - seg);
			if (n == 0 || (n == 1 && seg[0] == '.') ||
			    (n == 2 && seg[0] == '.' && seg[1] == '.'))
				return 0;
			if (*p == '\0')
				return 1;
			seg = p + 1;
		} else if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
			     (*p >= '0' && *p <= '9') || *p == '.' || *p == '_' || *p == '-')) {
			return 0;
		}
	}
}

/* Refuses a bad key with a message; 0 when it is good. */
static int remote_key_check(const char *key, char *err, size_t errlen)
{
	if (key == NULL || !remote_key_ok(key))
		return err_set(err, errlen, ERR_EINVAL, "remote key '%s' is not names of letters, "
			       "digits, '.', '_' and '-' between single '/'", key ? key : "(null)");
	return 0;
}

/* Opens the remote tier url with cfg's keys; nothing is contacted yet. */
int remote_open(const struct config *cfg, const char *url, struct remote **out, char *err,
		size_t errlen)
{
	struct remote *r;
	int rc;

	*out = NULL;
	if ((r = calloc(1, sizeof(*r))) == NULL)
		return err_set(err, errlen, ERR_ENOMEM, "out of memory");
	snprintf(r->url, sizeof(r->url), "%s", url);
	r->concurrency = cfg->upload_concurrency ? cfg->upload_concurrency : 1;
	r->part_bytes = cfg->upload_part_bytes ? cfg->upload_part_bytes : 64 << 20;
	r->file_mode = cfg->file_mode | 0600;
	r->dir_mode = cfg->dir_mode | 0700;
	if ((r->cap = rate_cap_new(cfg->upload_max_mib_per_s)) == NULL) {
		free(r);
		return err_set(err, errlen, ERR_ENOMEM, "out of memory");
	}
	if (strncmp(url, "s3://", 5) == 0) {
		const char *b = url + 5, *slash = strchr(b, '/');
		size_t n = slash ? (size_t)(slash - b) : strlen(b);
		if (n == 0 || n >= sizeof(r->bucket) ||
		    (slash && (!remote_key_ok(slash + 1)))) {
			rc = err_set(err, errlen, ERR_EINVAL, "remote '%s': not s3://bucket/prefix",
				     url);
			goto fail;
		}
		memcpy(r->bucket, b, n);
		snprintf(r->prefix, sizeof(r->prefix), "%s", slash ? slash + 1 : "");
		if ((rc = remote_s3_open(r, cfg, err, errlen)) != 0)
			goto fail;
	} else if (strncmp(url, "file:///", 8) == 0 && remote_key_ok(url + 8) &&
		   strlen(url + 7) < sizeof(r->prefix)) {
		snprintf(r->prefix, sizeof(r->prefix), "%s", url + 7);
		r->ops = &remote_file_ops;
	} else {
		rc = err_set(err, errlen, ERR_EINVAL, "remote '%s': expected s3://bucket/prefix or "
			     "file:///directory", url);
		goto fail;
	}
	*out = r;
	return 0;
fail:
	rate_cap_free(r->cap);
	free(r);
	return rc;
}

/* Closes r. */
void remote_close(struct remote *r)
{
	if (r == NULL)
		return;
	if (r->ops->close)
		r->ops->close(r);
	rate_cap_free(r->cap);
	free(r);
}

/* The URL r was opened with. */
const char *remote_url(const struct remote *r)
{
	return r->url;
}

/* Whether r answers. */
int remote_check(struct remote *r, char *err, size_t errlen)
{
	return r->ops->check(r, err, errlen);
}

/* Reads from a buffer (remote_put's source). */
static int remote_buf_read(void *arg, uint64_t off, void *buf, size_t len)
{
	memcpy(buf, (const char *)arg + off, len);
	return 0;
}

/* Writes len bytes as key under cond. */
int remote_put(struct remote *r, const char *key, const void *buf, size_t len, int cond,
	       const char *etag, char *etag_out, char *err, size_t errlen)
{
	struct remote_src src = { remote_buf_read, (void *)buf, len };
	int rc;

	if ((rc = remote_key_check(key, err, errlen)) != 0)
		return rc;
	if (cond == REMOTE_REPLACE && (etag == NULL || etag[0] == '\0' ||
				       strlen(etag) >= REMOTE_ETAG_MAX || strpbrk(etag, "\r\n")))
		return err_set(err, errlen, ERR_EINVAL, "a conditional replace needs the etag of "
			       "the version it replaces");
	if (etag_out)
		etag_out[0] = '\0';
	return r->ops->put(r, key, &src, cond, etag, etag_out, err, errlen);
}

/* Writes src as key. */
int remote_upload(struct remote *r, const char *key, const struct remote_src *src, char *err,
		  size_t errlen)
{
	int rc = remote_key_check(key, err, errlen);

	return rc ? rc : r->ops->upload(r, key, src, err, errlen);
}

/* Reads len bytes at off of key into buf. */
int remote_get(struct remote *r, const char *key, uint64_t off, void *buf, size_t len,
	       char *err, size_t errlen)
{
	int rc = remote_key_check(key, err, errlen);

	if (rc == 0 && off + len < off)
		rc = err_set(err, errlen, ERR_EINVAL, "range past 2^64");
	return rc ? rc : len == 0 ? 0 : r->ops->get(r, key, off, buf, len, err, errlen);
}

/* The size and etag of key. */
int remote_head(struct remote *r, const char *key, uint64_t *size, char *etag, char *err,
		size_t errlen)
{
	char tmp[REMOTE_ETAG_MAX];
	int rc = remote_key_check(key, err, errlen);

	return rc ? rc : r->ops->head(r, key, size, etag ? etag : tmp, err, errlen);
}

/* Reads key whole, at most max bytes, into a malloc'd buffer with a NUL after it (its etag
 * into etag when not NULL). */
char *remote_read_whole(struct remote *r, const char *key, size_t max, size_t *len,
			char *etag, int *rc, char *err, size_t errlen)
{
	uint64_t size;
	char *buf;

	if ((*rc = remote_head(r, key, &size, etag, err, errlen)) < 0)
		return NULL;
	if (size > max) {
		*rc = err_set(err, errlen, ERR_EMSGSIZE, "remote %s: %llu bytes", key,
			      (unsigned long long)size);
		return NULL;
	}
	if ((buf = malloc(size + 1)) == NULL) {
		*rc = err_set(err, errlen, ERR_ENOMEM, "out of memory");
		return NULL;
	}
	if ((*rc = remote_get(r, key, 0, buf, size, err, errlen)) < 0) {
		free(buf);
		return NULL;
	}
	buf[size] = '\0';
	*len = size;
	return buf;
}

/* Deletes key. */
int remote_delete(struct remote *r, const char *key, char *err, size_t errlen)
{
	int rc = remote_key_check(key, err, errlen);

	return rc ? rc : r->ops->del(r, key, err, errlen);
}

/* Calls cb for each upload left open under prefix. */
int remote_list_uploads(struct remote *r, const char *prefix, remote_upload_cb cb, void *arg,
			char *err, size_t errlen)
{
	int rc = prefix[0] ? remote_key_check(prefix, err, errlen) : 0;

	return rc ? rc : r->ops->list_uploads(r, prefix, cb, arg, err, errlen);
}

/* remote_list's filter between a tier and its caller. */
struct remote_names {
	remote_name_cb cb;
	void *arg;
};

/* Passes name on when it is one key segment. */
static int remote_name_filter(void *arg, const char *name)
{
	struct remote_names *f = arg;

	return strchr(name, '/') || !remote_key_ok(name) ? 0 : f->cb(f->arg, name);
}

/* Calls cb with each name directly below prefix. */
int remote_list(struct remote *r, const char *prefix, remote_name_cb cb, void *arg, char *err,
		size_t errlen)
{
	struct remote_names f = { cb, arg };
	int rc = remote_key_check(prefix, err, errlen);

	return rc ? rc : r->ops->list(r, prefix, remote_name_filter, &f, err, errlen);
}

/* Aborts the upload id of key. */
int remote_abort(struct remote *r, const char *key, const char *id, char *err, size_t errlen)
{
	int rc = remote_key_check(key, err, errlen);

	if (rc == 0 && (id[0] == '\0' || strlen(id) > 1024 || strpbrk(id, "\r\n")))
		rc = err_set(err, errlen, ERR_EINVAL, "'%s' is not an upload id", id);
	return rc ? rc : r->ops->abort(r, key, id, err, errlen);
}

/* Whether name is the directory of a later version below a remote tag: 'v' and the
 * decimal created_ns of its manifest (upload_version.c). */
int remote_version_name(const char *name)
{
	size_t n = strlen(name);

	return n > 1 && n < 22 && name[0] == 'v' && strspn(name + 1, "0123456789") == n - 1;
}

/* Whether a failure with code may pass if tried again later. */
int remote_retryable(int code)
{
	return code == ERR_EIO || code == ERR_ETIMEDOUT || code == ERR_EBUSY ||
	       code == ERR_ENOSPC || code == ERR_ENOMEM;
}

/* Checks the remote tier of every root of cfg, one line per remote that does not answer. */
int remote_check_roots(const struct config *cfg, char *err, size_t errlen)
{
	size_t used = 0;
	int bad = 0;

	if (errlen > 0)
		err[0] = '\0';
	for (size_t i = 0; i < cfg->n_roots; i++) {
		struct remote *r = NULL;
		char why[ERRLEN];
		if (cfg->root_remotes == NULL || cfg->root_remotes[i] == NULL)
			continue;
		why[0] = '\0';
		if (remote_open(cfg, cfg->root_remotes[i], &r, why, sizeof(why)) == 0)
			remote_check(r, why, sizeof(why));
		remote_close(r);
		if (why[0] == '\0')
			continue;
		bad = 1;
		if (used + 1 < errlen)
			used += (size_t)snprintf(err + used, errlen - used, "%sroot %s: %s",
						 used ? "\n" : "", cfg->allowed_roots[i], why);
		if (used >= errlen)
			used = errlen - 1;
	}
	return bad ? -1 : 0;
}
