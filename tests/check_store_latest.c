/*
 * check_store_latest.c — a job's commits and its `latest`: commits of one job racing with
 * retention never leave `latest` naming a deleted or uncommitted tag and never report an
 * error for a commit that happened; a commit that cannot move `latest` leaves no manifest;
 * recovery finishes a commit whose manifest was whole and repairs `latest` and keep_last.
 */
#include "harness_store.h"

#include <check.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define ROUNDS 150

/* One commit run on its own thread. */
struct racer {
	const char *dir;
	int rc;
	char err[ERRLEN];
};

/* Thread: commits one tag (world 1). */
static void *racer_main(void *arg)
{
	struct racer *r = arg;
	struct store_commit_info info;

	r->rc = store_commit(&cfg, r->dir, 1, "", NULL, 0, 0, &info, r->err, sizeof(r->err));
	return NULL;
}

/* What job/latest names now ("" when it is missing). */
static void latest_of(const char *job, char *out, size_t len)
{
	char *text = h_read_file(rpath("%s/latest", job), NULL);
	snprintf(out, len, "%s", text ? text : "");
	free(text);
}

/* Whether job/tag holds a manifest. */
static int committed(const char *job, const char *tag)
{
	char p[PATH_MAX];
	snprintf(p, sizeof(p), "%s/%s/MANIFEST.json", job, tag);
	return h_exists(rpath("%s", p));
}

/* Two commits of one job at once, keep_last 1, many rounds: both succeed, and after each
 * round latest names a tag that exists and is committed (the newest of the two). */
START_TEST(test_concurrent_commits)
{
	char a[64], b[64], latest[NAME_MAX + 1];

	cfg.keep_last = 1;
	for (int i = 0; i < ROUNDS; i++) {
		snprintf(a, sizeof(a), "job/r%03da", i);
		snprintf(b, sizeof(b), "job/r%03db", i);
		write_ckpt(rpath("%s", a), "rank0", 0, "m");
		write_ckpt(rpath("%s", b), "rank0", 0, NULL);
		struct racer ra = {.dir = rpath("%s", a)}, rb = {.dir = rpath("%s", b)};
		pthread_t ta, tb;
		ck_assert_int_eq(pthread_create(&ta, NULL, racer_main, &ra), 0);
		ck_assert_int_eq(pthread_create(&tb, NULL, racer_main, &rb), 0);
		pthread_join(ta, NULL);
		pthread_join(tb, NULL);
		ck_assert_msg(ra.rc == 0, "round %d: commit of %s: %s", i, a, ra.err);
		ck_assert_msg(rb.rc == 0, "round %d: commit of %s: %s", i, b, rb.err);
		latest_of("job", latest, sizeof(latest));
		ck_assert_msg(latest[0] && committed("job", latest),
			      "round %d: latest names '%s', not a committed tag", i, latest);
		/* keep_last 1: the other tag of the round is gone, latest's stays. */
		ck_assert_msg(committed("job", a + 4) + committed("job", b + 4) == 1,
			      "round %d: keep_last 1 kept %d tags", i,
			      committed("job", a + 4) + committed("job", b + 4));
	}
}
END_TEST

/* latest cannot be written (a directory is in its way): the commit fails and takes its
 * manifest back, so the tag does not read as committed. */
START_TEST(test_latest_failure_uncommits)
{
	char err[ERRLEN];
	struct store_commit_info info;

	write_ckpt(rpath("%s", "job/t1"), "rank0", 0, NULL);
	ck_assert_int_eq(mkdir(rpath("%s", "job/latest"), 0755), 0);
	write_text(rpath("%s", "job/latest/keep"), "x");
	int rc = store_commit(&cfg, rpath("%s", "job/t1"), 1, "", NULL, 0, 0, &info, err, sizeof(err));
	ck_assert_int_lt(rc, 0);
	ck_assert_msg(strstr(err, "latest") != NULL, "error does not name latest: %s", err);
	ck_assert(!h_exists(rpath("%s", "job/t1/MANIFEST.json")));
	ck_assert(h_exists(rpath("%s", "job/t1/rank0.safetensors")));
}
END_TEST

/* latest only moves forward: committing an older tag again leaves it on the newer one. */
START_TEST(test_latest_forward)
{
	char latest[NAME_MAX + 1];

	write_ckpt(rpath("%s", "job/t1"), "rank0", 0, NULL);
	commit_ok(rpath("%s", "job/t1"), 1);
	write_ckpt(rpath("%s", "job/t2"), "rank0", 0, NULL);
	commit_ok(rpath("%s", "job/t2"), 1);
	commit_ok(rpath("%s", "job/t1"), 1);
	latest_of("job", latest, sizeof(latest));
	ck_assert_str_eq(latest, "t2");
}
END_TEST

/* A job directory holding .dsckpt-no-latest (the Lightning plugin's dirpath) gets no latest
 * from a commit nor from recovery, while keep_last still applies. */
START_TEST(test_no_latest)
{
	cfg.keep_last = 1;
	write_ckpt(rpath("%s", "job/t1"), "rank0", 0, NULL);
	write_text(rpath("%s", "job/.dsckpt-no-latest"), "");
	commit_ok(rpath("%s", "job/t1"), 1);
	write_ckpt(rpath("%s", "job/t2"), "rank0", 0, NULL);
	commit_ok(rpath("%s", "job/t2"), 1);
	ck_assert(!h_exists(rpath("%s", "job/latest")));
	ck_assert(committed("job", "t2"));
	ck_assert_msg(!h_exists(rpath("%s", "job/t1")), "keep_last 1 was not applied");
	recover_run(&cfg, NULL);
	ck_assert(!h_exists(rpath("%s", "job/latest")));
	ck_assert(committed("job", "t2"));
}
END_TEST

/* Killed after the manifest's rename, before latest: recovery points latest at the newest
 * committed tag and completes keep_last, never deleting latest's tag. */
START_TEST(test_recover_latest)
{
	char latest[NAME_MAX + 1];

	cfg.keep_last = 1;
	write_ckpt(rpath("%s", "job/t1"), "rank0", 0, NULL);
	commit_ok(rpath("%s", "job/t1"), 1);
	cfg.keep_last = 0;
	write_ckpt(rpath("%s", "job/t2"), "rank0", 0, NULL);
	commit_ok(rpath("%s", "job/t2"), 1);
	write_text(rpath("%s", "job/latest"), "t1");	/* as if killed before latest moved */
	cfg.keep_last = 1;
	recover_run(&cfg, NULL);
	latest_of("job", latest, sizeof(latest));
	ck_assert_str_eq(latest, "t2");
	ck_assert(committed("job", "t2"));
	ck_assert_msg(!h_exists(rpath("%s", "job/t1")), "keep_last 1 was not completed");

	/* latest naming a tag that is gone: repaired too. */
	write_text(rpath("%s", "job/latest"), "t0");
	recover_run(&cfg, NULL);
	latest_of("job", latest, sizeof(latest));
	ck_assert_str_eq(latest, "t2");
}
END_TEST

/* Killed after the manifest was written whole but before its rename: recovery finishes the
 * commit (the tag is not deleted as uncommitted); a torn manifest is not finished. */
START_TEST(test_recover_whole_manifest)
{
	char latest[NAME_MAX + 1];

	write_ckpt(rpath("%s", "job/t1"), "rank0", 0, NULL);
	commit_ok(rpath("%s", "job/t1"), 1);
	write_ckpt(rpath("%s", "job/t2"), "rank0", 0, "m");
	commit_ok(rpath("%s", "job/t2"), 1);
	make_partial(rpath("%s", "job/t2/MANIFEST.json"));
	write_text(rpath("%s", "job/latest"), "t1");
	write_ckpt(rpath("%s", "job/t3"), "rank0", 0, NULL);
	commit_ok(rpath("%s", "job/t3"), 1);
	size_t len;
	char *text = h_read_file(rpath("%s", "job/t3/MANIFEST.json"), &len);
	ck_assert_int_eq(unlink(rpath("%s", "job/t3/MANIFEST.json")), 0);
	write_bytes(rpath("%s", "job/t3/MANIFEST.json.partial"), text, len / 2);
	free(text);
	write_text(rpath("%s", "job/latest"), "t1");

	recover_run(&cfg, NULL);

	ck_assert(committed("job", "t2"));
	ck_assert(!h_exists(rpath("%s", "job/t2/MANIFEST.json.partial")));
	ck_assert(h_exists(rpath("%s", "job/t2/rank0.safetensors")));
	ck_assert(h_exists(rpath("%s", "job/t2/rank0.meta")));
	latest_of("job", latest, sizeof(latest));
	ck_assert_str_eq(latest, "t2");
	ck_assert(!committed("job", "t3"));
	ck_assert(!h_exists(rpath("%s", "job/t3/rank0.safetensors")));	/* this host's, uncommitted */
}
END_TEST

/* Seconds on the monotonic clock. */
static double mono(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* 1,000 simulated nodes of one rank each seal one tag: one record per node; the last one to
 * write reads all 1,000, finds the set complete and commits 1,000 files. Prints the cost. */
START_TEST(test_thousand_nodes)
{
	enum { NODES = 1000 };
	char err[ERRLEN], host[32];
	uint8_t have[NODES];
	struct store_commit_info info;
	const char *tag = rpath("%s", "job/big");
	int jobfd;

	for (unsigned r = 0; r < NODES; r++) {
		char file[16];
		snprintf(file, sizeof(file), "rank%u", r);
		write_ckpt(tag, file, (int)r, NULL);
	}
	int dfd = store_open_tag(&cfg, tag, 0, 0, &jobfd, err, sizeof(err));
	ck_assert_msg(dfd >= 0, "%s", err);
	double t0 = mono(), scan = 0;
	for (unsigned r = 0; r < NODES; r++) {
		unsigned rank = r;
		snprintf(host, sizeof(host), "node-%04u", r);
		struct seal_record rec = {host, "job", NODES, &rank, 1, "", 0, NULL, 0, NULL};
		ck_assert_int_eq(store_seal_write(&cfg, dfd, &rec, 0, 0, err, sizeof(err)), 0);
		if (r == NODES - 2 || r == NODES - 1) {
			double s0 = mono();
			uint64_t newest;
			int got = store_seal_scan(dfd, "job", "", NODES, have, &newest);
			scan = mono() - s0;
			ck_assert_int_eq(got, (int)r + 1);	/* complete only with the last */
		}
	}
	double written = mono() - t0;
	t0 = mono();
	ck_assert_msg(store_commit(&cfg, tag, NODES, "", NULL, 0, 0, &info, err, sizeof(err)) == 0, "%s",
		      err);
	double commit = mono() - t0;
	ck_assert_uint_eq(info.files, NODES);
	char latest[NAME_MAX + 1];
	latest_of("job", latest, sizeof(latest));
	ck_assert_str_eq(latest, "big");
	printf("1000 nodes sealing one tag: %u records written in %.0f ms (%.2f ms each); the "
	       "last node reads all 1000 in %.1f ms; the commit of %u files takes %.0f ms\n",
	       NODES, written * 1e3, written * 1e3 / NODES, scan * 1e3, NODES, commit * 1e3);
	close(dfd);
	close(jobfd);
}
END_TEST

/* The suite. */
static Suite *latest_suite(void)
{
	Suite *s = suite_create("store latest");
	TCase *tc = tcase_create("latest");
	tcase_add_checked_fixture(tc, scratch_setup, scratch_teardown);
	tcase_add_test(tc, test_concurrent_commits);
	tcase_add_test(tc, test_latest_failure_uncommits);
	tcase_add_test(tc, test_latest_forward);
	tcase_add_test(tc, test_recover_latest);
	tcase_add_test(tc, test_no_latest);
	tcase_add_test(tc, test_recover_whole_manifest);
	tcase_add_test(tc, test_thousand_nodes);
	tcase_set_timeout(tc, 60);
	suite_add_tcase(s, tc);
	return s;
}

CHECK_MAIN(latest_suite)
