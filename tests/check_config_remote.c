/* check_config_remote.c — the remote tier's configuration (config_remote.c): roots given as
 * {path, remote}, the "s3" object, the upload keys and the credentials file's checks. */
#include "../daemon/dsckptd.h"
#include "harness.h"

#include <check.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SECRET "wJalrXUtnFEMI/K7MDENG/bPxRfiCYSECRETKEY"
#define TOKEN "FwoGZXIvYXdzEXAMPLETOKEN"

static char dir[256];   /* scratch directory: the roots, the config, the credentials */
static char path[512];  /* dir/c.json */
static char cred[512];  /* dir/cred */
static struct config *cfg;
static char err[4096];

/* Creates the scratch directory and a good credentials file (0600, ours). */
static void setup(void)
{
	h_tmpdir(dir, sizeof(dir));
	snprintf(path, sizeof(path), "%s/c.json", dir);
	snprintf(cred, sizeof(cred), "%s/cred", dir);
	log_init("check_config_remote", LOG_LVL_ERROR);
	int fd = open(cred, O_WRONLY | O_CREAT | O_EXCL, 0600);
	ck_assert_int_ge(fd, 0);
	dprintf(fd, "# comment\n[other]\naws_access_key_id = NOTME\n\n[default]\n"
		"aws_access_key_id = AKIDEXAMPLE\naws_secret_access_key=" SECRET "\n"
		"  aws_session_token =  " TOKEN "  \n");
	close(fd);
}

/* Frees the config and removes the scratch directory. */
static void teardown(void)
{
	config_free(cfg);
	cfg = NULL;
	h_rm_rf(dir);
}

/* Writes a config (printf format) and loads it; config_load's result. No message may carry
 * a secret. */
static int __attribute__((format(printf, 1, 2))) load(const char *fmt, ...)
{
	char text[4096];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(text, sizeof(text), fmt, ap);
	va_end(ap);
	FILE *f = fopen(path, "w");
	ck_assert_ptr_nonnull(f);
	fputs(text, f);
	fclose(f);
	config_free(cfg);
	int rc = config_load(path, &cfg, err, sizeof(err));
	ck_assert_int_eq(rc == 0, cfg != NULL);
	ck_assert_msg(strstr(err, SECRET) == NULL && strstr(err, TOKEN) == NULL, "%s", err);
	return rc;
}

/* Number of lines in err. */
static int err_lines(void)
{
	int n = err[0] != '\0';
	for (const char *p = err; *p; p++)
		n += *p == '\n';
	return n;
}

START_TEST(test_defaults)
{
	ck_assert_msg(load("{\"allowed_roots\": [\"%s\"]}", dir) == 0, "%s", err);
	ck_assert_ptr_null(cfg->root_remotes[0]);
	ck_assert_str_eq(cfg->s3_endpoint, "");
	ck_assert_str_eq(cfg->s3_region, "us-east-1");
	ck_assert_int_eq(cfg->s3_virtual, 1);
	ck_assert_str_eq(cfg->s3_credentials_file, "");
	ck_assert_ptr_null(cfg->s3_key_id);
	ck_assert_uint_eq(cfg->upload_concurrency, 8);
	ck_assert_uint_eq(cfg->upload_part_bytes, 64 << 20);
	ck_assert(cfg->upload_max_mib_per_s == 0);
	ck_assert_uint_eq(cfg->keep_last_remote, 0);
}
END_TEST

START_TEST(test_object_roots)
{
	char a[600], b[600], real[PATH_MAX];
	snprintf(a, sizeof(a), "%s/a", dir);
	snprintf(b, sizeof(b), "%s/b", dir);
	ck_assert_int_eq(mkdir(a, 0755), 0);
	ck_assert_int_eq(mkdir(b, 0755), 0);
	ck_assert_msg(load("{\"allowed_roots\": [\"%s\", {\"path\": \"%s\", \"remote\": "
			   "\"s3://my-bucket.1/team/ckpt\"}, {\"remote\": \"file:///shared/ckpt\","
			   " \"path\": \"%s\"}, {\"path\": \"%s\"}],"
			   " \"s3\": {\"endpoint\": \"http://127.0.0.1:9000\", \"region\": "
			   "\"eu-west-3\", \"addressing\": \"path\", \"credentials_file\": \"%s\"},"
			   " \"upload_concurrency\": 16, \"upload_part_size\": 8,"
			   " \"upload_max_mib_per_s\": 12.5, \"keep_last_remote\": 3}",
			   dir, a, b, dir, cred) == 0, "%s", err);
	ck_assert_uint_eq(cfg->n_roots, 4);
	ck_assert_ptr_nonnull(realpath(a, real));
	ck_assert_str_eq(cfg->allowed_roots[1], real);
	ck_assert_ptr_null(cfg->root_remotes[0]);
	ck_assert_str_eq(cfg->root_remotes[1], "s3://my-bucket.1/team/ckpt");
	ck_assert_str_eq(cfg->root_remotes[2], "file:///shared/ckpt");
	ck_assert_ptr_null(cfg->root_remotes[3]);
	ck_assert_str_eq(cfg->s3_endpoint, "http://127.0.0.1:9000");
	ck_assert_str_eq(cfg->s3_region, "eu-west-3");
	ck_assert_int_eq(cfg->s3_virtual, 0);
	ck_assert_str_eq(cfg->s3_key_id, "AKIDEXAMPLE");  /* [default], not [other] */
	ck_assert_str_eq(cfg->s3_secret, SECRET);
	ck_assert_str_eq(cfg->s3_token, TOKEN);
	ck_assert_uint_eq(cfg->upload_concurrency, 16);
	ck_assert_uint_eq(cfg->upload_part_bytes, 8 << 20);
	ck_assert(cfg->upload_max_mib_per_s == 12.5);
	ck_assert_uint_eq(cfg->keep_last_remote, 3);
}
END_TEST

START_TEST(test_bad_entries)
{
	static const struct {
		const char *entry, *want;
	} cases[] = {
		{ "{\"path\": \"%s\", \"remote\": \"http://x/y\"}", "expected s3://bucket/prefix" },
		{ "{\"path\": \"%s\", \"remote\": \"s3://ab\"}", "3 to 63 characters" },
		{ "{\"path\": \"%s\", \"remote\": \"s3://My_Bucket\"}", "lower-case letters" },
		{ "{\"path\": \"%s\", \"remote\": \"s3://bkt/a//b\"}", "between single '/'" },
		{ "{\"path\": \"%s\", \"remote\": \"s3://bkt/a/../b\"}", "no '.', '..'" },
		{ "{\"path\": \"%s\", \"remote\": \"s3://bkt/a/\"}", "trailing '/'" },
		{ "{\"path\": \"%s\", \"remote\": \"file://rel/dir\"}", "absolute directory" },
		{ "{\"path\": \"%s\", \"remote\": 5}", "\"remote\" must be a string" },
		{ "{\"remote\": \"file:///x\"}", "\"path\" must be a string" },
		{ "{\"path\": \"%s\", \"remot\": \"file:///x\"}", "unexpected key 'remot'" },
		{ "{\"path\": \"relative\", \"remote\": \"file:///x\"}", "not an absolute path" },
		{ "7", "expected a string or an object" },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char entry[512];
		snprintf(entry, sizeof(entry), cases[i].entry, dir);
		ck_assert_int_eq(load("{\"allowed_roots\": [\"%s\", %s]}", dir, entry), -1);
		ck_assert_msg(strstr(err, cases[i].want) != NULL && err_lines() == 1,
			      "%s: %s", entry, err);
		ck_assert_msg(strstr(err, "entry 2") || strstr(err, "relative"), "%s", err);
	}
}
END_TEST

START_TEST(test_bad_s3)
{
	static const struct {
		const char *s3, *want;
	} cases[] = {
		{ "{\"endpoint\": \"ftp://x\"}", "endpoint 'ftp://x': expected" },
		{ "{\"endpoint\": \"http://h:1/path\"}", "no path" },
		{ "{\"region\": \"US East\"}", "region 'US East' is not a region name" },
		{ "{\"addressing\": \"dns\"}", "addressing 'dns' is not" },
		{ "{\"credentials_file\": \"rel\"}", "not an absolute path" },
		{ "{\"region\": 5}", "'region' must be a string" },
		{ "{\"bucket\": \"x\"}", "unknown key 'bucket'" },
		{ "[]", "option 's3': expected an object, got an array" },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		ck_assert_int_eq(load("{\"allowed_roots\": [\"%s\"], \"s3\": %s}", dir,
				      cases[i].s3), -1);
		ck_assert_msg(strstr(err, cases[i].want) != NULL && err_lines() == 1,
			      "%s: %s", cases[i].s3, err);
	}
	/* Two mistakes, two lines. */
	ck_assert_int_eq(load("{\"allowed_roots\": [\"%s\"], \"s3\": {\"region\": \"\", "
			      "\"addressing\": \"x\"}}", dir), -1);
	ck_assert_int_eq(err_lines(), 2);
	ck_assert_int_eq(load("{\"allowed_roots\": [\"%s\"], \"upload_part_size\": 4}", dir),
			 -1);
	ck_assert_msg(strstr(err, "'upload_part_size': 4 is out of range [5, 5120]"), "%s", err);
}
END_TEST

START_TEST(test_s3_needs_credentials)
{
	ck_assert_int_eq(load("{\"allowed_roots\": [{\"path\": \"%s\", \"remote\": "
			      "\"s3://bkt/p\"}]}", dir), -1);
	ck_assert_msg(strstr(err, "the remote 's3://bkt/p' needs credentials_file") &&
		      err_lines() == 1, "%s", err);
	/* A file:// remote needs none. */
	ck_assert_msg(load("{\"allowed_roots\": [{\"path\": \"%s\", \"remote\": "
			   "\"file:///x\"}]}", dir) == 0, "%s", err);
}
END_TEST

/* Loads a config whose s3 credentials_file is file; config_load's result. */
static int load_cred(const char *file)
{
	return load("{\"allowed_roots\": [{\"path\": \"%s\", \"remote\": \"s3://bkt\"}], "
		    "\"s3\": {\"credentials_file\": \"%s\"}}", dir, file);
}

START_TEST(test_credentials_mode)
{
	static const mode_t bad[] = { 0644, 0640, 0604, 0620, 0602, 0660 };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		ck_assert_int_eq(chmod(cred, bad[i]), 0);
		ck_assert_int_eq(load_cred(cred), -1);
		ck_assert_msg(strstr(err, "group or others may read or write it (chmod 600") &&
			      err_lines() == 1, "%o: %s", bad[i], err);
	}
	ck_assert_int_eq(chmod(cred, 0400), 0);
	ck_assert_msg(load_cred(cred) == 0, "%s", err);
}
END_TEST

START_TEST(test_credentials_owner)
{
	uid_t uid;
	gid_t gid;
	if (geteuid() != 0 || h_user("dsckpt-atk", &uid, &gid) != 0) {
		printf("SKIP: test_credentials_owner needs root and useradd\n");
		return;
	}
	ck_assert_int_eq(chown(cred, uid, gid), 0);
	ck_assert_int_eq(load_cred(cred), -1);
	ck_assert_msg(strstr(err, "is owned by uid") && strstr(err, "not by the daemon's uid 0")
		      && err_lines() == 1, "%s", err);
}
END_TEST

START_TEST(test_credentials_unsafe)
{
	char lnk[600], fifo[600], none[600];
	snprintf(lnk, sizeof(lnk), "%s/lnk", dir);
	snprintf(fifo, sizeof(fifo), "%s/fifo", dir);
	snprintf(none, sizeof(none), "%s/cred-empty", dir);
	ck_assert_int_eq(symlink(cred, lnk), 0);
	ck_assert_int_eq(mkfifo(fifo, 0600), 0);
	int fd = open(none, O_WRONLY | O_CREAT, 0600);
	ck_assert_int_ge(fd, 0);
	dprintf(fd, "[default]\naws_access_key_id = AKID\n[x]\naws_secret_access_key = s\n");
	close(fd);

	ck_assert_int_eq(load_cred(lnk), -1);
	ck_assert_msg(strstr(err, "a symbolic link (not followed)") && err_lines() == 1, "%s",
		      err);
	ck_assert_int_eq(load_cred(fifo), -1); /* refused, without blocking */
	ck_assert_msg(strstr(err, "not a regular file: a FIFO"), "%s", err);
	ck_assert_int_eq(load_cred(none), -1);
	ck_assert_msg(strstr(err, "has no aws_access_key_id and aws_secret_access_key in "
			      "[default]") && err_lines() == 1, "%s", err);
	ck_assert_int_eq(load_cred("/nonexistent/cred"), -1);
	ck_assert_msg(strstr(err, "No such file or directory"), "%s", err);
}
END_TEST

START_TEST(test_help_lists_keys)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	config_print_help(f);
	fclose(f);
	ck_assert_msg(strstr(buf, "upload_concurrency") && strstr(buf, "keep_last_remote") &&
		      strstr(buf, "upload_max_mib_per_s") && strstr(buf, "  s3 "), "%s", buf);
	free(buf);
}
END_TEST

/* The suite. */
static Suite *config_remote_suite(void)
{
	Suite *s = suite_create("config_remote");
	TCase *tc = tcase_create("config_remote");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_defaults);
	tcase_add_test(tc, test_object_roots);
	tcase_add_test(tc, test_bad_entries);
	tcase_add_test(tc, test_bad_s3);
	tcase_add_test(tc, test_s3_needs_credentials);
	tcase_add_test(tc, test_credentials_mode);
	tcase_add_test(tc, test_credentials_owner);
	tcase_add_test(tc, test_credentials_unsafe);
	tcase_add_test(tc, test_help_lists_keys);
	suite_add_tcase(s, tc);
	return s;
}

CHECK_MAIN(config_remote_suite)
