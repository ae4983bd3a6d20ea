/*
 * harness_engine.c — the copy engine's suites' shared part (harness_engine.h says what):
 * the fake sources, the read gate, the event recorder, starting and stopping the engine, jobs
 * planned and submitted, and the checks of what each job left behind.
 */
#include "harness_engine.h"

#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

/* The loop engine.c posts to (main.c's in the daemon, handed to engine_start). */
struct uv_loop_s *eng_loop;

/* The running test's engine: its loop, cache, scratch root's id and jobs (ndone: finished). */
static char err[ERRLEN];
static struct store_root rootid;
struct cache *tcache;
static uv_loop_t uvloop;
struct tjob jobs[MAXJ];
static unsigned ndone;

/* The gate, both halves open until a test closes one. */
struct gate gate = { .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER };

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
void gate_wait(const int *closed)
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
void gate_open(void)
{
	pthread_mutex_lock(&gate.mu);
	gate.reads_closed = 0;
	gate.writes_closed = 0;
	pthread_cond_broadcast(&gate.cv);
	pthread_mutex_unlock(&gate.mu);
}

/* Waits (up to 20 s) until a thread waits at a gate; fails the test otherwise. */
void gate_wait_for_waiter(void)
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

/* Closes the read gate: the reads of gated fakes wait until gate_open. */
void gate_reads(void)
{
	pthread_mutex_lock(&gate.mu);
	gate.reads_closed = 1;
	pthread_mutex_unlock(&gate.mu);
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
		return err_set(e, elen, f->fail_code, "fake read %u failed", call);
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

/* Makes the scratch directory with the allowed root "ckpt" in it (a checked fixture). */
void eng_setup(void)
{
	log_init("check_engine", LOG_LVL_ERROR);
	scratch_setup();
	memset(jobs, 0, sizeof(jobs));
	ndone = 0;
}

/* Removes the scratch directory (and a tmpfs a test left mounted). */
void eng_teardown(void)
{
	scratch_teardown();
}

/* Starts the engine over a fresh cache of cache_bytes in chunk-byte chunks. */
void eng_start(unsigned copy, unsigned flush, uint64_t cache_bytes, uint64_t chunk)
{
	ck_assert_int_eq(uv_loop_init(&uvloop), 0);
	eng_loop = &uvloop;
	ck_assert_msg(cache_create(cache_bytes, chunk, NULL, &tcache, err, sizeof(err)) == 0,
		      "%s", err);
	ck_assert_msg(engine_start(eng_loop, tcache, copy, flush, on_event, err, sizeof(err)) == 0,
		      "%s", err);
}

/* Stops the engine: its threads join, every chunk is back, the loop closes. */
void eng_stop(void)
{
	engine_stop();
	ck_assert_uint_eq(cache_used(tcache), 0);
	uv_run(eng_loop, UV_RUN_NOWAIT);
	ck_assert_int_eq(uv_loop_close(eng_loop), 0);
	cache_destroy(tcache);
}

/* Opens (creating) <root>/<rel> as a checkpoint directory. */
int open_dir(const char *rel)
{
	char path[PATH_MAX * 2];
	int fd;

	snprintf(path, sizeof(path), "%s/%s", root, rel);
	fd = store_open_dir(&cfg, path, getuid(), getgid(), &rootid, err, sizeof(err));
	ck_assert_msg(fd >= 0, "%s: %s", path, err);
	return fd;
}

/*
 * Describes job t: n tensors (sizes from size(k, i), some zero), alternately from two fake
 * sources at gapped offsets; a .meta file when meta is set.
 */
void plan(struct tjob *t, const char *file, size_t n, uint64_t (*size)(size_t, size_t),
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
void submit(struct tjob *t, int dirfd, int o_direct)
{
	struct engine_req r = {.n = t->n, .uid = getuid(), .gid = getgid(), .mode = 0640,
			       .root = rootid, .res = t->res, .owner = t};
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
void run_until(unsigned n)
{
	while (ndone < n)
		uv_run(eng_loop, UV_RUN_ONCE);
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
void verify(const struct tjob *t, const char *rel)
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
void verify_failed(const struct tjob *t, const char *dir, int code, const char *msg)
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
uint64_t size_mixed(size_t k, size_t i)
{
	static const uint64_t base[] = {1, 4093, 0, 17 * KIB + 5, 3 * KIB, 20 * KIB + 1, 0,
					555, 12 * KIB, 7, 30 * KIB + 3, 2};
	return base[(i + k) % 12] * (1 + (k % 5)) / (1 + (i % 3));
}

/* Tensor sizes: large ones, 48 KiB and a little more. */
uint64_t size_big(size_t k, size_t i)
{
	return 48 * KIB + i * 1000 + k;
}

/* Tensor sizes: every tensor 16 KiB. */
uint64_t size_16k(size_t k, size_t i)
{
	return 16 * KIB;
}

/* Tensor sizes: none. */
uint64_t size_zero(size_t k, size_t i)
{
	return 0;
}

/* Adds the test case name to s: every test of it with eng_setup/eng_teardown, 120 s each. */
TCase *eng_case(Suite *s, const char *name)
{
	TCase *tc = tcase_create(name);

	tcase_add_checked_fixture(tc, eng_setup, eng_teardown);
	tcase_set_timeout(tc, 120);
	suite_add_tcase(s, tc);
	return tc;
}
