/*
 * check_quota.c — per-user limits (daemon/quota.c) fed directly, no daemon: charges up to a
 * limit and not one past it, the refusal's code and text, a charge that would wrap around,
 * users apart, limits changed under holdings, more given back than held, and charges taken
 * and given back from many threads at once.
 */
#include "../daemon/dsckptd.h"
#include "harness.h"

#include <check.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#define ALICE 1001
#define BOB 1002

/* The limits of a config with every per-user key set to small, known values. */
static void set_limits(unsigned saves, uint64_t held)
{
	struct config cfg;

	memset(&cfg, 0, sizeof(cfg));
	cfg.max_conns_per_user = 4;
	cfg.max_saves_per_user = saves;
	cfg.max_loads_per_user = 2;
	cfg.max_plans_per_user = 3;
	cfg.max_regions_per_user = 5;
	cfg.max_region_bytes = 1 << 20;
	cfg.max_unread_bytes = 1 << 16;
	cfg.max_blob_bytes = 1 << 12;
	cfg.max_held_bytes = held;
	cfg.max_seals_per_user = 6;
	quota_set_limits(&cfg);
}

/* Before any limits are set there are none; once set, each kind has its own. */
START_TEST(test_unset_and_kinds)
{
	char err[ERRLEN];

	ck_assert_int_eq(quota_take(ALICE, QUOTA_SAVES, UINT64_MAX, err, sizeof(err)), 0);
	ck_assert_uint_eq(quota_used(ALICE, QUOTA_SAVES), UINT64_MAX);
	quota_give(ALICE, QUOTA_SAVES, UINT64_MAX);

	set_limits(2, 1000);
	static const struct { int kind; uint64_t limit; } kinds[] = {
		{QUOTA_CONNS, 4}, {QUOTA_SAVES, 2}, {QUOTA_REGIONS, 5},
		{QUOTA_REGION_BYTES, 1 << 20}, {QUOTA_UNREAD, 1 << 16}, {QUOTA_BLOB, 1 << 12},
		{QUOTA_SEALS, 6}, {QUOTA_LOADS, 2}, {QUOTA_PLANS, 3}, {QUOTA_HELD, 1000},
	};
	for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
		int k = kinds[i].kind;
		ck_assert_int_eq(quota_take(ALICE, k, kinds[i].limit, err, sizeof(err)), 0);
		ck_assert_int_eq(quota_take(ALICE, k, 1, err, sizeof(err)), ERR_ELIMIT);
	}
	for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
		ck_assert_uint_eq(quota_used(ALICE, kinds[i].kind), kinds[i].limit);
		quota_give(ALICE, kinds[i].kind, kinds[i].limit);
		ck_assert_uint_eq(quota_used(ALICE, kinds[i].kind), 0);
	}
}
END_TEST

/* Up to the limit exactly, then refused with the key, the holding and the ask; a refused
 * charge leaves what is held as it was. */
START_TEST(test_boundary)
{
	char err[ERRLEN];

	set_limits(3, 4096);
	for (int i = 0; i < 3; i++)
		ck_assert_int_eq(quota_take(ALICE, QUOTA_SAVES, 1, err, sizeof(err)), 0);
	ck_assert_int_eq(quota_take(ALICE, QUOTA_SAVES, 1, err, sizeof(err)), ERR_ELIMIT);
	ck_assert_str_eq(err, "per-user limit max_saves_per_user reached: uid 1001 holds 3 of 3 "
			      "and asks for 1 more");
	ck_assert_uint_eq(quota_used(ALICE, QUOTA_SAVES), 3);

	ck_assert_int_eq(quota_take(ALICE, QUOTA_HELD, 4000, err, sizeof(err)), 0);
	ck_assert_int_eq(quota_take(ALICE, QUOTA_HELD, 97, err, sizeof(err)), ERR_ELIMIT);
	ck_assert_str_eq(err, "per-user limit max_held_mib_per_user reached: uid 1001 holds 4000 "
			      "of 4096 bytes and asks for 97 more");
	ck_assert_int_eq(quota_take(ALICE, QUOTA_HELD, 96, err, sizeof(err)), 0);
	ck_assert_uint_eq(quota_used(ALICE, QUOTA_HELD), 4096);
	ck_assert_int_eq(quota_take(ALICE, QUOTA_HELD, 0, err, sizeof(err)), 0);

	quota_give(ALICE, QUOTA_SAVES, 1);
	ck_assert_int_eq(quota_take(ALICE, QUOTA_SAVES, 1, err, sizeof(err)), 0);
	quota_give(ALICE, QUOTA_SAVES, 3);
	quota_give(ALICE, QUOTA_HELD, 4096);
}
END_TEST

/* A charge larger than the limit, or one that would wrap the holding around, is refused. */
START_TEST(test_overflow)
{
	char err[ERRLEN];
	struct config cfg;

	set_limits(2, UINT64_MAX - 10);
	ck_assert_int_eq(quota_take(ALICE, QUOTA_BLOB, (1 << 12) + 1, err, sizeof(err)),
			 ERR_ELIMIT);
	ck_assert_uint_eq(quota_used(ALICE, QUOTA_BLOB), 0);
	ck_assert_int_eq(quota_take(ALICE, QUOTA_BLOB, UINT64_MAX, err, sizeof(err)), ERR_ELIMIT);

	ck_assert_int_eq(quota_take(ALICE, QUOTA_HELD, UINT64_MAX - 20, err, sizeof(err)), 0);
	ck_assert_int_eq(quota_take(ALICE, QUOTA_HELD, 30, err, sizeof(err)), ERR_ELIMIT);
	ck_assert_int_eq(quota_take(ALICE, QUOTA_HELD, UINT64_MAX, err, sizeof(err)), ERR_ELIMIT);
	ck_assert_int_eq(quota_take(ALICE, QUOTA_HELD, 11, err, sizeof(err)), ERR_ELIMIT);
	ck_assert_uint_eq(quota_used(ALICE, QUOTA_HELD), UINT64_MAX - 20);
	ck_assert_int_eq(quota_take(ALICE, QUOTA_HELD, 10, err, sizeof(err)), 0);
	ck_assert_uint_eq(quota_used(ALICE, QUOTA_HELD), UINT64_MAX - 10);
	quota_give(ALICE, QUOTA_HELD, UINT64_MAX - 10);

	/* A limit of 0 refuses everything but nothing. */
	memset(&cfg, 0, sizeof(cfg));
	quota_set_limits(&cfg);
	ck_assert_int_eq(quota_take(ALICE, QUOTA_CONNS, 1, err, sizeof(err)), ERR_ELIMIT);
	ck_assert_str_eq(err, "per-user limit max_conns_per_user reached: uid 1001 holds 0 of 0 "
			      "and asks for 1 more");
	ck_assert_int_eq(quota_take(ALICE, QUOTA_CONNS, 0, err, sizeof(err)), 0);
}
END_TEST

/* One user at a limit leaves another's share whole; giving back is per user. */
START_TEST(test_users_apart)
{
	char err[ERRLEN];

	set_limits(2, 100);
	ck_assert_int_eq(quota_take(ALICE, QUOTA_SAVES, 2, err, sizeof(err)), 0);
	ck_assert_int_eq(quota_take(ALICE, QUOTA_SAVES, 1, err, sizeof(err)), ERR_ELIMIT);
	ck_assert_int_eq(quota_take(BOB, QUOTA_SAVES, 2, err, sizeof(err)), 0);
	ck_assert_int_eq(quota_take(BOB, QUOTA_SAVES, 1, err, sizeof(err)), ERR_ELIMIT);
	ck_assert_str_eq(err, "per-user limit max_saves_per_user reached: uid 1002 holds 2 of 2 "
			      "and asks for 1 more");
	ck_assert_int_eq(quota_take(0, QUOTA_SAVES, 2, err, sizeof(err)), 0);  /* root too */
	quota_give(BOB, QUOTA_SAVES, 2);
	ck_assert_uint_eq(quota_used(ALICE, QUOTA_SAVES), 2);
	ck_assert_uint_eq(quota_used(BOB, QUOTA_SAVES), 0);
	ck_assert_uint_eq(quota_used(0, QUOTA_SAVES), 2);
	quota_give(ALICE, QUOTA_SAVES, 2);
	quota_give(0, QUOTA_SAVES, 2);
	ck_assert_uint_eq(quota_used(ALICE, QUOTA_SAVES), 0);
}
END_TEST

/* New limits apply to the next charge: what is held above a lowered limit stays, and is
 * given back; no more is charged until the holding is below it again. */
START_TEST(test_reload)
{
	char err[ERRLEN];

	set_limits(5, 100);
	ck_assert_int_eq(quota_take(ALICE, QUOTA_SAVES, 5, err, sizeof(err)), 0);
	set_limits(2, 100);
	ck_assert_uint_eq(quota_used(ALICE, QUOTA_SAVES), 5);
	ck_assert_int_eq(quota_take(ALICE, QUOTA_SAVES, 1, err, sizeof(err)), ERR_ELIMIT);
	ck_assert_str_eq(err, "per-user limit max_saves_per_user reached: uid 1001 holds 5 of 2 "
			      "and asks for 1 more");
	quota_give(ALICE, QUOTA_SAVES, 3);
	ck_assert_int_eq(quota_take(ALICE, QUOTA_SAVES, 1, err, sizeof(err)), ERR_ELIMIT);
	quota_give(ALICE, QUOTA_SAVES, 1);
	ck_assert_int_eq(quota_take(ALICE, QUOTA_SAVES, 1, err, sizeof(err)), 0);
	set_limits(10, 100);
	ck_assert_int_eq(quota_take(ALICE, QUOTA_SAVES, 8, err, sizeof(err)), 0);
	ck_assert_uint_eq(quota_used(ALICE, QUOTA_SAVES), 10);
	quota_give(ALICE, QUOTA_SAVES, 10);
}
END_TEST

/* Giving back more than is held leaves nothing (not a wrapped count); giving to a user
 * holding nothing, or giving 0, changes nothing. */
START_TEST(test_give_more)
{
	char err[ERRLEN];

	set_limits(4, 100);
	quota_give(BOB, QUOTA_SAVES, 3);
	ck_assert_uint_eq(quota_used(BOB, QUOTA_SAVES), 0);
	ck_assert_int_eq(quota_take(BOB, QUOTA_SAVES, 2, err, sizeof(err)), 0);
	ck_assert_int_eq(quota_take(BOB, QUOTA_HELD, 50, err, sizeof(err)), 0);
	quota_give(BOB, QUOTA_SAVES, 0);
	ck_assert_uint_eq(quota_used(BOB, QUOTA_SAVES), 2);
	quota_give(BOB, QUOTA_SAVES, 5);
	ck_assert_uint_eq(quota_used(BOB, QUOTA_SAVES), 0);
	ck_assert_uint_eq(quota_used(BOB, QUOTA_HELD), 50);	/* other kinds untouched */
	ck_assert_int_eq(quota_take(BOB, QUOTA_SAVES, 4, err, sizeof(err)), 0);
	ck_assert_int_eq(quota_take(BOB, QUOTA_SAVES, 1, err, sizeof(err)), ERR_ELIMIT);
	quota_give(BOB, QUOTA_SAVES, 4);
	quota_give(BOB, QUOTA_HELD, UINT64_MAX);
	ck_assert_uint_eq(quota_used(BOB, QUOTA_HELD), 0);
	/* The user's entry went with its last charge: a new one starts from nothing. */
	ck_assert_int_eq(quota_take(BOB, QUOTA_HELD, 100, err, sizeof(err)), 0);
	quota_give(BOB, QUOTA_HELD, 100);
}
END_TEST

#define THREADS 8
#define ROUNDS 20000

/* A thread's part of test_threads: takes one and gives it back, ROUNDS times, as its own
 * uid (even threads) or the shared one (odd); the number of refusals. */
static void *churn(void *arg)
{
	long id = (long)arg;
	uid_t uid = id % 2 ? ALICE : (uid_t)(2000 + id);
	char err[ERRLEN];
	long refused = 0;

	for (int i = 0; i < ROUNDS; i++) {
		if (quota_take(uid, QUOTA_REGIONS, 1, err, sizeof(err)) < 0) {
			refused++;
			continue;
		}
		quota_give(uid, QUOTA_REGIONS, 1);
	}
	return (void *)refused;
}

/* Charges taken and given back from many threads (a region's charge goes back on a copy
 * thread) add up: four threads sharing a uid hold at most 4 of its 5 at once, so none is
 * refused, and nothing is left held. */
START_TEST(test_threads)
{
	pthread_t t[THREADS];

	set_limits(2, 100);	/* regions: 5; four threads share ALICE's */
	for (long i = 0; i < THREADS; i++)
		ck_assert_int_eq(pthread_create(&t[i], NULL, churn, (void *)i), 0);
	for (int i = 0; i < THREADS; i++) {
		void *refused;
		ck_assert_int_eq(pthread_join(t[i], &refused), 0);
		ck_assert_int_eq((long)refused, 0);
	}
	ck_assert_uint_eq(quota_used(ALICE, QUOTA_REGIONS), 0);
	for (int i = 0; i < THREADS; i += 2)
		ck_assert_uint_eq(quota_used((uid_t)(2000 + i), QUOTA_REGIONS), 0);
}
END_TEST

/* The suite. */
static Suite *quota_suite(void)
{
	Suite *s = suite_create("quota");
	TCase *tc = tcase_create("quota");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_unset_and_kinds);
	tcase_add_test(tc, test_boundary);
	tcase_add_test(tc, test_overflow);
	tcase_add_test(tc, test_users_apart);
	tcase_add_test(tc, test_reload);
	tcase_add_test(tc, test_give_more);
	tcase_add_test(tc, test_threads);
	suite_add_tcase(s, tc);
	return s;
}

CHECK_MAIN(quota_suite)
