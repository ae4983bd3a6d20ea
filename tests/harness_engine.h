/*
 * harness_engine.h — what the copy engine's suites (check_engine*.c) share: the engine with
 * its real copy and flush threads started over a tiny cache in a scratch root
 * (harness_store.h's), fake sources (deterministic bytes, optional delays, a read that waits
 * at a gate or fails at its Nth call with a chosen code), jobs planned, submitted and followed
 * event by event, and every DURABLE file read back byte for byte with format/'s parser.
 *
 * The test process is the loop thread: it submits, cancels and runs the loop; the engine's
 * threads call back into the fakes (their counters are atomic, the gate has its own lock).
 * Holding a flush thread at a chosen write (gate_writes) interposes pwrite, which this archive,
 * linked into every suite, must not do: it lives in tests/engine_hooks.c, which the Makefile
 * links only into the suites that hold writes.
 */
#ifndef DSCKPT_HARNESS_ENGINE_H
#define DSCKPT_HARNESS_ENGINE_H

#include "harness_store.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <uv.h>

#define KIB 1024ULL
#define MAXT 12 /* tensors per job */
#define MAXJ 48 /* jobs per test */

/* A fake source: byte i is pat(seed, i); reads may be delayed, held at the gate or fail. */
struct fake {
	uint64_t seed;
	unsigned fail_at;      /* the read call (1-based) that fails; 0: none */
	int fail_code;         /* the code it fails with */
	unsigned delay_us;     /* sleep in every read */
	int gated;             /* reads wait while the gate is closed */
	atomic_uint reads;     /* read calls so far */
	atomic_uint closes;    /* times the source was closed (must end at 1) */
};

/* One job as the test submits and sees it. */
struct tjob {
	char file[64];               /* "<file>" of <file>.safetensors */
	size_t n;
	char names[MAXT][40];
	uint64_t shape[MAXT];
	struct st_tensor st[MAXT];   /* borrowed by the engine until the job is freed */
	struct fake src[2];
	unsigned tsrc[MAXT];         /* which of src a tensor comes from */
	uint64_t src_off[MAXT];      /* and where in it */
	uint64_t data_len;
	uint8_t meta[200];           /* the .meta file's bytes; meta_len 0: no .meta */
	size_t meta_len;
	char meta_size[24];
	char meta_xxh3[17];          /* filled by the flush thread */
	const char *pairs[8];        /* __metadata__ */
	int bad_name;                /* tensor 0's name is not valid UTF-8 */
	int cancel_when_final;       /* engine_cancel in the final event's callback (a no-op) */
	int dirfd;                   /* its directory, wherever it is moved */
	struct resident *res;        /* handed to the engine with the job (resident.c), or NULL */
	/* what came back */
	struct job *job;
	int ev[8];
	unsigned nev;
	int code;
	char error[ERRLEN];
	uint64_t snap, flushed;
	uint64_t xxh3[MAXT];
	int done;
};

/* The jobs of the running test, and the cache its engine was started over. */
extern struct tjob jobs[MAXJ];
extern struct cache *tcache;
extern struct uv_loop_s *eng_loop;  /* the loop the engine posts to */

/* Where fake reads and interposed pwrites wait: closed gates hold them until opened. */
struct gate {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int reads_closed;      /* gated fake reads wait */
	char write_name[80];   /* pwrites to a file whose path holds this name... */
	unsigned write_at;     /* ...wait from this one on (1-based) while writes_closed */
	int writes_closed;
	unsigned writes;       /* pwrites to that file so far */
	unsigned waiting;      /* threads waiting at either gate now */
	atomic_int armed;      /* write_name is set */
};
extern struct gate gate;

/* Waits while *closed (under the gate's lock), counted in gate.waiting. */
void gate_wait(const int *closed);
/* Closes the read gate: the reads of gated fakes wait until gate_open. */
void gate_reads(void);
/* Opens both gates. */
void gate_open(void);
/* Waits (up to 20 s) until a thread waits at a gate; fails the test otherwise. */
void gate_wait_for_waiter(void);
/*
 * Holds pwrites to the file whose path holds name, from the at-th one on, until gate_open
 * (tests/engine_hooks.c: a suite that calls it links that file).
 */
void gate_writes(const char *name, unsigned at);

/* Makes the scratch directory with the allowed root "ckpt" in it (a checked fixture). */
void eng_setup(void);
/* Removes the scratch directory (and a tmpfs a test left mounted). */
void eng_teardown(void);
/* Starts the engine over a fresh cache of cache_bytes in chunk-byte chunks. */
void eng_start(unsigned copy, unsigned flush, uint64_t cache_bytes, uint64_t chunk);
/* Stops the engine: its threads join, every chunk is back, the loop closes. */
void eng_stop(void);
/* Opens (creating) <root>/<rel> as a checkpoint directory. */
int open_dir(const char *rel);
/*
 * Describes job t: n tensors (sizes from size(k, i), some zero), alternately from two fake
 * sources at gapped offsets; a .meta file when meta is set.
 */
void plan(struct tjob *t, const char *file, size_t n, uint64_t (*size)(size_t, size_t),
	  size_t k, int meta);
/* Hands job t to the engine, its file created in dirfd (o_direct when asked). */
void submit(struct tjob *t, int dirfd, int o_direct);
/* Runs the loop until n jobs have had their final event. */
void run_until(unsigned n);
/* Reads back a DURABLE job's <root>/<rel>/<file>.safetensors (and .meta) byte for byte. */
void verify(const struct tjob *t, const char *rel);
/* Checks a FAILED job: its code, its message, and neither its file nor a partial left. */
void verify_failed(const struct tjob *t, const char *dir, int code, const char *msg);

/* Tensor sizes (k: the job, i: the tensor): odd ones, empty ones and several chunks long. */
uint64_t size_mixed(size_t k, size_t i);
/* Tensor sizes: large ones, 48 KiB and a little more. */
uint64_t size_big(size_t k, size_t i);
/* Tensor sizes: every tensor 16 KiB. */
uint64_t size_16k(size_t k, size_t i);
/* Tensor sizes: none. */
uint64_t size_zero(size_t k, size_t i);

/* Adds the test case name to s: every test of it with eng_setup/eng_teardown, 120 s each. */
TCase *eng_case(Suite *s, const char *name);

#endif
