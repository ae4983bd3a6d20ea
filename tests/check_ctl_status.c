/*
 * check_ctl_status.c — dsckptctl status and list against a real daemon, as a user reads them:
 * a resident file's real bytes (not whole chunks), the cache's use split between saves and
 * resident files, whether the cache is pinned, one unit of time in JSON (uptime_ms), errors as
 * JSON under --json, and list without ROOT asking the daemon for its roots.
 */
#include "harness_daemon.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Runs dsckptctl -s SOCKET ARGS with stdout and stderr apart; exit status, outputs in *out
 * and *err (static buffers). */
static int ctl2(const char **out, const char **err, const char *args)
{
	static char o[65536], e[65536];
	const char *fo = h_path("%s/o.txt", D->dir), *fe = h_path("%s/e.txt", D->dir);
	int rc = h_system("%s -s '%s' %s >'%s' 2>'%s'", h_bin("dsckptctl"), D->socket, args, fo,
			  fe);
	char *so = h_read_file(fo, NULL), *se = h_read_file(fe, NULL);
	snprintf(o, sizeof(o), "%s", so ? so : "");
	snprintf(e, sizeof(e), "%s", se ? se : "");
	free(so);
	free(se);
	*out = o;
	*err = e;
	return rc;
}

/*
 * A 1.5 MiB file kept resident in 1 MiB chunks: status says 1.50 MiB resident (2.00 MiB of
 * cache chunks), the cache's used bytes held by resident files and none by saves; --json has
 * resident_data, cache_saves, cache_locked (all of it: the test runs as root, or says so) and
 * uptime_ms, not uptime_s.
 */
START_TEST(test_status_bytes)
{
	const char *out, *err;

	d_start(CACHE_16M, CHUNK_1M);
	dsckpt_conn_t *c = conn_open("st", 0, 1);
	const char *dir = h_path("%s/st/t1", D->root);
	void *mem;
	dsckpt_save_t *s = save_pattern(c, dir, "rank0", 3 * MIB / 2, 5, &mem);
	wait_level(c, s, DSCKPT_DURABLE, 30000);
	dsckpt_save_free(s);
	dsckpt_host_free(mem);
	CK_DS(c, dsckpt_commit(c, dir, 30000));
	dsckpt_close(c);

	ck_assert_int_eq(ctl2(&out, &err, "status"), 0);
	ck_assert_msg(strstr(out, "resident  1.50 MiB in 1 file (2.00 MiB of cache chunks)\n") &&
		      strstr(out, h_path("  %s/rank0  1.50 MiB, committed\n", dir)) &&
		      strstr(out, "cache     2.00 MiB used of 16.0 MiB (12%), chunk 1.00 MiB: 0 B by "
			     "saves, 2.00 MiB by resident files (free for saves)\n"),
		      "status said:\n%s", out);
	int pinned = !strstr(out, "not pinned");
	if (geteuid() == 0)
		ck_assert_msg(pinned, "root's cache not pinned:\n%s", out);

	ck_assert_int_eq(ctl2(&out, &err, "--json status"), 0);
	cJSON *doc = cJSON_Parse(out);
	ck_assert_msg(doc != NULL, "not JSON: %s", out);
	ck_assert_int_eq(cJSON_GetObjectItem(doc, "resident_data")->valuedouble, 3 * MIB / 2);
	ck_assert_int_eq(cJSON_GetObjectItem(doc, "cache_resident")->valuedouble, 2 * MIB);
	ck_assert_int_eq(cJSON_GetObjectItem(doc, "cache_saves")->valuedouble, 0);
	double total = cJSON_GetObjectItem(doc, "cache_total")->valuedouble;
	ck_assert_int_eq(cJSON_GetObjectItem(doc, "cache_locked")->valuedouble == total, pinned);
	ck_assert(cJSON_IsNumber(cJSON_GetObjectItem(doc, "uptime_ms")));
	ck_assert_ptr_null(cJSON_GetObjectItem(doc, "uptime_s"));
	ck_assert_ptr_null(cJSON_GetObjectItem(cJSON_GetObjectItem(doc, "metrics"), "uptime_s"));
	cJSON_Delete(doc);
	d_stop();
}
END_TEST

/* list without ROOT lists the daemon's allowed root (a table headed by it; under --json the
 * root's object), with the tag in the cache and local tiers; with no daemon it says it needs
 * ROOT. */
START_TEST(test_list_roots)
{
	const char *out, *err;

	d_start(CACHE_16M, CHUNK_1M);
	dsckpt_conn_t *c = conn_open("ls", 0, 1);
	save_and_commit(c, h_path("%s/ls/t1", D->root), 9);
	dsckpt_close(c);
	ck_assert_int_eq(ctl2(&out, &err, "list"), 0);
	ck_assert_msg(strstr(out, h_path("%s:\n", D->root)) && strstr(out, "ls/t1") &&
		      strstr(out, "committed") && strstr(out, "cache local"), "list said: %s%s",
		      out, err);
	ck_assert_int_eq(ctl2(&out, &err, "--json list"), 0);
	cJSON *doc = cJSON_Parse(out);
	ck_assert_msg(doc != NULL, "not JSON: %s", out);
	ck_assert_str_eq(cJSON_GetObjectItem(doc, "root")->valuestring, D->root);
	const cJSON *t = cJSON_GetArrayItem(cJSON_GetObjectItem(doc, "tags"), 0);
	ck_assert_str_eq(cJSON_GetObjectItem(t, "path")->valuestring, "ls/t1");
	cJSON_Delete(doc);
	d_stop();
}
END_TEST

/* Under --json an error is a JSON document on stdout ({"error": ...}), nothing on stderr;
 * without --json it stays a line on stderr. */
START_TEST(test_json_errors)
{
	const char *out, *err;

	d_start(CACHE_8M, CHUNK_1M);
	const char *none = h_path("%s/none.sock", D->dir);
	int rc = h_system("%s --json -s '%s' status >'%s/o.txt' 2>'%s/e.txt'", h_bin("dsckptctl"),
			  none, D->dir, D->dir);
	ck_assert_int_eq(rc, 1);
	char *o = h_read_file(h_path("%s/o.txt", D->dir), NULL);
	char *e = h_read_file(h_path("%s/e.txt", D->dir), NULL);
	cJSON *doc = o ? cJSON_Parse(o) : NULL;
	ck_assert_msg(doc && cJSON_IsString(cJSON_GetObjectItem(doc, "error")) && e && !e[0],
		      "stdout: %s\nstderr: %s", o, e);
	ck_assert_ptr_nonnull(strstr(cJSON_GetObjectItem(doc, "error")->valuestring,
				     "no dsckptd at"));
	cJSON_Delete(doc);
	free(o);
	free(e);
	ck_assert_int_eq(ctl2(&out, &err, "--json list /no/such/root"), 1);
	doc = cJSON_Parse(out);
	ck_assert_msg(doc && strstr(cJSON_GetObjectItem(doc, "error")->valuestring,
				    "cannot open /no/such/root") && !err[0], "%s|%s", out, err);
	cJSON_Delete(doc);
	ck_assert_int_eq(ctl2(&out, &err, "list /no/such/root"), 1);
	ck_assert_msg(!out[0] && strstr(err, "dsckptctl: cannot open /no/such/root"), "%s|%s", out,
		      err);
	d_stop();
}
END_TEST

/* The suite. */
static Suite *ctl_status_suite(void)
{
	Suite *s = suite_create("ctl status");
	h_add_case(s, "status bytes", test_status_bytes, 60, 1);
	h_add_case(s, "list roots", test_list_roots, 60, 1);
	h_add_case(s, "json errors", test_json_errors, 60, 1);
	return s;
}

CHECK_MAIN(ctl_status_suite)
