/*
 * check_single.c — one daemon per socket and per root: a second dsckptd on the same config, or
 * on another config sharing a root, touches nothing (no recovery, no cache) and says why.
 * Real daemons on real sockets; the bait is a stale partial file that any recovery deletes.
 */
#include "harness_daemon.h"

#include <check.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

/* The stale partial file of the running test (d_plant_bait). */
static const char *bait;

/* Runs dsckptd -d -c config to its end (it must not start); returns its exit status and
 * leaves its stderr in out. */
static int start_second(const char *config, const char *out)
{
	return h_system("timeout 20 %s -d -c '%s' >'%s' 2>&1", h_bin("dsckptd"), config, out);
}

/* Starts dsckptd -d -c config (stderr into out), waits until it answers STATUS on socket,
 * then stops it; the exit status of that, 0 when it served. */
static int start_serving(const char *config, const char *socket, const char *out)
{
	char daemon[512];

	snprintf(daemon, sizeof(daemon), "%s", h_bin("dsckptd")); /* h_bin's buffer is reused */
	return h_system("timeout 20 sh -c \"%s -d -c '%s' >'%s' 2>&1 & "
			"for i in \\$(seq 200); do %s -s '%s' status >/dev/null 2>&1 && "
			"kill \\$! && wait && exit 0; sleep 0.05; done; exit 1\"",
			daemon, config, out, h_bin("dsckptctl"), socket);
}

/* Writes a copy of d's config with another socket (and root, when root is not NULL). */
static void config_variant(const struct hdaemon *d, const char *path, const char *socket,
			   const char *root)
{
	size_t len;
	char *cfg = h_read_file(d->config, &len);
	ck_assert_ptr_nonnull(cfg);
	FILE *f = fopen(path, "w");
	ck_assert_ptr_nonnull(f);
	for (char *p = cfg; *p;) {
		if (strncmp(p, d->socket, strlen(d->socket)) == 0) {
			fputs(socket, f);
			p += strlen(d->socket);
		} else if (root && strncmp(p, d->root, strlen(d->root)) == 0) {
			fputs(root, f);
			p += strlen(d->root);
		} else {
			fputc(*p++, f);
		}
	}
	fclose(f);
	free(cfg);
}

/* Writes a copy of the config at path with "host": host added. */
static void config_add_host(const char *path, const char *host)
{
	size_t len;
	char *cfg = h_read_file(path, &len);
	ck_assert_ptr_nonnull(cfg);
	char *brace = strchr(cfg, '{');
	ck_assert_ptr_nonnull(brace);
	FILE *f = fopen(path, "w");
	ck_assert_ptr_nonnull(f);
	fprintf(f, "{\n  \"host\": \"%s\",%s", host, brace + 1);
	fclose(f);
	free(cfg);
}

/* A trainer (a child) that saves 16 MiB files through the daemon, one after another, until
 * the file stop appears; it exits with the number of saves that became DURABLE. */
static pid_t busy_trainer(const char *stop)
{
	pid_t pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid)
		return pid;
	dsckpt_conn_t *c;
	size_t n = 16 * MIB;
	int64_t shape[1] = {(int64_t)n};
	void *mem = dsckpt_host_alloc(n);
	int done = 0;
	if (!mem || dsckpt_connect(D->socket, &c) < 0 || dsckpt_identify(c, "busy", 0, 1) < 0)
		_exit(0);
	while (!h_exists(stop) && done < 250) {
		dsckpt_save_t *s;
		h_pattern_fill(mem, n, 900 + (uint64_t)done);
		if (dsckpt_save_begin(c, h_path("%s/busy/t%03d", D->root, done), "rank0", &s) < 0 ||
		    dsckpt_add_tensor(s, "t", "U8", shape, 1, mem, n) < 0 ||
		    dsckpt_save_end(s) < 0 || dsckpt_wait(s, DSCKPT_DURABLE, 30000) < 0)
			_exit(done);
		dsckpt_save_free(s);
		done++;
	}
	_exit(done);
}

/* A second daemon on the same config, started 200 times against a running one busy with a
 * trainer's saves: each exits at once saying why, the bait every recovery deletes is still
 * there, and every save of the trainer is whole. */
START_TEST(test_same_config)
{
	char out[512], stop[512];
	int st;

	d_start(CACHE_8M, CHUNK_1M);
	bait = d_plant_bait(D->root);
	snprintf(out, sizeof(out), "%s/second.log", D->dir);
	snprintf(stop, sizeof(stop), "%s/stop", D->dir);
	pid_t trainer = busy_trainer(stop);
	for (int i = 0; i < 200; i++) {
		int rc = start_second(D->config, out);
		ck_assert_msg(rc != 0, "a second daemon on the same socket started (try %d)", i);
		ck_assert_msg(h_exists(bait), "the second daemon (try %d) ran recovery", i);
	}
	ck_assert_msg(h_file_has(out, "another dsckptd"), "no reason given");
	ck_assert_msg(!h_file_has(out, "recovery") && !h_file_has(out, "ready"),
		      "the second daemon went on past its locks");
	close(open(stop, O_CREAT | O_WRONLY, 0600));
	ck_assert_int_eq(waitpid(trainer, &st, 0), trainer);
	int saves = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
	ck_assert_msg(saves > 0, "the trainer's saves failed (status %d)", st);
	for (int i = 0; i < saves; i++)
		check_pattern_file(h_path("%s/busy/t%03d", D->root, i), "rank0", 16 * MIB,
				   900 + (uint64_t)i);
	printf("200 second daemons refused while %d saves of 16 MiB went through\n", saves);
	/* The first one still serves. */
	ck_assert_int_eq(h_system("%s -s '%s' status >/dev/null", h_bin("dsckptctl"), D->socket),
			 0);
	d_stop();
}
END_TEST

/* Another socket on the same root: refused, nothing touched. Another root: it starts. And
 * once the first daemon is gone the same config starts and its recovery takes the bait. */
START_TEST(test_shared_root)
{
	char cfg2[512], sock2[512], out[512], root3[512], cfg3[512], sock3[512];

	d_start(CACHE_8M, NULL);
	bait = d_plant_bait(D->root);
	snprintf(cfg2, sizeof(cfg2), "%s/second.json", D->dir);
	snprintf(sock2, sizeof(sock2), "%s/second.sock", D->dir);
	snprintf(out, sizeof(out), "%s/second.log", D->dir);
	config_variant(D, cfg2, sock2, NULL);
	ck_assert_int_ne(start_second(cfg2, out), 0);
	ck_assert_msg(h_file_has(out, "serves the root"), "no reason given");
	ck_assert(h_exists(bait));
	ck_assert(!h_exists(sock2));

	/* Another node's daemon (its own node name, as a simulated node on this machine) shares
	 * the root and starts; a stale partial that names no host is anyone's to remove. */
	char cfg4[512], sock4[512];
	snprintf(cfg4, sizeof(cfg4), "%s/node.json", D->dir);
	snprintf(sock4, sizeof(sock4), "%s/node.sock", D->dir);
	config_variant(D, cfg4, sock4, NULL);
	config_add_host(cfg4, "node-x");
	snprintf(out, sizeof(out), "%s/node.log", D->dir);
	ck_assert_msg(start_serving(cfg4, sock4, out) == 0, "another node's daemon did not start: "
		      "%s", h_read_file(out, NULL));
	ck_assert_msg(!h_exists(bait), "the other node's recovery did not run");
	bait = d_plant_bait(D->root);

	/* A daemon with its own root and socket is not held back. */
	snprintf(root3, sizeof(root3), "%s/other-root", D->dir);
	snprintf(sock3, sizeof(sock3), "%s/third.sock", D->dir);
	snprintf(cfg3, sizeof(cfg3), "%s/third.json", D->dir);
	ck_assert_int_eq(mkdir(root3, 0755), 0);
	config_variant(D, cfg3, sock3, root3);
	snprintf(out, sizeof(out), "%s/third.log", D->dir);
	ck_assert_msg(start_serving(cfg3, sock3, out) == 0, "a daemon of its own root did not "
		      "start: %s", h_read_file(out, NULL));
	ck_assert(h_exists(bait));

	/* The first daemon gone, the second config starts, and its recovery removes the bait:
	 * what the refused starts left alone, a real start would have deleted. */
	d_kill(SIGTERM);
	snprintf(out, sizeof(out), "%s/second.log", D->dir);
	ck_assert_msg(start_serving(cfg2, sock2, out) == 0, "the second config did not start "
		      "after the first daemon left: %s", h_read_file(out, NULL));
	ck_assert_msg(!h_exists(bait), "recovery of a real start kept the bait");
	h_rm_rf(D->dir);
}
END_TEST

/* The suite. */
static Suite *single_suite(void)
{
	Suite *s = suite_create("single");
	TCase *tc = tcase_create("single");
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_same_config);
	tcase_add_test(tc, test_shared_root);
	suite_add_tcase(s, tc);
	return s;
}

CHECK_MAIN(single_suite)
