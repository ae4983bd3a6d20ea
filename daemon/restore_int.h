/*
 * restore_int.h — what restore.c (the restore threads, the jobs, their claims) shares with
 * restore_fill.c (a claimed unit's pieces read, written and hashed): a job, the lock over the
 * pool, and the filling calls. Nothing else includes it; restore.c's opening comment explains
 * the fields.
 */
#ifndef DSCKPTD_RESTORE_INT_H
#define DSCKPTD_RESTORE_INT_H

#include "dsckptd.h"

#include <pthread.h>
#include <xxhash.h>

/* What every job shares with the pool (restore.c's pool holds the one there is). */
struct restore_shared {
	pthread_mutex_t lock;      /* pool.lock: the job list, stop, every job field marked (L) */
	pthread_cond_t held_cv;    /* a piece's holds fell to one, or a job failed */
	struct cache *cache;       /* the chunks pieces are read into */
};

/* Where a job's threads spent their time, summed over threads (the debug line at its end). */
enum restore_phase {
	RP_CHUNK,      /* waiting for a cache chunk to read into */
	RP_READ,       /* reading from the page cache or with O_DIRECT */
	RP_WRITE,      /* queueing the copies out and hashing on the host */
	RP_SYNC,       /* waiting for the queued copies (device copies: the transfer itself) */
	RP_DIGEST,     /* the destinations checksumming themselves (on the device) */
	RP_N
};

/* A tensor's part in a piece, left for the thread that hashes the part before it. */
struct part {
	const uint8_t *p;          /* the bytes, in a chunk or a resident piece; NULL: none */
	uint64_t a, b;             /* data offsets */
	uint64_t ord;              /* the piece's index in pieces */
};

/* One restore job; pool.lock guards the fields marked (L). */
struct restore_job {
	struct restore_req r;
	struct restore_shared *sh; /* the pool's lock, held_cv and cache */
	uint64_t chunk;
	uint64_t *pieces;          /* the pieces holding a destination, ascending */
	uint64_t npieces;
	uint64_t *units;           /* unit u: pieces[units[u]] to pieces[units[u + 1] - 1] */
	uint64_t nunits;
	uint64_t next_unit;        /* (L) the next unit to claim */
	unsigned active;           /* (L) units claimed and not yet done */
	int failed;                /* (L) */
	int finished;              /* (L) the final event is posted */
	int code;                  /* (L) */
	char error[ERRLEN];        /* (L) */
	uint64_t *hashed;          /* (L) per destination: bytes hashed so far */
	XXH3_state_t **hs;         /* per destination hashed here (NULL otherwise) */
	uint8_t *ondev;            /* per destination: checksummed where it lies (source_digest) */
	size_t nondev;
	struct part *slot;         /* (L) per destination and piece it spans, from slot0[i] */
	uint64_t *slot0;
	void **chunk_of;           /* (L) per claimed piece: its cache chunk (NULL: resident) */
	unsigned *holds;           /* (L) per claimed piece: its copies + its unhashed parts */
	uint64_t done;             /* atomic: destination bytes in place */
	uint64_t ns[RP_N];         /* atomic: nanoseconds per phase, over every thread */
	uint64_t read_direct;      /* atomic: bytes read with O_DIRECT (the rest: page cache) */
	double t_submit, t_first;  /* (L) now_mono at restore_submit and at the first claim */
	double t_end;              /* (L) now_mono when the job finished */
	uint64_t number;           /* (L) the pool's count of jobs at its submission */
	double slowest;            /* (L) seconds of the slowest piece: read, copied, synced */
	uint64_t slowest_at;       /* (L) its index in pieces */
	struct restore_job *next;      /* (L) link in the active list */
	struct workq_item end;         /* its end, on its way to the loop */
};

/* Adds the seconds since t0 to the job's phase (now_mono's clock) and returns now. */
static inline double restore_time(struct restore_job *j, enum restore_phase ph, double t0)
{
	double t = now_mono();

	__atomic_add_fetch(&j->ns[ph], (uint64_t)((t - t0) * 1e9), __ATOMIC_RELAXED);
	return t;
}

/* restore_fill.c */
/* Records a job's first error and wakes threads waiting on its pieces (pool.lock held). */
void restore_fill_fail_locked(struct restore_job *j, int code, const char *error);
/* The first destination ending after data offset start; j->r.n when none does. */
size_t restore_fill_first_dst(const struct restore_job *j, uint64_t start);
/* Fills claimed unit u's pieces in order through *chunk (NULL when all are resident), then
 * *chunk is the thread's to give back (NULL: the job's); 0, or a negative ERR_E* with err. */
int restore_fill_unit(struct copier *cp, struct restore_job *j, uint64_t u, uint8_t **chunk,
		      char *err, size_t errlen);
/* Has the destinations that checksum themselves do so, every copy synced, and compares; 0,
 * or a negative ERR_E* with err (ERR_ECHECKSUM naming a mismatch). */
int restore_fill_check_ondev(struct restore_job *j, char *err, size_t errlen);

#endif
