/*
 * remote_s3_req.c — one S3 request over libcurl, and many at once: the URL (path or
 * virtual-hosted addressing, the query in SigV4's canonical form: sorted, percent-encoded,
 * because curl signs it as given), curl's signature (CURLOPT_AWS_SIGV4, the payload declared
 * UNSIGNED-PAYLOAD so that bodies stream from their source), the body streamed in under the
 * upload bandwidth cap or written out into a ranged read's destination, and the answer
 * mapped to one clear line: 403 (credentials), 404 (NoSuchBucket, NoSuchKey), 412 (another
 * writer was first), an unreachable endpoint. s3_parallel keeps r->concurrency requests in
 * flight on one multi handle.
 *
 * No message or log line is built from the credentials, and curl's verbose output (which
 * would show the Authorization header) is never turned on.
 */
#include "remote_s3.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Appends s percent-encoded as SigV4 wants a query value (all but A-Za-z0-9-._~). */
void s3_encode(char *out, size_t outlen, const char *s)
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
	rate_cap_take(q->r->cap, want);
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

/* Sets q up as method on key with query and extra headers (see remote_s3.h). */
int s3_req_init(struct s3_req *q, struct remote *r, const char *method, const char *key,
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
	curl_easy_setopt(q->h, CURLOPT_PROTOCOLS_STR, "http,https"); /* no redirect elsewhere */
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
void s3_req_free(struct s3_req *q)
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
int s3_xml(const char *s, const char *tag, char *out, size_t outlen)
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
int s3_perform(struct s3_req *q, const char *what, char *err, size_t errlen)
{
	q->cc = curl_easy_perform(q->h);
	curl_easy_getinfo(q->h, CURLINFO_RESPONSE_CODE, &q->status);
	log_debug("s3: %s %s: HTTP %ld", q->method, q->url, q->status);
	return s3_result(q, what, err, errlen);
}

/* Runs n requests, r->concurrency at a time, on one multi handle (see remote_s3.h). */
int s3_parallel(struct remote *r, struct s3_req *q, size_t n, s3_start_fn start, void *arg,
		const char *what, char *err, size_t errlen)
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

