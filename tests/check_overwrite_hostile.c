/*
 * check_overwrite_hostile.c — a tag saved again, from the attacker's side (README's security
 * model): the victim's job directory is writable by everyone, and another user takes the name
 * of the tag's staging directory (.<tag>.dsckpt-next) first: a link to a directory of its
 * own (to redirect the victim's new version there), a directory of its own holding a file (to
 * block the victim or slip a file into its checkpoint), and, before a restart, a directory of
 * its own that looks committed and newer (for recovery to exchange in). Each time the victim's
 * new version is saved and committed exactly as it wrote it, nothing of the victim lands in
 * the attacker's places, and the attacker's version never becomes the victim's tag. Two real
 * users (harness_hostile.h); without root the test says SKIP.
 */
#include "harness_hostile.h"

#include <check.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char job[512], stage[600], lair[600];

/* Attacker: a link at the staging name to its own directory. */
static int atk_link(void *arg)
{
	(void)arg;
	if (symlink(lair, stage) < 0)
		return say(1, 1, "attacker: %s", strerror(errno));
	return 0;
}

/* Attacker: its own directory at the staging name, with a file of its own in it. */
static int atk_dir(void *arg)
{
	(void)arg;
	char f[700];
	snprintf(f, sizeof(f), "%s/rank9.safetensors", stage);
	if (mkdir(stage, 0777) < 0)
		return say(1, 1, "attacker: mkdir: %s", strerror(errno));
	FILE *fp = fopen(f, "w");
	if (!fp)
		return say(1, 2, "attacker: %s", strerror(errno));
	fputs("not a checkpoint", fp);
	fclose(fp);
	return 0;
}

/* Attacker: its own directory at the staging name holding a manifest that reads as the
 * tag's newer version, for start-up recovery to exchange with the victim's tag. */
static int atk_committed(void *arg)
{
	(void)arg;
	char f[700];
	snprintf(f, sizeof(f), "%s/MANIFEST.json", stage);
	if (mkdir(stage, 0777) < 0)
		return say(1, 1, "attacker: mkdir: %s", strerror(errno));
	FILE *fp = fopen(f, "w");
	if (!fp)
		return say(1, 2, "attacker: %s", strerror(errno));
	fputs("{\"format\": \"dsckpt-manifest\", \"version\": 1, \"tag\": \"t1\", "
	      "\"created_ns\": 9999999999999999999, \"world_size\": 1, \"files\": []}", fp);
	fclose(fp);
	return 0;
}

/* The victim saves seed into its tag and commits; the tag must then be exactly that. */
static void victim_version(struct vic *v, uint64_t seed, const char *during)
{
	v->seed = seed;
	int vc = as_user(VIC, victim_main, v);
	victim_check(vc, v, during);
	ck_assert_msg(!h_exists(stage) || access(stage, F_OK) != 0,
		      "something is left at the staging name %s", during);
	ck_assert_str_eq(file_text(h_path("%s/latest", job)), "t1");
}

/* Another user's link, directory or committed-looking directory at the staging name neither
 * blocks nor redirects the victim's new versions. */
START_TEST(test_staging_squatted)
{
	HOSTILE_BEGIN("take the staging name of another user's tag");
	struct vic v = {.n = MIB, .commit = 1, .wait_ms = 20000};

	hd_start(CACHE_8M, NULL);
	snprintf(job, sizeof(job), "%s/jobV", D->root);
	snprintf(stage, sizeof(stage), "%s/.t1.dsckpt-next", job);
	snprintf(lair, sizeof(lair), "%s/lair", D->root);
	user_dir(job, VIC, 0777);
	user_dir(lair, ATK, 0777);
	v.dir = h_path("%s/t1", job);
	victim_version(&v, 61, "first version");

	ck_assert_int_eq(as_user(ATK, atk_link, NULL), 0);
	victim_version(&v, 62, "with a link at the staging name");
	ck_assert_msg(h_system("[ -z \"$(ls -A '%s')\" ]", lair) == 0,
		      "the victim's save went into the attacker's directory");

	ck_assert_int_eq(as_user(ATK, atk_dir, NULL), 0);
	victim_version(&v, 63, "with the attacker's directory at the staging name");
	ck_assert_msg(!h_exists(h_path("%s/t1/rank9.safetensors", job)),
		      "the attacker's file is in the victim's checkpoint");

	ck_assert_int_eq(as_user(ATK, atk_committed, NULL), 0);
	h_daemon_kill(D, SIGTERM);
	h_daemon_restart(D);
	hd_alive("after recovery of a planted staging directory");
	ck_assert_msg(h_exists(h_path("%s/t1/rank0.safetensors", job)),
		      "recovery exchanged the attacker's directory with the victim's tag");
	victim_check(0, &v, "after recovery of a planted staging directory");
	ck_assert_int_eq(h_system("rm -rf '%s'", stage), 0);
	hd_stop();
}
END_TEST

/* The suite. */
static Suite *overwrite_hostile_suite(void)
{
	Suite *s = suite_create("overwrite_hostile");
	TCase *tc = tcase_create("overwrite_hostile");
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_staging_squatted);
	suite_add_tcase(s, tc);
	return s;
}

CHECK_MAIN(overwrite_hostile_suite)
