/*
 * check_daemon_save.c — a trainer's saves, end to end: each test starts a real dsckptd on a
 * scratch socket and saves through libdsckpt (dtypes and shapes, several ranks, a save bigger
 * than the cache, saves in flight, the lazy snapshot, a save while another thread waits on the
 * connection); every file is read back and checked.
 */
#include "harness_daemon.h"

#include <check.h>
#include <limits.h>
#include <msgpack.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* Checks that the msgpack map in path has blob name equal to data. */
static void check_meta_blob(const char *path, const char *name, const void *data, size_t len)
{
	size_t flen, off = 0;
	char *buf = h_read_file(path, &flen);
	msgpack_unpacked up;
	int found = 0;

	ck_assert_msg(buf != NULL, "missing %s", path);
	msgpack_unpacked_init(&up);
	ck_assert_int_eq(msgpack_unpack_next(&up, buf, flen, &off), MSGPACK_UNPACK_SUCCESS);
	ck_assert_msg(off == flen, "%s: trailing bytes", path);
	ck_assert_int_eq(up.data.type, MSGPACK_OBJECT_MAP);
	for (uint32_t i = 0; i < up.data.via.map.size; i++) {
		msgpack_object *k = &up.data.via.map.ptr[i].key, *v = &up.data.via.map.ptr[i].val;
		if (k->type != MSGPACK_OBJECT_STR || k->via.str.size != strlen(name) ||
		    memcmp(k->via.str.ptr, name, k->via.str.size) != 0)
			continue;
		ck_assert_int_eq(v->type, MSGPACK_OBJECT_BIN);
		ck_assert_uint_eq(v->via.bin.size, len);
		ck_assert(memcmp(v->via.bin.ptr, data, len) == 0);
		found = 1;
	}
	ck_assert_msg(found, "%s: no blob %s", path, name);
	msgpack_unpacked_destroy(&up);
	free(buf);
}

/* Number under key of a JSON object, or -1 when it is missing or not a number. */
static double jnum(const cJSON *o, const char *key)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
	return cJSON_IsNumber(v) ? v->valuedouble : -1;
}

/* Several dtypes and shapes (0-d, empty), host_alloc and staged memory, a blob: bytes exact. */
START_TEST(test_round_trip)
{
	d_start(CACHE_32M, CHUNK_1M);
	const char *dir = h_path("%s/rt/step10", D->root);
	dsckpt_conn_t *c = conn_open("rt", 0, 1);
	dsckpt_save_t *s;
	struct {
		const char *name, *dtype;
		int ndim;
		int64_t shape[3];
		size_t nbytes;
		int host;
		void *p;
	} t[] = {
		{"layer.0.weight", "F32", 2, {33, 17}, 33 * 17 * 4, 1, NULL},
		{"layer.0.bias", "BF16", 1, {1001}, 1001 * 2, 0, NULL},
		{"step", "I64", 0, {0}, 8, 1, NULL},
		{"empty", "F32", 2, {0, 4}, 0, 0, NULL},
		{"mask", "BOOL", 3, {2, 3, 5}, 30, 0, NULL},
		{"emb", "F16", 2, {300, 129}, 300 * 129 * 2, 1, NULL},
		{"q", "I8", 1, {17}, 17, 0, NULL},
		{"d", "F64", 2, {2, 2}, 32, 1, NULL},
		{"big", "U8", 1, {3 * (int64_t)MIB + 5}, 3 * MIB + 5, 0, NULL},
		{"ids", "I32", 1, {999}, 999 * 4, 1, NULL},
	};
	const size_t nt = sizeof(t) / sizeof(t[0]);
	static const char blob1[] = "a pickled skeleton\0with a NUL";
	uint8_t blob2[70000];

	h_pattern_fill(blob2, sizeof(blob2), 99);
	CK_DS(c, dsckpt_save_begin(c, dir, "rank0", &s));
	for (size_t i = 0; i < nt; i++) {
		t[i].p = t[i].host ? dsckpt_host_alloc(t[i].nbytes ? t[i].nbytes : 1)
				   : malloc(t[i].nbytes ? t[i].nbytes : 1);
		ck_assert_ptr_nonnull(t[i].p);
		h_pattern_fill(t[i].p, t[i].nbytes, 100 + i);
		CK_DS(c, dsckpt_add_tensor(s, t[i].name, t[i].dtype, t[i].shape, t[i].ndim, t[i].p,
					   t[i].nbytes));
	}
	CK_DS(c, dsckpt_add_blob(s, "skeleton", blob1, sizeof(blob1)));
	CK_DS(c, dsckpt_add_blob(s, "rng", blob2, sizeof(blob2)));
	CK_DS(c, dsckpt_save_end(s));
	wait_level(c, s, DSCKPT_DURABLE, 30000);
	ck_assert(!h_exists(h_path("%s/MANIFEST.json", dir)));
	CK_DS(c, dsckpt_commit(c, dir, 30000));

	struct stf f;
	stf_load(&f, h_path("%s/rank0.safetensors", dir));
	for (size_t i = 0; i < nt; i++) {
		const uint8_t *p = stf_tensor(&f, t[i].name, t[i].dtype, t[i].shape, t[i].ndim,
					      t[i].nbytes);
		ck_assert_msg(memcmp(p, t[i].p, t[i].nbytes) == 0, "%s: bytes differ", t[i].name);
		if (t[i].host)
			dsckpt_host_free(t[i].p);
		else
			free(t[i].p);
	}
	ck_assert_int_eq(cJSON_GetArraySize(f.hdr), (int)nt + 1);
	ck_assert_str_eq(stf_meta(&f, "dsckpt.rank"), "0");
	ck_assert_str_eq(stf_meta(&f, "dsckpt.job"), "rt");
	ck_assert_ptr_nonnull(stf_meta(&f, "dsckpt.version"));
	stf_free(&f);
	check_meta_blob(h_path("%s/rank0.meta", dir), "skeleton", blob1, sizeof(blob1));
	check_meta_blob(h_path("%s/rank0.meta", dir), "rng", blob2, sizeof(blob2));

	char *man = h_read_file(h_path("%s/MANIFEST.json", dir), NULL);
	cJSON *mj = cJSON_Parse(man ? man : "");
	ck_assert_msg(cJSON_IsObject(mj), "MANIFEST.json is not a JSON object");
	cJSON *tag = cJSON_GetObjectItemCaseSensitive(mj, "tag");
	ck_assert(cJSON_IsString(tag) && strcmp(tag->valuestring, "step10") == 0);
	ck_assert(jnum(mj, "world_size") == 1);
	cJSON *mf, *files = cJSON_GetObjectItemCaseSensitive(mj, "files");
	int listed = 0;
	cJSON_ArrayForEach(mf, files) {
		cJSON *name = cJSON_GetObjectItemCaseSensitive(mf, "name");
		ck_assert(cJSON_IsString(name));
		struct stat st;
		ck_assert_int_eq(stat(h_path("%s/%s", dir, name->valuestring), &st), 0);
		ck_assert(jnum(mf, "size") == (double)st.st_size);
		listed++;
	}
	ck_assert_int_eq(listed, 2); /* rank0.safetensors and rank0.meta */
	cJSON_Delete(mj);
	free(man);
	ck_assert_str_eq(file_text(h_path("%s/rt/latest", D->root)), "step10");
	ck_assert(!has_partial(D->root));
	ctl_verify(dir);
	dsckpt_save_free(s);
	dsckpt_close(c);
	d_stop();
}
END_TEST

/* Child of test_ranks: rank r saves two ~10 MB tensors (host and staged); 0 on success. */
static int rank_main(const char *dir, int r)
{
	dsckpt_conn_t *c;
	dsckpt_save_t *s;
	size_t n = 10 * MIB + 4096 * (size_t)r + 3;
	int64_t shape[1] = {(int64_t)n};
	uint8_t *a = dsckpt_host_alloc(n), *b = malloc(n);
	int rc;

	if (!a || !b)
		return 10;
	h_pattern_fill(a, n, 1000 + 2 * (uint64_t)r);
	h_pattern_fill(b, n, 1001 + 2 * (uint64_t)r);
	if ((rc = dsckpt_connect(D->socket, &c)) < 0)
		return 11;
	if ((rc = dsckpt_identify(c, "mr", r, 4)) < 0 ||
	    (rc = dsckpt_save_begin(c, dir, h_path("rank%d", r), &s)) < 0 ||
	    (rc = dsckpt_add_tensor(s, "a", "U8", shape, 1, a, n)) < 0 ||
	    (rc = dsckpt_add_tensor(s, "b", "U8", shape, 1, b, n)) < 0 ||
	    (rc = dsckpt_save_end(s)) < 0 || (rc = dsckpt_wait(s, DSCKPT_DURABLE, 60000)) < 0) {
		fprintf(stderr, "rank %d: %s: %s\n", r, dsckpt_err_name(rc), dsckpt_last_error(c));
		return 12;
	}
	dsckpt_save_free(s);
	dsckpt_close(c);
	return 0;
}

/* Four rank processes save ~20 MB each at once; rank 0's own connection commits world 4. */
START_TEST(test_ranks)
{
	d_start(CACHE_32M, CHUNK_1M);
	const char *dir = h_path("%s/mr/global_step5", D->root);
	pid_t pid[4];

	for (int r = 0; r < 4; r++) {
		pid[r] = fork();
		ck_assert_int_ge(pid[r], 0);
		if (pid[r] == 0)
			_exit(rank_main(dir, r));
	}
	for (int r = 0; r < 4; r++) {
		int st;
		ck_assert_int_eq(waitpid(pid[r], &st, 0), pid[r]);
		ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "rank %d failed (status %d)",
			      r, st);
	}
	dsckpt_conn_t *c = conn_open("mr", 0, 4);
	CK_DS(c, dsckpt_commit(c, dir, 30000));
	for (int r = 0; r < 4; r++) {
		struct stf f;
		size_t n = 10 * MIB + 4096 * (size_t)r + 3;
		int64_t shape[1] = {(int64_t)n};
		stf_load(&f, h_path("%s/rank%d.safetensors", dir, r));
		const uint8_t *a = stf_tensor(&f, "a", "U8", shape, 1, n);
		const uint8_t *b = stf_tensor(&f, "b", "U8", shape, 1, n);
		ck_assert_msg(h_pattern_diff(a, n, 1000 + 2 * (uint64_t)r) == n, "rank %d a", r);
		ck_assert_msg(h_pattern_diff(b, n, 1001 + 2 * (uint64_t)r) == n, "rank %d b", r);
		ck_assert_str_eq(stf_meta(&f, "dsckpt.rank"), h_path("%d", r));
		stf_free(&f);
	}
	ck_assert_str_eq(file_text(h_path("%s/mr/latest", D->root)), "global_step5");
	ctl_verify(dir);
	dsckpt_close(c);
	d_stop();
}
END_TEST

/* A 100 MB save through a 16 MiB cache streams through it. */
START_TEST(test_bigger_than_cache)
{
	d_start(CACHE_16M, CHUNK_1M);
	const char *dir = h_path("%s/big/t1", D->root);
	dsckpt_conn_t *c = conn_open("big", 0, 1);
	void *mem;
	dsckpt_save_t *s = save_pattern(c, dir, "rank0", 100 * MIB + 12345, 5, &mem);
	wait_level(c, s, DSCKPT_DURABLE, 120000);
	dsckpt_progress_t pr;
	CK_DS(c, dsckpt_save_progress(s, &pr));
	ck_assert_int_ge(pr.level, DSCKPT_DURABLE);
	ck_assert_uint_eq(pr.bytes_total, 100 * MIB + 12345);
	ck_assert_uint_eq(pr.bytes_flushed, pr.bytes_total);
	CK_DS(c, dsckpt_commit(c, dir, 30000));
	check_pattern_file(dir, "rank0", 100 * MIB + 12345, 5);
	dsckpt_save_free(s);
	dsckpt_host_free(mem);
	dsckpt_close(c);
	d_stop();
}
END_TEST

/* Three saves begun and ended on one connection before waiting for any. */
START_TEST(test_saves_in_flight)
{
	d_start(CACHE_16M, CHUNK_1M);
	const char *dir = h_path("%s/inf/t1", D->root);
	dsckpt_conn_t *c = conn_open("inf", 0, 1);
	dsckpt_save_t *s[3];
	void *mem[3];
	static const char *files[3] = {"rank0", "optim", "extra"};

	for (int i = 0; i < 3; i++)
		s[i] = save_pattern(c, dir, files[i], 8 * MIB + (size_t)i, 20 + (uint64_t)i,
				    &mem[i]);
	for (int i = 2; i >= 0; i--)
		wait_level(c, s[i], DSCKPT_DURABLE, 60000);
	CK_DS(c, dsckpt_commit(c, dir, 30000));
	for (int i = 0; i < 3; i++) {
		check_pattern_file(dir, files[i], 8 * MIB + (size_t)i, 20 + (uint64_t)i);
		dsckpt_save_free(s[i]);
		dsckpt_host_free(mem[i]);
	}
	dsckpt_close(c);
	d_stop();
}
END_TEST

/* A finished save is answered long after (its WAIT over a minute later: a commit some long
 * steps on) while its client is connected and it is among the client's 64 newest (the 65th
 * is forgotten), and pending lists it only for its minute. */
START_TEST(test_wait_long_after)
{
	d_start(CACHE_16M, CHUNK_1M);
	const char *dir = h_path("%s/late/t1", D->root);
	char others[PATH_MAX];
	snprintf(others, sizeof(others), "%s/late/t0", D->root);
	dsckpt_conn_t *c = conn_open("late", 0, 1);
	void *mem, *omem[64];
	char *out = NULL, file[16];
	dsckpt_save_t *o[64];
	for (int i = 0; i < 64; i++) {	/* the oldest, then 63 more before s */
		snprintf(file, sizeof(file), "f%d", i);
		o[i] = save_pattern(c, others, file, 4096, 100 + (uint64_t)i, &omem[i]);
		wait_level(c, o[i], DSCKPT_DURABLE, 60000);
	}
	dsckpt_save_t *s = save_pattern(c, dir, "rank0", MIB, 31, &mem);

	wait_level(c, s, DSCKPT_DURABLE, 60000);
	CK_DS(c, dsckpt_commit(c, dir, 30000));
	ck_assert_int_eq(ctl(&out, "pending"), 0);
	ck_assert_msg(out && strstr(out, dir), "pending misses the save:\n%s", out ? out : "");
	free(out);
	sleep(75);	/* the daemon forgets finished saves a minute after, every 10 s */
	int rc = dsckpt_wait(s, DSCKPT_COMMITTED, 1000);
	ck_assert_msg(rc == DSCKPT_COMMITTED, "a wait 75 s after: %s: %s", dsckpt_err_name(rc),
		      dsckpt_last_error(c));
	ck_assert_int_eq(dsckpt_wait(o[1], DSCKPT_DURABLE, 1000), DSCKPT_DURABLE);
	ck_assert_int_eq(dsckpt_wait(o[0], DSCKPT_DURABLE, 1000), DSCKPT_ENOENT);
	ck_assert_int_eq(ctl(&out, "pending"), 0);
	ck_assert_msg(out && !strstr(out, dir), "pending lists a save kept for its client:\n%s",
		      out ? out : "");
	free(out);
	for (int i = 0; i < 64; i++) {
		dsckpt_save_free(o[i]);
		dsckpt_host_free(omem[i]);
	}
	dsckpt_save_free(s);
	dsckpt_host_free(mem);
	dsckpt_close(c);
	d_stop();
}
END_TEST

/* After wait(SNAPSHOT) the trainer overwrites its tensor; the file keeps the old bytes. */
START_TEST(test_lazy_snapshot)
{
	d_start(CACHE_32M, CHUNK_1M);
	const char *dir = h_path("%s/lazy/t1", D->root);
	dsckpt_conn_t *c = conn_open("lazy", 0, 1);
	void *mem;
	dsckpt_save_t *s = save_pattern(c, dir, "rank0", 24 * MIB, 7, &mem);
	wait_level(c, s, DSCKPT_SNAPSHOT, 30000);
	h_pattern_fill(mem, 24 * MIB, 8); /* the optimizer step */
	wait_level(c, s, DSCKPT_DURABLE, 30000);
	check_pattern_file(dir, "rank0", 24 * MIB, 7);
	dsckpt_save_free(s);
	dsckpt_host_free(mem);
	dsckpt_close(c);
	d_stop();
}
END_TEST

/* A thread waiting on one save of a connection (an upload thread's DURABLE wait), or
 * committing a directory through it. */
struct waiter {
	dsckpt_save_t *s;
	dsckpt_conn_t *c;        /* commit_main: the connection and directory */
	char dir[1024];
	int rc;
	atomic_int done;
};

/* Waits for COMMITTED, which comes once the test commits (a generous bound: no timing). */
static void *wait_main(void *arg)
{
	struct waiter *w = arg;

	w->rc = dsckpt_wait(w->s, DSCKPT_COMMITTED, 600000);
	atomic_store(&w->done, 1);
	return NULL;
}

/* While one thread waits on a connection, another saves and commits through it: the wait
 * holds the connection a slice at a time, so the save is handed over before the wait ends
 * (an order: the wait can only end with the commit made after the save). */
START_TEST(test_wait_shares_connection)
{
	d_start(CACHE_16M, CHUNK_1M);
	const char *dir = h_path("%s/share/t1", D->root);
	dsckpt_conn_t *c = conn_open("share", 0, 1);
	struct waiter w = {0};
	void *mem[2];
	pthread_t th;

	w.s = save_pattern(c, dir, "rank0", MIB, 1, &mem[0]);
	wait_level(c, w.s, DSCKPT_DURABLE, 30000);
	ck_assert_int_eq(pthread_create(&th, NULL, wait_main, &w), 0);
	h_sleep_ms(100);	/* the waiter is blocked in its WAIT */
	ck_assert(!atomic_load(&w.done));
	dsckpt_save_t *s = save_pattern(c, dir, "optim", MIB, 2, &mem[1]);
	wait_level(c, s, DSCKPT_DURABLE, 120000);
	ck_assert_msg(!atomic_load(&w.done), "the wait ended before the commit: %s",
		      w.rc < 0 ? dsckpt_err_name(w.rc) : dsckpt_level_name(w.rc));
	CK_DS(c, dsckpt_commit(c, dir, 120000));
	pthread_join(th, NULL);
	ck_assert_int_eq(w.rc, DSCKPT_COMMITTED);
	check_pattern_file(dir, "optim", MIB, 2);
	dsckpt_save_free(s);
	dsckpt_save_free(w.s);
	dsckpt_host_free(mem[0]);
	dsckpt_host_free(mem[1]);
	dsckpt_close(c);
	d_stop();
}
END_TEST

/* A thread committing a directory whose save is still open: it commits once the test ends
 * that save (a generous bound: no timing). */
static void *commit_main(void *arg)
{
	struct waiter *w = arg;

	w->rc = dsckpt_commit(w->c, w->dir, 600000);
	atomic_store(&w->done, 1);
	return NULL;
}

/* While one thread's COMMIT waits for durability, another saves and commits through the
 * connection; the waiting COMMIT ends only once its save is ended and durable (an order). */
START_TEST(test_commit_shares_connection)
{
	d_start(CACHE_16M, CHUNK_1M);
	dsckpt_conn_t *c = conn_open("share", 0, 1);
	struct waiter w = {.c = c};
	const char *dir = h_path("%s/share/other", D->root);
	dsckpt_save_t *open_save, *s;
	void *mem;
	pthread_t th;

	snprintf(w.dir, sizeof(w.dir), "%s/share/open", D->root);
	CK_DS(c, dsckpt_save_begin(c, w.dir, "rank0", &open_save));	/* never ended */
	ck_assert_int_eq(pthread_create(&th, NULL, commit_main, &w), 0);
	h_sleep_ms(100);
	ck_assert(!atomic_load(&w.done));
	s = save_pattern(c, dir, "rank0", MIB, 3, &mem);
	wait_level(c, s, DSCKPT_DURABLE, 120000);
	CK_DS(c, dsckpt_commit(c, dir, 120000));
	ck_assert_msg(!atomic_load(&w.done), "the other commit ended before its save: %s",
		      dsckpt_err_name(w.rc));
	ck_assert(!h_exists(h_path("%s/MANIFEST.json", w.dir)));
	ck_assert(h_exists(h_path("%s/MANIFEST.json", dir)));
	/* Now the open save ends: the waiting COMMIT commits it. */
	int64_t shape[1] = {(int64_t)MIB};
	CK_DS(c, dsckpt_add_tensor(open_save, "t", "U8", shape, 1, mem, MIB));
	CK_DS(c, dsckpt_save_end(open_save));
	pthread_join(th, NULL);
	ck_assert_msg(w.rc == 0, "the waiting commit: %s", dsckpt_err_name(w.rc));
	ck_assert(h_exists(h_path("%s/MANIFEST.json", w.dir)));
	check_pattern_file(w.dir, "rank0", MIB, 3);
	dsckpt_save_free(open_save);
	dsckpt_save_free(s);
	dsckpt_host_free(mem);
	dsckpt_close(c);
	d_stop();
}
END_TEST

/* Builds the suite: one test case per group, each with a time limit that fits it. */
static Suite *daemon_save_suite(void)
{
	Suite *s = suite_create("daemon save");
	h_add_case(s, "round trip", test_round_trip, 30, 1);
	h_add_case(s, "ranks", test_ranks, 60, 1);
	h_add_case(s, "bigger than cache", test_bigger_than_cache, 90, 1);
	h_add_case(s, "saves in flight", test_saves_in_flight, 60, 1);
	h_add_case(s, "wait long after", test_wait_long_after, 150, 1);
	h_add_case(s, "lazy snapshot", test_lazy_snapshot, 30, 1);
	h_add_case(s, "wait shares the connection", test_wait_shares_connection, 30, 1);
	h_add_case(s, "commit shares the connection", test_commit_shares_connection, 30, 1);
	return s;
}

CHECK_MAIN(daemon_save_suite)
