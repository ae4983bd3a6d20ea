/*
 * check_engine.c — the copy engine on its own: its real copy and flush threads over fake
 * sources (deterministic bytes, optional delays, a read that waits at a gate or fails at its
 * Nth call with a chosen code) and a tiny cache, so that saves stream through it. Many saves at
 * once, zero-byte saves, cancellation at every stage, failures injected at every step (source
 * read, header build, data write on a full tmpfs, the .meta write, the directory moved out of
 * its root or removed). After each: the event sequence of every job (at most one SNAPSHOT,
 * before exactly one final event), the code that arrived, every DURABLE file read back byte for
 * byte with format/'s parser and its checksums, no *.partial left after a failure, every cache
 * chunk back, and engine_stop joining.
 *
 * The test process is the loop thread: it submits, cancels and runs the loop; the engine's
 * threads call back into the fakes (their counters are atomic, the gate has its own lock).
 * pwrite is interposed below so that a flush thread can be held at a chosen write.
 */
#include "../daemon/dsckptd.h"
#include "harness.h"

#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>
#include <xxhash.h>

#define KIB 1024ULL
#define MAXT 12 /* tensors per job */
#define MAXJ 48 /* jobs per test */

/* engine.c posts to this loop (main.c's in the daemon). */
struct uv_loop_s *loop;

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

static char err[ERRLEN];
static char scratch[PATH_MAX];
static char root[PATH_MAX + 16];
static char *roots[1];
static struct config cfg;
static struct store_root rootid;
static struct cache *tcache;
static uv_loop_t uvloop;
static struct tjob jobs[MAXJ];
static unsigned ndone;

/* Where fake reads and interposed pwrites wait: closed gates hold them until opened. */
static struct {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int reads_closed;      /* gated fake reads wait */
	char write_name[80];   /* pwrites to a file whose path holds this name... */
	unsigned write_at;     /* ...wait from this one on (1-based) while writes_closed */
	int writes_closed;
	unsigned writes;       /* pwrites to that file so far */
	unsigned waiting;      /* threads waiting at either gate now */
	atomic_int armed;      /* write_name is set */
} gate = { .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER };

/* Byte i of the source with this seed (a mix, so that misplaced bytes never match). */
static uint8_t pat(uint64_t seed, uint64_t i)
{
	uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ULL ^ (seed + 1) * 0xD1B54A32D192ED03ULL;

	x ^= x >> 31;
	x *= 0xBF58476D1CE4E5B9ULL;
	x ^= x >> 29;
	return (uint8_t)x;
}

/* Waits while *closed (under the gate's lock), counted in gate.waiting. */
static void gate_wait(const int *closed)
{
	pthread_mutex_lock(&gate.mu);
	gate.waiting++;
	pthread_cond_broadcast(&gate.cv);
	while (*closed)
		pthread_cond_wait(&gate.cv, &gate.mu);
	gate.waiting--;
	pthread_mutex_unlock(&gate.mu);
}

/* Opens both gates. */
static void gate_open(void)
{
	pthread_mutex_lock(&gate.mu);
	gate.reads_closed = 0;
	gate.writes_closed = 0;
	pthread_cond_broadcast(&gate.cv);
	pthread_mutex_unlock(&gate.mu);
}

/* Waits (up to 20 s) until a thread waits at a gate; fails the test otherwise. */
static void gate_wait_for_waiter(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += 20;
	pthread_mutex_lock(&gate.mu);
	while (gate.waiting == 0) {
		if (pthread_cond_timedwait(&gate.cv, &gate.mu, &ts) == ETIMEDOUT)
			break;
	}
	unsigned w = gate.waiting;
	pthread_mutex_unlock(&gate.mu);
	ck_assert_msg(w > 0, "nothing reached the gate");
}

/* Holds pwrites to the file whose path holds name, from the at-th one on, until gate_open. */
static void gate_writes(const char *name, unsigned at)
{
	pthread_mutex_lock(&gate.mu);
	snprintf(gate.write_name, sizeof(gate.write_name), "%s", name);
	gate.write_at = at;
	gate.writes = 0;
	gate.writes_closed = 1;
	pthread_mutex_unlock(&gate.mu);
	atomic_store(&gate.armed, 1);
}

/*
 * The flush threads' pwrite (store_file.c calls it; this definition takes the place of
 * libc's): a write to the gated file waits at the gate from its write_at-th on, then every
 * write goes to the kernel as libc's would.
 */
ssize_t pwrite(int fd, const void *buf, size_t n, off_t off)
{
	if (atomic_load(&gate.armed)) {
		char link[64], path[PATH_MAX];
		ssize_t len;

		snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
		len = readlink(link, path, sizeof(path) - 1);
		path[len > 0 ? len : 0] = '\0';
		pthread_mutex_lock(&gate.mu);
		int hold = strstr(path, gate.write_name) != NULL && ++gate.writes >= gate.write_at;
		pthread_mutex_unlock(&gate.mu);
		if (hold)
			gate_wait(&gate.writes_closed);
	}
	return syscall(SYS_pwrite64, fd, buf, n, off);
}

/* Fills dst with the fake's bytes [off, off+len), or fails at its fail_at-th call. */
static int fake_read(void *priv, struct cuda_copier *cc, uint64_t off, void *dst, uint64_t len,
		     char *e, size_t elen)
{
	struct fake *f = priv;
	unsigned call = atomic_fetch_add(&f->reads, 1) + 1;
	uint8_t *p = dst;

	if (f->gated)
		gate_wait(&gate.reads_closed);
	if (f->delay_us)
		usleep(f->delay_us);
	if (f->fail_at && call == f->fail_at)
		return seterr(e, elen, f->fail_code, "fake read %u failed", call);
	for (uint64_t i = 0; i < len; i++)
		p[i] = pat(f->seed, off + i);
	return 0;
}

/* Counts the close of the source (the fake itself belongs to the test). */
static void fake_close(void *priv, uint64_t size)
{
	struct fake *f = priv;

	atomic_fetch_add(&f->closes, 1);
}

static const struct source_ops fake_ops = {
	.name = "fake", .read = fake_read, .close = fake_close,
};

/* Records an event of a job the way save.c handles it (sources released at SNAPSHOT, the job
 * freed with its final event), checking what each event carries. */
static void on_event(void *owner, struct job *j, int event, int code, const char *error)
{
	struct tjob *t = owner;

	ck_assert_ptr_eq(t->job, j);
	ck_assert_msg(!t->done, "%s: event %d after the final one", t->file, event);
	ck_assert_uint_lt(t->nev, 8);
	t->ev[t->nev++] = event;
	if (event == ENGINE_SNAPSHOT) {
		ck_assert_int_eq(code, 0);
		ck_assert_ptr_null(error);
		engine_release_sources(j);
		return;
	}
	ck_assert(event == ENGINE_DURABLE || event == ENGINE_FAILED);
	t->code = code;
	engine_progress(j, &t->snap, &t->flushed);
	if (event == ENGINE_DURABLE) {
		ck_assert_int_eq(code, 0);
		ck_assert_ptr_null(error);
		memcpy(t->xxh3, engine_checksums(j), t->n * sizeof(uint64_t));
	} else {
		char partial[128];
		ck_assert_int_lt(code, 0);
		ck_assert_ptr_nonnull(error);
		/* The engine removed the partial file itself, before handing the job back. */
		snprintf(partial, sizeof(partial), "%s.safetensors" FMT_PARTIAL, t->file);
		ck_assert_msg(faccessat(t->dirfd, partial, F_OK, 0) != 0 && errno == ENOENT,
			      "%s still exists at FAILED", partial);
	}
	if (t->cancel_when_final)
		engine_cancel(j, ERR_EIO, "too late");
	engine_job_free(j);
	/* As save.c does: the message is used after the job is freed (the sanitizer builds
	 * catch a message that lives in the job). */
	snprintf(t->error, sizeof(t->error), "%s", error ? error : "");
	t->job = NULL;
	t->done = 1;
	ndone++;
}

/* Makes the scratch directory with the allowed root "ckpt" in it. */
static void setup(void)
{
	char tmp[256];

	log_init("check_engine", LOG_LVL_ERROR);
	h_tmpdir(tmp, sizeof(tmp));
	ck_assert_ptr_nonnull(realpath(tmp, scratch));
	snprintf(root, sizeof(root), "%s/ckpt", scratch);
	ck_assert_int_eq(mkdir(root, 0755), 0);
	roots[0] = root;
	memset(&cfg, 0, sizeof(cfg));
	cfg.allowed_roots = roots;
	cfg.n_roots = 1;
	cfg.file_mode = 0640;
	cfg.dir_mode = 0750;
	memset(jobs, 0, sizeof(jobs));
	ndone = 0;
}

/* Removes the scratch directory (and a tmpfs a test left mounted). */
static void teardown(void)
{
	umount2(root, MNT_DETACH);
	h_rm_rf(scratch);
}

/* Starts the engine over a fresh cache of cache_bytes in chunk-byte chunks. */
static void start(unsigned copy, unsigned flush, uint64_t cache_bytes, uint64_t chunk)
{
	ck_assert_int_eq(uv_loop_init(&uvloop), 0);
	loop = &uvloop;
	ck_assert_msg(cache_create(cache_bytes, chunk, &tcache, err, sizeof(err)) == 0, "%s", err);
	ck_assert_msg(engine_start(tcache, copy, flush, on_event, err, sizeof(err)) == 0, "%s",
		      err);
}

/* Stops the engine: its threads join, every chunk is back, the loop closes. */
static void stop(void)
{
	engine_stop();
	ck_assert_uint_eq(cache_used(tcache), 0);
	uv_run(loop, UV_RUN_NOWAIT);
	ck_assert_int_eq(uv_loop_close(loop), 0);
	cache_destroy(tcache);
}

/* Opens (creating) <root>/<rel> as a checkpoint directory. */
static int open_dir(const char *rel)
{
	char path[PATH_MAX * 2];
	int fd;

	snprintf(path, sizeof(path), "%s/%s", root, rel);
	fd = store_open_dir(&cfg, path, getuid(), getgid(), &rootid, err, sizeof(err));
	ck_assert_msg(fd >= 0, "%s: %s", path, err);
	return fd;
}

/*
 * Describes job t: n tensors (sizes from size(i), some zero), alternately from two fake
 * sources at gapped offsets; a .meta file when meta is set.
 */
static void plan(struct tjob *t, const char *file, size_t n, uint64_t (*size)(size_t, size_t),
		 size_t k, int meta)
{
	uint64_t at[2] = {3, 5};

	ck_assert_uint_le(n, MAXT);
	snprintf(t->file, sizeof(t->file), "%s", file);
	t->n = n;
	t->data_len = 0;
	for (int s = 0; s < 2; s++)
		t->src[s].seed = k * 2 + (uint64_t)s + 1;
	for (size_t i = 0; i < n; i++) {
		snprintf(t->names[i], sizeof(t->names[i]), "layer.%zu.weight", i);
		t->shape[i] = size(k, i);
		t->st[i] = (struct st_tensor){t->names[i], "U8", &t->shape[i], 1, t->shape[i]};
		t->tsrc[i] = i % 2;
		t->src_off[i] = at[i % 2];
		at[i % 2] += t->shape[i] + 7;
		t->data_len += t->shape[i];
	}
	t->meta_len = 0;
	if (meta) {
		t->meta_len = 20 + k % 150;
		for (size_t i = 0; i < t->meta_len; i++)
			t->meta[i] = (uint8_t)(i * 13 + k);
	}
}

/* Hands job t to the engine, its file created in dirfd (o_direct when asked). */
static void submit(struct tjob *t, int dirfd, int o_direct)
{
	struct engine_req r = {.n = t->n, .uid = getuid(), .gid = getgid(), .mode = 0640,
			       .root = rootid, .owner = t};
	struct source *src[2];
	uint64_t end[2] = {8, 8};
	char name[128];
	size_t np = 0;

	for (size_t i = 0; i < t->n; i++) {
		uint64_t e = t->src_off[i] + t->shape[i];
		if (e > end[t->tsrc[i]])
			end[t->tsrc[i]] = e;
	}
	for (int s = 0; s < 2; s++)
		ck_assert_ptr_nonnull(src[s] = source_new(&fake_ops, &t->src[s], end[s] + 11));
	r.t = calloc(t->n ? t->n : 1, sizeof(*r.t));
	ck_assert_ptr_nonnull(r.t);
	uint64_t off = 0;
	for (size_t i = 0; i < t->n; i++) {
		r.t[i] = (struct engine_tensor){off, t->shape[i], src[t->tsrc[i]], t->src_off[i]};
		source_ref(src[t->tsrc[i]]);
		off += t->shape[i];
	}
	for (int s = 0; s < 2; s++)
		source_unref(src[s]);	/* the tensors hold theirs; unused ones close now */
	if (t->bad_name)
		snprintf(t->names[0], sizeof(t->names[0]), "bad\xff\xfename");
	t->pairs[np++] = "format";
	t->pairs[np++] = "pt";
	t->pairs[np++] = "dsckpt.host";
	t->pairs[np++] = "check-engine";
	if (t->meta_len) {
		snprintf(t->meta_size, sizeof(t->meta_size), "%zu", t->meta_len);
		t->pairs[np++] = "dsckpt.meta_size";
		t->pairs[np++] = t->meta_size;
		t->pairs[np++] = "dsckpt.meta_xxh3";
		t->pairs[np++] = t->meta_xxh3;
		snprintf(name, sizeof(name), "%s.meta", t->file);
		ck_assert_ptr_nonnull(r.meta_name = strdup(name));
		ck_assert_ptr_nonnull(r.meta_bytes = malloc(t->meta_len));
		memcpy(r.meta_bytes, t->meta, t->meta_len);
		r.meta_len = t->meta_len;
		r.meta_xxh3 = t->meta_xxh3;
	}
	r.st = t->st;
	r.meta = t->pairs;
	r.nmeta = np / 2;
	snprintf(name, sizeof(name), "%s.safetensors", t->file);
	ck_assert_msg(store_file_create(dirfd, name, getuid(), getgid(), 0640, o_direct, &r.file,
					err, sizeof(err)) == 0, "%s", err);
	r.dirfd = dup(dirfd);
	t->dirfd = dup(dirfd);
	ck_assert_int_ge(r.dirfd, 0);
	ck_assert_int_ge(t->dirfd, 0);
	ck_assert_msg(engine_submit(&r, &t->job, err, sizeof(err)) == 0, "%s", err);
}

/* Runs the loop until n jobs have had their final event. */
static void run_until(unsigned n)
{
	while (ndone < n)
		uv_run(loop, UV_RUN_ONCE);
}

/* Checks a job's events: at most one SNAPSHOT, before exactly one final event, which is
 * final (DURABLE, or FAILED with code when code is not 0). */
static void check_events(const struct tjob *t, int final, int code)
{
	unsigned snaps = 0;

	ck_assert_msg(t->done, "%s never finished", t->file);
	ck_assert_uint_ge(t->nev, 1);
	for (unsigned i = 0; i + 1 < t->nev; i++) {
		ck_assert_msg(t->ev[i] == ENGINE_SNAPSHOT, "%s: event %u is %d", t->file, i,
			      t->ev[i]);
		snaps++;
	}
	ck_assert_msg(snaps <= 1, "%s: %u SNAPSHOTs", t->file, snaps);
	ck_assert_msg(t->ev[t->nev - 1] == final, "%s: final event %d, wanted %d (%s)", t->file,
		      t->ev[t->nev - 1], final, t->error);
	if (final == ENGINE_DURABLE)
		ck_assert_msg(snaps == 1, "%s: DURABLE without SNAPSHOT", t->file);
	if (code)
		ck_assert_msg(t->code == code, "%s: code %s, wanted %s (%s)", t->file,
			      err_name(t->code), err_name(code), t->error);
	for (int s = 0; s < 2; s++)
		ck_assert_uint_eq(atomic_load(&t->src[s].closes), 1);
}

/* Fails the test on a header problem. */
static void problem(void *arg, const char *msg)
{
	ck_abort_msg("%s: header: %s", (const char *)arg, msg);
}

/* Whether dir (a path) holds a file whose name ends in suffix. */
static int dir_has(const char *dir, const char *suffix)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int found = 0;

	if (d == NULL)
		return 0;
	while ((e = readdir(d)) != NULL)
		found |= store_has_suffix(e->d_name, suffix) && e->d_type != DT_DIR;
	closedir(d);
	return found;
}

/* Reads back <root>/<rel>/<file>.safetensors of a DURABLE job: the header parses, every
 * tensor is where it should be with the bytes of its source, every checksum matches the
 * bytes (and the engine's), and the .meta file is whole. */
static void verify(const struct tjob *t, const char *rel)
{
	char path[PATH_MAX * 2];
	struct stat st;
	uint64_t data_start = 0;
	XXH3_state_t *all = XXH3_createState();

	check_events(t, ENGINE_DURABLE, 0);
	ck_assert_uint_eq(t->snap, t->data_len);
	ck_assert_uint_eq(t->flushed, t->data_len);
	snprintf(path, sizeof(path), "%s/%s/%s.safetensors", root, rel, t->file);
	int fd = open(path, O_RDONLY);
	ck_assert_msg(fd >= 0, "%s: %s", path, strerror(errno));
	ck_assert_int_eq(fstat(fd, &st), 0);
	struct st_header *h = st_header_read(fd, (uint64_t)st.st_size, &data_start, problem,
					     (void *)t->file);
	ck_assert_ptr_nonnull(h);
	ck_assert_uint_eq(data_start % ST_ALIGN, 0);
	ck_assert_uint_eq((uint64_t)st.st_size, data_start + t->data_len);
	ck_assert_uint_eq(h->n, t->n);
	ck_assert_ptr_nonnull(all);
	XXH3_64bits_reset(all);
	uint64_t off = 0;
	for (size_t i = 0; i < t->n; i++) {
		const struct st_entry *e = &h->t[i];
		uint64_t sum = 0;
		uint8_t *b = malloc(t->shape[i] ? t->shape[i] : 1);
		ck_assert_ptr_nonnull(b);
		ck_assert_str_eq(e->name, t->names[i]);
		ck_assert_uint_eq(e->begin, off);
		ck_assert_uint_eq(e->end, off + t->shape[i]);
		ck_assert_int_eq(pread(fd, b, t->shape[i], (off_t)(data_start + off)),
				 (ssize_t)t->shape[i]);
		/* One assertion per tensor: Check reports every assertion to its parent. */
		uint64_t k = 0;
		while (k < t->shape[i] && b[k] == pat(t->src[t->tsrc[i]].seed, t->src_off[i] + k))
			k++;
		ck_assert_msg(k == t->shape[i], "%s: tensor %zu differs at byte %llu", t->file, i,
			      (unsigned long long)k);
		ck_assert_int_eq(checksum_parse(e->xxh3, &sum), 0);
		ck_assert_uint_eq(sum, XXH3_64bits(b, t->shape[i]));
		ck_assert_uint_eq(sum, t->xxh3[i]);
		XXH3_64bits_update(all, b, t->shape[i]);
		off += t->shape[i];
		free(b);
	}
	uint64_t data_sum = 0;
	ck_assert_int_eq(checksum_parse(st_header_meta(h, CHECKSUM_KEY_DATA), &data_sum), 0);
	ck_assert_uint_eq(data_sum, XXH3_64bits_digest(all));
	ck_assert_str_eq(st_header_meta(h, "dsckpt.host"), "check-engine");
	if (t->meta_len) {
		size_t len = 0;
		uint64_t meta_sum = 0;
		snprintf(path, sizeof(path), "%s/%s/%s.meta", root, rel, t->file);
		char *m = h_read_file(path, &len);
		ck_assert_ptr_nonnull(m);
		ck_assert_uint_eq(len, t->meta_len);
		ck_assert_mem_eq(m, t->meta, len);
		ck_assert_int_eq(checksum_parse(st_header_meta(h, CHECKSUM_KEY_META), &meta_sum),
				 0);
		ck_assert_uint_eq(meta_sum, XXH3_64bits(t->meta, t->meta_len));
		free(m);
	}
	st_header_free(h);
	XXH3_freeState(all);
	close(fd);
	snprintf(path, sizeof(path), "%s/%s", root, rel);
	ck_assert_msg(!dir_has(path, FMT_PARTIAL), "a partial is left in %s", path);
}

/* Checks a FAILED job: its code, its message, and neither its file nor a partial left. */
static void verify_failed(const struct tjob *t, const char *dir, int code, const char *msg)
{
	char path[PATH_MAX * 2];

	check_events(t, ENGINE_FAILED, code);
	ck_assert_msg(strstr(t->error, msg) != NULL, "%s: error \"%s\" lacks \"%s\"", t->file,
		      t->error, msg);
	snprintf(path, sizeof(path), "%s/%s.safetensors", dir, t->file);
	ck_assert_msg(!h_exists(path), "%s exists after a failure", path);
	ck_assert_msg(!dir_has(dir, FMT_PARTIAL), "a partial is left in %s", dir);
}

/* Tensor sizes: a mix of odd sizes, empty tensors and ones spanning several chunks. */
static uint64_t size_mixed(size_t k, size_t i)
{
	static const uint64_t base[] = {1, 4093, 0, 17 * KIB + 5, 3 * KIB, 20 * KIB + 1, 0,
					555, 12 * KIB, 7, 30 * KIB + 3, 2};
	return base[(i + k) % 12] * (1 + (k % 5)) / (1 + (i % 3));
}

/* Tensor sizes: large ones, 48 KiB and a little more. */
static uint64_t size_big(size_t k, size_t i)
{
	return 48 * KIB + i * 1000 + k;
}

/* Tensor sizes: every tensor 16 KiB. */
static uint64_t size_16k(size_t k, size_t i)
{
	return 16 * KIB;
}

/* Tensor sizes: none. */
static uint64_t size_zero(size_t k, size_t i)
{
	return 0;
}

/* One save five times the cache, through two copy and two flush threads. */
START_TEST(test_one_save)
{
	start(2, 2, 32 * KIB, 16 * KIB);
	int dfd = open_dir("job/t1");
	plan(&jobs[0], "rank0", 12, size_mixed, 3, 1);
	ck_assert_uint_gt(jobs[0].data_len, 5 * 32 * KIB);
	submit(&jobs[0], dfd, 0);
	run_until(1);
	verify(&jobs[0], "job/t1");
	close(dfd);
	stop();
}
END_TEST

/* Dozens of saves at once, several many times the cache, on several geometries (_i): every
 * one is durable and whole. */
START_TEST(test_many_saves)
{
	static const struct {
		unsigned copy, flush;
		uint64_t cache, chunk;
		int o_direct;
	} g[] = {
		{2, 2, 4 * 16 * KIB, 16 * KIB, 0},
		{3, 1, 4 * 4 * KIB, 4 * KIB, 1},
		{1, 3, 2 * 64 * KIB, 64 * KIB, 1},
		{4, 4, 8 * 4 * KIB, 4 * KIB, 0},
	};
	unsigned n = 40;

	start(g[_i].copy, g[_i].flush, g[_i].cache, g[_i].chunk);
	int dfd = open_dir("job/many");
	for (unsigned k = 0; k < n; k++) {
		char file[32];
		snprintf(file, sizeof(file), "rank%u", k);
		plan(&jobs[k], file, k % 7 == 0 ? 0 : 1 + k % MAXT,
		     k % 6 == 5 ? size_big : size_mixed, k, k % 2);
		jobs[k].src[0].delay_us = k % 5 == 0 ? 200 : 0;
		submit(&jobs[k], dfd, g[_i].o_direct);
	}
	run_until(n);
	unsigned big = 0;
	for (unsigned k = 0; k < n; k++) {
		verify(&jobs[k], "job/many");
		big += jobs[k].data_len > 2 * g[_i].cache;
	}
	ck_assert_uint_ge(big, 6);
	close(dfd);
	stop();
}
END_TEST

/* Saves of zero bytes (no tensors, only empty tensors) are durable: a header and nothing else,
 * the empty checksum for each tensor. */
START_TEST(test_zero_bytes)
{
	start(2, 1, 4 * 4 * KIB, 4 * KIB);
	int dfd = open_dir("job/zero");
	plan(&jobs[0], "none", 0, size_zero, 0, 0);
	plan(&jobs[1], "empty", 5, size_zero, 1, 1);
	submit(&jobs[0], dfd, 1);
	submit(&jobs[1], dfd, 0);
	run_until(2);
	verify(&jobs[0], "job/zero");
	verify(&jobs[1], "job/zero");
	for (size_t i = 0; i < 5; i++)
		ck_assert_uint_eq(jobs[1].xxh3[i], XXH3_64bits(NULL, 0));
	ck_assert_uint_eq(atomic_load(&jobs[1].src[0].reads), 0);
	close(dfd);
	stop();
}
END_TEST

/* Cancelled while no chunk is free, before its first copy: FAILED with the code given,
 * nothing read, nothing left. */
START_TEST(test_cancel_before_copy)
{
	void *held[4];

	start(2, 2, 4 * 16 * KIB, 16 * KIB);
	for (int i = 0; i < 4; i++)
		ck_assert_ptr_nonnull(held[i] = cache_tryget(tcache, -1));
	int dfd = open_dir("job/c0");
	plan(&jobs[0], "rank0", 4, size_16k, 0, 1);
	submit(&jobs[0], dfd, 0);
	engine_cancel(jobs[0].job, ERR_ESHUTDOWN, "daemon shutting down");
	for (int i = 0; i < 4; i++)
		cache_put(tcache, held[i]);
	run_until(1);
	verify_failed(&jobs[0], root, ERR_ESHUTDOWN, "shutting down");
	ck_assert_uint_eq(jobs[0].nev, 1);
	ck_assert_uint_eq(atomic_load(&jobs[0].src[0].reads), 0);
	ck_assert_uint_eq(atomic_load(&jobs[0].src[1].reads), 0);
	close(dfd);
	stop();
}
END_TEST

/* Cancelled while a copy is in progress: FAILED with the code given, no SNAPSHOT. */
START_TEST(test_cancel_mid_copy)
{
	start(2, 2, 4 * 16 * KIB, 16 * KIB);
	int dfd = open_dir("job/c1");
	plan(&jobs[0], "rank0", 8, size_16k, 0, 0);
	jobs[0].src[0].gated = jobs[0].src[1].gated = 1;
	pthread_mutex_lock(&gate.mu);
	gate.reads_closed = 1;
	pthread_mutex_unlock(&gate.mu);
	submit(&jobs[0], dfd, 0);
	gate_wait_for_waiter();
	engine_cancel(jobs[0].job, ERR_EFAILED, "cancelled mid-copy");
	gate_open();
	run_until(1);
	verify_failed(&jobs[0], root, ERR_EFAILED, "mid-copy");
	ck_assert_uint_eq(jobs[0].nev, 1);
	close(dfd);
	stop();
}
END_TEST

/* Cancelled while a flush thread writes one of its pieces (the cache holds half the save, so
 * no SNAPSHOT yet): FAILED, the partial file removed. */
START_TEST(test_cancel_mid_flush)
{
	start(2, 2, 4 * 16 * KIB, 16 * KIB);
	int dfd = open_dir("job/c2");
	plan(&jobs[0], "flushme", 8, size_16k, 0, 0);
	gate_writes("flushme.safetensors", 3);	/* the header, piece 0, then hold piece 1 */
	submit(&jobs[0], dfd, 0);
	gate_wait_for_waiter();
	engine_cancel(jobs[0].job, ERR_ETIMEDOUT, "cancelled mid-flush");
	gate_open();
	run_until(1);
	verify_failed(&jobs[0], root, ERR_ETIMEDOUT, "mid-flush");
	ck_assert_uint_eq(jobs[0].nev, 1);
	ck_assert_uint_lt(jobs[0].flushed, jobs[0].data_len);
	close(dfd);
	stop();
}
END_TEST

/* Cancelled after SNAPSHOT, while its pieces are still being written: SNAPSHOT, then FAILED. */
START_TEST(test_cancel_after_snapshot)
{
	start(2, 1, 16 * 16 * KIB, 16 * KIB);
	int dfd = open_dir("job/c3");
	plan(&jobs[0], "snapped", 8, size_16k, 0, 1);
	gate_writes("snapped.safetensors", 2);	/* hold the first data piece */
	submit(&jobs[0], dfd, 0);
	while (jobs[0].nev == 0)
		uv_run(loop, UV_RUN_ONCE);
	ck_assert_int_eq(jobs[0].ev[0], ENGINE_SNAPSHOT);
	ck_assert(!jobs[0].done);
	engine_cancel(jobs[0].job, ERR_EINVAL, "cancelled after snapshot");
	gate_open();
	run_until(1);
	verify_failed(&jobs[0], root, ERR_EINVAL, "after snapshot");
	ck_assert_uint_eq(jobs[0].nev, 2);
	close(dfd);
	stop();
}
END_TEST

/* Cancelling a finished job changes nothing: once its file is in place but its event not yet
 * delivered, and in the callback of its final event. */
START_TEST(test_cancel_after_finish)
{
	char path[PATH_MAX * 2];

	start(2, 2, 4 * 16 * KIB, 16 * KIB);
	int dfd = open_dir("job/c4");
	plan(&jobs[0], "rank0", 6, size_mixed, 1, 1);
	plan(&jobs[1], "rank1", 6, size_mixed, 2, 0);
	jobs[1].cancel_when_final = 1;
	submit(&jobs[0], dfd, 0);
	snprintf(path, sizeof(path), "%s/job/c4/rank0.safetensors", root);
	for (int i = 0; i < 20000 && !h_exists(path); i++)
		usleep(1000);
	ck_assert(h_exists(path));
	engine_cancel(jobs[0].job, ERR_EIO, "too late");
	submit(&jobs[1], dfd, 0);
	run_until(2);
	uv_run(loop, UV_RUN_NOWAIT);
	verify(&jobs[0], "job/c4");
	verify(&jobs[1], "job/c4");
	ck_assert_uint_eq(jobs[0].nev, 2);
	ck_assert_uint_eq(jobs[1].nev, 2);
	close(dfd);
	stop();
}
END_TEST

/* Cancelled while its file is being finished (the header written again, checksums filled):
 * too late, the save is durable. */
START_TEST(test_cancel_while_finishing)
{
	start(2, 2, 4 * 16 * KIB, 16 * KIB);
	int dfd = open_dir("job/c5");
	plan(&jobs[0], "ending", 2, size_16k, 0, 1);
	gate_writes("ending.safetensors", 4);	/* header, two pieces, then the header again */
	submit(&jobs[0], dfd, 0);
	gate_wait_for_waiter();
	engine_cancel(jobs[0].job, ERR_EIO, "too late");
	gate_open();
	run_until(1);
	verify(&jobs[0], "job/c5");
	close(dfd);
	stop();
}
END_TEST

/* A source read that fails at its Nth call (_i: the first, a middle one, the last) fails the
 * save with that read's code and message; other saves at the same time are not disturbed. */
START_TEST(test_fail_read)
{
	static const int codes[] = {ERR_EIO, ERR_EBADF, ERR_ENOMEM};

	start(2, 2, 4 * 16 * KIB, 16 * KIB);
	int dfd = open_dir("job/r");
	plan(&jobs[0], "bad", 8, size_16k, 0, 1);
	/* 8 tensors, 4 from each source: fail its first, second or last read. */
	jobs[0].src[0].fail_at = _i == 0 ? 1 : _i == 1 ? 2 : 4;
	jobs[0].src[0].fail_code = codes[_i];
	plan(&jobs[1], "good", 10, size_mixed, 4, 1);
	submit(&jobs[0], dfd, 0);
	submit(&jobs[1], dfd, 0);
	run_until(2);
	verify_failed(&jobs[0], root, codes[_i], "fake read");
	ck_assert_uint_eq(jobs[0].nev, 1);	/* a piece was never copied: no SNAPSHOT */
	verify(&jobs[1], "job/r");
	close(dfd);
	stop();
}
END_TEST

/* A header that cannot be built (a tensor name that is not UTF-8) fails with EINVAL. */
START_TEST(test_fail_header)
{
	start(2, 2, 4 * 16 * KIB, 16 * KIB);
	int dfd = open_dir("job/h");
	plan(&jobs[0], "rank0", 8, size_16k, 0, 1);
	jobs[0].bad_name = 1;
	submit(&jobs[0], dfd, 0);
	run_until(1);
	verify_failed(&jobs[0], root, ERR_EINVAL, "UTF-8");
	close(dfd);
	stop();
}
END_TEST

/* A full disk (a tmpfs too small for the save) fails it with ENOSPC and leaves no partial;
 * the space comes back, and a save that fits is durable on the same filesystem. */
START_TEST(test_fail_enospc)
{
	char dir[PATH_MAX * 2];

	if (geteuid() != 0 || mount("tmpfs", root, "tmpfs", 0, "size=128k") != 0) {
		printf("SKIP: needs root to mount tmpfs (%s)\n", strerror(errno));
		return;
	}
	start(2, 2, 4 * 16 * KIB, 16 * KIB);
	int dfd = open_dir("job/full");
	plan(&jobs[0], "huge", 8, size_16k, 0, 0);
	jobs[0].shape[7] = 256 * KIB;
	jobs[0].st[7].nbytes = 256 * KIB;
	jobs[0].data_len += 240 * KIB;
	submit(&jobs[0], dfd, 0);
	run_until(1);
	snprintf(dir, sizeof(dir), "%s/job/full", root);
	verify_failed(&jobs[0], dir, ERR_ENOSPC, "no space left on device");
	plan(&jobs[1], "small", 3, size_16k, 1, 1);
	submit(&jobs[1], dfd, 0);
	run_until(2);
	verify(&jobs[1], "job/full");
	close(dfd);
	stop();
	umount2(root, MNT_DETACH);
}
END_TEST

/* The .meta file cannot be written (something else holds its partial's name): the save fails
 * with that code and its data file is not renamed into place. */
START_TEST(test_fail_meta)
{
	char dir[PATH_MAX * 2], path[PATH_MAX * 3];

	start(2, 2, 4 * 16 * KIB, 16 * KIB);
	int dfd = open_dir("job/m");
	snprintf(dir, sizeof(dir), "%s/job/m", root);
	snprintf(path, sizeof(path), "%s/rank0.meta.partial", dir);
	ck_assert_int_eq(mkdir(path, 0700), 0);
	ck_assert_int_eq(h_system("touch '%s/x'", path), 0);
	plan(&jobs[0], "rank0", 5, size_mixed, 0, 1);
	submit(&jobs[0], dfd, 0);
	run_until(1);
	verify_failed(&jobs[0], dir, ERR_EEXIST, "rank0.meta.partial");
	snprintf(path, sizeof(path), "%s/rank0.meta", dir);
	ck_assert(!h_exists(path));
	close(dfd);
	stop();
}
END_TEST

/* The directory is moved out of its allowed root (_i 0) or removed (_i 1) while the save is
 * written: nothing is renamed into place, with EACCES or ENOENT. */
START_TEST(test_fail_dir_gone)
{
	char dir[PATH_MAX * 2], away[PATH_MAX * 2];

	start(2, 2, 4 * 16 * KIB, 16 * KIB);
	int dfd = open_dir("job/gone");
	snprintf(dir, sizeof(dir), "%s/job/gone", root);
	snprintf(away, sizeof(away), "%s/away", scratch);
	plan(&jobs[0], "rank0", 4, size_16k, 0, _i);
	gate_writes("rank0.safetensors", 2);
	submit(&jobs[0], dfd, 0);
	gate_wait_for_waiter();
	if (_i == 0)
		ck_assert_int_eq(rename(dir, away), 0);
	else
		h_rm_rf(dir);
	gate_open();
	run_until(1);
	if (_i == 0)
		verify_failed(&jobs[0], away, ERR_EACCES, "moved out of its allowed root");
	else
		verify_failed(&jobs[0], dir, ERR_ENOENT, "removed");
	close(dfd);
	stop();
}
END_TEST

/* Builds the suite. */
static Suite *engine_suite(void)
{
	Suite *s = suite_create("engine");
	TCase *tc = tcase_create("saves");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_one_save);
	tcase_add_loop_test(tc, test_many_saves, 0, 4);
	tcase_add_test(tc, test_zero_bytes);
	suite_add_tcase(s, tc);

	tc = tcase_create("cancel");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_cancel_before_copy);
	tcase_add_test(tc, test_cancel_mid_copy);
	tcase_add_test(tc, test_cancel_mid_flush);
	tcase_add_test(tc, test_cancel_after_snapshot);
	tcase_add_test(tc, test_cancel_after_finish);
	tcase_add_test(tc, test_cancel_while_finishing);
	suite_add_tcase(s, tc);

	tc = tcase_create("failures");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 120);
	tcase_add_loop_test(tc, test_fail_read, 0, 3);
	tcase_add_test(tc, test_fail_header);
	tcase_add_test(tc, test_fail_enospc);
	tcase_add_test(tc, test_fail_meta);
	tcase_add_loop_test(tc, test_fail_dir_gone, 0, 2);
	suite_add_tcase(s, tc);
	return s;
}

/* Runs the suite; non-zero on failure. */
int main(void)
{
	SRunner *sr = srunner_create(engine_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
