/*
 * trainer.c — a demo "trainer" that checkpoints through dsckptd the way a real one would.
 *
 * It forks --ranks processes. Each rank allocates --tensors tensors (--mb MiB in all, F32,
 * BF16 and I64 in turn) with dsckpt_host_alloc, plus one small F32 tensor from malloc (which
 * the library stages), and "trains": every step adds a constant to every 8-byte word. Every
 * --steps-per-ckpt steps it saves ROOT/JOB/step<N>/rank<r>.safetensors (+ .meta with a JSON
 * blob), waits for SNAPSHOT before the next step changes the tensors, and before the next
 * checkpoint (or at the end) waits for DURABLE; then all ranks meet at a barrier and rank 0
 * commits the tag.
 *
 * Tensor contents, for checking a checkpoint from outside: tensor t (named "layer<t>", the
 * malloc'd one "extra", t = --tensors) of rank r, as little-endian 64-bit words, holds at step
 * s word i = mix(r << 48 | t << 32 | i) + s * 0x9e3779b97f4a7c15 (mod 2^64), mix as below.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../dsckpt.h"

#define STEP_ADD 0x9e3779b97f4a7c15ull
#define EXTRA_WORDS 64

/* Options. */
struct opts {
	const char *socket;
	const char *dir;       /* ROOT/JOB */
	const char *job;
	int ranks, ckpts, steps_per_ckpt, tensors;
	long mb;
};

/* One tensor of a rank. */
struct tensor {
	char name[32];
	const char *dtype;
	int64_t shape[2];
	uint64_t *words;
	size_t nbytes;
	int host;              /* from dsckpt_host_alloc */
};

/* Figures of one checkpoint, printed by rank 0. */
struct ckpt {
	int step;
	dsckpt_save_t *save;
	int snapped;           /* SNAPSHOT reached: no need to ask again */
	uint64_t bytes;
	double end_us, snap_ms, durable_ms, commit_ms;
};

/* splitmix64's finalizer. */
static uint64_t mix(uint64_t x)
{
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

/* Seconds on the monotonic clock. */
static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Reports a failed call of rank r and returns 1. */
static int fail(int r, dsckpt_conn_t *c, const char *what, int err)
{
	const char *detail = dsckpt_last_error(c);
	fprintf(stderr, "rank %d: %s: %s%s%s\n", r, what, dsckpt_strerror(err),
		*detail ? ": " : "", detail);
	return 1;
}

/* Allocates and fills the tensors of rank r (step 0); 0 or -1. */
static int tensors_init(const struct opts *o, int r, struct tensor *t)
{
	static const char *const dtypes[] = {"F32", "BF16", "I64"};
	static const unsigned sizes[] = {4, 2, 8};
	size_t each = (size_t)o->mb * (1u << 20) / (size_t)o->tensors / 512 * 512;

	if (each == 0)
		each = 512;
	for (int i = 0; i <= o->tensors; i++) {
		int extra = i == o->tensors;
		int k = i % 3;
		t[i].nbytes = extra ? EXTRA_WORDS * 8 : each;
		t[i].dtype = extra ? "F32" : dtypes[k];
		snprintf(t[i].name, sizeof(t[i].name), extra ? "extra" : "layer%d", i);
		t[i].shape[1] = 64;
		t[i].shape[0] = (int64_t)(t[i].nbytes / (extra ? 4 : sizes[k]) / 64);
		t[i].host = !extra;
		t[i].words = extra ? malloc(t[i].nbytes) : dsckpt_host_alloc(t[i].nbytes);
		if (!t[i].words) {
			fprintf(stderr, "rank %d: cannot allocate %zu bytes: %s\n", r,
				t[i].nbytes, strerror(errno));
			return -1;
		}
		for (size_t w = 0; w < t[i].nbytes / 8; w++)
			t[i].words[w] = mix((uint64_t)r << 48 | (uint64_t)i << 32 | w);
	}
	return 0;
}

/* One training step: every word changes. */
static void tensors_step(const struct opts *o, struct tensor *t)
{
	for (int i = 0; i <= o->tensors; i++)
		for (size_t w = 0; w < t[i].nbytes / 8; w++)
			t[i].words[w] += STEP_ADD;
}

/* Frees the tensors. */
static void tensors_free(const struct opts *o, struct tensor *t)
{
	for (int i = 0; i <= o->tensors; i++) {
		if (t[i].host)
			dsckpt_host_free(t[i].words);
		else
			free(t[i].words);
	}
}

/* Saves the tensors of rank r at step into ck; 0 or 1. */
static int ckpt_save(const struct opts *o, int r, dsckpt_conn_t *c, struct tensor *t,
		     struct ckpt *ck, int step)
{
	char dir[4200], file[32], meta[128];
	int e;

	snprintf(dir, sizeof(dir), "%s/step%d", o->dir, step);
	snprintf(file, sizeof(file), "rank%d", r);
	memset(ck, 0, sizeof(*ck));
	ck->step = step;
	if ((e = dsckpt_save_begin(c, dir, file, &ck->save)) < 0)
		return fail(r, c, "dsckpt_save_begin", e);
	for (int i = 0; i <= o->tensors; i++) {
		e = dsckpt_add_tensor(ck->save, t[i].name, t[i].dtype, t[i].shape, 2, t[i].words,
				      t[i].nbytes);
		if (e < 0)
			return fail(r, c, "dsckpt_add_tensor", e);
		ck->bytes += t[i].nbytes;
	}
	int n = snprintf(meta, sizeof(meta), "{\"step\": %d, \"rank\": %d, \"world\": %d}",
			 step, r, o->ranks);
	if ((e = dsckpt_add_blob(ck->save, "trainer_state", meta, (size_t)n)) < 0)
		return fail(r, c, "dsckpt_add_blob", e);
	double t1 = now();
	if ((e = dsckpt_save_end(ck->save)) < 0)
		return fail(r, c, "dsckpt_save_end", e);
	ck->end_us = (now() - t1) * 1e6;
	return 0;
}

/* Waits until the tensors may change again (SNAPSHOT), once per checkpoint; 0 or 1. */
static int ckpt_snapshot(int r, dsckpt_conn_t *c, struct ckpt *ck)
{
	if (ck->snapped)
		return 0;
	double t0 = now();
	int e = dsckpt_wait(ck->save, DSCKPT_SNAPSHOT, -1);
	if (e < 0)
		return fail(r, c, "dsckpt_wait(SNAPSHOT)", e);
	ck->snap_ms = (now() - t0) * 1e3;
	ck->snapped = 1;
	return 0;
}

/* Finishes a checkpoint: DURABLE, barrier, commit on rank 0, one line printed; 0 or 1. */
static int ckpt_finish(const struct opts *o, int r, dsckpt_conn_t *c, struct ckpt *ck,
		       pthread_barrier_t *barrier)
{
	char dir[4200];
	int e;

	if (ckpt_snapshot(r, c, ck))
		return 1;
	double t0 = now();
	if ((e = dsckpt_wait(ck->save, DSCKPT_DURABLE, -1)) < 0)
		return fail(r, c, "dsckpt_wait(DURABLE)", e);
	ck->durable_ms = (now() - t0) * 1e3;
	dsckpt_save_free(ck->save);
	ck->save = NULL;
	pthread_barrier_wait(barrier);
	if (r != 0)
		return 0;
	snprintf(dir, sizeof(dir), "%s/step%d", o->dir, ck->step);
	t0 = now();
	if ((e = dsckpt_commit(c, dir, -1)) < 0)
		return fail(r, c, "dsckpt_commit", e);
	ck->commit_ms = (now() - t0) * 1e3;
	printf("step %d: %d x %" PRIu64 " bytes, save_end %.0f us, snapshot wait %.1f ms, "
	       "durable wait %.1f ms, commit %.1f ms\n", ck->step, o->ranks, ck->bytes,
	       ck->end_us, ck->snap_ms, ck->durable_ms, ck->commit_ms);
	fflush(stdout);
	return 0;
}

/* The life of one rank; returns its exit status. */
static int rank_main(const struct opts *o, int r, pthread_barrier_t *barrier)
{
	struct tensor *t = calloc((size_t)o->tensors + 1, sizeof(*t));
	struct ckpt ck = {0};
	dsckpt_conn_t *c = NULL;
	int e, st = 1;

	if (!t || tensors_init(o, r, t) < 0)
		goto out;
	if ((e = dsckpt_connect(o->socket, &c)) < 0) {
		fail(r, NULL, "dsckpt_connect", e);
		goto out;
	}
	if ((e = dsckpt_identify(c, o->job, r, o->ranks)) < 0) {
		fail(r, c, "dsckpt_identify", e);
		goto out;
	}
	for (int step = 1; step <= o->ckpts * o->steps_per_ckpt; step++) {
		if (ck.save && ckpt_snapshot(r, c, &ck))
			goto out;
		tensors_step(o, t);
		if (step % o->steps_per_ckpt != 0)
			continue;
		if (ck.save && ckpt_finish(o, r, c, &ck, barrier))
			goto out;
		if (ckpt_save(o, r, c, t, &ck, step))
			goto out;
	}
	if (ck.save && ckpt_finish(o, r, c, &ck, barrier))
		goto out;
	st = 0;
out:
	dsckpt_save_free(ck.save);
	dsckpt_close(c);
	if (t)
		tensors_free(o, t);
	free(t);
	return st;
}

/* Prints usage. */
static void usage(FILE *f)
{
	fprintf(f, "usage: dsckpt-example-trainer --dir /ROOT/JOB [--socket PATH] [--job NAME]\n"
		"         [--ranks N] [--mb MB] [--ckpts K] [--steps-per-ckpt S] [--tensors T]\n"
		"Checkpoints go to ROOT/JOB/step<N>; --mb is per rank (default 100).\n");
}

/* Parses a positive integer option or exits. */
static long positive(const char *name, const char *s)
{
	char *end;
	errno = 0;
	long v = strtol(s, &end, 10);
	if (errno || *end || v < 1 || v > 1000000) {
		fprintf(stderr, "dsckpt-example-trainer: bad %s: %s\n", name, s);
		exit(2);
	}
	return v;
}

/* Forks the ranks, waits for them, and fails if any failed. */
int main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{"socket", required_argument, NULL, 's'},
		{"dir", required_argument, NULL, 'd'},
		{"job", required_argument, NULL, 'j'},
		{"ranks", required_argument, NULL, 'n'},
		{"mb", required_argument, NULL, 'm'},
		{"ckpts", required_argument, NULL, 'k'},
		{"steps-per-ckpt", required_argument, NULL, 'p'},
		{"tensors", required_argument, NULL, 't'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	struct opts o = {.job = "demo", .ranks = 1, .mb = 100, .ckpts = 3,
			 .steps_per_ckpt = 5, .tensors = 16};
	pthread_barrierattr_t attr;
	int ch, failed = 0;

	while ((ch = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		switch (ch) {
		case 's': o.socket = optarg; break;
		case 'd': o.dir = optarg; break;
		case 'j': o.job = optarg; break;
		case 'n': o.ranks = (int)positive("--ranks", optarg); break;
		case 'm': o.mb = positive("--mb", optarg); break;
		case 'k': o.ckpts = (int)positive("--ckpts", optarg); break;
		case 'p': o.steps_per_ckpt = (int)positive("--steps-per-ckpt", optarg); break;
		case 't': o.tensors = (int)positive("--tensors", optarg); break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (!o.dir || optind != argc) {
		usage(stderr);
		return 2;
	}

	/* The barrier lives in memory the forked ranks share. */
	pthread_barrier_t *barrier = mmap(NULL, sizeof(*barrier), PROT_READ | PROT_WRITE,
					  MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (barrier == MAP_FAILED) {
		perror("mmap");
		return 1;
	}
	pthread_barrierattr_init(&attr);
	pthread_barrierattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
	pthread_barrier_init(barrier, &attr, (unsigned)o.ranks);
	pthread_barrierattr_destroy(&attr);

	pid_t *pids = calloc((size_t)o.ranks, sizeof(*pids));
	if (!pids) {
		perror("calloc");
		return 1;
	}
	fflush(stdout);
	for (int r = 0; r < o.ranks; r++) {
		pids[r] = fork();
		if (pids[r] < 0) {
			perror("fork");
			failed = 1;
			break;
		}
		if (pids[r] == 0)
			_exit(rank_main(&o, r, barrier));
	}
	/* A rank that fails would leave the others at the barrier: stop them. */
	for (int left = o.ranks; left > 0 && !failed; left--) {
		int st;
		pid_t p = wait(&st);
		if (p < 0)
			break;
		for (int r = 0; r < o.ranks; r++)
			if (pids[r] == p)
				pids[r] = 0;   /* reaped: never signal a recycled pid */
		if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
			failed = 1;
	}
	if (failed) {
		for (int r = 0; r < o.ranks; r++)
			if (pids[r] > 0)
				kill(pids[r], SIGTERM);
		while (wait(NULL) > 0)
			;
	}
	free(pids);
	return failed;
}
