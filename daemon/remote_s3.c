/*
 * remote_s3.c — the S3 tier: an S3-compatible store over libcurl. curl signs every request
 * (CURLOPT_AWS_SIGV4, the payload declared UNSIGNED-PAYLOAD so that bodies stream from their
 * source), and one multi handle per call keeps upload_concurrency requests in flight: the
 * parts of a multipart upload, the ranges of a read. Path ("host/bucket/key") or virtual
 * ("bucket.host/key") addressing. Query strings are written in SigV4's canonical form
 * (sorted, percent-encoded) because curl signs them as given.
 *
 * The secret key and session token live only in the curl handle's options and in struct
 * s3 (wiped on close); no message or log line is built from them, and curl's verbose output
 * (which would show the Authorization header) is never turned on.
 */
#include "remote_int.h"

#include <curl/curl.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define S3_BODY_MAX (4u << 20) /* an XML answer kept (a listing of 1,000 uploads) */
#define S3_URL_MAX 4096

/* The tier's state: where the store is and who we are to it. */
struct s3 {
	char scheme[8];           /* "http" or "https" */
	char host[520];           /* host[:port] of the endpoint */
	int virtual_hosted;
	char sigv4[96];           /* "aws:amz:REGION:s3" */
	char userpwd[512];        /* key:secret; a secret */
	char token[4200];         /* "x-amz-security-token: ..." or ""; a secret */
};

/* One request and what came back. */
struct s3_req {
	CURL *h;
	struct curl_slist *hdrs;
	struct remote *r;
	const char *method;
	char url[S3_URL_MAX];
	const struct remote_src *src;  /* the body of a PUT */
	uint64_t src_off, src_len, src_pos;
	int src_rc;
	const char *post;              /* the body of a POST */
	char *dst;                     /* a ranged GET's destination */
	size_t dst_len, dst_pos;
	int overflow;
	char *body;                    /* any other answer (XML) */
	size_t body_len;
	char etag[REMOTE_ETAG_MAX];
	long status;
	CURLcode cc;
	char cerr[CURL_ERROR_SIZE];
};

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

/* Appends s percent-encoded as SigV4 wants a query value (all but A-Za-z0-9-._~). */
static void s3_encode(char *out, size_t outlen, const char *s)
{
	size_t n = strlen(out);

	for (; *s && n + 4 < outlen; s++) {
		unsigned char c = (unsigned char)*s;
		if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
		    c == '-' || c == '.' || c == '_' || c == '~')
			out[n++] = (char)c;
		else
			n += (size_t)snprintf(out + n, outlen - n, "%%%02X", c);
	}
	out[n] = '\0';
}

/* The URL of key ("" for the bucket itself) with a canonical query ("" for none). */
static void s3_url(const struct remote *r, const char *key, const char *query, char *out,
		   size_t outlen)
{
	const struct s3 *s = r->tier;
	char path[2300];

	/* The object's path below the bucket: prefix/key, or "" for the bucket. */
	snprintf(path, sizeof(path), "%s%s%s", key[0] ? r->prefix : "",
		 key[0] && r->prefix[0] ? "/" : "", key);
	if (s->virtual_hosted)
		snprintf(out, outlen, "%s://%s.%s/%s%s%s", s->scheme, r->bucket, s->host, path,
			 query[0] ? "?" : "", query);
	else
		snprintf(out, outlen, "%s://%s/%s%s%s%s%s", s->scheme, s->host, r->bucket,
			 path[0] ? "/" : "", path, query[0] ? "?" : "", query);
}

/* Keeps a response's body (XML), bounded, or writes a ranged GET into its destination. */
static size_t s3_write(char *data, size_t size, size_t n, void *arg)
{
	struct s3_req *q = arg;
	size_t len = size * n;
	long status = 0;

	/* An error's XML goes to body, whatever the destination. */
	curl_easy_getinfo(q->h, CURLINFO_RESPONSE_CODE, &status);
	if (q->dst && status >= 200 && status < 300) {
		if (len > q->dst_len - q->dst_pos) {
			q->overflow = 1;
			return 0;
		}
		memcpy(q->dst + q->dst_pos, data, len);
		q->dst_pos += len;
		return len;
	}
	if (q->body_len + len > S3_BODY_MAX)
		return 0;
	char *b = realloc(q->body, q->body_len + len + 1);
	if (b == NULL)
		return 0;
	memcpy(b + q->body_len, data, len);
	q->body = b;
	q->body_len += len;
	b[q->body_len] = '\0';
	return len;
}

/* Takes the ETag of the answer. */
static size_t s3_header(char *line, size_t size, size_t n, void *arg)
{
	struct s3_req *q = arg;
	size_t len = size * n;

	if (len > 5 && strncasecmp(line, "ETag:", 5) == 0) {
		const char *v = line + 5;
		size_t vl = len - 5;
		while (vl && (*v == ' ' || *v == '\t'))
			v++, vl--;
		while (vl && (v[vl - 1] == '\r' || v[vl - 1] == '\n' || v[vl - 1] == ' '))
			vl--;
		if (vl < sizeof(q->etag))
			snprintf(q->etag, sizeof(q->etag), "%.*s", (int)vl, v);
	}
	return len;
}

/* Streams a PUT's body from its source, within the upload bandwidth cap. */
static size_t s3_read(char *buf, size_t size, size_t n, void *arg)
{
	struct s3_req *q = arg;
	uint64_t left = q->src_len - q->src_pos;
	size_t want = size * n < left ? size * n : (size_t)left;

	if (want == 0)
		return 0;
	remote_throttle(q->r, want);
	if ((q->src_rc = q->src->read(q->src->arg, q->src_off + q->src_pos, buf, want)) != 0)
		return CURL_READFUNC_ABORT;
	q->src_pos += want;
	return want;
}

/* Rewinds a PUT's body (curl resends it after a redirect or an auth negotiation). */
static int s3_seek(void *arg, curl_off_t off, int origin)
{
	struct s3_req *q = arg;

	if (origin != SEEK_SET || off < 0 || (uint64_t)off > q->src_len)
		return CURL_SEEKFUNC_CANTSEEK;
	q->src_pos = (uint64_t)off;
	return CURL_SEEKFUNC_OK;
}

/* Sets q up as method on key with query and extra headers (NULL-terminated); the body
 * (src range, post, dst) is set by the caller before. 0 or a code. */
static int s3_req_init(struct s3_req *q, struct remote *r, const char *method, const char *key,
		       const char *query, const char *const *extra, char *err, size_t errlen)
{
	const struct s3 *s = r->tier;
	struct curl_slist *l;

	q->r = r;
	q->method = method;
	s3_url(r, key, query, q->url, sizeof(q->url));
	if ((q->h = curl_easy_init()) == NULL)
		return err_set(err, errlen, ERR_ENOMEM, "curl_easy_init failed");
	q->hdrs = curl_slist_append(NULL, "x-amz-content-sha256: UNSIGNED-PAYLOAD");
	if (q->hdrs && s->token[0])
		q->hdrs = curl_slist_append(q->hdrs, s->token);
	for (; extra && *extra && q->hdrs; extra++)
		if ((l = curl_slist_append(q->hdrs, *extra)) != NULL)
			q->hdrs = l;
	if (q->hdrs == NULL)
		return err_set(err, errlen, ERR_ENOMEM, "out of memory");
	curl_easy_setopt(q->h, CURLOPT_URL, q->url);
	curl_easy_setopt(q->h, CURLOPT_PATH_AS_IS, 1L);
	curl_easy_setopt(q->h, CURLOPT_AWS_SIGV4, s->sigv4);
	curl_easy_setopt(q->h, CURLOPT_USERPWD, s->userpwd);
	curl_easy_setopt(q->h, CURLOPT_HTTPHEADER, q->hdrs);
	curl_easy_setopt(q->h, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(q->h, CURLOPT_CONNECTTIMEOUT, 10L);
	/* A stalled transfer (under 1 byte/s for a minute) fails instead of hanging. */
	curl_easy_setopt(q->h, CURLOPT_LOW_SPEED_LIMIT, 1L);
	curl_easy_setopt(q->h, CURLOPT_LOW_SPEED_TIME, 60L);
	curl_easy_setopt(q->h, CURLOPT_ERRORBUFFER, q->cerr);
	curl_easy_setopt(q->h, CURLOPT_WRITEFUNCTION, s3_write);
	curl_easy_setopt(q->h, CURLOPT_WRITEDATA, q);
	curl_easy_setopt(q->h, CURLOPT_HEADERFUNCTION, s3_header);
	curl_easy_setopt(q->h, CURLOPT_HEADERDATA, q);
	curl_easy_setopt(q->h, CURLOPT_PRIVATE, q);
	if (strcmp(method, "PUT") == 0) {
		curl_easy_setopt(q->h, CURLOPT_UPLOAD, 1L);
		curl_easy_setopt(q->h, CURLOPT_UPLOAD_BUFFERSIZE, 1L << 20);
		curl_easy_setopt(q->h, CURLOPT_INFILESIZE_LARGE, (curl_off_t)q->src_len);
		curl_easy_setopt(q->h, CURLOPT_READFUNCTION, s3_read);
		curl_easy_setopt(q->h, CURLOPT_READDATA, q);
		curl_easy_setopt(q->h, CURLOPT_SEEKFUNCTION, s3_seek);
		curl_easy_setopt(q->h, CURLOPT_SEEKDATA, q);
	} else if (strcmp(method, "POST") == 0) {
		curl_easy_setopt(q->h, CURLOPT_POSTFIELDS, q->post ? q->post : "");
	} else if (strcmp(method, "HEAD") == 0) {
		curl_easy_setopt(q->h, CURLOPT_NOBODY, 1L);
	} else if (strcmp(method, "DELETE") == 0) {
		curl_easy_setopt(q->h, CURLOPT_CUSTOMREQUEST, "DELETE");
	}
	return 0;
}

/* Frees what q holds. */
static void s3_req_free(struct s3_req *q)
{
	if (q->h)
		curl_easy_cleanup(q->h);
	curl_slist_free_all(q->hdrs);
	free(q->body);
	q->h = NULL;
	q->hdrs = NULL;
	q->body = NULL;
}

/* The text of XML element tag in s (from the first), unescaped, into out; whether found. */
static int s3_xml(const char *s, const char *tag, char *out, size_t outlen)
{
	char open[64], close[64];
	const char *a, *b;
	size_t n = 0;

	snprintf(open, sizeof(open), "<%s>", tag);
	snprintf(close, sizeof(close), "</%s>", tag);
	if (s == NULL || (a = strstr(s, open)) == NULL || (b = strstr(a, close)) == NULL)
		return 0;
	for (a += strlen(open); a < b && n + 1 < outlen; a++) {
		static const char *const ent[][2] = { { "&amp;", "&" }, { "&lt;", "<" },
			{ "&gt;", ">" }, { "&quot;", "\"" }, { "&apos;", "'" } };
		size_t e = 0;
		while (e < 5 && strncmp(a, ent[e][0], strlen(ent[e][0])) != 0)
			e++;
		out[n++] = e < 5 ? ent[e][1][0] : *a;
		if (e < 5)
			a += strlen(ent[e][0]) - 1;
	}
	out[n] = '\0';
	return 1;
}

/* Maps q's outcome to 0 or a code with one clear line in err. */
static int s3_result(struct s3_req *q, const char *what, char *err, size_t errlen)
{
	char code[128] = "", msg[512] = "";

	if (q->src_rc)
		return err_set(err, errlen, q->src_rc, "%s: reading the source failed", what);
	if (q->overflow)
		return err_set(err, errlen, ERR_EIO, "%s: the server sent more than asked for", what);
	if (q->cc != CURLE_OK) {
		const char *detail = q->cerr[0] ? q->cerr : curl_easy_strerror(q->cc);
		int timeout = q->cc == CURLE_OPERATION_TIMEDOUT;
		return err_set(err, errlen, timeout ? ERR_ETIMEDOUT : ERR_EIO,
			       "%s: endpoint %s unreachable: %s", what,
			       ((const struct s3 *)q->r->tier)->host, detail);
	}
	s3_xml(q->body, "Code", code, sizeof(code));
	s3_xml(q->body, "Message", msg, sizeof(msg));
	if (q->status >= 200 && q->status < 300 && code[0] == '\0')
		return 0;
	const char *sep = msg[0] ? ": " : "";
	switch (q->status) {
	case 403:
		return err_set(err, errlen, ERR_EACCES, "%s: access denied (HTTP 403 %s%s%s): "
			       "check the keys of s3's credentials_file and the bucket's policy",
			       what, code[0] ? code : "Forbidden", sep, msg);
	case 404:
		if (strcmp(code, "NoSuchBucket") == 0)
			return err_set(err, errlen, ERR_ENOENT, "%s: bucket '%s' does not exist "
				       "at %s (HTTP 404 NoSuchBucket)", what, q->r->bucket,
				       ((const struct s3 *)q->r->tier)->host);
		return err_set(err, errlen, ERR_ENOENT, "%s: not found (HTTP 404 %s)", what,
			       code[0] ? code : "NoSuchKey");
	case 412:
		return err_set(err, errlen, ERR_EEXIST, "%s: precondition failed (HTTP 412): "
			       "another writer was first", what);
	case 409:
		return err_set(err, errlen, ERR_EBUSY, "%s: conflict (HTTP 409 %s%s%s)", what,
			       code, sep, msg);
	case 400:
		return err_set(err, errlen, ERR_EINVAL, "%s: refused (HTTP 400 %s%s%s)", what,
			       code, sep, msg);
	default:
		return err_set(err, errlen, ERR_EIO, "%s: HTTP %ld %s%s%s", what, q->status, code,
			       sep, msg);
	}
}

/* Performs one request and maps its outcome. */
static int s3_perform(struct s3_req *q, const char *what, char *err, size_t errlen)
{
	q->cc = curl_easy_perform(q->h);
	curl_easy_getinfo(q->h, CURLINFO_RESPONSE_CODE, &q->status);
	log_debug("s3: %s %s: HTTP %ld", q->method, q->url, q->status);
	return s3_result(q, what, err, errlen);
}

/* Starts request i of a parallel call (s3_req_init on q); 0 or a code. */
typedef int (*s3_start_fn)(void *arg, size_t i, struct s3_req *q, char *err, size_t errlen);

/* Runs n requests, r->concurrency at a time, on one multi handle; stops starting new ones at
 * the first failure. q[i] keeps each outcome (the caller frees them). 0 or the first code. */
static int s3_parallel(struct remote *r, struct s3_req *q, size_t n, s3_start_fn start,
		       void *arg, const char *what, char *err, size_t errlen)
{
	CURLM *m = curl_multi_init();
	size_t next = 0, running = 0;
	int rc = 0;

	if (m == NULL)
		return err_set(err, errlen, ERR_ENOMEM, "curl_multi_init failed");
	while (next < n || running > 0) {
		while (rc == 0 && next < n && running < r->concurrency) {
			if ((rc = start(arg, next, &q[next], err, errlen)) != 0)
				break;
			curl_multi_add_handle(m, q[next].h);
			next++;
			running++;
		}
		if (rc != 0 && running == 0)
			break;
		int still, left;
		curl_multi_perform(m, &still);
		CURLMsg *msg;
		while ((msg = curl_multi_info_read(m, &left)) != NULL) {
			struct s3_req *d;
			if (msg->msg != CURLMSG_DONE)
				continue;
			curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&d);
			d->cc = msg->data.result;
			curl_easy_getinfo(d->h, CURLINFO_RESPONSE_CODE, &d->status);
			curl_multi_remove_handle(m, d->h);
			running--;
			log_debug("s3: %s %s: HTTP %ld", d->method, d->url, d->status);
			int drc = s3_result(d, what, rc ? NULL : err, errlen);
			if (rc == 0)
				rc = drc;
		}
		if (running > 0)
			curl_multi_poll(m, NULL, 0, 1000, NULL);
	}
	curl_multi_cleanup(m);
	return rc;
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

const struct remote_ops remote_s3_ops = {
	.check = s3_check,
	.put = s3_put,
	.upload = s3_upload,
	.get = s3_get,
	.head = s3_head,
	.del = s3_delete,
	.list_uploads = s3_list_uploads,
	.abort = s3_abort,
	.close = s3_close,
};
