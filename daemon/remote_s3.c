/*
 * remote_s3.c — the S3 tier: an S3-compatible store's operations for remote.c (a bucket
 * check, PUT with If-None-Match or If-Match, multipart uploads in parallel parts, ranged
 * reads in parallel, HEAD, DELETE, a listing of names, listing and aborting multipart uploads),
 * each made of
 * remote_s3_req.c's requests.
 *
 * The secret key and session token live only in struct s3 (wiped on close) and the curl
 * handles' options.
 */
#include "remote_s3.h"

#include <stdlib.h>
#include <string.h>

static pthread_once_t s3_once = PTHREAD_ONCE_INIT;
static CURLcode s3_global_rc;

/* curl_global_init, once for the process (it is not thread-safe itself). */
static void s3_global(void)
{
	s3_global_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

/* Opens the S3 tier of r with cfg's s3 keys. */
int remote_s3_open(struct remote *r, const struct config *cfg, char *err, size_t errlen)
{
	const char *ep = cfg->s3_endpoint && cfg->s3_endpoint[0] ? cfg->s3_endpoint : NULL;
	const char *region = cfg->s3_region && cfg->s3_region[0] ? cfg->s3_region : "us-east-1";
	struct s3 *s;

	pthread_once(&s3_once, s3_global);
	if (s3_global_rc != CURLE_OK)
		return err_set(err, errlen, ERR_EIO, "libcurl: %s",
			       curl_easy_strerror(s3_global_rc));
	if (ep && strstr(ep, "://") == NULL)
		return err_set(err, errlen, ERR_EINVAL, "s3 endpoint '%s' is not http(s)://host",
			       ep);
	if (cfg->s3_key_id == NULL || cfg->s3_secret == NULL)
		return err_set(err, errlen, ERR_EACCES, "remote '%s': no credentials (s3's "
			       "credentials_file)", r->url);
	if ((s = calloc(1, sizeof(*s))) == NULL)
		return err_set(err, errlen, ERR_ENOMEM, "out of memory");
	if (ep) {
		const char *host = strstr(ep, "://") + 3;
		snprintf(s->scheme, sizeof(s->scheme), "%.*s", (int)(host - 3 - ep), ep);
		snprintf(s->host, sizeof(s->host), "%s", host);
	} else {
		snprintf(s->scheme, sizeof(s->scheme), "https");
		snprintf(s->host, sizeof(s->host), "s3.%s.amazonaws.com", region);
	}
	s->virtual_hosted = cfg->s3_virtual;
	snprintf(s->sigv4, sizeof(s->sigv4), "aws:amz:%s:s3", region);
	if ((size_t)snprintf(s->userpwd, sizeof(s->userpwd), "%s:%s", cfg->s3_key_id,
			     cfg->s3_secret) >= sizeof(s->userpwd) ||
	    (cfg->s3_token && (size_t)snprintf(s->token, sizeof(s->token),
					       "x-amz-security-token: %s", cfg->s3_token) >=
	     sizeof(s->token))) {
		explicit_bzero(s, sizeof(*s));
		free(s);
		return err_set(err, errlen, ERR_EINVAL, "remote '%s': the credentials are too "
			       "long", r->url);
	}
	r->tier = s;
	r->ops = &remote_s3_ops;
	return 0;
}

/* Wipes and frees the tier's state. */
static void s3_close(struct remote *r)
{
	explicit_bzero(r->tier, sizeof(struct s3));
	free(r->tier);
}

/* Checks that the bucket answers to our credentials (a listing of one key). */
static int s3_check(struct remote *r, char *err, size_t errlen)
{
	struct s3_req q = { 0 };
	char what[1200];
	int rc;

	snprintf(what, sizeof(what), "remote '%s': bucket check", r->url);
	if ((rc = s3_req_init(&q, r, "GET", "", "list-type=2&max-keys=1", NULL, err,
			      errlen)) == 0)
		rc = s3_perform(&q, what, err, errlen);
	s3_req_free(&q);
	return rc;
}

/* PUTs src as key under cond; the new etag into etag_out. */
static int s3_put(struct remote *r, const char *key, const struct remote_src *src, int cond,
		  const char *etag, char *etag_out, char *err, size_t errlen)
{
	struct s3_req q = { .src = src, .src_len = src->size };
	char hdr[REMOTE_ETAG_MAX + 16], what[1200];
	const char *extra[2] = { NULL, NULL };
	int rc;

	if (cond == REMOTE_CREATE)
		extra[0] = "If-None-Match: *";
	else if (cond == REMOTE_REPLACE) {
		snprintf(hdr, sizeof(hdr), "If-Match: %s", etag);
		extra[0] = hdr;
	}
	snprintf(what, sizeof(what), "remote '%s': PUT %s", r->url, key);
	if ((rc = s3_req_init(&q, r, "PUT", key, "", extra, err, errlen)) == 0)
		rc = s3_perform(&q, what, err, errlen);
	if (rc == 0 && etag_out)
		snprintf(etag_out, REMOTE_ETAG_MAX, "%s", q.etag);
	s3_req_free(&q);
	return rc;
}

/* A multipart upload in progress. */
struct s3_mpu {
	struct remote *r;
	const char *key;
	const struct remote_src *src;
	char id[1100];       /* UploadId */
	char id_enc[3400];   /* percent-encoded */
};

/* Starts the PUT of part i. */
static int s3_part_start(void *arg, size_t i, struct s3_req *q, char *err, size_t errlen)
{
	struct s3_mpu *u = arg;
	char query[3500];

	q->src = u->src;
	q->src_off = (uint64_t)i * u->r->part_bytes;
	q->src_len = u->src->size - q->src_off < u->r->part_bytes ?
		     u->src->size - q->src_off : u->r->part_bytes;
	snprintf(query, sizeof(query), "partNumber=%zu&uploadId=%s", i + 1, u->id_enc);
	return s3_req_init(q, u->r, "PUT", u->key, query, NULL, err, errlen);
}

/* Aborts the multipart upload id of key. */
static int s3_abort(struct remote *r, const char *key, const char *id, char *err,
		    size_t errlen)
{
	struct s3_req q = { 0 };
	char query[3500] = "uploadId=", what[1200];
	int rc;

	s3_encode(query, sizeof(query), id);
	snprintf(what, sizeof(what), "remote '%s': abort upload of %s", r->url, key);
	if ((rc = s3_req_init(&q, r, "DELETE", key, query, NULL, err, errlen)) == 0)
		rc = s3_perform(&q, what, err, errlen);
	s3_req_free(&q);
	return rc;
}

/* Creates the multipart upload of u->key: its id into u. */
static int s3_mpu_create(struct s3_mpu *u, const char *what, char *err, size_t errlen)
{
	struct s3_req q = { 0 };
	int rc;

	if ((rc = s3_req_init(&q, u->r, "POST", u->key, "uploads=", NULL, err, errlen)) == 0 &&
	    (rc = s3_perform(&q, what, err, errlen)) == 0 &&
	    !s3_xml(q.body, "UploadId", u->id, sizeof(u->id)))
		rc = err_set(err, errlen, ERR_EIO, "%s: no UploadId in the answer", what);
	s3_req_free(&q);
	u->id_enc[0] = '\0';
	s3_encode(u->id_enc, sizeof(u->id_enc), u->id);
	return rc;
}

/* Completes u from its parts' etags. */
static int s3_mpu_complete(struct s3_mpu *u, struct s3_req *parts, size_t n, const char *what,
			   char *err, size_t errlen)
{
	size_t cap = 64 + n * (64 + REMOTE_ETAG_MAX), len = 0;
	char *xml = malloc(cap), query[3500];
	struct s3_req q = { 0 };
	int rc;

	if (xml == NULL)
		return err_set(err, errlen, ERR_ENOMEM, "out of memory");
	len += (size_t)snprintf(xml, cap, "<CompleteMultipartUpload>");
	for (size_t i = 0; i < n; i++)
		len += (size_t)snprintf(xml + len, cap - len, "<Part><PartNumber>%zu</PartNumber>"
					"<ETag>%s</ETag></Part>", i + 1, parts[i].etag);
	snprintf(xml + len, cap - len, "</CompleteMultipartUpload>");
	q.post = xml;
	snprintf(query, sizeof(query), "uploadId=%s", u->id_enc);
	const char *extra[] = { "Content-Type: application/xml", NULL };
	if ((rc = s3_req_init(&q, u->r, "POST", u->key, query, extra, err, errlen)) == 0)
		rc = s3_perform(&q, what, err, errlen); /* an <Error> in a 200 is one too */
	s3_req_free(&q);
	free(xml);
	return rc;
}

/* Uploads src as key: one PUT up to a part, else a multipart upload in parallel parts,
 * aborted when it fails (a server gone leaves it for remote_list_uploads to find). */
static int s3_upload(struct remote *r, const char *key, const struct remote_src *src,
		     char *err, size_t errlen)
{
	struct s3_mpu u = { .r = r, .key = key, .src = src };
	size_t n = (size_t)((src->size + r->part_bytes - 1) / r->part_bytes);
	struct s3_req *parts;
	char what[1200], why[ERRLEN];
	int rc;

	if (src->size <= r->part_bytes)
		return s3_put(r, key, src, REMOTE_ANY, NULL, NULL, err, errlen);
	if (n > 10000)
		return err_set(err, errlen, ERR_EINVAL, "%s: %zu parts, past S3's 10,000 (raise "
			       "upload_part_size)", key, n);
	snprintf(what, sizeof(what), "remote '%s': upload of %s", r->url, key);
	if ((rc = s3_mpu_create(&u, what, err, errlen)) != 0)
		return rc;
	if ((parts = calloc(n, sizeof(*parts))) == NULL) {
		rc = err_set(err, errlen, ERR_ENOMEM, "out of memory");
		goto fail_abort;
	}
	rc = s3_parallel(r, parts, n, s3_part_start, &u, what, err, errlen);
	if (rc == 0)
		rc = s3_mpu_complete(&u, parts, n, what, err, errlen);
	for (size_t i = 0; i < n; i++)
		s3_req_free(&parts[i]);
	free(parts);
	if (rc == 0)
		return 0;
fail_abort:
	if (s3_abort(r, key, u.id, why, sizeof(why)) != 0)
		log_debug("%s: %s", what, why);
	return rc;
}

/* A ranged read in progress. */
struct s3_get {
	struct remote *r;
	const char *key;
	uint64_t off;
	char *buf;
	size_t len;
};

/* Starts the GET of range i. */
static int s3_range_start(void *arg, size_t i, struct s3_req *q, char *err, size_t errlen)
{
	struct s3_get *g = arg;
	uint64_t a = (uint64_t)i * g->r->part_bytes;
	size_t n = g->len - a < g->r->part_bytes ? g->len - a : g->r->part_bytes;
	char range[80];

	snprintf(range, sizeof(range), "Range: bytes=%llu-%llu",
		 (unsigned long long)(g->off + a), (unsigned long long)(g->off + a + n - 1));
	const char *extra[] = { range, NULL };
	q->dst = g->buf + a;
	q->dst_len = n;
	return s3_req_init(q, g->r, "GET", g->key, "", extra, err, errlen);
}

/* Reads len bytes at off of key, in parallel ranges of a part each. */
static int s3_get(struct remote *r, const char *key, uint64_t off, void *buf, size_t len,
		  char *err, size_t errlen)
{
	struct s3_get g = { r, key, off, buf, len };
	size_t n = (len + r->part_bytes - 1) / r->part_bytes;
	struct s3_req *q = calloc(n, sizeof(*q));
	char what[1200];
	int rc;

	if (q == NULL)
		return err_set(err, errlen, ERR_ENOMEM, "out of memory");
	snprintf(what, sizeof(what), "remote '%s': GET %s", r->url, key);
	rc = s3_parallel(r, q, n, s3_range_start, &g, what, err, errlen);
	for (size_t i = 0; i < n && rc == 0; i++)
		if (q[i].status != 206 || q[i].dst_pos != q[i].dst_len)
			rc = err_set(err, errlen, ERR_EIO, "%s: %zu bytes at %llu: got %zu (HTTP "
				     "%ld); the object is shorter", what, q[i].dst_len,
				     (unsigned long long)(off + (uint64_t)i * r->part_bytes),
				     q[i].dst_pos, q[i].status);
	for (size_t i = 0; i < n; i++)
		s3_req_free(&q[i]);
	free(q);
	return rc;
}

/* The size and etag of key. */
static int s3_head(struct remote *r, const char *key, uint64_t *size, char *etag, char *err,
		   size_t errlen)
{
	struct s3_req q = { 0 };
	curl_off_t cl = -1;
	char what[1200];
	int rc;

	snprintf(what, sizeof(what), "remote '%s': HEAD %s", r->url, key);
	if ((rc = s3_req_init(&q, r, "HEAD", key, "", NULL, err, errlen)) == 0 &&
	    (rc = s3_perform(&q, what, err, errlen)) == 0) {
		curl_easy_getinfo(q.h, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &cl);
		if (cl < 0)
			rc = err_set(err, errlen, ERR_EIO, "%s: no Content-Length", what);
		*size = (uint64_t)cl;
		snprintf(etag, REMOTE_ETAG_MAX, "%s", q.etag);
	}
	s3_req_free(&q);
	return rc;
}

/* Deletes key (S3 answers 204 whether or not it was there). */
static int s3_delete(struct remote *r, const char *key, char *err, size_t errlen)
{
	struct s3_req q = { 0 };
	char what[1200];
	int rc;

	snprintf(what, sizeof(what), "remote '%s': DELETE %s", r->url, key);
	if ((rc = s3_req_init(&q, r, "DELETE", key, "", NULL, err, errlen)) == 0)
		rc = s3_perform(&q, what, err, errlen);
	s3_req_free(&q);
	return rc;
}

/* Lists the multipart uploads open under prefix, page by page. */
static int s3_list_uploads(struct remote *r, const char *prefix, remote_upload_cb cb,
			   void *arg, char *err, size_t errlen)
{
	char full[2200], kmark[1100] = "", imark[1100] = "", what[1200];
	size_t plen = r->prefix[0] ? strlen(r->prefix) + 1 : 0;
	int rc = 0, more = 1;

	snprintf(full, sizeof(full), "%s%s%s", r->prefix, r->prefix[0] ? "/" : "", prefix);
	snprintf(what, sizeof(what), "remote '%s': list uploads", r->url);
	while (rc == 0 && more) {
		struct s3_req q = { 0 };
		char query[8000] = "", flag[16] = "";
		/* Canonical: parameters sorted by name. */
		if (kmark[0]) {
			strcat(query, "key-marker=");
			s3_encode(query, sizeof(query), kmark);
			strcat(query, "&");
		}
		if (full[0]) {
			strcat(query, "prefix=");
			s3_encode(query, sizeof(query), full);
			strcat(query, "&");
		}
		if (imark[0]) {
			strcat(query, "upload-id-marker=");
			s3_encode(query, sizeof(query), imark);
			strcat(query, "&");
		}
		strcat(query, "uploads=");
		if ((rc = s3_req_init(&q, r, "GET", "", query, NULL, err, errlen)) == 0)
			rc = s3_perform(&q, what, err, errlen);
		for (const char *p = q.body; rc == 0 && p && (p = strstr(p, "<Upload>")); p++) {
			char key[1100], id[1100];
			if (s3_xml(p, "Key", key, sizeof(key)) && s3_xml(p, "UploadId", id, sizeof(id))
			    && strncmp(key, full, strlen(full)) == 0 && strlen(key) > plen)
				rc = cb(arg, key + plen, id);
		}
		more = rc == 0 && s3_xml(q.body, "IsTruncated", flag, sizeof(flag)) &&
		       strcmp(flag, "true") == 0 &&
		       s3_xml(q.body, "NextKeyMarker", kmark, sizeof(kmark)) &&
		       s3_xml(q.body, "NextUploadIdMarker", imark, sizeof(imark));
		s3_req_free(&q);
	}
	return rc;
}

/* Calls cb with each name directly below prefix: ListObjectsV2 with delimiter '/' (its
 * CommonPrefixes and Contents), page by page. */
static int s3_list(struct remote *r, const char *prefix, remote_name_cb cb, void *arg,
		   char *err, size_t errlen)
{
	char full[2200], token[2048] = "", what[1200];
	int rc = 0, more = 1;

	snprintf(full, sizeof(full), "%s%s%s/", r->prefix, r->prefix[0] ? "/" : "", prefix);
	snprintf(what, sizeof(what), "remote '%s': list %s", r->url, prefix);
	while (rc == 0 && more) {
		struct s3_req q = { 0 };
		char query[9000] = "", flag[16] = "";
		/* Canonical: parameters sorted by name. */
		if (token[0]) {
			strcat(query, "continuation-token=");
			s3_encode(query, sizeof(query), token);
			strcat(query, "&");
		}
		strcat(query, "delimiter=%2F&list-type=2&");
		if (r->list_keys)
			snprintf(query + strlen(query), sizeof(query) - strlen(query),
				 "max-keys=%u&", r->list_keys);
		strcat(query, "prefix=");
		s3_encode(query, sizeof(query), full);
		if ((rc = s3_req_init(&q, r, "GET", "", query, NULL, err, errlen)) == 0)
			rc = s3_perform(&q, what, err, errlen);
		for (const char *p = q.body; rc == 0 && p && (p = strstr(p, "<CommonPrefixes>"));
		     p++) {
			char name[1100];
			size_t n;
			if (s3_xml(p, "Prefix", name, sizeof(name)) &&
			    strncmp(name, full, strlen(full)) == 0 &&
			    (n = strlen(name)) > strlen(full) + 1 && name[n - 1] == '/') {
				name[n - 1] = '\0';
				rc = cb(arg, name + strlen(full));
			}
		}
		for (const char *p = q.body; rc == 0 && p && (p = strstr(p, "<Contents>")); p++) {
			char key[1100];
			if (s3_xml(p, "Key", key, sizeof(key)) &&
			    strncmp(key, full, strlen(full)) == 0 && strlen(key) > strlen(full))
				rc = cb(arg, key + strlen(full));
		}
		more = rc == 0 && s3_xml(q.body, "IsTruncated", flag, sizeof(flag)) &&
		       strcmp(flag, "true") == 0 &&
		       s3_xml(q.body, "NextContinuationToken", token, sizeof(token));
		s3_req_free(&q);
	}
	return rc;
}

const struct remote_ops remote_s3_ops = {
	.check = s3_check,
	.put = s3_put,
	.upload = s3_upload,
	.get = s3_get,
	.head = s3_head,
	.del = s3_delete,
	.list_uploads = s3_list_uploads,
	.list = s3_list,
	.abort = s3_abort,
	.close = s3_close,
};
