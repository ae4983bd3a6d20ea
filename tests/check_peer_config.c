/* check_peer_config.c — the peer copies' configuration (config_peer.c): defaults that change
 * nothing for a single node, the secret file's checks (owner, mode, length, never in a
 * message), replica_root checked as a root and kept apart from the allowed roots. */
#include "../daemon/dsckptd.h"
#include "harness.h"

#include <check.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SECRET "0123456789abcdef0123456789abcdef-cluster-secret"

static char dir[256];    /* scratch: dir/root (allowed root), dir/rep, the config, secret */
static char path[512];   /* dir/c.json */
static char secret[512]; /* dir/secret */
static struct config *cfg;
static char err[4096];

/* Writes text into file with mode, replacing it. */
static void put(const char *file, const char *text, mode_t mode)
{
	unlink(file);
	int fd = open(file, O_WRONLY | O_CREAT | O_EXCL, mode);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	ck_assert_int_eq(fchmod(fd, mode), 0);
	close(fd);
}

/* Creates the scratch directory, a root, a replica directory and a good secret file. */
static void setup(void)
{
	h_tmpdir(dir, sizeof(dir));
	snprintf(path, sizeof(path), "%s/c.json", dir);
	snprintf(secret, sizeof(secret), "%s/secret", dir);
	log_init("check_peer_config", LOG_LVL_ERROR);
	ck_assert_int_eq(mkdir(h_path("%s/root", dir), 0755), 0);
	ck_assert_int_eq(mkdir(h_path("%s/rep", dir), 0700), 0);
	put(secret, SECRET "\n", 0600);
}

/* Frees the config and removes the scratch directory. */
static void teardown(void)
{
	config_free(cfg);
	cfg = NULL;
	h_rm_rf(dir);
}

/* Loads a config of the allowed root dir/root and the keys in fmt (JSON members, printf);
 * config_load's result. No message may carry the secret. */
static int __attribute__((format(printf, 1, 2))) load(const char *fmt, ...)
{
	char keys[2048], text[4096];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(keys, sizeof(keys), fmt, ap);
	va_end(ap);
	snprintf(text, sizeof(text), "{\"socket\": \"%s/s\", \"allowed_roots\": [\"%s/root\"], "
		 "\"host_cache_size\": 0.0625, \"chunk_size\": 1%s%s}", dir, dir,
		 keys[0] ? ", " : "", keys);
	put(path, text, 0600);
	config_free(cfg);
	cfg = NULL;
	err[0] = '\0';
	int rc = config_load(path, &cfg, err, sizeof(err));
	ck_assert_int_eq(rc == 0, cfg != NULL);
	ck_assert_msg(strstr(err, "cluster-secret") == NULL, "%s", err);
	return rc;
}

START_TEST(test_defaults_off)
{
	ck_assert_int_eq(load("%s", ""), 0);
	ck_assert_uint_eq(cfg->replicas, 1);
	ck_assert_uint_eq(cfg->peer_port, 18540);
	ck_assert_str_eq(cfg->peer_secret_file, "");
	ck_assert_ptr_null(cfg->peer_secret);
	ck_assert_str_eq(cfg->replica_root, "");
	ck_assert_uint_eq(cfg->replica_cache_bytes, 1ull << 30);
	/* Without a secret nothing is sent nor listened for, whatever replicas says. */
	ck_assert_int_eq(config_peer_on(cfg), 0);
}
END_TEST

START_TEST(test_on)
{
	ck_assert_int_eq(load("\"replicas\": 2, \"peer_port\": 7000, \"peer_secret_file\": "
			      "\"%s\", \"replica_cache_size\": 0.5, \"replica_root\": "
			      "\"%s/./rep\"", secret, dir), 0);
	ck_assert_int_eq(config_peer_on(cfg), 1);
	ck_assert_uint_eq(cfg->replicas, 2);
	ck_assert_uint_eq(cfg->peer_port, 7000);
	ck_assert_uint_eq(cfg->peer_secret_len, strlen(SECRET)); /* newline cut */
	ck_assert_int_eq(memcmp(cfg->peer_secret, SECRET, strlen(SECRET)), 0);
	ck_assert_uint_eq(cfg->replica_cache_bytes, 1ull << 29);
	ck_assert_str_eq(cfg->replica_root, h_path("%s/rep", dir)); /* canonical */
	/* replicas 0 turns copies off even with a secret. */
	ck_assert_int_eq(load("\"replicas\": 0, \"peer_secret_file\": \"%s\"", secret), 0);
	ck_assert_int_eq(config_peer_on(cfg), 0);
}
END_TEST

START_TEST(test_secret_checks)
{
	put(secret, SECRET, 0640);
	ck_assert_int_eq(load("\"peer_secret_file\": \"%s\"", secret), -1);
	ck_assert_msg(strstr(err, "has mode 0640") && strstr(err, "chmod 600"), "%s", err);
	put(secret, SECRET, 0604);
	ck_assert_int_eq(load("\"peer_secret_file\": \"%s\"", secret), -1);
	ck_assert_msg(strstr(err, "has mode 0604"), "%s", err);
	put(secret, "short-secret \n", 0600);
	ck_assert_int_eq(load("\"peer_secret_file\": \"%s\"", secret), -1);
	ck_assert_msg(strstr(err, "holds 12 bytes") && strstr(err, "at least 16"), "%s", err);
	ck_assert_int_eq(load("\"peer_secret_file\": \"relative/secret\""), -1);
	ck_assert_msg(strstr(err, "not an absolute path"), "%s", err);
	ck_assert_int_eq(load("\"peer_secret_file\": \"%s/missing\"", dir), -1);
	ck_assert_msg(strstr(err, "peer_secret_file"), "%s", err);
	/* A link is refused, not followed. */
	put(secret, SECRET, 0600);
	ck_assert_int_eq(symlink(secret, h_path("%s/link", dir)), 0);
	ck_assert_int_eq(load("\"peer_secret_file\": \"%s/link\"", dir), -1);
	ck_assert_msg(strstr(err, "peer_secret_file"), "%s", err);
}
END_TEST

START_TEST(test_secret_owner)
{
	uid_t uid;
	gid_t gid;
	if (geteuid() != 0 || h_user("nobody", &uid, &gid) != 0) {
		printf("SKIP: test_secret_owner needs root and the user nobody\n");
		return;
	}
	ck_assert_int_eq(chown(secret, uid, gid), 0);
	ck_assert_int_eq(load("\"peer_secret_file\": \"%s\"", secret), -1);
	ck_assert_msg(strstr(err, "is owned by uid") && strstr(err, "chown"), "%s", err);
}
END_TEST

START_TEST(test_replica_root)
{
	ck_assert_int_eq(load("\"replica_root\": \"rep\""), -1);
	ck_assert_msg(strstr(err, "not an absolute path"), "%s", err);
	ck_assert_int_eq(load("\"replica_root\": \"%s/none\"", dir), -1);
	ck_assert_msg(strstr(err, "No such file or directory"), "%s", err);
	ck_assert_int_eq(load("\"replica_root\": \"%s\"", secret), -1);
	ck_assert_msg(strstr(err, "must be a directory"), "%s", err);
	ck_assert_int_eq(chmod(h_path("%s/rep", dir), 0777), 0);
	ck_assert_int_eq(load("\"replica_root\": \"%s/rep\"", dir), -1);
	ck_assert_msg(strstr(err, "group and others may not write"), "%s", err);
	/* Inside an allowed root, or holding one: refused. */
	ck_assert_int_eq(mkdir(h_path("%s/root/rep", dir), 0700), 0);
	ck_assert_int_eq(load("\"replica_root\": \"%s/root/rep\"", dir), -1);
	ck_assert_msg(strstr(err, "overlaps the allowed root"), "%s", err);
	ck_assert_int_eq(chmod(dir, 0700), 0);
	ck_assert_int_eq(load("\"replica_root\": \"%s\"", dir), -1);
	ck_assert_msg(strstr(err, "overlaps the allowed root"), "%s", err);
}
END_TEST

START_TEST(test_ranges)
{
	ck_assert_int_eq(load("\"replicas\": 9"), -1);
	ck_assert_msg(strstr(err, "replicas"), "%s", err);
	ck_assert_int_eq(load("\"peer_port\": 0"), -1);
	ck_assert_msg(strstr(err, "peer_port"), "%s", err);
	ck_assert_int_eq(load("\"replica_cache_size\": -1"), -1);
	ck_assert_msg(strstr(err, "replica_cache_size"), "%s", err);
}
END_TEST

/* The suite. */
static Suite *peer_config_suite(void)
{
	Suite *s = suite_create("peer_config");
	TCase *tc = tcase_create("peer_config");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_defaults_off);
	tcase_add_test(tc, test_on);
	tcase_add_test(tc, test_secret_checks);
	tcase_add_test(tc, test_secret_owner);
	tcase_add_test(tc, test_replica_root);
	tcase_add_test(tc, test_ranges);
	suite_add_tcase(s, tc);
	return s;
}

CHECK_MAIN(peer_config_suite)
