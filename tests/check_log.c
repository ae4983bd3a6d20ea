/*
 * check_log.c — log.c: every message comes out as one escaped line (client-chosen names
 * cannot forge log lines), long messages are written and cut with a marker, log_warn appends
 * strerror, errno survives. stderr is redirected into a temporary file for each test.
 */
#include "../daemon/dsckptd.h"
#include "harness.h"

#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static FILE *cap;              /* the file stderr is redirected into */
static char out[512 * 1024];   /* what the last test wrote, NUL-terminated */

/* Points stderr at an unlinked temporary file and logs as "check_log", outside the journal. */
static void setup(void)
{
	unsetenv("JOURNAL_STREAM");
	cap = tmpfile();
	ck_assert_ptr_nonnull(cap);
	ck_assert_int_eq(dup2(fileno(cap), STDERR_FILENO), STDERR_FILENO);
	log_init("check_log", LOG_LVL_DEBUG);
}

/* Closes the capture file (stderr stays on it until the forked test exits). */
static void teardown(void)
{
	fclose(cap);
}

/* Reads everything written to stderr so far into out; returns its length. */
static size_t captured(void)
{
	fflush(stderr);
	ssize_t n = pread(fileno(cap), out, sizeof(out) - 1, 0);
	ck_assert_int_ge(n, 0);
	out[n] = '\0';
	return (size_t)n;
}

/* Number of '\n' in out. */
static int lines(void)
{
	int n = 0;
	for (const char *p = out; *p; p++)
		n += *p == '\n';
	return n;
}

/* The message of the one line in out: what follows "<level>: " up to the newline. */
static const char *message(const char *level)
{
	char tag[32];
	snprintf(tag, sizeof(tag), "]: %s: ", level);
	char *p = strstr(out, tag);
	ck_assert_msg(p != NULL, "no \"%s\" prefix in: %s", tag, out);
	char *nl = strchr(p, '\n');
	ck_assert_ptr_nonnull(nl);
	*nl = '\0';
	return p + strlen(tag);
}

START_TEST(test_plain)
{
	log_info("saved %s in %d ms", "rank0", 12);
	captured();
	ck_assert_int_eq(lines(), 1);
	ck_assert_msg(strstr(out, " check_log[") != NULL, "prefix: %s", out);
	ck_assert_str_eq(message("info"), "saved rank0 in 12 ms");
}
END_TEST

START_TEST(test_newline_forges_nothing)
{
	const char *dir = "/ckpt/a\n2026-01-01T00:00:00.000+0000 dsckptd[1]: error: forged";
	log_warnx("refused directory %s", dir);
	captured();
	ck_assert_int_eq(lines(), 1);
	ck_assert_str_eq(message("warn"), "refused directory /ckpt/a\\n2026-01-01T00:00:00.000+0000 "
			 "dsckptd[1]: error: forged");
}
END_TEST

START_TEST(test_control_and_high_bytes)
{
	log_info("%s", "a\x01\x1b[31mb\x7f\xc3\xa9\tc\r\xff");
	captured();
	ck_assert_int_eq(lines(), 1);
	ck_assert_str_eq(message("info"), "a\\x01\\x1b[31mb\\x7f\\xc3\\xa9\\tc\\x0d\\xff");
}
END_TEST

START_TEST(test_backslash_doubled)
{
	/* without the doubling, a name holding a literal "\n" would read like a line break */
	log_info("%s", "C:\\dir\\n");
	captured();
	ck_assert_str_eq(message("info"), "C:\\\\dir\\\\n");
}
END_TEST

START_TEST(test_medium_message_whole)
{
	/* longer than the stack buffer, shorter than the limit: written whole */
	size_t n = 20000;
	char *big = malloc(n + 1);
	memset(big, 'm', n);
	big[n] = '\0';
	big[n - 1] = 'Z';
	log_info("<%s>", big);
	captured();
	ck_assert_int_eq(lines(), 1);
	const char *m = message("info");
	ck_assert_uint_eq(strlen(m), n + 2);
	ck_assert(m[0] == '<' && m[n] == 'Z' && m[n + 1] == '>');
	free(big);
}
END_TEST

START_TEST(test_huge_message_cut)
{
	size_t n = 100 * 1024;
	char *big = malloc(n + 1);
	memset(big, 'h', n);
	big[n] = '\0';
	errno = ENOSPC;
	log_warn("%s", big);
	ck_assert_int_eq(errno, ENOSPC);
	captured();
	ck_assert_int_eq(lines(), 1);
	const char *m = message("warn");
	size_t kept = strspn(m, "h");
	ck_assert_uint_eq(kept, 64 * 1024);
	char tail[128];
	snprintf(tail, sizeof(tail), "...(%zu more bytes): %s", n - kept, strerror(ENOSPC));
	ck_assert_str_eq(m + kept, tail);
	free(big);
}
END_TEST

START_TEST(test_errno_preserved)
{
	errno = EACCES;
	log_info("one");
	ck_assert_int_eq(errno, EACCES);
	log_warn("two");
	ck_assert_int_eq(errno, EACCES);
	log_debug("three %s", "\n");
	ck_assert_int_eq(errno, EACCES);
	log_set_level(LOG_LVL_ERROR);
	log_info("not written");
	ck_assert_int_eq(errno, EACCES);
	captured();
	ck_assert_int_eq(lines(), 3);
}
END_TEST

START_TEST(test_warn_appends_strerror)
{
	errno = ENOENT;
	log_warn("open %s", "/ckpt/x");
	captured();
	char want[128];
	snprintf(want, sizeof(want), "open /ckpt/x: %s", strerror(ENOENT));
	ck_assert_str_eq(message("warn"), want);
}
END_TEST

START_TEST(test_journal_prefix)
{
	/* $JOURNAL_STREAM naming our stderr: "<prio>level: " and no timestamp */
	struct stat st;
	char env[64];
	ck_assert_int_eq(fstat(STDERR_FILENO, &st), 0);
	snprintf(env, sizeof(env), "%llu:%llu", (unsigned long long)st.st_dev,
		 (unsigned long long)st.st_ino);
	setenv("JOURNAL_STREAM", env, 1);
	log_init("check_log", LOG_LVL_INFO);
	log_error("disk %s", "full\n<3>error: forged");
	captured();
	ck_assert_str_eq(out, "<3>error: disk full\\n<3>error: forged\n");
}
END_TEST

/* The log suite. */
static Suite *log_suite(void)
{
	Suite *s = suite_create("log");
	TCase *tc = tcase_create("log");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_plain);
	tcase_add_test(tc, test_newline_forges_nothing);
	tcase_add_test(tc, test_control_and_high_bytes);
	tcase_add_test(tc, test_backslash_doubled);
	tcase_add_test(tc, test_medium_message_whole);
	tcase_add_test(tc, test_huge_message_cut);
	tcase_add_test(tc, test_errno_preserved);
	tcase_add_test(tc, test_warn_appends_strerror);
	tcase_add_test(tc, test_journal_prefix);
	suite_add_tcase(s, tc);
	return s;
}

CHECK_MAIN(log_suite)
