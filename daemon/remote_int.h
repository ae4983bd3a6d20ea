/*
 * remote_int.h — what remote.c shares with the two tiers behind it, remote_s3.c (an
 * S3-compatible store over libcurl) and remote_file.c (a shared directory): struct remote
 * and each tier's operations. Nothing else includes it.
 */
#ifndef DSCKPTD_REMOTE_INT_H
#define DSCKPTD_REMOTE_INT_H

#include "dsckptd.h"

#include <pthread.h>
#include <time.h>

/* One tier's operations; their arguments are remote.c's, already checked. */
struct remote_ops {
	int (*check)(struct remote *r, char *err, size_t errlen);
	int (*put)(struct remote *r, const char *key, const struct remote_src *src, int cond,
		   const char *etag, char *etag_out, char *err, size_t errlen);
	int (*upload)(struct remote *r, const char *key, const struct remote_src *src,
		      char *err, size_t errlen);
	int (*get)(struct remote *r, const char *key, uint64_t off, void *buf, size_t len,
		   char *err, size_t errlen);
	int (*head)(struct remote *r, const char *key, uint64_t *size, char *etag, char *err,
		    size_t errlen);
	int (*del)(struct remote *r, const char *key, char *err, size_t errlen);
	int (*list_uploads)(struct remote *r, const char *prefix, remote_upload_cb cb,
			    void *arg, char *err, size_t errlen);
	int (*list)(struct remote *r, const char *prefix, remote_name_cb cb, void *arg,
		    char *err, size_t errlen);
	int (*abort)(struct remote *r, const char *key, const char *id, char *err,
		     size_t errlen);
	void (*close)(struct remote *r);
};

/* A remote tier, immutable after remote_open (its bandwidth cap has a lock of its own). */
struct remote {
	const struct remote_ops *ops;
	char url[1100];           /* as configured, for messages */
	char bucket[64];          /* s3: the bucket */
	char prefix[1100];        /* s3: the key prefix ("" or "a/b"); file: the directory */
	unsigned concurrency;     /* requests in flight per call */
	uint64_t part_bytes;      /* multipart part, ranged read */
	unsigned file_mode, dir_mode;
	unsigned list_keys;       /* s3: keys per ListObjectsV2 page; 0: the server's (1000) —
				   * only a test sets it, to see the pages followed */
	void *tier;               /* the tier's own state (remote_s3.c) */
	struct rate_cap *cap;     /* upload_max_mib_per_s, shared by every call (rate_cap.c) */
};

/* remote_s3.c: opens the S3 tier of r (bucket and prefix set) with cfg's s3 keys. */
int remote_s3_open(struct remote *r, const struct config *cfg, char *err, size_t errlen);
extern const struct remote_ops remote_s3_ops;
/* remote_file.c: the file:// tier's operations (r->prefix is the directory). */
extern const struct remote_ops remote_file_ops;

#endif /* DSCKPTD_REMOTE_INT_H */
