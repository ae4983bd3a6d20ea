/*
 * replica_int.h — replica_store.c's copies, shared with replica_recover.c (the copies found
 * on replica_root at start-up) and replica_list.c (LIST, FETCH by tag). Nothing else reads
 * them.
 */
#ifndef DSCKPTD_REPLICA_INT_H
#define DSCKPTD_REPLICA_INT_H

#include "dsckptd.h"

#include <pthread.h>
#include <xxh_x86dispatch.h>  /* XXH3 with the CPU's widest vectors (AVX2, AVX-512) */

#define REPLICA_ID_FILE "#id"             /* a copy's identity on replica_root */
#define REPLICA_MANIFEST_FILE "#manifest" /* and its manifest ('#': no file's name) */

struct replica_file {
	const struct manifest_file *mf;  /* its entry in the copy's manifest */
	uint8_t *mem;                    /* in memory, or NULL: spilled */
	int fd;                          /* spilled: the file, else -1 */
	uint64_t got;                    /* bytes arrived */
	XXH3_state_t *whole, *data;      /* the checksums of what arrived */
	int done;                        /* checked whole */
};

struct replica {
	struct replica *next;            /* the store's list, oldest first */
	struct replica_store *rs;
	struct replica_id id;            /* strings owned */
	struct manifest *m;
	char *manifest;
	size_t manifest_len;
	struct replica_file *files;      /* the owner's files: nfiles of m's */
	unsigned nfiles;
	uint64_t mem;                    /* bytes of the budget it holds */
	uint64_t seq;
	int dirfd;                       /* its directory under the root, or -1 */
	unsigned refs;                   /* lookups holding it (rs->lock) */
	int evicted;                     /* out of the list; freed by the last replica_put */
	int saved;                       /* its identity on the root: recoverable */
	int keep;                        /* freed by a close: its directory stays */
};

struct replica_store {
	pthread_mutex_t lock;
	uint64_t cap, used;              /* memory budget, bytes of it held */
	int rootfd;                      /* replica_root, or -1 */
	struct replica *head;
	uint64_t seq;
	uint64_t evictions;
};

#endif /* DSCKPTD_REPLICA_INT_H */
