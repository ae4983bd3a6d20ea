/* check_store_recover.c — recovery at start-up: what a crash left goes, also on a shared root. */
#include "harness_store.h"

#include <check.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Recovery removes stale partials and uncommitted tags of ours, nothing else. */
START_TEST(test_recover)
{
	char outside[PATH_MAX + 16], p[PATH_MAX + 48];
	write_ckpt(rpath("%s", "job/done"), "rank0", 0, "m");
	commit_ok(rpath("%s", "job/done"), 1);
	write_text(rpath("%s", "job/done/rank1.safetensors.partial"), "half");
	backdate(rpath("%s", "job/done/rank1.safetensors.partial"), 3600);
	write_text(rpath("%s", "job/latest.partial"), "x");
	backdate(rpath("%s", "job/latest.partial"), 3600);
	write_ckpt(rpath("%s", "job/crashed"), "rank0", 0, "m");
	write_ckpt_host(rpath("%s", "job/crashed"), "rank1", 1, NULL, NULL);
	backdate(rpath("%s", "job/crashed"), 3600);
	write_ckpt(rpath("%s", "job/mixed"), "rank0", 0, NULL);
	write_foreign(rpath("%s", "job/mixed/theirs.safetensors"));
	ck_assert_int_eq(mkdir(rpath("%s", "other"), 0755), 0);
	write_foreign(rpath("%s", "other/model.safetensors"));
	write_text(rpath("%s", "other/download.partial"), "not ours");
	write_ckpt(rpath("%s", "a/b/c/d/e/f/g/h/i/j"), "rank0", 0, NULL); /* too deep */

	snprintf(outside, sizeof(outside), "%s/outside", scratch);
	ck_assert_int_eq(mkdir(outside, 0755), 0);
	snprintf(p, sizeof(p), "%s/x.safetensors.partial", outside);
	write_text(p, "outside");
	ck_assert_int_eq(symlink(outside, rpath("%s", "job/link")), 0);

	recover_run(&cfg, NULL);

	ck_assert(!h_exists(rpath("%s", "job/done/rank1.safetensors.partial")));
	ck_assert(!h_exists(rpath("%s", "job/latest.partial")));
	ck_assert(h_exists(rpath("%s", "job/done/rank0.safetensors")));
	ck_assert(h_exists(rpath("%s", "job/done/rank0.meta")));
	ck_assert(!h_exists(rpath("%s", "job/crashed")));
	ck_assert(!h_exists(rpath("%s", "job/mixed/rank0.safetensors")));
	ck_assert(h_exists(rpath("%s", "job/mixed/theirs.safetensors")));
	ck_assert(h_exists(rpath("%s", "other/model.safetensors")));
	ck_assert(h_exists(rpath("%s", "other/download.partial")));
	ck_assert(h_exists(rpath("%s", "a/b/c/d/e/f/g/h/i/j/rank0.safetensors")));
	ck_assert(h_exists(p));
	ck_assert(h_exists(rpath("%s", "job/link")));
	commit_ok(rpath("%s", "job/done"), 1);
}
END_TEST

/* The host name recorded in files is printable, at most 255 bytes, and settable. */
START_TEST(test_host)
{
	char longname[300];
	const char *h = store_host();
	ck_assert_uint_gt(strlen(h), 0);
	ck_assert_uint_lt(strlen(h), 256);
	for (const char *c = h; *c; c++)
		ck_assert(*c > ' ' && *c < 0x7f);
	ck_assert_ptr_eq(store_host(), h);
	store_set_host("node a\n\xc3\xa9");
	ck_assert_str_eq(store_host(), "node?a???");
	memset(longname, 'n', sizeof(longname) - 1);
	longname[sizeof(longname) - 1] = 0;
	store_set_host(longname);
	ck_assert_uint_eq(strlen(store_host()), 255);
}
END_TEST

/* A shared root: only what this host left goes; other hosts' and recent unnamed files stay. */
START_TEST(test_recover_hosts)
{
	const char *t = rpath("%s", "job/t1");
	store_set_host("node-b");
	write_ckpt_host(t, "rank0", 0, "m", "node-a");  /* durable, another node's */
	write_ckpt_host(t, "rank1", 1, "m", "node-b");  /* durable, ours */
	write_ckpt_host(t, "rank2", 2, "m", NULL);      /* durable, from before hosts */
	write_ckpt_host(t, "rank3", 3, NULL, "node-a"); /* another node's, before its rename */
	make_partial(rpath("%s", "job/t1/rank3.safetensors"));
	write_text(rpath("%s", "job/t1/rank3.meta.partial"), "m");
	write_ckpt_host(t, "rank4", 4, NULL, "node-b"); /* ours, before the rename */
	make_partial(rpath("%s", "job/t1/rank4.safetensors"));
	write_text(rpath("%s", "job/t1/rank4.meta.partial"), "m");
	write_ckpt_host(t, "rank5", 5, NULL, NULL);     /* an earlier version's, just written */
	make_partial(rpath("%s", "job/t1/rank5.safetensors"));
	char zeros[8192] = {0};                         /* data written, header not yet */
	write_bytes(rpath("%s", "job/t1/rank6.safetensors.partial"), zeros, sizeof(zeros));
	write_bytes(rpath("%s", "job/t1/rank7.safetensors.partial"), zeros, sizeof(zeros));
	backdate(rpath("%s", "job/t1/rank7.safetensors.partial"), 3600);
	write_text(rpath("%s", "job/t1/rank8.meta.partial"), "m");
	write_text(rpath("%s", "job/t1/MANIFEST.json.partial"), "{");
	ck_assert_int_eq(mkdir(rpath("%s", "old"), 0755), 0);
	write_text(rpath("%s", "old/latest.partial"), "t0");
	backdate(rpath("%s", "old/latest.partial"), 3600);
	write_ckpt(rpath("%s", "job/gone"), "rank0", 0, "m");   /* an old tag of ours */
	backdate(rpath("%s", "job/gone"), 3600);
	write_ckpt(rpath("%s", "job/fresh"), "rank0", 0, "m");  /* a recent tag of ours */
	write_ckpt_host(rpath("%s", "job/done"), "rank0", 0, NULL, "node-a");
	commit_ok(rpath("%s", "job/done"), 1);
	write_text(rpath("%s", "job/latest.partial"), "t1");

	recover_run(&cfg, NULL);

	static const char *const kept[] = {
		"rank0.safetensors", "rank0.meta", "rank3.safetensors.partial",
		"rank3.meta.partial",
		"rank5.safetensors.partial", "rank6.safetensors.partial", "rank8.meta.partial",
		"MANIFEST.json.partial"};
	static const char *const removed[] = {
		"rank1.safetensors", "rank1.meta", "rank2.safetensors", "rank2.meta",
		"rank4.safetensors.partial", "rank4.meta.partial", "rank7.safetensors.partial"};
	for (size_t i = 0; i < sizeof(kept) / sizeof(kept[0]); i++)
		ck_assert_msg(h_exists(rpath("job/t1/%s", kept[i])), "%s was removed", kept[i]);
	for (size_t i = 0; i < sizeof(removed) / sizeof(removed[0]); i++)
		ck_assert_msg(!h_exists(rpath("job/t1/%s", removed[i])), "%s is left", removed[i]);
	ck_assert(h_exists(rpath("%s", "job/latest.partial")));
	ck_assert(!h_exists(rpath("%s", "old/latest.partial")));
	ck_assert(!h_exists(rpath("%s", "job/gone")));
	ck_assert(!h_exists(rpath("%s", "job/fresh/rank0.safetensors")));
	ck_assert(h_exists(rpath("%s", "job/fresh")));  /* another node may be about to fill it */
	ck_assert(h_exists(rpath("%s", "job/done/MANIFEST.json")));

	/* Node A's daemon restarts later: its own files go, the recent unnamed partials stay. */
	store_set_host("node-a");
	recover_run(&cfg, NULL);
	ck_assert(!h_exists(rpath("%s", "job/t1/rank0.safetensors")));
	ck_assert(!h_exists(rpath("%s", "job/t1/rank0.meta")));
	ck_assert(!h_exists(rpath("%s", "job/t1/rank3.safetensors.partial")));
	ck_assert(!h_exists(rpath("%s", "job/t1/rank3.meta.partial")));
	ck_assert(h_exists(rpath("%s", "job/t1/rank6.safetensors.partial")));
	ck_assert(h_exists(rpath("%s", "job/done/rank0.safetensors")));
}
END_TEST

/* A crash between a file's .meta and its rename (the .meta in place, the file a partial):
 * in a tag without a manifest the .meta goes with our partial (another node's stays for that
 * node); in a committed tag it stays. */
START_TEST(test_recover_meta_beside_partial)
{
	store_set_host("node-b");
	write_ckpt_host(rpath("%s", "job/t"), "dcp_metadata", 0, "m", "node-b");
	make_partial(rpath("%s", "job/t/dcp_metadata.safetensors"));
	write_ckpt_host(rpath("%s", "job/t"), "rank1", 1, "m", "node-a");
	make_partial(rpath("%s", "job/t/rank1.safetensors"));
	write_ckpt(rpath("%s", "job/done"), "rank0", 0, "m");
	commit_ok(rpath("%s", "job/done"), 1);
	write_ckpt_host(rpath("%s", "job/done"), "extra", 0, "m", "node-b");
	make_partial(rpath("%s", "job/done/extra.safetensors"));

	recover_run(&cfg, NULL);

	ck_assert(!h_exists(rpath("%s", "job/t/dcp_metadata.safetensors.partial")));
	ck_assert_msg(!h_exists(rpath("%s", "job/t/dcp_metadata.meta")),
		      "the .meta of a removed partial is left");
	ck_assert(h_exists(rpath("%s", "job/t/rank1.safetensors.partial")));
	ck_assert(h_exists(rpath("%s", "job/t/rank1.meta")));
	ck_assert(!h_exists(rpath("%s", "job/done/extra.safetensors.partial")));
	ck_assert(h_exists(rpath("%s", "job/done/extra.meta")));
	ck_assert(h_exists(rpath("%s", "job/done/rank0.meta")));
}
END_TEST

/* Recovery's budget is per user (the owner of a directory below the root): a tree past its
 * entries or bytes is left as it is from there on, another user's is still recovered; a file
 * with two links is never read (nor removed). */
START_TEST(test_recover_budget)
{
	char name[32];

	cfg.max_recovery_entries = 40;
	write_ckpt(rpath("%s", "jobA/t1"), "rank0", 0, NULL);
	for (int i = 0; i < 50; i++) {
		snprintf(name, sizeof(name), "junk%02d", i);
		write_text(rpath("jobA/t1/%s", name), "x");
	}
	write_ckpt(rpath("%s", "jobB/t1"), "rank0", 0, NULL);
	write_ckpt(rpath("%s", "jobB/t2"), "rank0", 0, NULL);
	ck_assert_int_eq(link(rpath("%s", "jobB/t2/rank0.safetensors"),
			      rpath("%s", "jobB/t2/again.safetensors")), 0);
	ck_assert_int_eq(h_system("chown -R 4242 '%s'", rpath("%s", "jobA")), 0);
	ck_assert_int_eq(h_system("chown -R 4343 '%s'", rpath("%s", "jobB")), 0);
	recover_run(&cfg, NULL);
	ck_assert_msg(h_exists(rpath("%s", "jobA/t1/rank0.safetensors")),
		      "a tree past its user's entries was recovered");
	ck_assert_msg(!h_exists(rpath("%s", "jobB/t1/rank0.safetensors")),
		      "another user's tree was not recovered");
	ck_assert_msg(h_exists(rpath("%s", "jobB/t2/rank0.safetensors")) &&
		      h_exists(rpath("%s", "jobB/t2/again.safetensors")),
		      "a file with two links was removed");

	/* Bytes: two headers' worth for three files of ours; the third stays. */
	cfg.max_recovery_entries = 100000;
	cfg.max_recovery_bytes = 2 * STORE_HEADER_PREFIX;
	for (int r = 0; r < 3; r++) {
		snprintf(name, sizeof(name), "rank%d", r);
		write_ckpt(rpath("%s", "jobC/t1"), name, r, NULL);
	}
	ck_assert_int_eq(h_system("chown -R 4444 '%s'", rpath("%s", "jobC")), 0);
	recover_run(&cfg, NULL);
	ck_assert(!h_exists(rpath("%s", "jobC/t1/rank0.safetensors")));
	ck_assert(!h_exists(rpath("%s", "jobC/t1/rank1.safetensors")));
	ck_assert_msg(h_exists(rpath("%s", "jobC/t1/rank2.safetensors")),
		      "a header past its user's bytes was read");
}
END_TEST

/* Builds the suite. */
static Suite *store_suite(void)
{
	Suite *s = suite_create("store recover");
	TCase *tc = tcase_create("recover");
	tcase_add_checked_fixture(tc, scratch_setup, scratch_teardown);
	tcase_add_test(tc, test_recover);
	tcase_add_test(tc, test_host);
	tcase_add_test(tc, test_recover_hosts);
	tcase_add_test(tc, test_recover_meta_beside_partial);
	tcase_add_test(tc, test_recover_budget);
	tcase_set_timeout(tc, 20);
	suite_add_tcase(s, tc);
	return s;
}

/* Runs the suite; non-zero exit status when a test failed. */
int main(void)
{
	return h_run_suite(store_suite(), NULL);
}
