/*
 * check_overwrite_crash.c — a committed tag's new version committed by a process SIGKILLed
 * before each of the commit's steps in turn (tests/swap_hooks.c stops it before its n-th
 * rename, link, unlink, mkdir or fsync: the manifest written into the staging directory, the
 * exchange with the tag, the old version moved aside and removed, `latest`), then start-up
 * recovery. After every kill: the tag is exactly one version, whole (its manifest lists every
 * file, of the right size, all of one version), `latest` names it, no staging or old
 * directory is left, and once a kill finds the new version in place no later one finds the
 * old.
 */
#include "harness_store.h"
#include "swap_hooks.h"

#include <check.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* Makes <job>/last committed as version "v1" (two ranks, with the seal record its seal left)
 * and <job>/.last.dsckpt-next holding version "v2", written and not committed. */
static void two_versions(const char *job)
{
	char tag[PATH_MAX], stage[PATH_MAX], err[ERRLEN];
	unsigned ranks[2] = {0, 1};
	struct seal_record r = {store_host(), "j", 2, ranks, 2, "", 0, NULL, 0, NULL};

	snprintf(tag, sizeof(tag), "%s/last", rpath("%s", job));
	snprintf(stage, sizeof(stage), "%s/.last.dsckpt-next", rpath("%s", job));
	write_ckpt(tag, "rank0", 0, "version-v1");
	write_ckpt(tag, "rank1", 1, "version-v1");
	int fd = open(tag, STORE_DIR_FLAGS);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(store_seal_write(&cfg, fd, &r, 0, 0, err, sizeof(err)), 0);
	close(fd);
	commit_ok(tag, 2);
	ck_assert_int_eq(mkdir(stage, 0700), 0);
	write_ckpt(stage, "rank0", 0, "version-v2");
	write_ckpt(stage, "rank1", 1, "version-v2");
}

/* Which version dir/file.meta holds: 1 or 2 (0: neither). */
static int meta_version(const char *dir, const char *file)
{
	char path[PATH_MAX];
	size_t len;
	snprintf(path, sizeof(path), "%s/%s.meta", dir, file);
	char *b = h_read_file(path, &len);
	int v = !b ? 0 : memmem(b, len, "version-v1", 10) ? 1 : memmem(b, len, "version-v2", 10) ? 2 : 0;
	free(b);
	return v;
}

/* Checks <job>/last after recovery as the header says; returns its version. */
static int check_tag(const char *job)
{
	char tag[PATH_MAX], why[300];
	int present;

	snprintf(tag, sizeof(tag), "%s/last", rpath("%s", job));
	int fd = open(tag, STORE_DIR_FLAGS);
	ck_assert_msg(fd >= 0, "%s is gone", tag);
	struct manifest *m = manifest_load(fd, &present, why, sizeof(why));
	ck_assert_msg(m, "%s has no sound manifest: %s", tag, why);
	ck_assert_str_eq(m->tag, "last");
	ck_assert_uint_eq(m->nfiles, 4);
	for (size_t i = 0; i < m->nfiles; i++) {
		struct stat st;
		ck_assert_int_eq(fstatat(fd, m->files[i].name, &st, AT_SYMLINK_NOFOLLOW), 0);
		ck_assert_uint_eq((uint64_t)st.st_size, m->files[i].size);
	}
	manifest_free(m);
	close(fd);
	int v = meta_version(tag, "rank0");
	ck_assert_msg(v > 0 && v == meta_version(tag, "rank1"), "ranks of two versions in %s",
		      tag);
	char *latest = h_read_file(rpath("%s/latest", job), NULL);
	ck_assert_str_eq(latest ? latest : "", "last");
	free(latest);
	ck_assert(!h_exists(rpath("%s/.last.dsckpt-next", job)));
	ck_assert(!h_exists(rpath("%s/.last.dsckpt-old", job)));
	ck_assert(!h_exists(rpath("%s/last/MANIFEST.json.partial", job)));
	return v;
}

/* The commit of the new version, killed before each of its steps, then recovered. */
START_TEST(test_kill_every_step)
{
	int seen_new = 0;

	for (unsigned k = 1; k < 200; k++) {
		char job[32], stage[PATH_MAX], err[ERRLEN];
		int st;
		snprintf(job, sizeof(job), "job%u", k);
		two_versions(job);
		snprintf(stage, sizeof(stage), "%s/.last.dsckpt-next", rpath("%s", job));
		pid_t pid = fork();
		ck_assert_int_ge(pid, 0);
		if (pid == 0) {
			struct store_commit_info info;
			swap_hooks_arm(k);
			int rc = store_commit(&cfg, stage, 2, "", NULL, 0, 0, &info, err, sizeof(err));
			swap_hooks_arm(0);
			if (rc < 0)
				fprintf(stderr, "commit: %s\n", err);
			_exit(rc == 0 ? 0 : 1);
		}
		ck_assert_int_eq(waitpid(pid, &st, 0), pid);
		int killed = WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL;
		ck_assert_msg(killed || (WIFEXITED(st) && WEXITSTATUS(st) == 0),
			      "the commit failed (status %d)", st);
		recover_run(&cfg, NULL);
		int v = check_tag(job);
		printf("killed before step %u: %s, the tag is version %d\n", k,
		       killed ? "recovered" : "not killed (all steps done)", v);
		ck_assert_msg(v == 2 || !seen_new, "step %u: the old version came back", k);
		seen_new |= v == 2;
		if (!killed) {
			ck_assert_int_eq(v, 2);
			ck_assert_uint_gt(k, 4);
			return;
		}
	}
	ck_abort_msg("the commit never ran to its end");
}
END_TEST

/* An old version holding a directory its user made cannot be removed whole: it is left aside
 * under another name, and the tag's later versions are still saved and committed. */
START_TEST(test_old_version_with_a_directory)
{
	char stage[PATH_MAX];

	snprintf(stage, sizeof(stage), "%s", rpath("%s/.last.dsckpt-next", "jobd"));
	for (int v = 0; v < 3; v++) {
		if (v == 0) {
			two_versions("jobd");
			ck_assert_int_eq(mkdir(rpath("%s/last/mine", "jobd"), 0700), 0);
		} else {
			ck_assert_int_eq(mkdir(stage, 0700), 0);
			write_ckpt(stage, "rank0", 0, "version-v2");
			write_ckpt(stage, "rank1", 1, "version-v2");
		}
		commit_ok(stage, 2);
		ck_assert_int_eq(check_tag("jobd"), 2);
	}
	ck_assert_int_eq(h_system("ls -a '%s' | grep -q '^\\.last\\.dsckpt-old\\.[0-9]'",
				  rpath("%s", "jobd")), 0);
}
END_TEST

/* The suite. */
static Suite *overwrite_crash_suite(void)
{
	Suite *s = suite_create("overwrite_crash");
	TCase *tc = tcase_create("overwrite_crash");
	tcase_set_timeout(tc, 120);
	tcase_add_checked_fixture(tc, scratch_setup, scratch_teardown);
	tcase_add_test(tc, test_kill_every_step);
	tcase_add_test(tc, test_old_version_with_a_directory);
	suite_add_tcase(s, tc);
	return s;
}

CHECK_MAIN(overwrite_crash_suite)
