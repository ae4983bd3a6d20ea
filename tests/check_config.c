/* check_config.c — the JSON configuration loader: defaults, every key, every kind of error. */
#include "../daemon/dsckptd.h"
#include "harness.h"

#include <check.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MIB (1024ULL * 1024)
#define GIB (1024ULL * MIB)

static char dir[256];        /* scratch directory, also used as the allowed root */
static char path[512];       /* dir/c.json */
static struct config *cfg;
static char err[4096];

/* Creates the scratch directory. */
static void setup(void)
{
	h_tmpdir(dir, sizeof(dir));
	snprintf(path, sizeof(path), "%s/c.json", dir);
	log_init("check_config", LOG_LVL_ERROR);
}

/* Frees the config and removes the scratch directory. */
static void teardown(void)
{
	config_free(cfg);
	cfg = NULL;
	h_rm_rf(dir);
}

/* Writes text to path. */
static void write_file(const char *text)
{
	FILE *f = fopen(path, "w");
	ck_assert_ptr_nonnull(f);
	fputs(text, f);
	fclose(f);
}

/* Writes a config (printf format) and loads it instead of the last; config_load's result. */
static int __attribute__((format(printf, 1, 2))) load(const char *fmt, ...)
{
	char text[4096];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(text, sizeof(text), fmt, ap);
	va_end(ap);
	write_file(text);
	config_free(cfg);
	int rc = config_load(path, &cfg, err, sizeof(err));
	ck_assert_int_eq(rc == 0, cfg != NULL);
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
	char real[PATH_MAX];
	ck_assert_ptr_nonnull(realpath(dir, real));
	ck_assert_msg(load("{\"allowed_roots\": [\"%s\"]}", dir) == 0, "%s", err);
	ck_assert_str_eq(cfg->socket, "/run/dsckptd/dsckptd.sock");
	ck_assert_uint_eq(cfg->socket_mode, 0660);
	ck_assert_uint_eq(cfg->n_roots, 1);
	ck_assert_str_eq(cfg->allowed_roots[0], real);
	ck_assert(cfg->host_cache_gib == 4.0);
	ck_assert_uint_eq(cfg->chunk_bytes, 64 * MIB);
	ck_assert_uint_eq(cfg->host_cache_bytes, 4 * GIB);
	ck_assert_uint_eq(cfg->flush_threads, 4);
	ck_assert_uint_eq(cfg->copy_threads, 0);  /* auto: the daemon picks by GPU count */
	ck_assert_uint_eq(cfg->keep_last, 0);
	ck_assert_int_eq(cfg->log_level, LOG_LVL_INFO);
	ck_assert_int_eq(cfg->o_direct, 1);
	ck_assert_int_eq(cfg->gpu_checksums, 1);
}
END_TEST

START_TEST(test_every_key)
{
	char sub[600], lnk[600], real[PATH_MAX];
	snprintf(sub, sizeof(sub), "%s/sub", dir);
	snprintf(lnk, sizeof(lnk), "%s/lnk", dir);
	ck_assert_int_eq(mkdir(sub, 0755), 0);
	ck_assert_int_eq(symlink(sub, lnk), 0);
	ck_assert_ptr_nonnull(realpath(sub, real));
	ck_assert_msg(load("{\"socket\": \"/tmp/x.sock\", \"socket_mode\": \"0600\","
			   " \"allowed_roots\": [\"%s\", \"%s/\"], \"host_cache_size\": 2,"
			   " \"chunk_size\": 8, \"flush_threads\": 64, \"copy_threads\": 1,"
			   " \"keep_last\": 100000, \"log_level\": \"debug\", \"o_direct\": false,"
			   " \"host\": \"node-7.rack2\", \"gpu_checksums\": false}", dir, lnk) == 0,
		      "%s", err);
	ck_assert_str_eq(cfg->host, "node-7.rack2");
	ck_assert_str_eq(cfg->socket, "/tmp/x.sock");
	ck_assert_uint_eq(cfg->socket_mode, 0600);
	ck_assert_uint_eq(cfg->n_roots, 2);
	ck_assert_str_eq(cfg->allowed_roots[1], real); /* the symlink is resolved */
	ck_assert(cfg->host_cache_gib == 2.0);
	ck_assert_uint_eq(cfg->host_cache_bytes, 2 * GIB);
	ck_assert_uint_eq(cfg->chunk_bytes, 8 * MIB);
	ck_assert_uint_eq(cfg->flush_threads, 64);
	ck_assert_uint_eq(cfg->copy_threads, 1);
	ck_assert_uint_eq(cfg->keep_last, 100000);
	ck_assert_int_eq(cfg->log_level, LOG_LVL_DEBUG);
	ck_assert_int_eq(cfg->o_direct, 0);
	ck_assert_int_eq(cfg->gpu_checksums, 0);
}
END_TEST

START_TEST(test_fractions)
{
	ck_assert_msg(load("{\"allowed_roots\": [\"%s\"], \"host_cache_size\": 0.25}", dir) == 0,
		      "%s", err);
	ck_assert(cfg->host_cache_gib == 0.25);
	ck_assert_uint_eq(cfg->host_cache_bytes, 256 * MIB);
	ck_assert_uint_eq(cfg->chunk_bytes, 64 * MIB);

	/* 1.5 MiB chunks; 0.1 GiB is not a whole number of them: rounded down. */
	ck_assert_msg(load("{\"allowed_roots\": [\"%s\"], \"host_cache_size\": 0.1,"
			   " \"chunk_size\": 1.5}", dir) == 0, "%s", err);
	ck_assert_uint_eq(cfg->chunk_bytes, 1536 * 1024);
	ck_assert_uint_eq(cfg->host_cache_bytes, (107374182 / (1536 * 1024)) * 1536 * 1024);

	/* A chunk size that is not a multiple of 4 KiB is rounded down to one. */
	ck_assert_msg(load("{\"allowed_roots\": [\"%s\"], \"chunk_size\": 1.0001}", dir) == 0,
		      "%s", err);
	ck_assert_uint_eq(cfg->chunk_bytes, 1 * MIB);
}
END_TEST

START_TEST(test_chunk_clamp)
{
	/* 1 MiB of cache (the minimum) holds 4 chunks of 256 KiB, not one of 64 MiB. */
	ck_assert_msg(load("{\"allowed_roots\": [\"%s\"], \"host_cache_size\": 0.0009765625}",
			   dir) == 0, "%s", err);
	ck_assert_uint_eq(cfg->chunk_bytes, 256 * 1024);
	ck_assert_uint_eq(cfg->host_cache_bytes, 1 * MIB);

	/* 0.1 GiB / 4 = 26843545.6 bytes, rounded down to 4 KiB. */
	ck_assert_msg(load("{\"allowed_roots\": [\"%s\"], \"host_cache_size\": 0.1}", dir) == 0,
		      "%s", err);
	ck_assert_uint_eq(cfg->chunk_bytes, 26841088);
	ck_assert_uint_eq(cfg->chunk_bytes % 4096, 0);
	ck_assert_uint_eq(cfg->host_cache_bytes, 4 * 26841088ULL);
}
END_TEST

START_TEST(test_bad_octal)
{
	static const char *const bad[] = { "\"0999\"", "\"abc\"", "\"\"", "\"01000\"",
					   "\"-1\"", "\"0x1ff\"",
					   "\"077777777777777777777\"" };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		ck_assert_int_eq(load("{\"allowed_roots\": [\"%s\"], \"socket_mode\": %s}", dir,
				      bad[i]), -1);
		ck_assert_msg(strstr(err, "socket_mode") != NULL, "%s: %s", bad[i], err);
		ck_assert_int_eq(err_lines(), 1);
	}
	ck_assert_int_eq(load("{\"allowed_roots\": [\"%s\"], \"socket_mode\": 660}", dir), -1);
	ck_assert_msg(strstr(err, "'socket_mode': expected an octal string") != NULL, "%s", err);
	ck_assert_int_eq(load("{\"allowed_roots\": [\"%s\"], \"socket_mode\": \"777\"}", dir), 0);
	ck_assert_uint_eq(cfg->socket_mode, 0777);
	ck_assert_int_eq(load("{\"allowed_roots\": [\"%s\"], \"socket_mode\": \"00640\"}", dir), 0);
	ck_assert_uint_eq(cfg->socket_mode, 0640);
}
END_TEST

START_TEST(test_unknown_key)
{
	ck_assert_int_eq(load("{\"allowed_roots\": [\"%s\"], \"foo\": 1}", dir), -1);
	ck_assert_str_eq(err, "unknown option 'foo' (dsckptd --help lists the options)");
	ck_assert_int_eq(load("{\"allowed_roots\": [\"%s\"], \"keep_last\": 1,"
			      " \"keep_last\": 2}", dir), -1);
	ck_assert_str_eq(err, "duplicate option 'keep_last'");
}
END_TEST

START_TEST(test_wrong_types)
{
	static const struct {
		const char *json, *want;
	} cases[] = {
		{ "\"socket\": 5", "option 'socket': expected a string, got a number" },
		{ "\"flush_threads\": \"4\"", "option 'flush_threads': expected an integer, "
		  "got the string \"4\" (write 4 without quotes)" },
		{ "\"copy_threads\": 2.5", "option 'copy_threads': 2.5 is not an integer" },
		{ "\"host_cache_size\": \"4\"", "option 'host_cache_size': expected a number" },
		{ "\"chunk_size\": null", "option 'chunk_size': expected a number, got null" },
		{ "\"keep_last\": true", "option 'keep_last': expected an integer, got a boolean" },
		{ "\"log_level\": 3", "option 'log_level': expected a string" },
		{ "\"log_level\": \"verbose\"", "'verbose' is not one of error, warn, info, debug" },
		{ "\"o_direct\": 1", "option 'o_direct': expected a boolean, got a number" },
		{ "\"o_direct\": \"yes\"", "option 'o_direct': expected a boolean, got a string" },
		{ "\"allowed_roots\": \"/tmp\"", "option 'allowed_roots': expected an array" },
		{ "\"allowed_roots\": [1]", "option 'allowed_roots': entry 1: expected a string" },
		{ "\"allowed_roots\": []", "option 'allowed_roots': expected 1 to 64 directories" },
		{ "\"allowed_roots\": {}", "option 'allowed_roots': expected an array" },
		{ "\"socket\": \"\"", "option 'socket': length must be" },
		{ "\"flush_threads\": 0", "option 'flush_threads': 0 is out of range [1, 64]" },
		{ "\"flush_threads\": 65", "option 'flush_threads': 65 is out of range" },
		{ "\"keep_last\": -1", "option 'keep_last': -1 is out of range" },
		{ "\"host_cache_size\": 0", "option 'host_cache_size': 0 is out of range" },
		{ "\"host_cache_size\": 4097", "out of range" },
		{ "\"host_cache_size\": 1e999", "out of range" },
		{ "\"chunk_size\": 0.5", "option 'chunk_size': 0.5 is out of range [1, 1024]" },
		{ "\"host\": \"a b\"", "option 'host': printable ASCII without spaces or '/'" },
		{ "\"host\": \"../x\"", "option 'host': printable ASCII" },
		{ "\"host\": 7", "option 'host': expected a string" },
		{ "\"socket\": \"run/d.sock\"", "option 'socket': 'run/d.sock' is not an absolute path" },
		{ "\"host_cache_size\": 4096", "host_cache_size 4096 GiB is more than this machine's" },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		ck_assert_int_eq(load("{%s}", cases[i].json), -1);
		ck_assert_msg(strstr(err, cases[i].want) != NULL, "%s: got '%s'", cases[i].json,
			      err);
	}
	/* A socket path that does not fit in sockaddr_un. */
	char longp[200];
	memset(longp, 'a', sizeof(longp) - 1);
	longp[sizeof(longp) - 1] = '\0';
	ck_assert_int_eq(load("{\"allowed_roots\": [\"%s\"], \"socket\": \"/%s\"}", dir, longp),
			 -1);
	ck_assert_msg(strstr(err, "option 'socket': length must be 1 to 107") != NULL, "%s", err);
}
END_TEST

START_TEST(test_roots)
{
	ck_assert_int_eq(load("{\"allowed_roots\": [\"%s/missing\"]}", dir), -1);
	ck_assert_msg(strstr(err, "missing': No such file or directory (create it: mkdir -p ")
		      != NULL, "%s", err);

	ck_assert_int_eq(load("{\"allowed_roots\": [\"relative/dir\"]}"), -1);
	ck_assert_str_eq(err, "option 'allowed_roots': 'relative/dir' is not an absolute path");

	ck_assert_int_eq(load("{\"allowed_roots\": [\"%s\"]}", path), -1);
	ck_assert_msg(strstr(err, "c.json' is not a directory") != NULL, "%s", err);

	/* A good root next to bad ones: every bad one is reported, nothing leaks. */
	ck_assert_int_eq(load("{\"allowed_roots\": [\"%s\", \"x\", \"%s/nope\", 3]}", dir, dir),
			 -1);
	ck_assert_int_eq(err_lines(), 3);
}
END_TEST

START_TEST(test_syntax_error)
{
	ck_assert_int_eq(load("{\n  \"socket\": \"/x\",\n  oops\n}\n"), -1);
	ck_assert_msg(strncmp(err, "JSON syntax error at line 3, column ", 36) == 0, "%s", err);
	/* The caller names the file (dsckptd: PATH: ..., reload of PATH failed: ...). */
	ck_assert_msg(strstr(err, path) == NULL, "%s", err);

	ck_assert_int_eq(load("{\"allowed_roots\": [\"%s\"]} trailing", dir), -1);
	ck_assert_msg(strstr(err, "JSON syntax error at line 1") != NULL, "%s", err);

	ck_assert_int_eq(load("%s", ""), -1);
	ck_assert_msg(strstr(err, "JSON syntax error") != NULL, "%s", err);

	ck_assert_int_eq(load("{\"socket\": \"/x"), -1);
	ck_assert_msg(strstr(err, "JSON syntax error") != NULL, "%s", err);

	ck_assert_int_eq(load("[1, 2]"), -1);
	ck_assert_msg(strstr(err, "expected a JSON object, got an array") != NULL, "%s", err);

	/* An embedded NUL byte. */
	FILE *f = fopen(path, "w");
	fwrite("{}\0{", 1, 4, f);
	fclose(f);
	ck_assert_int_eq(config_load(path, &cfg, err, sizeof(err)), -1);
	ck_assert_msg(strstr(err, "NUL byte") != NULL, "%s", err);
}
END_TEST

START_TEST(test_missing_file)
{
	char p[600];
	snprintf(p, sizeof(p), "%s/none.json", dir);
	ck_assert_int_eq(config_load(p, &cfg, err, sizeof(err)), -1);
	ck_assert_ptr_null(cfg);
	ck_assert_str_eq(err, "No such file or directory");
	ck_assert_int_eq(config_load(dir, &cfg, err, sizeof(err)), -1);
	ck_assert_msg(strstr(err, "not a regular file") != NULL, "%s", err);
}
END_TEST

/* A key a few edits from an option's name is answered with that name; others with where the
 * names are listed. */
START_TEST(test_did_you_mean)
{
	static const struct {
		const char *key, *want;
	} cases[] = {
		{ "host_cache_sise", "host_cache_size" },
		{ "allowed_root", "allowed_roots" },
		{ "Keep_Last", "keep_last" },
		{ "flushthreads", "flush_threads" },
		{ "socketmode", "socket_mode" },
		{ "loglevel", "log_level" },
		{ "odirect", "o_direct" },
	};
	char want[128];

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		ck_assert_int_eq(load("{\"allowed_roots\": [\"%s\"], \"%s\": 1}", dir,
				      cases[i].key), -1);
		snprintf(want, sizeof(want), "unknown option '%s' (did you mean '%s'?)",
			 cases[i].key, cases[i].want);
		ck_assert_str_eq(err, want);
	}
	ck_assert_int_eq(load("{\"allowed_roots\": [\"%s\"], \"compression\": 1}", dir), -1);
	ck_assert_str_eq(err, "unknown option 'compression' (dsckptd --help lists the options)");
}
END_TEST

/* One message per mistake: a size given as a string is that one error (with the fix), not
 * also a cache of 0 GiB "too small" derived from it; the same for chunk_size. */
START_TEST(test_one_error_per_mistake)
{
	ck_assert_int_eq(load("{\"allowed_roots\": [\"%s\"], \"host_cache_size\": \"2\"}",
			      dir), -1);
	ck_assert_str_eq(err, "option 'host_cache_size': expected a number, got the string \"2\" "
			 "(write 2 without quotes)");
	ck_assert_int_eq(load("{\"allowed_roots\": [\"%s\"], \"chunk_size\": \"0.5\","
			      " \"host_cache_size\": 0.0625}", dir), -1);
	ck_assert_int_eq(err_lines(), 1);
	ck_assert_msg(strstr(err, "(write 0.5 without quotes)") != NULL, "%s", err);
	ck_assert_int_eq(load("{\"allowed_roots\": [\"%s\"], \"host_cache_size\": 0}", dir),
			 -1);
	ck_assert_str_eq(err, "option 'host_cache_size': 0 is out of range [0.000976562, 4096]");
	ck_assert_int_eq(load("{\"allowed_roots\": [\"%s\"], \"keep_last\": \"two\"}", dir),
			 -1);
	ck_assert_str_eq(err, "option 'keep_last': expected an integer, got a string");
}
END_TEST

START_TEST(test_all_errors_together)
{
	ck_assert_int_eq(load("{\"allowed_roots\": [\"rel\"], \"flush_threads\": 0,"
			      " \"bogus\": 1, \"socket_mode\": \"9\", \"o_direct\": 0,"
			      " \"log_level\": \"loud\"}"), -1);
	ck_assert_int_eq(err_lines(), 6);
	static const char *const keys[] = { "allowed_roots", "flush_threads", "bogus",
					    "socket_mode", "o_direct", "log_level" };
	for (size_t i = 0; i < 6; i++)
		ck_assert_msg(strstr(err, keys[i]) != NULL, "%s missing in %s", keys[i], err);
}
END_TEST

START_TEST(test_small_err_buffer)
{
	char small[16];
	write_file("{\"bogus\": 1, \"other\": 2, \"socket\": 1}");
	memset(small, 'x', sizeof(small));
	ck_assert_int_eq(config_load(path, &cfg, small, sizeof(small)), -1);
	ck_assert_ptr_null(cfg);
	ck_assert_uint_lt(strlen(small), sizeof(small));
	ck_assert_int_eq(config_load(path, &cfg, small, 0), -1);
}
END_TEST

START_TEST(test_repo_config)
{
	struct stat st;
	/* What make install ships keeps every checkpoint, as the documented default says:
	 * retention is a choice the operator writes down (checked here with or without the
	 * default root). */
	FILE *shipped = fopen("conf/dsckptd.json", "r");
	char text[4096] = "";
	ck_assert_ptr_nonnull(shipped);
	ck_assert_uint_gt(fread(text, 1, sizeof(text) - 1, shipped), 0);
	fclose(shipped);
	ck_assert_msg(strstr(text, "keep_last") == NULL, "conf/dsckptd.json sets keep_last");
	int have_root = stat("/var/lib/dsckpt", &st) == 0 && S_ISDIR(st.st_mode);
	int rc = config_load("conf/dsckptd.json", &cfg, err, sizeof(err));
	if (have_root) {
		ck_assert_msg(rc == 0, "%s", err);
		ck_assert_uint_eq(cfg->keep_last, 0);
		ck_assert_uint_eq(cfg->host_cache_bytes, 4 * GIB);
	} else {
		/* The only problem is the missing default root. */
		ck_assert_int_eq(rc, -1);
		ck_assert_int_eq(err_lines(), 1);
		ck_assert_msg(strstr(err, "'/var/lib/dsckpt'") != NULL, "%s", err);
	}
}
END_TEST

START_TEST(test_help)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	config_print_help(f);
	fclose(f);
	static const char *const keys[] = { "socket ", "socket_mode", "allowed_roots",
					    "host_cache_size", "chunk_size", "flush_threads",
					    "copy_threads", "keep_last", "log_level", "o_direct",
					    "\"/run/dsckptd/dsckptd.sock\"", "[\"/var/lib/dsckpt\"]" };
	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
		ck_assert_msg(strstr(buf, keys[i]) != NULL, "%s missing", keys[i]);
	free(buf);
	config_free(NULL);
}
END_TEST

/* The suite. */
static Suite *config_suite(void)
{
	Suite *s = suite_create("config");
	TCase *tc = tcase_create("load");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_defaults);
	tcase_add_test(tc, test_every_key);
	tcase_add_test(tc, test_fractions);
	tcase_add_test(tc, test_chunk_clamp);
	tcase_add_test(tc, test_bad_octal);
	tcase_add_test(tc, test_unknown_key);
	tcase_add_test(tc, test_wrong_types);
	tcase_add_test(tc, test_roots);
	tcase_add_test(tc, test_syntax_error);
	tcase_add_test(tc, test_missing_file);
	tcase_add_test(tc, test_did_you_mean);
	tcase_add_test(tc, test_one_error_per_mistake);
	tcase_add_test(tc, test_all_errors_together);
	tcase_add_test(tc, test_small_err_buffer);
	tcase_add_test(tc, test_repo_config);
	tcase_add_test(tc, test_help);
	suite_add_tcase(s, tc);
	return s;
}

CHECK_MAIN(config_suite)
