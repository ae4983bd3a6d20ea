/* check_peer_nodes.c — peer_nodes.c, the job's nodes its trainers told (NODES): each user's
 * tellings are its own (another user's of the same job name neither replaces nor stands in
 * for them, root's included), a user keeps its last PEER_NODES_PER_USER jobs (its next
 * replaces its own oldest, however many jobs other users tell), a job told again replaces
 * its list, and every telling's bytes are charged to its user's max_held_mib_per_user
 * (ELIMIT past it, the earlier telling kept; given back when a telling is replaced). */
#include "harness.h"
#include "../daemon/dsckptd.h"

#include <check.h>
#include <stdio.h>
#include <string.h>

#define VIC 1001
#define ATK 1002

/* peer_nodes_each's fn: appends host to the comma-separated list in arg. */
static int add_host(void *arg, const char *host)
{
	char *out = arg;
	size_t at = strlen(out);

	snprintf(out + at, 256 - at, "%s%s", at ? "," : "", host);
	return 0;
}

/* The hosts uid told of job, comma-separated ("" when none), and their ranks' count. */
static const char *told(const char *job, uid_t uid, unsigned *nranks)
{
	static char out[256];
	unsigned ranks[PEER_NODES_MAX_RANKS];

	out[0] = '\0';
	*nranks = peer_nodes_each(job, uid, add_host, out, ranks);
	return out;
}

/* Tells job's nodes (one host) as uid with one rank; the result. */
static int tell(const char *job, uid_t uid, const char *host, unsigned rank)
{
	char err[256];
	const char *hosts[1] = { host };

	return peer_nodes_tell(job, uid, hosts, 1, &rank, 1, err, sizeof(err));
}

/* Another user's tellings, of the same job name and of many others, leave the victim's. */
START_TEST(test_users_apart)
{
	unsigned n;

	ck_assert_int_eq(tell("pj", VIC, "10.9.0.1", 3), 0);
	ck_assert_int_eq(tell("pj", ATK, "10.9.0.66", 0), 0);
	for (int k = 0; k < 100; k++) {
		char job[32];
		snprintf(job, sizeof(job), "flood%d", k);
		ck_assert_int_eq(tell(job, ATK, "10.9.0.66", 0), 0);
	}
	ck_assert_str_eq(told("pj", VIC, &n), "10.9.0.1");
	ck_assert_uint_eq(n, 1);
	ck_assert_str_eq(told("pj", 0, &n), "");          /* root told nothing */
	ck_assert(peer_nodes_member("pj", VIC, "10.9.0.1:18540"));
	ck_assert(!peer_nodes_member("pj", VIC, "10.9.0.66:18540"));
	ck_assert(!peer_nodes_member("pj", ATK, "10.9.0.66:18540")); /* its pj pushed out */
	ck_assert_str_eq(told("flood99", ATK, &n), "10.9.0.66");
	ck_assert_str_eq(told("flood84", ATK, &n), "10.9.0.66");
	ck_assert_str_eq(told("flood83", ATK, &n), "");  /* its 17th newest: gone */
}
END_TEST

/* A job told again replaces its list, and the charge follows the bytes kept. */
START_TEST(test_told_again_and_charged)
{
	const char *two[2] = { "10.9.1.1", "10.9.1.2" };
	unsigned rank = 1, n;
	char err[256];

	ck_assert_int_eq(quota_used(VIC, QUOTA_HELD), 0);
	ck_assert_int_eq(peer_nodes_tell("pj", VIC, two, 2, &rank, 1, err, sizeof(err)), 0);
	uint64_t held = quota_used(VIC, QUOTA_HELD);
	ck_assert_uint_gt(held, 0);
	ck_assert_str_eq(told("pj", VIC, &n), "10.9.1.1,10.9.1.2");
	ck_assert_int_eq(tell("pj", VIC, "10.9.1.3", 2), 0);
	ck_assert_str_eq(told("pj", VIC, &n), "10.9.1.3");
	ck_assert_uint_eq(quota_used(VIC, QUOTA_HELD), held - strlen("10.9.1.1") - 1);
	ck_assert_uint_eq(quota_used(ATK, QUOTA_HELD), 0);
}
END_TEST

/* Past max_held_mib_per_user a telling is refused with ELIMIT naming the key, and the
 * user's earlier telling of the job stays. */
START_TEST(test_bound)
{
	static char names[PEER_NODES_MAX][STORE_HOST_MAX];
	static const char *hosts[PEER_NODES_MAX];
	struct config cfg;
	unsigned rank = 0, n;
	char err[256] = "";

	memset(&cfg, 0, sizeof(cfg));
	cfg.max_held_bytes = 1 << 20;
	quota_set_limits(&cfg);     /* the others 0: unused here */
	for (unsigned i = 0; i < PEER_NODES_MAX; i++) {
		memset(names[i], 'h', STORE_HOST_MAX - 1);
		names[i][STORE_HOST_MAX - 1] = '\0';
		snprintf(names[i], 8, "%05u", i);
		names[i][5] = 'h';
		hosts[i] = names[i];
	}
	ck_assert_int_eq(tell("pj", VIC, "10.9.2.1", 0), 0);
	ck_assert_int_eq(peer_nodes_tell("pj", VIC, hosts, PEER_NODES_MAX, &rank, 1, err,
					 sizeof(err)), ERR_ELIMIT);
	ck_assert_msg(strstr(err, "max_held_mib_per_user"), "%s", err);
	ck_assert_str_eq(told("pj", VIC, &n), "10.9.2.1");
	ck_assert_int_eq(peer_nodes_tell("big", ATK, hosts, PEER_NODES_MAX / 2, &rank, 1, err,
					 sizeof(err)), 0);   /* half a MiB: within it */
}
END_TEST

/* The suite. */
static Suite *peer_nodes_suite(void)
{
	Suite *s = suite_create("peer_nodes");
	TCase *tc = tcase_create("peer_nodes");
	tcase_add_test(tc, test_users_apart);
	tcase_add_test(tc, test_told_again_and_charged);
	tcase_add_test(tc, test_bound);
	suite_add_tcase(s, tc);
	return s;
}

CHECK_MAIN(peer_nodes_suite)
