/*
 * save_int.h — what save.c and save_gc.c share: a save as the registry holds it.
 */
#ifndef DSCKPT_SAVE_INT_H
#define DSCKPT_SAVE_INT_H

#include "dsckptd.h"
#include "../proto/proto.h"

struct save {
	struct save *next;       /* first, with level: save_begin walks every save's */
	int level;
	uint64_t id;
	uint64_t client;         /* the connection's id */
	pid_t pid;
	uid_t uid;
	gid_t gid;
	char jobname[PROTO_MAX_NAME + 1];
	unsigned rank, world;
	char run[PROTO_MAX_RUN + 1];
	char dir[PROTO_MAX_STR + 1];
	struct store_dirid dirid; /* the directory dirfd was when SAVE_BEGIN opened it */
	char file[129];
	int dirfd;
	struct store_root root;  /* the allowed root dirfd was opened under */
	struct store_file *out;  /* file.safetensors.partial, made at SAVE_BEGIN (so that an
				    early save's SAVE_END does not wait for it); the engine's
				    from SAVE_END */
	int code;                /* FAILED: its ERR_E* */
	char error[ERRLEN];
	struct tensors *tl;      /* its own, or a plan's shared until something is added */
	size_t shared_n;         /* sharing a plan's list: it holds the sources of its first
				    shared_n entries itself, until SAVE_END (tensors.c) */
	struct blobs *blobs;     /* charged to uid until DURABLE or FAILED */
	int counted;             /* one QUOTA_SAVES charged to uid until DURABLE or FAILED */
	struct job *job;
	struct st_origin origin; /* the header's __metadata__ pairs, lent to the job */
	uint64_t snap, flushed;  /* final counts, once the job is gone */
	uint8_t *hdr;            /* DURABLE: the file's header as written (hdr_len bytes) and */
	size_t hdr_len;          /* its size, which its node's seal record describes without */
	uint64_t size;           /* opening the file; NULL without memory */
	double t_accept, t_change;
	int settled;             /* peer.c sent the node's copies of the tag: copies of replicas */
	unsigned copies, replicas;
	char copies_why[256];    /* settled short of replicas: why no more */
	char remote_why[ERRLEN]; /* never REMOTE (another version of the tag replaced it): why */
	unsigned holds;          /* save_hold without save_release: not forgotten */
	int gone;                /* its client left (an ended save goes on without it) */
	int slim;                /* kept past LINGER_S: tl, blobs and hdr freed */
	uint64_t bytes;          /* slim: what tensors_bytes(tl) was */
};

/* Drops the references a save sharing a plan's list holds to its sources. */
void save_unshare(struct save *s);

#endif /* DSCKPT_SAVE_INT_H */
