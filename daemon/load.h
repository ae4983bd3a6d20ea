/*
 * load.h — what load.c (the registry of loads: levels, destinations, the restore job) and
 * load_file.c (a load's file: opened for its user, its header read and parsed, its resident
 * copy pinned) share; nothing else includes it.
 */
#ifndef DSCKPTD_LOAD_H
#define DSCKPTD_LOAD_H

#include "dsckptd.h"
#include "../proto/proto.h"

#include <sys/stat.h>
#include <uv.h>

enum parse_state { PARSE_DONE, PARSE_QUEUED, PARSE_RUNNING };

/* A destination: a tensor of the file and where it goes. */
struct load_dst {
	long t;                 /* index in the header */
	struct source *src;     /* a reference the load owns until the job takes it */
	uint64_t off;
};

struct load {
	uint64_t id, client;    /* client: the connection's id; 0 once it is gone */
	uid_t uid;
	char path[PROTO_MAX_STR + 160];   /* dir/file.safetensors, for messages */
	/* While parse != PARSE_DONE: the LOAD_BEGIN, and what parse_work needs; while it
	 * runs, parse_work alone touches the fields below up to res (and code, error). */
	enum parse_state parse;
	uint64_t req;
	uv_work_t work;
	struct stat st;
	char dir[PROTO_MAX_STR + 1], file[PROTO_MAX_NAME + 1];
	unsigned max_tensors;   /* the config's max_tensors_per_save at LOAD_BEGIN */
	gid_t gid;
	struct config *pull;    /* referenced: the tag is pulled from its remote tier first */
	int pulled;             /* it was: PULL_REMOTE or PULL_PEER, where the bytes came from */
	uint64_t held;          /* charged to uid as QUOTA_HELD */
	int fd, dfd;            /* the file, buffered and O_DIRECT (or -1) */
	struct st_header *h;
	uint64_t data_len;      /* bytes of the data region */
	struct resident *res;   /* pinned, or NULL */
	uint64_t cached;        /* data bytes the resident copy holds */
	struct load_dst *d;
	size_t n, cap;
	uint8_t *named;         /* per header tensor: named already */
	uint64_t bytes;         /* destination bytes */
	char mismatch[2048];    /* the first MISMATCH_SHOWN, "; "-separated */
	unsigned nmismatch;
	int level, code;
	char error[ERRLEN];
	struct restore_job *job;
	uint64_t done;          /* bytes in place, once the job is gone */
	struct load *next;
};

/* Charges n more bytes to l's user as QUOTA_HELD; 0 or ELIMIT with err. Any thread. */
static inline int load_hold(struct load *l, uint64_t n, char *err, size_t errlen)
{
	int rc = quota_take(l->uid, QUOTA_HELD, n, err, errlen);

	if (rc == 0)
		l->held += n;
	return rc;
}

/* Gives n bytes of l's QUOTA_HELD back. */
static inline void load_unhold(struct load *l, uint64_t n)
{
	quota_give(l->uid, QUOTA_HELD, n);
	l->held -= n;
}

/* load_file.c */
/* Opens dir's file.safetensors for uid: below one of c's allowed roots, no symbolic link, a
 * regular file of uid (any for root). An fd (st filled), or a negative ERR_E* with err. */
int load_file_open(const struct config *c, const char *dir, const char *file, uid_t uid,
		   gid_t gid, struct stat *st, char *err, size_t errlen);
/* Reads and checks l's header into l->h (charged to its user), pins its resident copy and
 * opens the file again with O_DIRECT where it helps; 0 or a negative ERR_E* with err.
 * Threadpool: it alone touches l's file fields meanwhile. */
int load_file_read(struct load *l, char *err, size_t errlen);

#endif /* DSCKPTD_LOAD_H */
