/*
 * remote_s3.h — what remote_s3.c (the S3 tier's operations) and remote_s3_req.c (one request
 * over libcurl, and many in parallel) share. Nothing else includes it.
 */
#ifndef DSCKPTD_REMOTE_S3_H
#define DSCKPTD_REMOTE_S3_H

#include "remote_int.h"

#include <curl/curl.h>

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

/* remote_s3_req.c */
/* Appends s percent-encoded as SigV4 wants a query value (all but A-Za-z0-9-._~). */
void s3_encode(char *out, size_t outlen, const char *s);
/* Sets q up as method ("GET", "PUT", "POST", "HEAD", "DELETE") on key ("" for the bucket)
 * with a canonical query ("" for none) and extra headers (NULL-terminated, or NULL); the
 * body (src range, post, dst) is set in q before. 0 or a code. */
int s3_req_init(struct s3_req *q, struct remote *r, const char *method, const char *key,
		const char *query, const char *const *extra, char *err, size_t errlen);
/* Frees what q holds. */
void s3_req_free(struct s3_req *q);
/* The text of XML element tag in s (from the first), unescaped, into out; whether found. */
int s3_xml(const char *s, const char *tag, char *out, size_t outlen);
/* Performs one request; 0 or a code with one clear line in err, saying what it was. */
int s3_perform(struct s3_req *q, const char *what, char *err, size_t errlen);
/* Starts request i of a parallel call (s3_req_init on q); 0 or a code. */
typedef int (*s3_start_fn)(void *arg, size_t i, struct s3_req *q, char *err, size_t errlen);
/* Runs n requests, r->concurrency at a time, on one multi handle; stops starting new ones
 * at the first failure. q[i] keeps each outcome (the caller frees them). 0 or the first
 * code. */
int s3_parallel(struct remote *r, struct s3_req *q, size_t n, s3_start_fn start, void *arg,
		const char *what, char *err, size_t errlen);

#endif /* DSCKPTD_REMOTE_S3_H */
