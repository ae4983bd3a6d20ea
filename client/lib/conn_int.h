/*
 * conn_int.h — the connection as conn.c (its life, errors, HELLO, regions), conn_wire.c
 * (its requests on the wire) and conn_batch.c (REGION_ADDs posted together) share it.
 * Nothing else includes it: the rest of the library reaches a connection through
 * internal.h's lib_conn_* calls.
 */
#ifndef DSCKPT_CONN_INT_H
#define DSCKPT_CONN_INT_H

#include "internal.h"

#include <pthread.h>
#include <sys/un.h>

/* Requests posted and not yet answered, at most: one more settles the oldest first. */
#define LIB_POST_MAX 64
/* Descriptors they carry, at most: the kernel fails a sendmsg (ETOOMANYREFS) once a user
 * not privileged has more descriptors in flight than RLIMIT_NOFILE (often 1024), and a VMM
 * region's frames carry up to PROTO_MAX_FDS each. */
#define LIB_POST_FDS (2 * PROTO_MAX_FDS)

/* A posted request: its id and type, the descriptors it carried, and who takes its reply. */
struct lib_posted {
	uint64_t id;
	unsigned type, nfds;
	lib_take_fn take;
	void *arg;
};

/* A connection to dsckptd (dsckpt_conn_t). */
struct dsckpt_conn {
	pthread_mutex_t lock;
	int fd;                     /* -1 after dsckpt_close */
	int broken;                 /* every request now fails with DSCKPT_EPIPE */
	int refs;
	int world;                  /* from dsckpt_identify; 0 before */
	char run[PROTO_MAX_RUN + 1]; /* from dsckpt_identify_run; "" unknown */
	int timeout_ms;             /* longest wait for a reply; -1: no limit */
	int refused;                /* the last failure is the daemon's ERROR reply */
	int cause;                  /* the code behind the last DSCKPT_EFAILED, or 0 */
	const char *self;           /* this end in messages: "libdsckpt" or "dsckptctl" */
	uint64_t next_id;
	uint64_t req_id;            /* id of the request on the wire */
	unsigned req_type;          /* its type */
	struct lib_posted posted[LIB_POST_MAX]; /* requests whose replies are not read yet, */
	unsigned posted_head, nposted;          /* oldest at posted_head (a ring) */
	unsigned posted_fds;                    /* the descriptors they carried */
	struct lib_batch *batch;    /* open: REGION_ADDs of placements are posted into it */
	uint64_t swept_gen;         /* lib_host_generation() at the last sweep */
	struct lib_hostref *regs;   /* host blocks registered here, sorted by region id */
	size_t nregs, capregs;
	struct lib_cuda *cuda;      /* GPU regions and events (cuda.c); NULL until needed */
	struct lib_stages pool;     /* staging arenas kept for the next save (stage.c) */
	uint64_t max_tensors;       /* the daemon's max_tensors_per_save (HELLO); 0 unknown */
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	char err[LIB_ERRLEN];       /* message of the last failed call */
	char dead[LIB_ERRLEN];      /* why the connection broke */
};

/* Drops region from the host blocks registered on c, if there (conn.c). */
void lib_conn_forget_host(dsckpt_conn_t *c, uint64_t region);

#endif
