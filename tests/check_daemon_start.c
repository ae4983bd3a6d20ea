/*
 * check_daemon_start.c — dsckptd started from a shell, as a user types it: in the background
 * the command returns once the daemon answers (status 0), or fails with its error and status 1
 * (a second daemon on the same config); --pidfile and --log; the terminal gets nothing once the
 * daemon is ready; a relative -c is still found at SIGHUP, and a failed reload is one log line.
 * Configuration mistakes are reported once, with the file named once. Real daemons on real
 * sockets; the test process is their subreaper, so that it reaps them and reads their status.
 */
#include "harness_daemon.h"

#include <check.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* Generous bound on things that happen "soon" on a loaded machine. */
#define SOON_MS 60000

/* A daemon started in the background: its scratch directory, as the harness lays it out. */
static struct hdaemon bg;

/* Makes a scratch directory with a config (socket, root, small cache) in bg; relative paths
 * inside it are what the commands use (they run in bg.dir). */
static void bg_config(void)
{
	memset(&bg, 0, sizeof(bg));
	h_tmpdir(bg.dir, sizeof(bg.dir));
	snprintf(bg.root, sizeof(bg.root), "%s/ckpt", bg.dir);
	snprintf(bg.socket, sizeof(bg.socket), "%s/d.sock", bg.dir);
	snprintf(bg.config, sizeof(bg.config), "%s/dsckptd.json", bg.dir);
	snprintf(bg.log, sizeof(bg.log), "%s/d.log", bg.dir);
	ck_assert_int_eq(mkdir(bg.root, 0755), 0);
	FILE *f = fopen(bg.config, "w");
	ck_assert_ptr_nonnull(f);
	fprintf(f, "{\"socket\": \"%s\", \"socket_mode\": \"0600\", \"allowed_roots\": [\"%s\"],\n"
		" \"host_cache_size\": %g, \"chunk_size\": 1, \"flush_threads\": 2}\n", bg.socket,
		bg.root, CACHE_16M);
	fclose(f);
	/* Orphans (the daemon, once the command exits) become this process's children. */
	ck_assert_int_eq(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
	h_daemon_note(&bg);
}

/* Runs `dsckptd ARGS` in bg.dir with stdout and stderr appended to bg.dir/term.out; its exit
 * status. */
static int __attribute__((format(printf, 1, 2))) bg_run(const char *fmt, ...)
{
	char args[1024], *bin = realpath(h_bin("dsckptd"), NULL);
	va_list ap;

	ck_assert_ptr_nonnull(bin);
	va_start(ap, fmt);
	vsnprintf(args, sizeof(args), fmt, ap);
	va_end(ap);
	int rc = h_system("cd '%s' && '%s' %s </dev/null >>term.out 2>&1", bg.dir, bin, args);
	free(bin);
	return rc;
}

/* The pid in bg.dir/d.pid (0 when missing). */
static pid_t bg_pid(void)
{
	return (pid_t)atoi(h_text(h_path("%s/d.pid", bg.dir)));
}

/* Waits (at most SOON_MS) until file holds words; whether it does. */
static int wait_text(const char *file, const char *words)
{
	for (int ms = 0; ms < SOON_MS; ms += 20) {
		if (strstr(h_text(file), words))
			return 1;
		h_sleep_ms(20);
	}
	return 0;
}

/* SIGTERM to the background daemon; reaps it (this process is its subreaper) and checks that
 * it exited 0 and took its pid file with it. */
static void bg_stop(void)
{
	pid_t pid = bg_pid();
	int st = 0;

	ck_assert_int_gt(pid, 0);
	ck_assert_int_eq(kill(pid, SIGTERM), 0);
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	bg.pid = 0;
	h_daemon_note(&bg);
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "dsckptd exited with status %d",
		      st);
	ck_assert_msg(!h_exists(h_path("%s/d.pid", bg.dir)), "the pid file outlived dsckptd");
	h_rm_rf(bg.dir);
}

/*
 * `dsckptd -c cfg` (relative) returns once the daemon answers: status and a save work at once;
 * its pid file names it; its standard descriptors are /dev/null from then on, and the log
 * file has the start-up lines and what came after. A second daemon on the same config exits 1
 * after its error, which names the first daemon's pid.
 */
START_TEST(test_background_ready)
{
	bg_config();
	int rc = bg_run("-c dsckptd.json --pidfile d.pid --log d.log");
	ck_assert_msg(rc == 0, "dsckptd exited %d: %s", rc,
		      h_text(h_path("%s/term.out", bg.dir)));
	pid_t pid = bg_pid();
	ck_assert_int_gt(pid, 0);
	bg.pid = pid;
	h_daemon_note(&bg);
	/* Ready when the command returned: the socket answers, at once. */
	int fd = h_connect(bg.socket);
	ck_assert_msg(fd >= 0, "nothing answers on %s after dsckptd returned", bg.socket);
	close(fd);
	ck_assert_int_eq(h_system("'%s' -s '%s' status >/dev/null", h_bin("dsckptctl"),
				  bg.socket), 0);
	ck_assert_str_eq(h_text(h_path("/proc/%d/comm", (int)pid)), "dsckptd\n");
	char link[256];
	for (int i = 0; i <= 2; i++) {
		ssize_t n = readlink(h_path("/proc/%d/fd/%d", (int)pid, i), link, sizeof(link) - 1);
		ck_assert_int_gt(n, 0);
		link[n] = '\0';
		ck_assert_msg(strcmp(link, "/dev/null") == 0, "fd %d of the daemon is %s", i, link);
	}
	const char *term = h_path("%s/term.out", bg.dir);
	ck_assert_msg(strstr(h_text(term), "ready on"), "the terminal did not see the start: %s",
		      h_text(term));
	ck_assert_msg(strstr(h_text(term), "the log goes to "), "%s", h_text(term));
	ck_assert_msg(strstr(h_text(bg.log), "ready on"), "log: %s", h_text(bg.log));

	/* A save through the library, on the socket the command left ready. */
	dsckpt_conn_t *c = NULL;
	ck_assert_int_eq(dsckpt_connect(bg.socket, &c), 0);
	CK_DS(c, dsckpt_identify(c, "bg", 0, 1));
	save_and_commit(c, h_path("%s/bg/s1", bg.root), 7);
	dsckpt_close(c);

	/* A second daemon on the same config: its error, then status 1, pid file untouched. */
	ck_assert_int_eq(h_system("cd '%s' && : >term.out", bg.dir), 0);
	rc = bg_run("-c dsckptd.json");
	ck_assert_msg(rc == 1, "a second dsckptd exited %d: %s", rc, h_text(term));
	char words[64];
	snprintf(words, sizeof(words), "another dsckptd (pid %d)", (int)pid);
	ck_assert_msg(strstr(h_text(term), words), "the second dsckptd said: %s",
		      h_text(term));
	ck_assert_int_eq(bg_pid(), pid);
	bg_stop();
}
END_TEST

/*
 * Started from its directory with a relative -c, the daemon reloads that file at SIGHUP (it
 * runs in /), writing to its log and not to the terminal; a bad file's problems make one log
 * line, joined, not a literal "\n".
 */
START_TEST(test_reload_relative)
{
	bg_config();
	ck_assert_int_eq(bg_run("-c ./dsckptd.json -p d.pid -l d.log"), 0);
	bg.pid = bg_pid();
	h_daemon_note(&bg);
	ck_assert_int_eq(kill(bg.pid, SIGHUP), 0);
	const char *words = h_path("configuration reloaded from %s/./dsckptd.json", bg.dir);
	ck_assert_msg(wait_text(bg.log, words), "no '%s' in the log: %s", words,
		      h_text(bg.log));
	const char *term = h_path("%s/term.out", bg.dir);
	ck_assert_msg(!strstr(h_text(term), "reloaded"), "the terminal got: %s",
		      h_text(term));

	FILE *f = fopen(bg.config, "w");
	fprintf(f, "{\"flush_thread\": 2, \"keep_last\": -1}\n");
	fclose(f);
	ck_assert_int_eq(kill(bg.pid, SIGHUP), 0);
	ck_assert_msg(wait_text(bg.log, "keeping the old configuration"), "%s",
		      h_text(bg.log));
	const char *line = strstr(h_text(bg.log), "reload of ");
	ck_assert_ptr_nonnull(line);
	char one[1024];
	snprintf(one, sizeof(one), "%.*s", (int)strcspn(line, "\n"), line);
	ck_assert_msg(strstr(one, "(did you mean 'flush_threads'?); option 'keep_last': -1 is "
			     "out of range") && !strstr(one, "\\n"), "the failed reload logged: %s",
		      one);
	/* The old configuration is still served. */
	ck_assert_int_eq(h_system("'%s' -s '%s' status >/dev/null", h_bin("dsckptctl"),
				  bg.socket), 0);
	bg_stop();
}
END_TEST

/* A daemon that cannot start (its socket's directory is missing) makes the command print the
 * reason and exit 1; nothing is left running, and no pid file. Without --log, the terminal is
 * told that the log goes to syslog. */
START_TEST(test_background_failure)
{
	bg_config();
	FILE *f = fopen(h_path("%s/nodir.json", bg.dir), "w");
	fprintf(f, "{\"socket\": \"%s/none/d.sock\", \"allowed_roots\": [\"%s\"],"
		" \"host_cache_size\": %g, \"chunk_size\": 1}\n", bg.dir, bg.root, CACHE_16M);
	fclose(f);
	const char *term = h_path("%s/term.out", bg.dir);
	int rc = bg_run("-c nodir.json");
	ck_assert_msg(rc == 1, "dsckptd exited %d: %s", rc, h_text(term));
	ck_assert_msg(strstr(h_text(term), "none") && strstr(h_text(term), "not starting"),
		      "the command said: %s", h_text(term));
	ck_assert_int_eq(waitpid(-1, NULL, WNOHANG), -1);	/* no child left behind */
	ck_assert_int_eq(bg_run("-c nodir.json -p d.pid"), 1);
	ck_assert(!h_exists(h_path("%s/d.pid", bg.dir)));

	ck_assert_int_eq(bg_run("-c dsckptd.json -p d.pid"), 0);
	bg.pid = bg_pid();
	h_daemon_note(&bg);
	ck_assert_msg(strstr(h_text(term), "the log goes to syslog"), "%s", h_text(term));
	bg_stop();
}
END_TEST

/* dsckptd -n names the file once per problem and says each mistake once. */
START_TEST(test_config_errors_once)
{
	bg_config();
	const char *term = h_path("%s/term.out", bg.dir);
	FILE *f = fopen(h_path("%s/bad.json", bg.dir), "w");
	fprintf(f, "{\"socket\": \"/x\",\n oops}\n");
	fclose(f);
	ck_assert_int_eq(bg_run("-n -c bad.json"), 1);
	ck_assert_str_eq(h_text(term), "dsckptd: bad.json: JSON syntax error at line 2, "
			 "column 3\n");
	f = fopen(h_path("%s/bad.json", bg.dir), "w");
	fprintf(f, "{\"allowed_roots\": [\"%s\"], \"host_cache_size\": \"2\","
		" \"keep_lats\": 3}\n", bg.root);
	fclose(f);
	ck_assert_int_eq(h_system("cd '%s' && : >term.out", bg.dir), 0);
	ck_assert_int_eq(bg_run("-n -c bad.json"), 1);
	ck_assert_str_eq(h_text(term),
			 "dsckptd: bad.json: option 'host_cache_size': expected a number, got the "
			 "string \"2\" (write 2 without quotes)\n"
			 "dsckptd: bad.json: unknown option 'keep_lats' (did you mean "
			 "'keep_last'?)\n");
	h_rm_rf(bg.dir);
}
END_TEST

/* The suite. */
static Suite *daemon_start_suite(void)
{
	Suite *s = suite_create("daemon start");
	h_add_case(s, "background ready", test_background_ready, 120, 1);
	h_add_case(s, "reload relative", test_reload_relative, 120, 1);
	h_add_case(s, "background failure", test_background_failure, 120, 1);
	h_add_case(s, "config errors once", test_config_errors_once, 60, 1);
	return s;
}

CHECK_MAIN(daemon_start_suite)
