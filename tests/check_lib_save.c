/*
 * check_lib_save.c — libdsckpt's data path against a scripted fake daemon (fake_peer.c):
 * a whole save (zero-copy host blocks, staged memory, blobs in pieces, small blobs with the
 * end), freed blocks unregistered, huge saves split into frames, no GPU without a driver,
 * batches of tensors, deferred saves (one frame for a whole save), the run id HELLO carries.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "fake_peer.h"
#include "harness.h"

/* The environment variables libdsckpt takes a run id from. */
static const char *const run_vars[] = {"DSCKPT_RUN_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID",
				       "SLURM_STEP_ID", "SLURM_RESTART_COUNT", "PMIX_NAMESPACE",
				       "OMPI_MCA_ess_base_jobid"};

/* The run id HELLO carries: the caller's, else the environment's (in its order, skipping
 * TORCHELASTIC_RUN_ID's placeholder "none" and values that cannot be run ids), else none;
 * a caller's id that cannot be one is refused before anything is sent. */
START_TEST(test_run_ids)
{
	static const struct {
		const char *env[4];  /* NAME=value */
		const char *given;   /* to dsckpt_identify_run; NULL: dsckpt_identify */
		const char *want;
	} cases[] = {
		{{NULL}, NULL, ""},
		{{"DSCKPT_RUN_ID=abc", "TORCHELASTIC_RUN_ID=te", "SLURM_JOB_ID=12"}, NULL, "abc"},
		{{"TORCHELASTIC_RUN_ID=te1", "SLURM_JOB_ID=12"}, NULL, "te1"},
		{{"TORCHELASTIC_RUN_ID=none", "SLURM_JOB_ID=12", "SLURM_STEP_ID=3",
		  "SLURM_RESTART_COUNT=1"}, NULL, "12.3.1"},
		{{"SLURM_JOB_ID=12", "PMIX_NAMESPACE=px"}, NULL, "12.batch.0"},
		{{"PMIX_NAMESPACE=slurm.pmix.12.0", "OMPI_MCA_ess_base_jobid=99"}, NULL,
		 "slurm.pmix.12.0"},
		{{"OMPI_MCA_ess_base_jobid=4242"}, NULL, "4242"},
		{{"DSCKPT_RUN_ID=bad\001id", "TORCHELASTIC_RUN_ID=ok"}, NULL, "ok"},
		{{"DSCKPT_RUN_ID=abc"}, "mine", "mine"},
		{{"DSCKPT_RUN_ID=abc"}, "", ""},
	};
	char want[64], big[DSCKPT_RUN_MAX + 2];

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct fake f;
		dsckpt_conn_t *c;
		for (size_t k = 0; k < sizeof(run_vars) / sizeof(run_vars[0]); k++)
			unsetenv(run_vars[k]);
		for (size_t k = 0; k < 4 && cases[i].env[k]; k++)
			putenv((char *)cases[i].env[k]);
		fake_start(&f);
		ck_assert_int_eq(dsckpt_connect(f.path, &c), 0);
		int rc = cases[i].given ? dsckpt_identify_run(c, "job", 0, 2, cases[i].given)
					: dsckpt_identify(c, "job", 0, 2);
		ck_assert_msg(rc == 0, "case %zu: %s", i, dsckpt_last_error(c));
		ck_assert_msg(strcmp(dsckpt_run(c), cases[i].want) == 0, "case %zu: run '%s', "
			      "not '%s'", i, dsckpt_run(c), cases[i].want);
		dsckpt_close(c);
		char *log = fake_finish(&f);
		snprintf(want, sizeof(want), "hello trainer job 0/2%s%s\n", *cases[i].want ?
			 " run=" : "", cases[i].want);
		ck_assert_msg(strstr(log, want), "case %zu: the peer saw %s", i, log);
		free(log);
	}
	for (size_t k = 0; k < sizeof(run_vars) / sizeof(run_vars[0]); k++)
		unsetenv(run_vars[k]);

	struct fake f;
	dsckpt_conn_t *c;
	fake_start(&f);
	ck_assert_int_eq(dsckpt_connect(f.path, &c), 0);
	memset(big, 'r', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	ck_assert_int_eq(dsckpt_identify_run(c, "job", 0, 2, big), DSCKPT_EINVAL);
	ck_assert_int_eq(dsckpt_identify_run(c, "job", 0, 2, "tab\there"), DSCKPT_EINVAL);
	big[DSCKPT_RUN_MAX] = '\0';	/* the longest */
	ck_assert_int_eq(dsckpt_identify_run(c, "job", 0, 2, big), 0);
	ck_assert_str_eq(dsckpt_run(c), big);
	dsckpt_close(c);
	char *log = fake_finish(&f);
	ck_assert_int_eq(fake_count(log, "hello"), 1);
	free(log);
}
END_TEST

/* A whole save: 1,000 tensors zero-copy in one frame, staged ones, a blob in pieces. */
START_TEST(test_fake_save)
{
	enum { NT = 1000 };
	struct fake f;
	dsckpt_conn_t *c = fake_connect(&f);
	dsckpt_save_t *s;
	dsckpt_progress_t p;
	char name[64], line[256];
	size_t blen = 9u << 20;
	uint8_t *host = dsckpt_host_alloc(NT * 64);
	uint8_t *heap = malloc(3000);
	uint8_t *blob = malloc(blen);
	int64_t shape[2] = {4, 4};
	struct lib_hostref h;

	for (size_t i = 0; i < NT * 64; i++)
		host[i] = (uint8_t)(i * 7);
	for (size_t i = 0; i < 3000; i++)
		heap[i] = (uint8_t)(i * 13);
	for (size_t i = 0; i < blen; i++)
		blob[i] = (uint8_t)(i >> 3);
	ck_assert_int_eq(lib_host_find(host, 1, &h), 1);

	ck_assert_int_eq(dsckpt_save_begin(c, "/ck/job/step1", "rank0", &s), 0);
	for (int i = 0; i < NT; i++) {
		snprintf(name, sizeof(name), "layer.%d.weight", i);
		ck_assert_int_eq(dsckpt_add_tensor(s, name, "F32", shape, 2, host + i * 64, 64),
				 0);
	}
	ck_assert_int_eq(dsckpt_add_tensor(s, "layer.0.weight", "F32", shape, 2, host, 64),
			 DSCKPT_EEXIST);
	ck_assert_ptr_nonnull(strstr(dsckpt_last_error(c), "layer.0.weight"));
	ck_assert_int_eq(dsckpt_add_tensor(s, "bad", "F32", shape, 2, host, 63), DSCKPT_EINVAL);
	int64_t s128[1] = {128};
	ck_assert_int_eq(dsckpt_add_tensor(s, "past", "U8", s128, 1, host + h.size - 64, 128),
			 DSCKPT_EINVAL);
	int64_t s1[1] = {1000}, s2[1] = {2000}, s0[1] = {0};
	ck_assert_int_eq(dsckpt_add_tensor(s, "staged.a", "U8", s1, 1, heap, 1000), 0);
	ck_assert_int_eq(dsckpt_add_tensor(s, "staged.b", "U8", s2, 1, heap + 1000, 2000), 0);
	ck_assert_int_eq(dsckpt_add_tensor(s, "empty", "F32", s0, 1, NULL, 0), 0);
	ck_assert_int_eq(dsckpt_add_blob(s, "skeleton", blob, blen), 0);
	ck_assert_int_eq(dsckpt_add_blob(s, "skeleton", blob, 1), DSCKPT_EEXIST);
	ck_assert_int_eq(dsckpt_add_blob(s, "layer.0.weight", "x", 1), 0);
	ck_assert_int_eq(dsckpt_add_blob(s, "empty", NULL, 0), 0);
	ck_assert_int_eq(dsckpt_wait(s, DSCKPT_SNAPSHOT, 0), DSCKPT_ESTATE);

	double t0 = h_now_us();
	ck_assert_int_eq(dsckpt_save_end(s), 0);
	double took = h_now_us() - t0;
	ck_assert_msg(took < 20000, "save_end took %.0f us", took);

	ck_assert_int_eq(dsckpt_save_end(s), DSCKPT_ESTATE);
	ck_assert_int_eq(dsckpt_add_tensor(s, "late", "U8", s1, 1, heap, 1000), DSCKPT_ESTATE);
	ck_assert_int_eq(dsckpt_add_blob(s, "late", "x", 1), DSCKPT_ESTATE);
	ck_assert_int_eq(dsckpt_wait(s, DSCKPT_SNAPSHOT, -1), DSCKPT_SNAPSHOT);
	ck_assert_int_eq(dsckpt_wait(s, DSCKPT_REPLICATED + 1, -1), DSCKPT_EINVAL);
	ck_assert_int_eq(dsckpt_wait(s, -1, -1), DSCKPT_EINVAL);
	ck_assert_int_eq(dsckpt_save_progress(s, &p), 0);
	ck_assert_int_eq(p.level, DSCKPT_SNAPSHOT);
	ck_assert_uint_eq(p.bytes_total, 100);
	ck_assert_uint_eq(p.bytes_snapshot, 60);
	ck_assert_uint_eq(p.bytes_flushed, 20);
	ck_assert_int_eq(dsckpt_commit(c, "/ck/job/step1", 5000), 0);
	ck_assert_int_eq(dsckpt_commit(c, "relative", 5000), DSCKPT_EINVAL);
	dsckpt_save_free(s);
	dsckpt_close(c);

	char *log = fake_finish(&f);
	ck_assert_ptr_nonnull(strstr(log, "hello trainer job 0/2\n"));
	ck_assert_ptr_nonnull(strstr(log, "save_begin /ck/job/step1 rank0\n"));
	/* One host region (added once) and one staging arena, kept for the next save once the
	 * wait saw SNAPSHOT: neither is deleted (the connection's close drops both). */
	ck_assert_int_eq(fake_count(log, "region_add"), 2);
	snprintf(line, sizeof(line), "region_add %" PRIu64 " %" PRIu64 "\n", h.region, h.size);
	ck_assert_ptr_nonnull(strstr(log, line));
	ck_assert_ptr_nonnull(strstr(log, " 67108864\n"));
	ck_assert_int_eq(fake_count(log, "region_del"), 0);
	/* The tensors travel in one frame with the two small blobs, the 9 MiB blob in three
	 * pieces before them. */
	ck_assert_int_eq(fake_count(log, "tensors=1003 blobs=2"), 1);
	ck_assert_int_eq(fake_count(log, "blob skeleton len=4194304"), 2);
	ck_assert_int_eq(fake_count(log, "blob skeleton len=1048576"), 1);
	ck_assert_int_eq(fake_count(log, "blob empty len=0"), 1);
	for (int i = 0; i < NT; i += 111) {
		snprintf(line, sizeof(line), "tensor layer.%d.weight F32 ndim=2 region=%" PRIu64
			 " offset=%d nbytes=64 fnv=%016" PRIx64 "\n", i, h.region, i * 64,
			 fake_fnv(host + i * 64, 64));
		ck_assert_msg(strstr(log, line), "missing %s", line);
	}
	snprintf(line, sizeof(line), "offset=0 nbytes=1000 fnv=%016" PRIx64 "\n",
		 fake_fnv(heap, 1000));
	ck_assert_msg(strstr(log, line), "missing %s", line);
	snprintf(line, sizeof(line), "offset=4096 nbytes=2000 fnv=%016" PRIx64 "\n",
		 fake_fnv(heap + 1000, 2000));
	ck_assert_msg(strstr(log, line), "missing %s", line);
	ck_assert_ptr_nonnull(strstr(log, "tensor empty F32 ndim=1"));
	ck_assert_ptr_nonnull(strstr(log, "wait 7 2 20\n"));	/* a slice of a wait without limit */
	ck_assert_ptr_nonnull(strstr(log, "wait 7 0 0\n"));
	ck_assert_ptr_nonnull(strstr(log, "commit /ck/job/step1 2 20\n"));	/* a slice of 5000 ms */
	free(log);
	dsckpt_host_free(host);
	free(heap);
	free(blob);
}
END_TEST

/* Freed host blocks are unregistered before the next SAVE_ADD, once. */
START_TEST(test_fake_region_del)
{
	struct fake f;
	dsckpt_conn_t *c = fake_connect(&f);
	dsckpt_save_t *s;
	int64_t shape[1] = {4096};
	uint8_t *a = dsckpt_host_alloc(4096), *b = dsckpt_host_alloc(4096);
	struct lib_hostref ha, hb;
	char line[64];

	ck_assert_int_eq(lib_host_find(a, 1, &ha), 1);
	ck_assert_int_eq(lib_host_find(b, 1, &hb), 1);
	ck_assert_int_eq(dsckpt_save_begin(c, "/ck/j/t1", "r0", &s), 0);
	ck_assert_int_eq(dsckpt_add_tensor(s, "a", "U8", shape, 1, a, 4096), 0);
	ck_assert_int_eq(dsckpt_add_tensor(s, "b", "U8", shape, 1, b, 4096), 0);
	ck_assert_int_eq(dsckpt_save_end(s), 0);
	dsckpt_save_free(s);
	dsckpt_host_free(a);
	ck_assert_int_eq(dsckpt_save_begin(c, "/ck/j/t2", "r0", &s), 0);
	ck_assert_int_eq(dsckpt_add_tensor(s, "b", "U8", shape, 1, b, 4096), 0);
	ck_assert_int_eq(dsckpt_save_end(s), 0);
	dsckpt_save_free(s);
	ck_assert_int_eq(dsckpt_save_begin(c, "/ck/j/t3", "r0", &s), 0);
	ck_assert_int_eq(dsckpt_save_end(s), 0);
	dsckpt_save_free(s);
	dsckpt_close(c);
	dsckpt_host_free(b);

	char *log = fake_finish(&f);
	snprintf(line, sizeof(line), "region_del %" PRIu64 "\n", ha.region);
	char *del = strstr(log, line);
	ck_assert_ptr_nonnull(del);
	ck_assert_ptr_nonnull(strstr(del, "save_add"));
	ck_assert_ptr_null(strstr(del, "region_add"));   /* b stays registered */
	ck_assert_ptr_nonnull(strstr(log, "save_begin /ck/j/t2") < del ? del : NULL);
	ck_assert_int_eq(fake_count(log, "region_del"), 1);
	ck_assert_int_eq(fake_count(log, "region_add"), 2);
	free(log);
}
END_TEST

/* Tens of thousands of long-named tensors are split into frames under 16 MiB. */
START_TEST(test_fake_split)
{
	enum { NT = 40000 };
	struct fake f;
	dsckpt_conn_t *c = fake_connect(&f);
	dsckpt_save_t *s;
	char name[PROTO_MAX_NAME + 1];
	int64_t shape[16];
	uint8_t *mem = dsckpt_host_alloc(NT);

	for (int i = 0; i < 16; i++)
		shape[i] = 1;
	memset(name, 'x', PROTO_MAX_NAME);
	name[PROTO_MAX_NAME] = 0;
	ck_assert_int_eq(dsckpt_save_begin(c, "/ck/j/t", "r0", &s), 0);
	for (int i = 0; i < NT; i++) {
		snprintf(name, sizeof(name), "%06d", i);
		name[6] = 'x';
		ck_assert_int_eq(dsckpt_add_tensor(s, name, "U8", shape, 16, mem + i, 1), 0);
	}
	ck_assert_int_eq(dsckpt_save_end(s), 0);
	dsckpt_save_free(s);
	dsckpt_close(c);
	dsckpt_host_free(mem);

	char *log = fake_finish(&f);
	int frames = 0, total = 0;
	for (char *p = log; (p = strstr(p, "save_add len=")); p++) {
		unsigned len, nt, nb;
		ck_assert_int_eq(sscanf(p, "save_add len=%u tensors=%u blobs=%u", &len, &nt, &nb),
				 3);
		ck_assert_uint_lt(len, PROTO_MAX_BODY / 2);
		frames++;
		total += (int)nt;
	}
	ck_assert_int_ge(frames, 3);
	ck_assert_int_eq(total, NT);
	ck_assert_int_eq(fake_count(log, "tensor "), NT);
	free(log);
}
END_TEST

/*
 * Without a CUDA driver (or in a process that never initialised CUDA) memory the library did
 * not allocate is host memory, wherever it lies: a device-looking mapping far from the heap
 * is staged, the stream is only stored, and SAVE_END carries no event.
 */
START_TEST(test_fake_no_gpu)
{
	struct fake f;
	dsckpt_conn_t *c = fake_connect(&f);
	dsckpt_save_t *s, *s2;
	struct lib_gpu_ref g;
	size_t n = 1 << 20;
	int64_t shape[1] = {(int64_t)n};
	char line[160];
	uint8_t *far = mmap((void *)0x7f0000000000ull, n, PROT_READ | PROT_WRITE,
			    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	ck_assert(far != MAP_FAILED);
	for (size_t i = 0; i < n; i++)
		far[i] = (uint8_t)(i * 31 + 7);
	uint64_t sum = fake_fnv(far, n);
	lib_conn_lock(c);
	ck_assert_int_eq(lib_cuda_place(c, far, n, -1, NULL, &g), 0);
	ck_assert_int_eq(lib_cuda_place(c, NULL, 0, 0, NULL, &g), 0);
	lib_conn_unlock(c);

	ck_assert_int_eq(dsckpt_save_begin(c, "/ck/j/t1", "r0", &s), 0);
	ck_assert_int_eq(dsckpt_save_set_stream(s, (void *)0x1234), 0);
	ck_assert_int_eq(dsckpt_add_tensor(s, "far", "U8", shape, 1, far, n), 0);
	ck_assert_int_eq(dsckpt_save_set_stream(s, NULL), 0);
	ck_assert_int_eq(dsckpt_save_end(s), 0);
	ck_assert_int_eq(dsckpt_save_set_stream(s, NULL), DSCKPT_ESTATE);
	ck_assert_ptr_nonnull(strstr(dsckpt_last_error(c), "already ended"));
	dsckpt_save_free(s);
	/* A save that failed refuses a stream too. */
	ck_assert_int_eq(dsckpt_save_begin(c, "/ck/j/t2", "r0", &s2), 0);
	ck_assert_int_eq(dsckpt_add_tensor(s2, "far", "U8", shape, 1, far, n), 0);
	dsckpt_close(c);
	ck_assert_int_eq(dsckpt_save_end(s2), DSCKPT_EPIPE);
	ck_assert_int_eq(dsckpt_save_set_stream(s2, NULL), DSCKPT_ESTATE);
	dsckpt_save_free(s2);
	munmap(far, n);

	char *log = fake_finish(&f);
	/* Each save staged the bytes in an arena of its own; only the first reached SAVE_END,
	 * without an event. */
	ck_assert_int_eq(fake_count(log, "region_add"), 2);
	ck_assert_int_eq(fake_count(log, "region_del"), 1);
	snprintf(line, sizeof(line), "offset=0 nbytes=%zu fnv=%016" PRIx64, n, sum);
	ck_assert_int_eq(fake_count(log, line), 1);
	ck_assert_int_eq(fake_count(log, "tensor far U8 ndim=1"), 1);
	ck_assert_int_eq(fake_count(log, "save_end"), 1);
	ck_assert_ptr_nonnull(strstr(log, "save_end 7\n"));
	free(log);
}
END_TEST

/* dsckpt_add_tensors adds a batch as single calls would and stops at the first bad one. */
START_TEST(test_fake_add_tensors)
{
	struct fake f;
	dsckpt_conn_t *c = fake_connect(&f);
	dsckpt_save_t *s;
	uint8_t *host = dsckpt_host_alloc(4096);
	int64_t sh[2] = {4, 4}, bad[1] = {-1};
	dsckpt_tensor_t t[4] = {
		{"a", "F32", sh, 2, host, 64},
		{"b", "U8", sh, 2, host + 64, 16},
		{"c", "F32", bad, 1, host, 0},
		{"d", "F32", sh, 2, host, 64},
	};
	size_t added = 99;

	ck_assert_int_eq(dsckpt_save_begin(c, "/ck/job/batch", "rank0", &s), 0);
	ck_assert_int_eq(dsckpt_add_tensors(s, NULL, 1, &added), DSCKPT_EINVAL);
	ck_assert_uint_eq(added, 0);
	ck_assert_int_eq(dsckpt_add_tensors(s, t, 0, NULL), 0);
	ck_assert_int_eq(dsckpt_add_tensors(s, t, 4, &added), DSCKPT_EINVAL);
	ck_assert_uint_eq(added, 2);
	ck_assert_ptr_nonnull(strstr(dsckpt_last_error(c), "tensor c"));
	ck_assert_int_eq(dsckpt_add_tensors(s, t, 1, &added), DSCKPT_EEXIST);
	ck_assert_uint_eq(added, 0);
	ck_assert_int_eq(dsckpt_add_tensors(s, t + 3, 1, &added), 0);
	ck_assert_uint_eq(added, 1);
	ck_assert_int_eq(dsckpt_save_end(s), 0);
	ck_assert_int_eq(dsckpt_add_tensors(s, t + 3, 1, &added), DSCKPT_ESTATE);
	ck_assert_uint_eq(added, 0);
	ck_assert_int_eq(dsckpt_release_gpu(NULL), DSCKPT_EINVAL);
	ck_assert_int_eq(dsckpt_release_gpu(c), 0);  /* no GPU memory here: nothing to send */
	dsckpt_save_free(s);
	dsckpt_close(c);
	char *log = fake_finish(&f);
	ck_assert_int_eq(fake_count(log, "tensors=3 blobs=0"), 1);
	ck_assert_ptr_nonnull(strstr(log, "tensor d F32 ndim=2"));
	ck_assert_ptr_null(strstr(log, "tensor c "));
	ck_assert_int_eq(fake_count(log, "region_del"), 0);
	free(log);
	dsckpt_host_free(host);
}
END_TEST

/*
 * A deferred save sends nothing until save_end, which sends one SAVE_BEGIN with the tensors,
 * the small blobs and end; the id in its reply serves waits. A blob over 1 MiB begins the save
 * early (the held blobs go first, keeping their order), and a save freed before its end was
 * never heard of.
 */
START_TEST(test_fake_deferred)
{
	struct fake f;
	dsckpt_conn_t *c = fake_connect(&f);
	dsckpt_save_t *s;
	uint8_t *host = dsckpt_host_alloc(4096);
	size_t blen = 2u << 20;
	uint8_t *blob = calloc(1, blen);
	int64_t shape[1] = {1024};
	const unsigned defer = DSCKPT_SAVE_DEFER;

	ck_assert_int_eq(dsckpt_save_begin_flags(c, "/ck/job/step1", "rank0", 4, &s),
			 DSCKPT_EINVAL);
	ck_assert_int_eq(dsckpt_save_begin_flags(c, "relative", "rank0", defer, &s),
			 DSCKPT_EINVAL);
	ck_assert_int_eq(dsckpt_save_begin_flags(c, "/ck/job/step1", "rank0", defer, &s), 0);
	ck_assert_int_eq(dsckpt_add_tensor(s, "w", "F32", shape, 1, host, 4096), 0);
	ck_assert_int_eq(dsckpt_add_blob(s, "meta", "abc", 3), 0);
	ck_assert_int_eq(dsckpt_wait(s, DSCKPT_SNAPSHOT, 0), DSCKPT_ESTATE);
	ck_assert_int_eq(dsckpt_save_end(s), 0);
	ck_assert_int_eq(dsckpt_wait(s, DSCKPT_SNAPSHOT, -1), DSCKPT_SNAPSHOT);
	dsckpt_save_free(s);

	ck_assert_int_eq(dsckpt_save_begin_flags(c, "/ck/job/step2", "rank0", defer, &s), 0);
	ck_assert_int_eq(dsckpt_add_blob(s, "small", "x", 1), 0);
	ck_assert_int_eq(dsckpt_add_blob(s, "big", blob, blen), 0);
	ck_assert_int_eq(dsckpt_add_tensor(s, "w", "F32", shape, 1, host, 4096), 0);
	ck_assert_int_eq(dsckpt_save_end(s), 0);
	dsckpt_save_free(s);

	ck_assert_int_eq(dsckpt_save_begin_flags(c, "/ck/job/step3", "rank0", defer, &s), 0);
	ck_assert_int_eq(dsckpt_add_tensor(s, "w", "F32", shape, 1, host, 4096), 0);
	dsckpt_save_free(s);
	dsckpt_close(c);

	char *log = fake_finish(&f);
	const char *one = strstr(log, "save_begin /ck/job/step1 rank0 end\n");
	ck_assert_msg(one != NULL, "no whole save in\n%s", log);
	ck_assert_ptr_nonnull(strstr(one, "save_add len="));
	ck_assert_int_eq(sscanf(strstr(one, "save_add len="), "save_add len=%*u tensors=1 "
				"blobs=1\ntensor w F32"), 0);
	ck_assert_ptr_nonnull(strstr(log, "blob meta len=3 "));
	ck_assert_ptr_nonnull(strstr(log, "wait 7 2 20\n"));
	const char *two = strstr(log, "save_begin /ck/job/step2 rank0\n");
	ck_assert_ptr_nonnull(two);
	const char *small = strstr(two, "blob small len=1 "), *big = strstr(two, "blob big len=");
	ck_assert(small && big && small < big);
	ck_assert_int_eq(fake_count(log, "save_begin"), 2);
	ck_assert_int_eq(fake_count(log, "tensors=0 blobs=1"), 2);
	ck_assert_int_eq(fake_count(log, "tensors=1 blobs=1"), 1);
	ck_assert_int_eq(fake_count(log, "tensors=1 blobs=0"), 1);
	ck_assert_int_eq(fake_count(log, "save_end 7"), 2);
	ck_assert_ptr_null(strstr(log, "step3"));
	free(log);
	free(blob);
	dsckpt_host_free(host);
}
END_TEST

/*
 * An early save sends SAVE_BEGIN at once and reads its reply at save_end, which sends one
 * SAVE_END with the tensor and the blob; a request in between (COMMIT) reads the pending
 * reply first, so each request still gets its own reply in order.
 */
START_TEST(test_fake_early)
{
	struct fake f;
	dsckpt_conn_t *c = fake_connect(&f);
	dsckpt_save_t *s;
	uint8_t *host = dsckpt_host_alloc(4096);
	int64_t shape[1] = {1024};

	ck_assert_int_eq(dsckpt_save_begin_flags(c, "/ck/job/e1", "rank0", DSCKPT_SAVE_EARLY,
						 &s), 0);
	ck_assert_int_eq(dsckpt_add_tensor(s, "w", "F32", shape, 1, host, 4096), 0);
	ck_assert_int_eq(dsckpt_add_blob(s, "meta", "abc", 3), 0);
	ck_assert_int_eq(dsckpt_wait(s, DSCKPT_SNAPSHOT, 0), DSCKPT_ESTATE);
	ck_assert_int_eq(dsckpt_commit(c, "/ck/job/e0", 0), 0);
	ck_assert_int_eq(dsckpt_save_end(s), 0);
	ck_assert_int_eq(dsckpt_wait(s, DSCKPT_SNAPSHOT, -1), DSCKPT_SNAPSHOT);
	dsckpt_save_free(s);
	dsckpt_close(c);

	char *log = fake_finish(&f);
	const char *b1 = strstr(log, "save_begin /ck/job/e1 rank0\n");
	const char *b2 = strstr(log, "commit /ck/job/e0 ");
	const char *add = b2 ? strstr(b2, "save_add len=") : NULL;
	const char *end = add ? strstr(add, "save_end 7\n") : NULL;
	ck_assert_msg(b1 && b2 && b1 < b2 && end, "not begin, commit, end in\n%s", log);
	ck_assert_int_eq(sscanf(add, "save_add len=%*u tensors=1 blobs=1\ntensor w F32"), 0);
	ck_assert_int_eq(fake_count(log, "save_begin"), 1);
	ck_assert_int_eq(fake_count(log, "save_add len="), 1);
	free(log);
	dsckpt_host_free(host);
}
END_TEST

/* The suite. */
static Suite *lib_save_suite(void)
{
	Suite *s = suite_create("lib_save");
	TCase *tc = tcase_create("fake-peer");
	tcase_set_timeout(tc, 20);
	tcase_add_test(tc, test_fake_save);
	tcase_add_test(tc, test_run_ids);
	tcase_add_test(tc, test_fake_region_del);
	tcase_add_test(tc, test_fake_split);
	tcase_add_test(tc, test_fake_no_gpu);
	tcase_add_test(tc, test_fake_add_tensors);
	tcase_add_test(tc, test_fake_deferred);
	tcase_add_test(tc, test_fake_early);
	suite_add_tcase(s, tc);
	return s;
}

CHECK_MAIN(lib_save_suite)
