/*
 * check_auth.c — who may do what (daemon/auth.c), on real session states (session.c) and no
 * daemon: what a session may ask before HELLO, as a trainer and as dsckptctl, each refusal's
 * code and text, an unknown action refused (fail closed), and which saves a uid may see.
 */
#include "../daemon/dsckptd.h"
#include "harness.h"

#include <check.h>
#include <string.h>

/* One action and what a session of each role gets for it: 0, or the refusal's text. */
struct rule {
	enum auth_action a;
	const char *none, *trainer, *ctl;
};

static const struct rule rules[] = {
	{AUTH_REQUEST, "the first message must be HELLO", NULL, NULL},
	{AUTH_HELLO, NULL, "HELLO was already sent", "HELLO was already sent"},
	{AUTH_SAVE, "only an identified trainer may save", NULL,
	 "only an identified trainer may save"},
	{AUTH_COMMIT, "only an identified trainer may commit", NULL,
	 "only an identified trainer may commit"},
	{AUTH_SEAL, "only an identified trainer may seal", NULL,
	 "only an identified trainer may seal"},
	{AUTH_LOAD, "the first message must be HELLO", NULL, NULL},
};

/* A session of uid 1000 that sent HELLO as role (SESSION_NONE: no HELLO yet). */
static struct session *session_as(int role)
{
	struct session *cl = session_new(7, 4242, 1000, 1000);

	ck_assert_ptr_nonnull(cl);
	if (role != SESSION_NONE)
		session_set_identity(cl, role, "job", 0, 1, "run-1");
	return cl;
}

/* Checks every action for a session of role against the rules' column for it. */
static void check_role(int role)
{
	struct session *cl = session_as(role);
	char err[ERRLEN];

	for (size_t i = 0; i < sizeof(rules) / sizeof(rules[0]); i++) {
		const struct rule *r = &rules[i];
		const char *want = role == SESSION_NONE ? r->none
				   : role == SESSION_TRAINER ? r->trainer : r->ctl;
		strcpy(err, "untouched");
		int rc = auth_check(cl, r->a, err, sizeof(err));
		if (!want) {
			ck_assert_msg(rc == 0, "role %d action %d refused: %d %s", role, r->a, rc,
				      err);
			ck_assert_str_eq(err, "untouched");
		} else {
			ck_assert_msg(rc == ERR_ESTATE, "role %d action %d: %d, not ESTATE", role,
				      r->a, rc);
			ck_assert_str_eq(err, want);
		}
	}
	session_free(cl);
}

/* Before HELLO only HELLO is allowed. */
START_TEST(test_before_hello)
{
	check_role(SESSION_NONE);
}
END_TEST

/* A trainer may save, commit, seal and load, and says HELLO only once. */
START_TEST(test_trainer)
{
	check_role(SESSION_TRAINER);
}
END_TEST

/* dsckptctl may ask and load, never save, commit or seal. */
START_TEST(test_ctl)
{
	check_role(SESSION_CTL);
}
END_TEST

/* An action auth.c does not know is refused for every role (fail closed), and a refusal
 * with a short or no error buffer still says no. */
START_TEST(test_fail_closed)
{
	char err[ERRLEN], small[8];

	for (int role = SESSION_NONE; role <= SESSION_CTL; role++) {
		struct session *cl = session_as(role);
		ck_assert_int_eq(auth_check(cl, (enum auth_action)(AUTH_LOAD + 1), err,
					    sizeof(err)), ERR_EPERM);
		ck_assert_str_eq(err, "operation not permitted");
		ck_assert_int_eq(auth_check(cl, (enum auth_action)-1, err, sizeof(err)), ERR_EPERM);
		session_free(cl);
	}
	struct session *cl = session_as(SESSION_CTL);
	ck_assert_int_eq(auth_check(cl, AUTH_SAVE, small, sizeof(small)), ERR_ESTATE);
	ck_assert_str_eq(small, "only an");
	ck_assert_int_eq(auth_check(cl, AUTH_SEAL, NULL, 0), ERR_ESTATE);
	session_free(cl);
}
END_TEST

/* A uid sees its own saves; root sees everyone's; nobody else's are seen, root's included. */
START_TEST(test_sees)
{
	ck_assert(auth_sees(1000, 1000));
	ck_assert(auth_sees(0, 1000));
	ck_assert(auth_sees(0, 0));
	ck_assert(!auth_sees(1000, 1001));
	ck_assert(!auth_sees(1001, 1000));
	ck_assert(!auth_sees(1000, 0));
	ck_assert(!auth_sees((uid_t)-1, 0));
}
END_TEST

/* The suite. */
static Suite *auth_suite(void)
{
	Suite *s = suite_create("auth");
	TCase *tc = tcase_create("auth");
	tcase_add_test(tc, test_before_hello);
	tcase_add_test(tc, test_trainer);
	tcase_add_test(tc, test_ctl);
	tcase_add_test(tc, test_fail_closed);
	tcase_add_test(tc, test_sees);
	suite_add_tcase(s, tc);
	return s;
}

CHECK_MAIN(auth_suite)
