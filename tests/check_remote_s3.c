/*
 * check_remote_s3.c — remote.c's S3 tier (remote_s3.c) against a real S3-compatible server:
 * moto's standalone server, started on 127.0.0.1 by the suite (tests/moto.h). Conditional
 * writes and a race between two writers, a 40 MiB multipart upload in parallel parts read
 * back by ranges, aborted and left-over uploads, virtual-hosted addressing, a listing of more
 * names than one page holds, followed page by page. The failures are
 * check_remote_s3_faults.c's. Without moto each test says SKIP.
 */
#include "../daemon/remote_int.h"
#include "harness.h"
#include "moto.h"

#include <check.h>
#include <curl/curl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char err[ERRLEN];

START_TEST(test_conditional_put)
{
	NEED_MOTO();
	struct config *c = test_cfg(moto_shared.port, 0);
	make_bucket(moto_shared.port, "cond");
	struct remote *r = open_remote(c, "s3://cond/team/ckpt");
	char e1[REMOTE_ETAG_MAX], e2[REMOTE_ETAG_MAX], buf[16] = "";
	uint64_t size;

	ck_assert_msg(remote_check(r, err, sizeof(err)) == 0, "%s", err);
	ck_assert_msg(remote_put(r, "job/latest", "tag-1", 5, REMOTE_CREATE, NULL, e1, err,
				 sizeof(err)) == 0, "%s", err);
	ck_assert_int_gt(strlen(e1), 2);
	ck_assert_int_eq(remote_put(r, "job/latest", "tag-X", 5, REMOTE_CREATE, NULL, NULL, err,
				    sizeof(err)), ERR_EEXIST);
	ck_assert_msg(strstr(err, "precondition failed (HTTP 412)"), "%s", err);
	ck_assert_int_eq(remote_put(r, "job/latest", "tag-X", 5, REMOTE_REPLACE, "\"0000\"",
				    NULL, err, sizeof(err)), ERR_EEXIST);
	ck_assert_msg(remote_put(r, "job/latest", "tag-2", 5, REMOTE_REPLACE, e1, e2, err,
				 sizeof(err)) == 0, "%s", err);
	ck_assert_str_ne(e1, e2);
	/* The old etag no longer matches: latest moves only from what the writer saw. */
	ck_assert_int_eq(remote_put(r, "job/latest", "tag-1", 5, REMOTE_REPLACE, e1, NULL, err,
				    sizeof(err)), ERR_EEXIST);
	ck_assert_msg(remote_get(r, "job/latest", 0, buf, 5, err, sizeof(err)) == 0, "%s", err);
	ck_assert_str_eq(buf, "tag-2");
	ck_assert_msg(remote_head(r, "job/latest", &size, e1, err, sizeof(err)) == 0, "%s", err);
	ck_assert_uint_eq(size, 5);
	ck_assert_str_eq(e1, e2);
	/* Under the prefix, as the key says. */
	ck_assert_int_eq(raw(moto_shared.port, "GET", "/cond/team/ckpt/job/latest", NULL, buf,
			     sizeof(buf)), 200);
	ck_assert_str_eq(buf, "tag-2");
	ck_assert_msg(remote_delete(r, "job/latest", err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(remote_head(r, "job/latest", &size, NULL, err, sizeof(err)), ERR_ENOENT);
	ck_assert_int_eq(remote_get(r, "job/latest", 0, buf, 5, err, sizeof(err)), ERR_ENOENT);
	/* Keys naming anything outside the prefix are refused before any request. */
	ck_assert_int_eq(remote_put(r, "../x", "a", 1, REMOTE_ANY, NULL, NULL, err, sizeof(err)),
			 ERR_EINVAL);
	ck_assert_int_eq(remote_put(r, "a//b", "a", 1, REMOTE_ANY, NULL, NULL, err, sizeof(err)),
			 ERR_EINVAL);
	remote_close(r);
	config_free(c);
}
END_TEST

/* One of two racing writers. */
struct racer {
	struct remote *r;
	const char *key;
	char data[8];
	pthread_barrier_t *go;
	int rc;
	char err[ERRLEN];
};

/* Writes the racer's data with If-None-Match once both are ready. */
static void *race(void *arg)
{
	struct racer *w = arg;
	pthread_barrier_wait(w->go);
	w->rc = remote_put(w->r, w->key, w->data, 8, REMOTE_CREATE, NULL, NULL, w->err,
			   sizeof(w->err));
	return NULL;
}

START_TEST(test_race_create)
{
	NEED_MOTO();
	struct config *c = test_cfg(moto_shared.port, 0);
	make_bucket(moto_shared.port, "race");
	struct remote *r = open_remote(c, "s3://race");

	for (int round = 0; round < 10; round++) {
		pthread_barrier_t go;
		struct racer w[2] = { { .r = r }, { .r = r } };
		pthread_t t[2];
		char key[64], got[9] = "";
		snprintf(key, sizeof(key), "job/tag%d/manifest", round);
		pthread_barrier_init(&go, NULL, 2);
		for (int i = 0; i < 2; i++) {
			w[i].key = key;
			w[i].go = &go;
			snprintf(w[i].data, sizeof(w[i].data), "writer%d", i);
			pthread_create(&t[i], NULL, race, &w[i]);
		}
		for (int i = 0; i < 2; i++)
			pthread_join(t[i], NULL);
		pthread_barrier_destroy(&go);
		int won = w[0].rc == 0 ? 0 : 1;
		ck_assert_msg((w[0].rc == 0) + (w[1].rc == 0) == 1, "round %d: %d (%s), %d (%s)",
			      round, w[0].rc, w[0].err, w[1].rc, w[1].err);
		ck_assert_msg(w[!won].rc == ERR_EEXIST, "%s", w[!won].err);
		ck_assert_msg(remote_get(r, key, 0, got, 8, err, sizeof(err)) == 0, "%s", err);
		ck_assert_msg(memcmp(got, w[won].data, 8) == 0, "round %d: the loser's bytes",
			      round);
	}
	remote_close(r);
	config_free(c);
}
END_TEST

START_TEST(test_multipart_ranges)
{
	NEED_MOTO();
	struct config *c = test_cfg(moto_shared.port, 0);
	make_bucket(moto_shared.port, "multi");
	struct remote *r = open_remote(c, "s3://multi/p");
	size_t n = 40 * MIB + 12345;
	char *data = malloc(n), *back = malloc(n);
	struct remote_src src = { mem_read, data, n };
	struct found f;
	uint64_t size;

	h_pattern_fill(data, n, 33);
	double t0 = h_now_us();
	ck_assert_msg(remote_upload(r, "job/t1/rank0.safetensors", &src, err, sizeof(err)) == 0,
		      "%s", err);
	double t1 = h_now_us();
	ck_assert_msg(remote_head(r, "job/t1/rank0.safetensors", &size, NULL, err,
				  sizeof(err)) == 0, "%s", err);
	ck_assert_uint_eq(size, n);
	/* moto answers a multipart object's etag as "<md5 of md5s>-<parts>": 9 parts. */
	memset(back, 0, n);
	ck_assert_msg(remote_get(r, "job/t1/rank0.safetensors", 0, back, n, err,
				 sizeof(err)) == 0, "%s", err);
	double t2 = h_now_us();
	ck_assert_int_eq(h_pattern_diff(back, n, 33), n);
	printf("moto on loopback, 40 MiB in 5 MiB parts, 4 in flight: upload %.0f MB/s, "
	       "ranged read %.0f MB/s\n", n / (t1 - t0), n / (t2 - t1));
	static const size_t ranges[][2] = { { 1, 1 }, { 5 * MIB - 3, 7 }, { 17 * MIB + 5, 11 * MIB },
					    { 40 * MIB + 12340, 5 } };
	for (size_t i = 0; i < 4; i++) {
		memset(back, 0, ranges[i][1]);
		ck_assert_msg(remote_get(r, "job/t1/rank0.safetensors", ranges[i][0], back,
					 ranges[i][1], err, sizeof(err)) == 0, "%s", err);
		ck_assert_int_eq(memcmp(back, data + ranges[i][0], ranges[i][1]), 0);
	}
	/* Past the end: a clear error, not short data. */
	ck_assert_int_ne(remote_get(r, "job/t1/rank0.safetensors", n - 2, back, 4, err,
				    sizeof(err)), 0);
	ck_assert_int_eq(open_uploads(r, &f), 0);
	remote_close(r);
	config_free(c);
	free(data);
	free(back);
}
END_TEST

/* A source that fails at its third part. */
static int failing_read(void *arg, uint64_t off, void *buf, size_t len)
{
	memset(buf, 7, len);
	return off >= 10 * MIB ? ERR_EIO : 0;
}

START_TEST(test_abort)
{
	NEED_MOTO();
	struct config *c = test_cfg(moto_shared.port, 0);
	make_bucket(moto_shared.port, "abort");
	struct remote *r = open_remote(c, "s3://abort/pre");
	struct remote_src src = { failing_read, NULL, 30 * MIB };
	struct found f;
	char body[4096];
	uint64_t size;

	/* A failed upload aborts its multipart upload: nothing stays open, no object. */
	ck_assert_int_eq(remote_upload(r, "job/t/f", &src, err, sizeof(err)), ERR_EIO);
	ck_assert_msg(strstr(err, "reading the source failed"), "%s", err);
	ck_assert_int_eq(open_uploads(r, &f), 0);
	ck_assert_int_eq(remote_head(r, "job/t/f", &size, NULL, err, sizeof(err)), ERR_ENOENT);
	/* An upload left open (a daemon killed mid-upload) is found and aborted. */
	ck_assert_int_eq(raw(moto_shared.port, "POST", "/abort/pre/job/t2/g?uploads=", "", body,
			     sizeof(body)), 200);
	ck_assert_int_eq(raw(moto_shared.port, "POST", "/abort/elsewhere?uploads=", "", body,
			     sizeof(body)), 200);
	ck_assert_int_eq(open_uploads(r, &f), 1);  /* not the one outside the prefix */
	ck_assert_str_eq(f.key, "job/t2/g");
	ck_assert_msg(remote_abort(r, f.key, f.id, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(open_uploads(r, &f), 0);
	ck_assert_int_eq(remote_abort(r, "job/t2/g", "nosuchid", err, sizeof(err)), ERR_ENOENT);
	remote_close(r);
	config_free(c);
}
END_TEST

START_TEST(test_virtual_addressing)
{
	NEED_MOTO();
	struct config *c = test_cfg(moto_shared.port, 1);  /* bucket.localhost: curl resolves it */
	make_bucket(moto_shared.port, "virt");
	char logpath[64] = "/tmp/check_remote_s3.log.XXXXXX", buf[4] = "", want[128];
	int saved = capture_begin(logpath);
	struct remote *r = open_remote(c, "s3://virt/a/b");
	int checked = remote_check(r, err, sizeof(err));
	int put = remote_put(r, "k", "abc", 3, REMOTE_ANY, NULL, NULL, err, sizeof(err));
	char *log = capture_end(logpath, saved);
	ck_assert_msg(checked == 0 && put == 0, "%s", err);
	/* The bucket in the host name, the prefix and key in the path. */
	snprintf(want, sizeof(want), "PUT http://virt.localhost:%d/a/b/k: HTTP 200", moto_shared.port);
	ck_assert_msg(strstr(log, want), "%s", log);
	ck_assert_int_eq(raw(moto_shared.port, "GET", "/virt/a/b/k", NULL, buf, sizeof(buf)), 200);
	ck_assert_str_eq(buf, "abc");
	free(log);
	remote_close(r);
	config_free(c);
}
END_TEST

/* remote_list's callback: counts names into arg (an int[2]: all, and those of "d*"). */
static int count_name(void *arg, const char *name)
{
	int *n = arg;
	n[0]++;
	n[1] += name[0] == 'd';
	return 0;
}

/* ListObjectsV2 with 2 keys a page: 7 objects and 3 prefixes below "page" come in 5 pages
 * (continuation tokens), each name once. (moto ignores max-uploads: ListMultipartUploads'
 * pages are check_remote_orphans.c's, re-paged by tests/s3_proxy.py.) */
START_TEST(test_list_pages)
{
	NEED_MOTO();
	struct config *c = test_cfg(moto_shared.port, 0);
	make_bucket(moto_shared.port, "pages");
	struct remote *r = open_remote(c, "s3://pages/pre");
	char key[64], logpath[64] = "/tmp/check_remote_s3.log.XXXXXX";
	int n[2] = {0, 0};

	for (int i = 0; i < 7; i++) {
		snprintf(key, sizeof(key), "page/f%d", i);
		ck_assert_msg(remote_put(r, key, "x", 1, REMOTE_ANY, NULL, NULL, err,
					 sizeof(err)) == 0, "%s", err);
	}
	for (int i = 0; i < 3; i++) {
		snprintf(key, sizeof(key), "page/d%d/inside", i);
		ck_assert_msg(remote_put(r, key, "x", 1, REMOTE_ANY, NULL, NULL, err,
					 sizeof(err)) == 0, "%s", err);
	}
	r->list_keys = 2;
	log_init("check_remote_s3", LOG_LVL_DEBUG);
	int saved = capture_begin(logpath);
	int rc = remote_list(r, "page", count_name, n, err, sizeof(err));
	char *log = capture_end(logpath, saved);
	log_init("check_remote_s3", LOG_LVL_ERROR);
	ck_assert_msg(rc == 0, "%s", err);
	ck_assert_int_eq(n[0], 10);
	ck_assert_int_eq(n[1], 3);
	int pages = 0;
	for (const char *p = log; (p = strstr(p, "list-type=2")) != NULL; p++)
		pages++;
	ck_assert_msg(pages == 5, "%d pages: %s", pages, log);
	free(log);
	remote_close(r);
	config_free(c);
}
END_TEST

/* Once, in the runner before the tests: quiet logs, then moto_shared_up. */
static void shared_up(void)
{
	log_init("check_remote_s3", LOG_LVL_ERROR);
	moto_shared_up();
}

/* The suite. */
static Suite *remote_s3_suite(void)
{
	Suite *s = suite_create("remote_s3");
	TCase *tc = tcase_create("remote_s3");
	tcase_add_unchecked_fixture(tc, shared_up, moto_shared_down);
	tcase_set_timeout(tc, 240);
	tcase_add_test(tc, test_conditional_put);
	tcase_add_test(tc, test_race_create);
	tcase_add_test(tc, test_multipart_ranges);
	tcase_add_test(tc, test_abort);
	tcase_add_test(tc, test_virtual_addressing);
	tcase_add_test(tc, test_list_pages);
	suite_add_tcase(s, tc);
	return s;
}

CHECK_MAIN(remote_s3_suite)
