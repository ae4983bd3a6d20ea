/*
 * check_hostile_seal.c — SEAL from the attacker's side (DESIGN.md §8): another user seals the
 * victim's tag (refused, nothing written there, nothing committed), and floods the daemon with
 * seals of its own tags as a job of 65,536 ranks (cut at max_seals_per_user with ELIMIT, the
 * daemon alive); the victim's own seal is then committed at once. Two real users
 * (harness_hostile.h); without root the test says SKIP.
 */
#include "harness_hostile.h"

#include <check.h>
#include <stdio.h>
#include <string.h>

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

int main(void)
{
	Suite *s = suite_create("hostile seal");
	h_add_case(s, "seal attacks", test_seal_attacks, 90, 1);
	return h_run_suite(s, NULL);
}
