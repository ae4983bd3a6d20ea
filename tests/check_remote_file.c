/*
 * check_remote_file.c — remote.c's file:// tier (remote_file.c), through the same calls as
 * the S3 tier: conditional writes and two racing writers, a 40 MiB upload read back by
 * ranges, temporary files of a killed writer found and removed, a full filesystem (a small
 * tmpfs, as root), the directory check, and keys that could leave the directory refused.
 */
#include "../daemon/dsckptd.h"
#include "harness.h"

#include <check.h>
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#define MIB (1024u * 1024u)

static char dir[256];       /* scratch directory: the shared directory's stand-in */
static char url[300];       /* file://dir */
static struct config cfg = { .upload_concurrency = 4, .upload_part_bytes = 5 * MIB,
			     .file_mode = 0600, .dir_mode = 0700 };
static char err[ERRLEN];

/* Makes the scratch directory. */
static void setup(void)
{
	log_init("check_remote_file", LOG_LVL_ERROR);
	h_tmpdir(dir, sizeof(dir));
	snprintf(url, sizeof(url), "file://%s", dir);
}

/* Removes it. */
static void teardown(void)
{
	h_rm_rf(dir);
}

/* Opens the tier at u. */
static struct remote *open_remote(const char *u)
{
	struct remote *r;
	ck_assert_msg(remote_open(&cfg, u, &r, err, sizeof(err)) == 0, "%s", err);
	return r;
}

/* Reads from a memory buffer. */
static int mem_read(void *arg, uint64_t off, void *buf, size_t len)
{
	memcpy(buf, (const char *)arg + off, len);
	return 0;
}

/* Counts the uploads a listing finds, remembering the last. */
struct found {
	int n;
	char key[256], id[256];
};

/* remote_list_uploads' callback. */
static int count_upload(void *arg, const char *key, const char *id)
{
	struct found *f = arg;
	f->n++;
	snprintf(f->key, sizeof(f->key), "%s", key);
	snprintf(f->id, sizeof(f->id), "%s", id);
	return 0;
}

/* How many temporary files are left under r. */
static int open_uploads(struct remote *r, struct found *f)
{
	memset(f, 0, sizeof(*f));
	ck_assert_msg(remote_list_uploads(r, "", count_upload, f, err, sizeof(err)) == 0, "%s",
		      err);
	return f->n;
}

START_TEST(test_conditional_put)
{
	struct remote *r = open_remote(url);
	char e1[REMOTE_ETAG_MAX], e2[REMOTE_ETAG_MAX], buf[8] = "";
	uint64_t size;
	struct found f;

	ck_assert_msg(remote_check(r, err, sizeof(err)) == 0, "%s", err);
	ck_assert_msg(remote_put(r, "job/latest", "tag-1", 5, REMOTE_CREATE, NULL, e1, err,
				 sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(remote_put(r, "job/latest", "tag-X", 5, REMOTE_CREATE, NULL, NULL, err,
				    sizeof(err)), ERR_EEXIST);
	ck_assert_msg(strstr(err, "another writer was first"), "%s", err);
	ck_assert_int_eq(remote_put(r, "job/latest", "tag-X", 5, REMOTE_REPLACE, "\"0\"", NULL,
				    err, sizeof(err)), ERR_EEXIST);
	ck_assert_msg(remote_put(r, "job/latest", "tag-2", 5, REMOTE_REPLACE, e1, e2, err,
				 sizeof(err)) == 0, "%s", err);
	ck_assert_str_ne(e1, e2);
	ck_assert_int_eq(remote_put(r, "job/latest", "tag-1", 5, REMOTE_REPLACE, e1, NULL, err,
				    sizeof(err)), ERR_EEXIST);
	ck_assert_msg(remote_get(r, "job/latest", 0, buf, 5, err, sizeof(err)) == 0, "%s", err);
	ck_assert_str_eq(buf, "tag-2");
	ck_assert_msg(remote_head(r, "job/latest", &size, e1, err, sizeof(err)) == 0, "%s", err);
	ck_assert_uint_eq(size, 5);
	ck_assert_str_eq(e1, e2);
	char *onfs = h_read_file(h_path("%s/job/latest", dir), NULL);
	ck_assert_str_eq(onfs, "tag-2");
	free(onfs);
	ck_assert_int_eq(open_uploads(r, &f), 0);  /* no temporary file left by a loser */
	ck_assert_msg(remote_delete(r, "job/latest", err, sizeof(err)) == 0, "%s", err);
	ck_assert_msg(remote_delete(r, "job/latest", err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(remote_head(r, "job/latest", &size, NULL, err, sizeof(err)), ERR_ENOENT);
	ck_assert_int_eq(remote_get(r, "job/latest", 0, buf, 5, err, sizeof(err)), ERR_ENOENT);
	static const char *const bad[] = { "../x", "a//b", "/abs", "a/./b", "a/..", "",
					   "a/.b.dsckpt-upload-1", "sp ace" };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		ck_assert_int_eq(remote_put(r, bad[i], "a", 1, REMOTE_ANY, NULL, NULL, err,
					    sizeof(err)), ERR_EINVAL);
	remote_close(r);
}
END_TEST

/* One of two racing writers. */
struct racer {
	struct remote *r;
	const char *key;
	char data[8];
	pthread_barrier_t *go;
	int rc;
};

/* Writes the racer's data, create-only, once both are ready. */
static void *race(void *arg)
{
	struct racer *w = arg;
	pthread_barrier_wait(w->go);
	w->rc = remote_put(w->r, w->key, w->data, 8, REMOTE_CREATE, NULL, NULL, NULL, 0);
	return NULL;
}

START_TEST(test_race_create)
{
	struct remote *r = open_remote(url);
	for (int round = 0; round < 50; round++) {
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
		ck_assert_msg((w[0].rc == 0) + (w[1].rc == 0) == 1, "round %d: %d, %d", round,
			      w[0].rc, w[1].rc);
		int won = w[0].rc == 0 ? 0 : 1;
		ck_assert_int_eq(w[!won].rc, ERR_EEXIST);
		ck_assert_msg(remote_get(r, key, 0, got, 8, err, sizeof(err)) == 0, "%s", err);
		ck_assert_int_eq(memcmp(got, w[won].data, 8), 0);
	}
	remote_close(r);
}
END_TEST

START_TEST(test_upload_ranges)
{
	struct remote *r = open_remote(url);
	size_t n = 40 * MIB + 12345;
	char *data = malloc(n), *back = malloc(n);
	struct remote_src src = { mem_read, data, n };
	struct found f;
	uint64_t size;

	h_pattern_fill(data, n, 5);
	ck_assert_msg(remote_upload(r, "job/t1/rank0.safetensors", &src, err, sizeof(err)) == 0,
		      "%s", err);
	ck_assert_msg(remote_head(r, "job/t1/rank0.safetensors", &size, NULL, err,
				  sizeof(err)) == 0, "%s", err);
	ck_assert_uint_eq(size, n);
	ck_assert_msg(remote_get(r, "job/t1/rank0.safetensors", 0, back, n, err,
				 sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(h_pattern_diff(back, n, 5), n);
	ck_assert_msg(remote_get(r, "job/t1/rank0.safetensors", 17 * MIB + 3, back, 9 * MIB, err,
				 sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(memcmp(back, data + 17 * MIB + 3, 9 * MIB), 0);
	ck_assert_int_eq(remote_get(r, "job/t1/rank0.safetensors", n - 2, back, 4, err,
				    sizeof(err)), ERR_EIO);
	ck_assert_msg(strstr(err, "shorter"), "%s", err);
	struct stat st;
	ck_assert_int_eq(stat(h_path("%s/job/t1/rank0.safetensors", dir), &st), 0);
	ck_assert_uint_eq(st.st_mode & 0777, 0600);
	ck_assert_int_eq(open_uploads(r, &f), 0);
	remote_close(r);
	free(data);
	free(back);
}
END_TEST

START_TEST(test_leftover_uploads)
{
	struct remote *r = open_remote(url);
	struct found f;

	/* What a writer killed mid-upload leaves: a temporary file beside the key. */
	ck_assert_int_eq(mkdir(h_path("%s/job", dir), 0700), 0);
	ck_assert_int_eq(mkdir(h_path("%s/job/t", dir), 0700), 0);
	int fd = open(h_path("%s/job/t/.rank0.safetensors.dsckpt-upload-00ff", dir),
		      O_WRONLY | O_CREAT, 0600);
	ck_assert_int_ge(fd, 0);
	close(fd);
	ck_assert_int_eq(open_uploads(r, &f), 1);
	ck_assert_str_eq(f.key, "job/t/rank0.safetensors");
	ck_assert_str_eq(f.id, ".rank0.safetensors.dsckpt-upload-00ff");
	ck_assert_int_eq(remote_list_uploads(r, "job/other", count_upload, &f, err, sizeof(err)),
			 0);
	ck_assert_int_eq(remote_abort(r, f.key, "../../x", err, sizeof(err)), ERR_EINVAL);
	ck_assert_int_eq(remote_abort(r, "job/t/other", f.id, err, sizeof(err)), ERR_EINVAL);
	ck_assert_msg(remote_abort(r, f.key, f.id, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(open_uploads(r, &f), 0);
	/* One directly in the directory (a job's latest). */
	fd = open(h_path("%s/.latest.dsckpt-upload-01", dir), O_WRONLY | O_CREAT, 0600);
	ck_assert_int_ge(fd, 0);
	close(fd);
	ck_assert_int_eq(open_uploads(r, &f), 1);
	ck_assert_str_eq(f.key, "latest");
	ck_assert_msg(remote_abort(r, f.key, f.id, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(open_uploads(r, &f), 0);
	remote_close(r);
}
END_TEST

START_TEST(test_full_filesystem)
{
	char small[300];
	if (geteuid() != 0) {
		printf("SKIP: test_full_filesystem needs root (a tmpfs of 1 MiB)\n");
		return;
	}
	snprintf(small, sizeof(small), "%s/small", dir);
	ck_assert_int_eq(mkdir(small, 0700), 0);
	ck_assert_int_eq(mount("tmpfs", small, "tmpfs", 0, "size=1m"), 0);
	char u[400];
	snprintf(u, sizeof(u), "file://%s", small);
	struct remote *r = open_remote(u);
	size_t n = 4 * MIB;
	char *data = calloc(1, n);
	struct remote_src src = { mem_read, data, n };
	struct found f;
	int rc = remote_upload(r, "job/t/big", &src, err, sizeof(err));
	ck_assert_msg(rc == ERR_ENOSPC && strstr(err, "the shared filesystem is full"), "%d %s",
		      rc, err);
	ck_assert(remote_retryable(rc));
	ck_assert_int_eq(open_uploads(r, &f), 0);  /* the temporary file went */
	ck_assert(!h_exists(h_path("%s/job/t/big", small)));
	/* Room again: the same call succeeds. */
	src.size = 256 * 1024;
	ck_assert_msg(remote_upload(r, "job/t/big", &src, err, sizeof(err)) == 0, "%s", err);
	remote_close(r);
	free(data);
	umount(small);
}
END_TEST

START_TEST(test_check)
{
	char u[400];
	struct remote *r;

	snprintf(u, sizeof(u), "file://%s/missing", dir);
	r = open_remote(u);
	ck_assert_int_eq(remote_check(r, err, sizeof(err)), ERR_ENOENT);
	ck_assert_msg(strstr(err, "does not exist (mount the shared filesystem, or create it)"),
		      "%s", err);
	ck_assert(!remote_retryable(ERR_ENOENT));
	remote_close(r);
	ck_assert_int_eq(close(open(h_path("%s/file", dir), O_WRONLY | O_CREAT, 0600)), 0);
	snprintf(u, sizeof(u), "file://%s/file", dir);
	r = open_remote(u);
	ck_assert_int_eq(remote_check(r, err, sizeof(err)), ERR_EINVAL);
	ck_assert_msg(strstr(err, "is not a directory"), "%s", err);
	remote_close(r);
	ck_assert_int_eq(remote_open(&cfg, "file://relative", &r, err, sizeof(err)), ERR_EINVAL);
	ck_assert_int_eq(remote_open(&cfg, "ftp://x/y", &r, err, sizeof(err)), ERR_EINVAL);
	/* s3:// without credentials is refused at open. */
	ck_assert_int_eq(remote_open(&cfg, "s3://bkt/p", &r, err, sizeof(err)), ERR_EACCES);
}
END_TEST

START_TEST(test_bandwidth_cap)
{
	struct config capped = cfg;
	struct remote *r;
	size_t n = 24 * MIB;
	char *data = calloc(1, n);
	struct remote_src src = { mem_read, data, n };

	/* 8 MiB/s, a second's worth of burst at most: 24 MiB cannot take under 2 s. Only a
	 * lower bound is asserted (a busy machine makes it slower, never faster). */
	capped.upload_max_mib_per_s = 8;
	ck_assert_msg(remote_open(&capped, url, &r, err, sizeof(err)) == 0, "%s", err);
	double t0 = h_now_us();
	ck_assert_msg(remote_upload(r, "job/t/capped", &src, err, sizeof(err)) == 0, "%s", err);
	double s = (h_now_us() - t0) / 1e6;
	printf("24 MiB under a cap of 8 MiB/s: %.2f s, %.1f MiB/s\n", s, 24 / s);
	ck_assert_msg(s >= 1.9, "%.2f s: the cap was not held", s);
	remote_close(r);
	free(data);
}
END_TEST

/* The suite. */
static Suite *remote_file_suite(void)
{
	Suite *s = suite_create("remote_file");
	TCase *tc = tcase_create("remote_file");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_conditional_put);
	tcase_add_test(tc, test_race_create);
	tcase_add_test(tc, test_upload_ranges);
	tcase_add_test(tc, test_leftover_uploads);
	tcase_add_test(tc, test_full_filesystem);
	tcase_add_test(tc, test_check);
	tcase_add_test(tc, test_bandwidth_cap);
	suite_add_tcase(s, tc);
	return s;
}

CHECK_MAIN(remote_file_suite)
