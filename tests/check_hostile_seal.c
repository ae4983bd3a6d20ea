/*
 * check_hostile_seal.c — SEAL from the attacker's side (DESIGN.md §8): another user seals the
 * victim's tag (refused, nothing written there, nothing committed), and floods the daemon with
 * seals of its own tags as a job of 65,536 ranks (cut at max_seals_per_user with ELIMIT, the
 * daemon alive); the victim's own seal is then committed at once. Seals another user left on
 * a path it then removed hold nothing against the user who takes the path next, and no
 * reply tells that user anything of them. Two real users (harness_hostile.h); without root
 * the test says SKIP.
 */
#include "harness_hostile.h"

#include <check.h>
#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#define FLOOD 12
#define LIMIT 8

/* Attacker: seals the victim's tag (rc[1]: its code), then saves into and seals FLOOD tags of
 * its own as rank 0 of 65,536 (n[1]: seals refused with ELIMIT, n[2]: accepted). */
static int atk_seal(void *arg)
{
	dsckpt_conn_t *c;
	int rc;

	if ((rc = dsckpt_connect(D->socket, &c)) < 0 ||
	    (rc = dsckpt_identify(c, "jobV", 0, 65536)) < 0)
		return say(1, 1, "attacker: connect: %s", dsckpt_err_name(rc));
	B->rc[1] = dsckpt_seal(c, h_path("%s/jobV/t1", D->root));
	snprintf(B->msg[1], sizeof(B->msg[1]), "%s", dsckpt_last_error(c));
	for (int i = 0; i < FLOOD; i++) {
		const char *dir = h_path("%s/jobA/s%02d", D->root, i);
		dsckpt_save_t *s;
		int64_t shape[1] = {16};
		void *mem = dsckpt_host_alloc(16);
		if (!mem || dsckpt_save_begin(c, dir, "rank0", &s) < 0 ||
		    dsckpt_add_tensor(s, "t", "U8", shape, 1, mem, 16) < 0 ||
		    dsckpt_save_end(s) < 0 || dsckpt_wait(s, DSCKPT_DURABLE, 10000) < 0)
			return say(2, 2, "attacker: save %d: %s", i, dsckpt_last_error(c));
		rc = dsckpt_seal(c, dir);
		B->n[1] += rc == DSCKPT_ELIMIT;
		B->n[2] += rc >= 0;
	}
	return 0;
}

/* Victim: seals its tag (rc[0]). */
static int vic_seal(void *arg)
{
	dsckpt_conn_t *c;
	int rc;

	if ((rc = dsckpt_connect(D->socket, &c)) < 0 || (rc = dsckpt_identify(c, "jobV", 0, 1)) < 0)
		return say(0, 1, "victim: connect: %s", dsckpt_err_name(rc));
	B->rc[0] = dsckpt_seal(c, h_path("%s/jobV/t1", D->root));
	return 0;
}

/* Another user's SEAL of the victim's tag is refused; a flood of seals stops at the limit. */
START_TEST(test_seal_attacks)
{
	HOSTILE_BEGIN("seal another user's tag, flood seals");
	struct vic v = {.n = MIB, .seed = 77, .wait_ms = 10000};

	hd_start(CACHE_8M, "\"max_seals_per_user\": 8,");
	v.dir = h_path("%s/jobV/t1", D->root);
	int vc = as_user(VIC, victim_main, &v);
	victim_check(vc, &v, "before the attack");
	int ac = as_user(ATK, atk_seal, NULL);
	ck_assert_msg(ac == 0, "attacker: %s: %s", status_str(ac), B->msg[2]);
	ck_assert_msg(B->rc[1] < 0, "the attacker sealed the victim's tag: %s",
		      code_name(B->rc[1]));
	printf("attacker's SEAL of the victim's tag: %s: %s\n", code_name(B->rc[1]), B->msg[1]);
	ck_assert_msg(h_system("ls '%s' | grep -q '^SEAL\\.'", v.dir) != 0,
		      "a seal record appeared in the victim's tag");
	ck_assert(!h_exists(h_path("%s/MANIFEST.json", v.dir)));
	ck_assert_msg(B->n[2] == LIMIT && B->n[1] == FLOOD - LIMIT,
		      "of %d seals, %lld accepted and %lld refused with ELIMIT (limit %d)", FLOOD,
		      B->n[2], B->n[1], LIMIT);
	hd_alive("after the seal flood");
	ck_assert_int_eq(as_user(VIC, vic_seal, NULL), 0);
	ck_assert_msg(B->rc[0] == 0, "the victim's seal: %s", code_name(B->rc[0]));
	double t0 = now_s();
	while (!h_exists(h_path("%s/MANIFEST.json", v.dir)) && now_s() - t0 < 10)
		h_sleep_ms(20);
	ck_assert_msg(h_exists(h_path("%s/MANIFEST.json", v.dir)),
		      "the victim's sealed tag was not committed within 10 s of the flood");
	victim_check(0, &v, "after the attack");
	hd_stop();
}
END_TEST

/* Whether dir holds a seal record (the daemon wrote its node's). */
static int has_record(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int found = 0;

	while (d && (e = readdir(d)))
		found |= strncmp(e->d_name, "SEAL.", 5) == 0 || strncmp(e->d_name, "SEAL+", 5) == 0;
	if (d)
		closedir(d);
	return found;
}

/* Saves 4 KiB of seed's pattern as dir/rank0 through c, waits DURABLE and seals dir; 0, or
 * the first failure's code with its message appended to slot's. */
static int save_seal(dsckpt_conn_t *c, const char *dir, uint64_t seed, int slot)
{
	int64_t shape[1] = {4096};
	void *mem = dsckpt_host_alloc(4096);
	dsckpt_save_t *s = NULL;
	const char *what = "save_begin";
	int rc;

	if (!mem)
		return DSCKPT_ENOMEM;
	h_pattern_fill(mem, 4096, seed);
	if ((rc = dsckpt_save_begin(c, dir, "rank0", &s)) >= 0 &&
	    (what = "add_tensor", rc = dsckpt_add_tensor(s, "t", "U8", shape, 1, mem, 4096)) >= 0 &&
	    (what = "save_end", rc = dsckpt_save_end(s)) >= 0 &&
	    (what = "wait", rc = dsckpt_wait(s, DSCKPT_DURABLE, 10000)) >= 0)
		what = "seal", rc = dsckpt_seal(c, dir);
	if (rc < 0) {
		size_t len = strlen(B->msg[slot]);
		snprintf(B->msg[slot] + len, sizeof(B->msg[slot]) - len, "%s %s: %s: %s\n", what,
			 dir, dsckpt_err_name(rc), dsckpt_last_error(c));
	}
	dsckpt_save_free(s);
	dsckpt_host_free(mem);
	return rc < 0 ? rc : 0;
}

/* Attacker: seals <root>/shared/t1 as rank 0 of job "default" and <root>/shared/t2 as rank 0
 * of job "atk-secret-job", both of 2 ranks (never committed), then removes <root>/shared. */
static int atk_seal_leave(void *arg)
{
	dsckpt_conn_t *c, *c2;
	const char *t1 = h_path("%s/shared/t1", D->root), *t2 = h_path("%s/shared/t2", D->root);
	int rc;

	if ((rc = dsckpt_connect(D->socket, &c)) < 0 || (rc = dsckpt_connect(D->socket, &c2)) < 0 ||
	    (rc = dsckpt_identify(c, "default", 0, 2)) < 0 ||
	    (rc = dsckpt_identify(c2, "atk-secret-job", 0, 2)) < 0)
		return say(1, 1, "attacker: connect: %s", dsckpt_err_name(rc));
	if (save_seal(c, t1, 5, 1) < 0 || save_seal(c2, t2, 6, 1) < 0)
		return 2;
	for (int i = 0; i < 500 && !(has_record(t1) && has_record(t2)); i++)
		h_sleep_ms(20);
	if (!has_record(t1) || !has_record(t2))
		return say(1, 3, "attacker: the daemon wrote no seal record");
	dsckpt_close(c);
	dsckpt_close(c2);
	h_rm_rf(h_path("%s/shared", D->root));
	return h_exists(h_path("%s/shared", D->root)) ? say(1, 4, "attacker: cannot remove") : 0;
}

/* Victim, at once after: saves and seals rank 0 of its one-rank job "default" into both
 * paths (rc[0]: the first failure, 0 if none; every failure's message in slot 0). */
static int vic_take_paths(void *arg)
{
	dsckpt_conn_t *c;
	int rc;

	if ((rc = dsckpt_connect(D->socket, &c)) < 0 || (rc = dsckpt_identify(c, "default", 0, 1)) < 0)
		return say(0, 1, "victim: connect: %s", dsckpt_err_name(rc));
	int r1 = save_seal(c, h_path("%s/shared/t1", D->root), 81, 0);
	int r2 = save_seal(c, h_path("%s/shared/t2", D->root), 82, 0);
	B->rc[0] = r1 < 0 ? r1 : r2;
	dsckpt_close(c);
	return 0;
}

/* Issue 29 item 10: another user's seals on a path it removed refuse nothing to the user who
 * takes the path next, at once, and no reply to that user names the other's uid or job. */
START_TEST(test_seal_left_behind)
{
	HOSTILE_BEGIN("seals left on a removed path");
	uid_t auid;
	gid_t agid;
	char uidtext[32];

	hd_start(CACHE_8M, NULL);
	ck_assert_int_eq(chmod(D->root, 01777), 0);	/* a shared root: users remove their own */
	user_ids(ATK, &auid, &agid);
	ck_assert_msg(as_user(ATK, atk_seal_leave, NULL) == 0, "attacker: %s", B->msg[1]);
	ck_assert_int_eq(as_user(VIC, vic_take_paths, NULL), 0);
	printf("the victim's saves and seals on the paths the attacker sealed and removed: %s%s\n",
	       code_name(B->rc[0]), B->msg[0][0] ? "" : " (no error)");
	snprintf(uidtext, sizeof(uidtext), "%u", (unsigned)auid);
	ck_assert_msg(!strstr(B->msg[0], "atk-secret-job") && !strstr(B->msg[0], uidtext),
		      "a reply to the victim named the attacker's job or uid: %s", B->msg[0]);
	ck_assert_msg(B->rc[0] == 0, "the attacker's removed seals refused the victim: %s",
		      B->msg[0]);
	for (int i = 1; i <= 2; i++) {
		const char *dir = h_path("%s/shared/t%d", D->root, i);
		double t0 = now_s();
		while (!h_exists(h_path("%s/MANIFEST.json", dir)) && now_s() - t0 < 10)
			h_sleep_ms(20);
		ck_assert_msg(h_exists(h_path("%s/MANIFEST.json", dir)), "%s was not committed",
			      dir);
		const char *why = st_check(h_path("%s/rank0.safetensors", dir), "t", 4096,
					   80 + (uint64_t)i);
		ck_assert_msg(!why, "%s: %s", dir, why ? why : "");
	}
	hd_alive("after the victim took the paths");
	hd_stop();
}
END_TEST

/* The suite. */
static Suite *hostile_seal_suite(void)
{
	Suite *s = suite_create("hostile seal");
	h_add_case(s, "seal attacks", test_seal_attacks, 90, 1);
	h_add_case(s, "seals left behind", test_seal_left_behind, 90, 1);
	return s;
}

CHECK_MAIN(hostile_seal_suite)
