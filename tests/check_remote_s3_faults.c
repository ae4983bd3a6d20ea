/*
 * check_remote_s3_faults.c — remote.c's S3 tier when things go wrong, against moto's server
 * on 127.0.0.1 (tests/moto.h): a missing bucket and an unreachable endpoint, credentials
 * moto refuses (its IAM checks on: curl's signatures are verified), a server killed
 * mid-upload (an error that may be retried, and the retry succeeds), no credential in a log
 * line or a message, and `dsckptd -n` checking each root's remote. Without moto each test
 * says SKIP.
 */
#include "../daemon/dsckptd.h"
#include "harness.h"
#include "moto.h"

#include <check.h>
#include <curl/curl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char err[ERRLEN];

START_TEST(test_missing_bucket_unreachable)
{
	NEED_MOTO();
	struct config *c = test_cfg(moto_shared.port, 0);
	struct remote *r = open_remote(c, "s3://no-such-bucket/p");
	char buf[4];

	ck_assert_int_eq(remote_check(r, err, sizeof(err)), ERR_ENOENT);
	ck_assert_msg(strstr(err, "bucket 'no-such-bucket' does not exist at 127.0.0.1:") &&
		      strstr(err, "NoSuchBucket"), "%s", err);
	ck_assert(!remote_retryable(ERR_ENOENT));
	ck_assert_int_eq(remote_put(r, "a", "x", 1, REMOTE_ANY, NULL, NULL, err, sizeof(err)),
			 ERR_ENOENT);
	remote_close(r);
	config_free(c);

	c = test_cfg(free_port(), 0);
	r = open_remote(c, "s3://bkt");
	int rc = remote_check(r, err, sizeof(err));
	ck_assert_msg(rc == ERR_EIO && strstr(err, "unreachable") &&
		      strstr(err, "127.0.0.1"), "%d %s", rc, err);
	ck_assert(remote_retryable(rc));
	ck_assert_int_eq(remote_get(r, "k", 0, buf, 4, err, sizeof(err)), ERR_EIO);
	remote_close(r);
	config_free(c);
}
END_TEST

/* The value of XML element tag in s into out. */
static void xml_value(const char *s, const char *tag, char *out, size_t outlen)
{
	char open[64];
	snprintf(open, sizeof(open), "<%s>", tag);
	const char *a = strstr(s, open);
	ck_assert_ptr_nonnull(a);
	a += strlen(open);
	snprintf(out, outlen, "%.*s", (int)(strchr(a, '<') - a), a);
}

START_TEST(test_credentials)
{
	NEED_MOTO();
	struct moto m;
	char body[8192], key[128], secret[128];
	ck_assert_msg(moto_start(&m, 0, 4) == 0, "moto did not start (%s)", m.log);
	/* The first four requests are free: a user with every right, its keys, a bucket. */
	ck_assert_int_eq(raw(m.port, "POST", "/", "Action=CreateUser&UserName=u&Version="
			     "2010-05-08", body, sizeof(body)), 200);
	ck_assert_int_eq(raw(m.port, "POST", "/", "Action=PutUserPolicy&UserName=u&PolicyName="
			     "all&PolicyDocument=%7B%22Version%22%3A%222012-10-17%22%2C%22Statement"
			     "%22%3A%5B%7B%22Effect%22%3A%22Allow%22%2C%22Action%22%3A%22*%22%2C%22"
			     "Resource%22%3A%22*%22%7D%5D%7D&Version=2010-05-08", body,
			     sizeof(body)), 200);
	ck_assert_int_eq(raw(m.port, "POST", "/", "Action=CreateAccessKey&UserName=u&Version="
			     "2010-05-08", body, sizeof(body)), 200);
	xml_value(body, "AccessKeyId", key, sizeof(key));
	xml_value(body, "SecretAccessKey", secret, sizeof(secret));
	make_bucket(m.port, "auth");

	/* Good keys: moto checks curl's signature on every request. */
	struct config *c = test_cfg(m.port, 0);
	free(c->s3_key_id);
	free(c->s3_secret);
	free(c->s3_token);
	c->s3_token = NULL;
	c->s3_key_id = strdup(key);
	c->s3_secret = strdup(secret);
	struct remote *r = open_remote(c, "s3://auth/p");
	char buf[8] = "";
	ck_assert_msg(remote_check(r, err, sizeof(err)) == 0, "%s", err);
	ck_assert_msg(remote_put(r, "job/t/a", "signed", 6, REMOTE_CREATE, NULL, NULL, err,
				 sizeof(err)) == 0, "%s", err);
	ck_assert_msg(remote_get(r, "job/t/a", 0, buf, 6, err, sizeof(err)) == 0, "%s", err);
	ck_assert_str_eq(buf, "signed");
	remote_close(r);

	/* A wrong secret: refused, and said so. */
	free(c->s3_secret);
	c->s3_secret = strdup(SECRET);
	r = open_remote(c, "s3://auth/p");
	ck_assert_int_eq(remote_check(r, err, sizeof(err)), ERR_EACCES);
	ck_assert_msg(strstr(err, "access denied (HTTP 403 SignatureDoesNotMatch") &&
		      strstr(err, "credentials_file"), "%s", err);
	ck_assert_msg(!strstr(err, SECRET) && !strstr(err, secret), "%s", err);
	ck_assert(!remote_retryable(ERR_EACCES));
	remote_close(r);
	/* An unknown key id. */
	free(c->s3_key_id);
	c->s3_key_id = strdup(KEY_ID);
	r = open_remote(c, "s3://auth/p");
	ck_assert_int_eq(remote_put(r, "job/t/b", "x", 1, REMOTE_ANY, NULL, NULL, err,
				    sizeof(err)), ERR_EACCES);
	ck_assert_msg(strstr(err, "InvalidAccessKeyId"), "%s", err);
	remote_close(r);
	config_free(c);
	moto_kill(&m);
	unlink(m.log);
}
END_TEST

/* An upload running in a thread. */
struct bg_upload {
	struct remote *r;
	const struct remote_src *src;
	int rc;
	char err[ERRLEN];
};

/* Runs the upload. */
static void *bg_upload_main(void *arg)
{
	struct bg_upload *u = arg;
	u->rc = remote_upload(u->r, "job/t/big", u->src, u->err, sizeof(u->err));
	return NULL;
}

START_TEST(test_server_stopped_mid_upload)
{
	NEED_MOTO();
	struct moto m;
	ck_assert_msg(moto_start(&m, 0, -1) == 0, "moto did not start (%s)", m.log);
	make_bucket(m.port, "stop");
	struct config *c = test_cfg(m.port, 0);
	c->upload_max_mib_per_s = 4;  /* 40 MiB: ten seconds at least */
	struct remote *r = open_remote(c, "s3://stop/p");
	size_t n = 40 * MIB;
	char *data = malloc(n), *back = malloc(n);
	struct remote_src src = { mem_read, data, n };
	struct bg_upload u = { .r = r, .src = &src };
	struct found f;
	pthread_t t;

	h_pattern_fill(data, n, 9);
	pthread_create(&t, NULL, bg_upload_main, &u);
	/* Once the multipart upload exists, the server goes. */
	int seen = 0;
	for (int i = 0; i < 600 && !seen; i++) {
		struct remote *probe = open_remote(c, "s3://stop/p");
		memset(&f, 0, sizeof(f));
		seen = remote_list_uploads(probe, "", count_upload, &f, err, sizeof(err)) == 0 &&
		       f.n > 0;
		remote_close(probe);
		if (!seen)
			h_sleep_ms(50);
	}
	ck_assert_msg(seen, "the upload never started");
	moto_kill(&m);
	pthread_join(t, NULL);
	ck_assert_msg(u.rc != 0 && remote_retryable(u.rc), "%d: %s", u.rc, u.err);
	ck_assert_msg(strstr(u.err, "unreachable"), "%s", u.err);
	printf("server killed mid-upload: %s\n", u.err);

	/* The server back (empty: moto keeps nothing), the same call succeeds. */
	ck_assert_msg(moto_start(&m, m.port, -1) == 0, "moto did not restart (%s)", m.log);
	make_bucket(m.port, "stop");
	c->upload_max_mib_per_s = 0;
	remote_close(r);
	r = open_remote(c, "s3://stop/p");
	ck_assert_msg(remote_upload(r, "job/t/big", &src, err, sizeof(err)) == 0, "%s", err);
	ck_assert_msg(remote_get(r, "job/t/big", 0, back, n, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(h_pattern_diff(back, n, 9), n);
	ck_assert_int_eq(open_uploads(r, &f), 0);
	remote_close(r);
	config_free(c);
	moto_kill(&m);
	unlink(m.log);
	free(data);
	free(back);
}
END_TEST

START_TEST(test_no_secret_logged)
{
	NEED_MOTO();
	char logpath[64] = "/tmp/check_remote_s3.log.XXXXXX", big[6 * MIB / 4];
	int saved = capture_begin(logpath);
	struct config *c = test_cfg(moto_shared.port, 0);
	make_bucket(moto_shared.port, "quiet");
	struct remote *r = open_remote(c, "s3://quiet");
	struct remote_src src = { mem_read, big, sizeof(big) };
	char msgs[8][ERRLEN];
	memset(big, 1, sizeof(big));
	remote_check(r, msgs[0], ERRLEN);
	remote_put(r, "a", "x", 1, REMOTE_CREATE, NULL, NULL, msgs[1], ERRLEN);
	remote_put(r, "a", "x", 1, REMOTE_CREATE, NULL, NULL, msgs[2], ERRLEN);
	remote_upload(r, "b", &src, msgs[3], ERRLEN);
	remote_get(r, "nope", 0, big, 1, msgs[4], ERRLEN);
	remote_close(r);
	r = open_remote(c, "s3://missing-bucket");
	remote_check(r, msgs[5], ERRLEN);
	remote_close(r);
	config_free(c);
	c = test_cfg(free_port(), 0);
	r = open_remote(c, "s3://x-y-z");
	remote_check(r, msgs[6], ERRLEN);
	remote_close(r);
	config_free(c);
	char *log = capture_end(logpath, saved);
	ck_assert_msg(strstr(log, "s3: PUT http://127.0.0.1:"), "debug lines missing: %s", log);
	ck_assert_msg(!strstr(log, SECRET) && !strstr(log, TOKEN) && !strstr(log, KEY_ID),
		      "%s", log);
	for (int i = 0; i < 7; i++)
		ck_assert_msg(!strstr(msgs[i], SECRET) && !strstr(msgs[i], TOKEN) &&
			      !strstr(msgs[i], KEY_ID), "%s", msgs[i]);
	free(log);
}
END_TEST

/* Runs dsckptd -n on a config of roots (JSON entries) and an s3 object at port; its exit
 * status, and its output in out. */
static int check_config(const char *dir, const char *roots, int port, char *out, size_t outlen)
{
	char path[400], cred[400], cmd[1200];
	snprintf(cred, sizeof(cred), "%s/cred", dir);
	snprintf(path, sizeof(path), "%s/c.json", dir);
	FILE *f = fopen(cred, "w");
	ck_assert_ptr_nonnull(f);
	fprintf(f, "[default]\naws_access_key_id = " KEY_ID "\naws_secret_access_key = " SECRET
		"\n");
	fclose(f);
	ck_assert_int_eq(chmod(cred, 0600), 0);
	f = fopen(path, "w");
	ck_assert_ptr_nonnull(f);
	fprintf(f, "{\"allowed_roots\": [%s], \"s3\": {\"endpoint\": "
		"\"http://127.0.0.1:%d\", \"addressing\": \"path\", \"credentials_file\": \"%s\"}}",
		roots, port, cred);
	fclose(f);
	snprintf(cmd, sizeof(cmd), "%s -n -c %s 2>&1", h_bin("dsckptd"), path);
	FILE *p = popen(cmd, "r");
	ck_assert_ptr_nonnull(p);
	size_t n = fread(out, 1, outlen - 1, p);
	out[n] = '\0';
	int st = pclose(p);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

START_TEST(test_dsckptd_check)
{
	NEED_MOTO();
	char dir[256], roots[2048], out[8192];
	h_tmpdir(dir, sizeof(dir));
	make_bucket(moto_shared.port, "good");
	ck_assert_int_eq(mkdir(h_path("%s/shared", dir), 0700), 0);
	for (const char *n = "abcde"; *n; n++)
		ck_assert_int_eq(mkdir(h_path("%s/%c", dir, *n), 0700), 0);
	snprintf(roots, sizeof(roots), "\"%s/a\", {\"path\": \"%s/b\", \"remote\": \"s3://good/p\"}, "
		 "{\"path\": \"%s/e\", \"remote\": \"file://%s/shared\"}", dir, dir, dir, dir);
	ck_assert_msg(check_config(dir, roots, moto_shared.port, out, sizeof(out)) == 0, "%s", out);
	ck_assert_str_eq(out, "configuration OK\n");

	/* A missing bucket, a missing directory: one line each, naming the root. */
	snprintf(roots, sizeof(roots), "{\"path\": \"%s/b\", \"remote\": \"s3://good/p\"}, "
		 "{\"path\": \"%s/c\", \"remote\": \"s3://gone/p\"}, "
		 "{\"path\": \"%s/d\", \"remote\": \"file://%s/nowhere\"}", dir, dir, dir, dir);
	ck_assert_int_eq(check_config(dir, roots, moto_shared.port, out, sizeof(out)), 1);
	ck_assert_msg(strstr(out, h_path("root %s/c: remote 's3://gone/p': bucket check: bucket "
					 "'gone' does not exist", dir)) &&
		      strstr(out, h_path("root %s/d: remote 'file://%s/nowhere': directory", dir,
					 dir)), "%s", out);
	int lines = 0;
	for (const char *p = out; *p; p++)
		lines += *p == '\n';
	ck_assert_msg(lines == 2 && !strstr(out, "configuration OK"), "%s", out);

	/* An endpoint where nothing answers. */
	snprintf(roots, sizeof(roots), "{\"path\": \"%s/b\", \"remote\": \"s3://good/p\"}", dir);
	ck_assert_int_eq(check_config(dir, roots, free_port(), out, sizeof(out)), 1);
	ck_assert_msg(strstr(out, "unreachable") && !strstr(out, SECRET), "%s", out);
	h_rm_rf(dir);
}
END_TEST

/* Once, in the runner before the tests: quiet logs, then moto_shared_up. */
static void shared_up(void)
{
	log_init("check_remote_s3_faults", LOG_LVL_ERROR);
	moto_shared_up();
}

/* The suite. */
static Suite *remote_s3_faults_suite(void)
{
	Suite *s = suite_create("remote_s3_faults");
	TCase *tc = tcase_create("remote_s3_faults");
	tcase_add_unchecked_fixture(tc, shared_up, moto_shared_down);
	tcase_set_timeout(tc, 240);
	tcase_add_test(tc, test_missing_bucket_unreachable);
	tcase_add_test(tc, test_credentials);
	tcase_add_test(tc, test_server_stopped_mid_upload);
	tcase_add_test(tc, test_no_secret_logged);
	tcase_add_test(tc, test_dsckptd_check);
	suite_add_tcase(s, tc);
	return s;
}

CHECK_MAIN(remote_s3_faults_suite)
