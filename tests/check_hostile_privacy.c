/*
 * check_hostile_privacy.c — what one user may learn of or forge about another's: the victim's
 * committed files (modes), the saves dsckptctl pending lists, and lines in the daemon's log.
 * Each test is one way an unprivileged trainer could attack a daemon running as root (DESIGN.md
 * §8), run by two real users (harness_hostile.h), and asserts what the daemon must do instead.
 * Without root every test says SKIP.
 */
#include "harness_hostile.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- 1. privacy ---- */

/* What the attacker of test_privacy tries to open (below <root>/jobV). */
static const struct {
	const char *path;
	int flags;
} peek[] = {
	{"", O_RDONLY | O_DIRECTORY},
	{"/t1", O_RDONLY | O_DIRECTORY},
	{"/t1/rank0.safetensors", O_RDONLY},
	{"/t1/rank0.meta", O_RDONLY},
	{"/t1/MANIFEST.json", O_RDONLY},
	{"/latest", O_RDONLY},
};
#define NPEEK ((int)(sizeof(peek) / sizeof(peek[0])))

/* Attacker of test_privacy: opens each of peek; rc[i]: 0 if it opened, else the errno. */
static int atk_peek(void *arg)
{
	for (int i = 0; i < NPEEK; i++) {
		int fd = open(h_path("%s/jobV%s", D->root, peek[i].path),
			      peek[i].flags | O_CLOEXEC);
		B->rc[i] = fd >= 0 ? 0 : errno;
		if (fd >= 0)
			close(fd);
	}
	return 0;
}

/* The victim's committed checkpoint is private (0700/0600 by default, dir_mode/file_mode when
 * configured): the attacker cannot open any of it. */
START_TEST(test_privacy)
{
	static const struct {
		const char *name, *extra;
		unsigned dmode, fmode;
	} it[] = {
		{"defaults", NULL, 0700, 0600},
		{"dir_mode 0750, file_mode 0640",
		 "\"file_mode\": \"0640\", \"dir_mode\": \"0750\",", 0750, 0640},
	};
	HOSTILE_BEGIN(h_path("privacy (%s)", it[_i].name));
	struct vic v = {.n = MIB, .seed = 40, .blob = 4096, .commit = 1, .wait_ms = 10000};
	struct stat st;

	hd_start(CACHE_32M, it[_i].extra);
	v.dir = h_path("%s/jobV/t1", D->root);
	int vc = as_user(VIC, victim_main, &v);
	victim_check(vc, &v, "");
	int ac = as_user(ATK, atk_peek, NULL);
	ck_assert_int_eq(ac, 0);
	for (int i = 0; i < NPEEK; i++)
		ck_assert_msg(B->rc[i] == EACCES, "the attacker %s <root>/jobV%s (%s, mode %04o); "
			      "want EACCES", B->rc[i] ? "could not open, but not for EACCES,"
			      : "opened", peek[i].path, B->rc[i] ? strerror(B->rc[i]) : "readable",
			      lstat(h_path("%s/jobV%s", D->root, peek[i].path), &st) == 0
				      ? (unsigned)(st.st_mode & 07777) : 0u);
	for (int i = 0; i < NPEEK; i++) {
		const char *p = h_path("%s/jobV%s", D->root, peek[i].path);
		unsigned want = (peek[i].flags & O_DIRECTORY) ? it[_i].dmode : it[_i].fmode;
		ck_assert_int_eq(lstat(p, &st), 0);
		ck_assert_msg((st.st_mode & 07777) == want, "%s has mode %04o, want %04o", p,
			      (unsigned)(st.st_mode & 07777), want);
	}
	hd_stop();
}
END_TEST

/* ---- 2. what the daemon tells ---- */

/* Attacker of test_pending_private: one durable save of its own into jobA/t1. */
static int atk_own_save(void *arg)
{
	struct res r;
	int fd = r_trainer("jobA", &r);
	int mfd = memfd_pattern(4096, 50, 1);
	if (fd < 0 || mfd < 0 || r_region(fd, 1, mfd, 4096, &r) < 0)
		return say(2, 1, "HELLO/REGION_ADD: %s", r.msg);
	int64_t save = r_begin(fd, h_path("%s/jobA/t1", D->root), "rank0", &r);
	if (save < 0 || r_end(fd, save, 4096, 0, &r) < 0 ||
	    r_wait(fd, save, DSCKPT_DURABLE, 20000, &r) != DSCKPT_DURABLE)
		return say(2, 2, "save: %s", r.msg);
	close(fd);
	return 0;
}

/* Child of run_pending: execs dsckptctl --json pending on the test daemon's socket, its
 * output into the pipe *arg. */
static int exec_pending(void *arg)
{
	dup2(*(const int *)arg, 1);
	setenv("DSCKPT_SOCKET", D->socket, 1);
	execl(h_bin("dsckptctl"), "dsckptctl", "--json", "pending", (char *)NULL);
	return 126;
}

/*
 * Runs dsckptctl --json pending as user (root when NULL) and counts the listed saves whose
 * dir lies in <root>/jobV and in <root>/jobA.
 */
static void run_pending(const char *user, int *vic, int *atk)
{
	int p[2];
	char *out = NULL;
	size_t len = 0;

	ck_assert_int_eq(pipe(p), 0);
	fflush(stdout);
	pid_t pid;
	if (user) {
		pid = as_user_spawn(user, exec_pending, &p[1], 20);
	} else {
		pid = fork();
		ck_assert_int_ge(pid, 0);
		if (pid == 0)
			_exit(exec_pending(&p[1]));
	}
	close(p[1]);
	FILE *f = fdopen(p[0], "r");
	char buf[4096];
	size_t k;
	while ((k = fread(buf, 1, sizeof(buf), f)) > 0) {
		out = realloc(out, len + k + 1);
		memcpy(out + len, buf, k);
		len += k;
		out[len] = 0;
	}
	fclose(f);
	int rc = as_user_wait(pid);
	ck_assert_msg(rc == 0 && out, "dsckptctl --json pending as %s: %s: %s",
		      user ? user : "root", status_str(rc), out ? out : "");
	cJSON *doc = cJSON_Parse(out), *s;
	cJSON *saves = cJSON_GetObjectItemCaseSensitive(doc, "saves");
	ck_assert_msg(cJSON_IsArray(saves), "dsckptctl --json pending: %s", out);
	const char *vdir = h_path("%s/jobV/", D->root), *adir = h_path("%s/jobA/", D->root);
	*vic = *atk = 0;
	cJSON_ArrayForEach(s, saves) {
		const char *d = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(s, "dir"));
		*vic += d && strncmp(d, vdir, strlen(vdir)) == 0;
		*atk += d && strncmp(d, adir, strlen(adir)) == 0;
	}
	cJSON_Delete(doc);
	free(out);
}

/* dsckptctl pending run by the attacker lists none of the victim's saves; run by root it
 * lists both users'. */
START_TEST(test_pending_private)
{
	HOSTILE_BEGIN("pending lists only one's own saves");
	struct vic v = {.n = MIB, .seed = 51, .wait_ms = 10000};
	int vn, an;

	hd_start(CACHE_8M, NULL);
	v.dir = h_path("%s/jobV/t1", D->root);
	victim_check(as_user(VIC, victim_main, &v), &v, "");
	int ac = as_user(ATK, atk_own_save, NULL);
	ck_assert_msg(ac == 0, "attacker's own save: %s", B->msg[2]);
	run_pending(NULL, &vn, &an);
	ck_assert_msg(vn == 1 && an == 1, "as root, pending lists %d of the victim's and %d of "
		      "the attacker's saves; want 1 and 1", vn, an);
	run_pending(ATK, &vn, &an);
	ck_assert_msg(vn == 0, "as the attacker, pending lists %d of the victim's saves (and %d "
		      "of its own); want none of the victim's", vn, an);
	hd_stop();
}
END_TEST

/* A user outside the socket's group (mode 0660, group root) is told that group root is no
 * group to join (socket_group is), not to check whether dsckptd is running. */
START_TEST(test_socket_group)
{
	HOSTILE_BEGIN("dsckptctl outside the socket's group");
	int p[2];
	char out[4096] = "";
	size_t len = 0;
	ssize_t k;

	hd_start(CACHE_8M, NULL);
	ck_assert_int_eq(chmod(D->socket, 0660), 0);	/* socket_mode "0660", group root */
	ck_assert_int_eq(pipe(p), 0);
	fflush(stdout);
	pid_t pid = as_user_spawn(ATK, exec_ctl_status, &p[1], 20);
	close(p[1]);
	while (len < sizeof(out) - 1 && (k = read(p[0], out + len, sizeof(out) - 1 - len)) > 0)
		len += (size_t)k;
	close(p[0]);
	int rc = as_user_wait(pid);
	ck_assert_msg(rc == 1, "dsckptctl status outside the group: %s: %s", status_str(rc), out);
	ck_assert_msg(strstr(out, "Permission denied") && strstr(out, "group root") &&
		      strstr(out, "socket_group") && !strstr(out, "usermod -aG root") &&
		      !strstr(out, "is dsckptd running"), "dsckptctl said: %s", out);
	hd_stop();
}
END_TEST

/* A tag name holding a newline and a forged log line. */
#define FORGED "2026-01-01T00:00:00.000+0000 dsckptd[1]: error: FORGED"

/* Attacker of test_log_escape: saves and commits <root>/jobA/t\n<forged line>. */
static int atk_log(void *arg)
{
	const char *dir = h_path("%s/jobA/t\n" FORGED, D->root);
	int64_t shape[1] = {4096};
	dsckpt_conn_t *c;
	dsckpt_save_t *s;
	int rc;
	void *mem = dsckpt_host_alloc(4096);

	if ((rc = dsckpt_connect(D->socket, &c)) < 0 || (rc = dsckpt_identify(c, "atk", 0, 1)) < 0)
		return say(2, 1, "connect: %s", dsckpt_err_name(rc));
	if ((rc = dsckpt_save_begin(c, dir, "rank0", &s)) < 0 ||
	    (rc = dsckpt_add_tensor(s, "t", "U8", shape, 1, mem, 4096)) < 0 ||
	    (rc = dsckpt_save_end(s)) < 0 || (rc = dsckpt_wait(s, DSCKPT_DURABLE, 20000)) < 0 ||
	    (rc = dsckpt_commit(c, dir, 20000)) < 0)
		return say(2, 2, "saving: %s: %s", dsckpt_err_name(rc), dsckpt_last_error(c));
	dsckpt_save_free(s);
	dsckpt_close(c);
	return 0;
}

/* A newline and a forged line in a tag name: the daemon's log (debug) shows the name
 * escaped and no line that the attacker wrote. */
START_TEST(test_log_escape)
{
	HOSTILE_BEGIN("log lines escaped");
	hd_start(CACHE_8M, NULL);
	int ac = as_user(ATK, atk_log, NULL);
	ck_assert_msg(ac == 0, "attacker: %s: %s", status_str(ac), B->msg[2]);
	hd_alive("after the forged tag name");
	char *log = h_read_file(D->log, NULL);
	ck_assert_ptr_nonnull(log);
	int escaped = 0;
	for (char *line = log, *next; line && *line; line = next) {
		next = strchr(line, '\n');
		if (next)
			*next++ = 0;
		ck_assert_msg(strncmp(line, "2026-01-01T", 11) != 0 && strncmp(line, "FORGED", 6),
			      "the daemon's log has a line the attacker wrote: '%s'", line);
		static const char *const esc[] = {"t\\n2026", "t\\x0a2026", "t\\x0A2026",
						  "t\\0122026"};
		for (size_t i = 0; i < sizeof(esc) / sizeof(esc[0]); i++)
			escaped += strstr(line, esc[i]) && strstr(line, "FORGED");
	}
	free(log);
	ck_assert_msg(escaped > 0, "the daemon's log never shows the tag name escaped (\\n)");
	hd_stop();
}
END_TEST

/* Builds the suite: one test case per group, each with a time limit that fits it. */
static Suite *hostile_privacy_suite(void)
{
	Suite *s = suite_create("hostile privacy");
	h_add_case(s, "privacy", test_privacy, 60, 2);
	h_add_case(s, "pending", test_pending_private, 60, 1);
	h_add_case(s, "log escape", test_log_escape, 60, 1);
	h_add_case(s, "socket group", test_socket_group, 60, 1);
	return s;
}

CHECK_MAIN(hostile_privacy_suite)
