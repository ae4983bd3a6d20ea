/* check_peer_place.c — peer_place.c's placement, exhaustively for jobs of 1 to 64 nodes and
 * replicas 0 to 3: every node computes its peers from the host names in an order of its own;
 * the peers are other nodes, distinct, as many as the job allows; every node keeps the copies
 * of exactly as many others; and losing any `replicas` nodes (every subset of that size)
 * leaves every node's files on a node still up. */
#include "../daemon/dsckptd.h"
#include "harness.h"

#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAXN 64
#define MAXR 3

static char names[MAXN][32];
static const char *ordered[MAXN];

/* Node i's name: not in the ring's order (hashed digits), so sorting matters. */
static void make_names(unsigned n)
{
	for (unsigned i = 0; i < n; i++) {
		snprintf(names[i], sizeof(names[i]), "gpu-%02u-%u.cluster", (i * 37u) % 97u, i);
		ordered[i] = names[i];
	}
}

/* The index of name among names. */
static unsigned index_of(const char *name, unsigned n)
{
	for (unsigned i = 0; i < n; i++)
		if (name == names[i] || strcmp(name, names[i]) == 0)
			return i;
	ck_abort_msg("peer %s is not a node of the job", name);
	return 0;
}

/* peers[x][j]: node x's j-th peer, each node computed from the names shuffled its own way. */
static unsigned peers[MAXN][MAXR], npeers[MAXN];

/* Places every node of a job of n for replicas r and checks what each node alone can. */
static void place_all(unsigned n, unsigned r, uint64_t seed)
{
	const char *view[MAXN], *out[MAXR + 1];

	for (unsigned x = 0; x < n; x++) {
		memcpy(view, ordered, n * sizeof(*view));
		for (unsigned i = n; i > 1; i--) {  /* this node's order of the seal records */
			seed = seed * 6364136223846793005ull + 1442695040888963407ull;
			unsigned j = (unsigned)(seed >> 33) % i;
			const char *t = view[i - 1];
			view[i - 1] = view[j];
			view[j] = t;
		}
		int k = peer_place(view, n, names[x], r, out, MAXR + 1);
		unsigned want = r < n - 1 ? r : n - 1;
		ck_assert_msg(k == (int)want, "n %u r %u node %u: %d peers", n, r, x, k);
		npeers[x] = (unsigned)k;
		for (int j = 0; j < k; j++) {
			peers[x][j] = index_of(out[j], n);
			ck_assert_msg(peers[x][j] != x, "n %u r %u: node %u is its own peer", n, r, x);
			for (int i = 0; i < j; i++)
				ck_assert_msg(peers[x][i] != peers[x][j], "n %u r %u node %u: a peer "
					      "twice", n, r, x);
		}
		/* Its owners are those that name it as a peer. */
		k = peer_place_owners(view, n, names[x], r, out, MAXR + 1);
		ck_assert_int_eq(k, (int)want);
	}
}

/* Whether node x's files survive the loss of the nodes in lost (a bit per node). */
static int survives(unsigned x, uint64_t lost)
{
	if (!(lost >> x & 1))
		return 1;
	for (unsigned j = 0; j < npeers[x]; j++)
		if (!(lost >> peers[x][j] & 1))
			return 1;
	return 0;
}

/* Every subset of exactly f of n nodes lost (f ≤ 3), each checked against every node. */
static void check_losses(unsigned n, unsigned f, unsigned r)
{
	unsigned a[3] = { 0 };
	uint64_t count = 0;

	if (f == 0 || f > n)
		return;
	/* Combinations in lexicographic order. */
	for (unsigned i = 0; i < f; i++)
		a[i] = i;
	for (;;) {
		uint64_t lost = 0;
		for (unsigned i = 0; i < f; i++)
			lost |= 1ull << a[i];
		/* With f ≤ r and f < n, some copy of every node's files is up. */
		/* Plain ifs: a passing ck_assert writes to Check's pipe, a million times here. */
		for (unsigned x = 0; x < n; x++)
			if (!survives(x, lost))
				ck_abort_msg("n %u r %u: losing %u nodes (first %u) loses node %u's "
					     "files", n, r, f, a[0], x);
		count++;
		int i = (int)f - 1;
		while (i >= 0 && a[i] == n - f + (unsigned)i)
			i--;
		if (i < 0)
			break;
		a[i]++;
		for (unsigned j = (unsigned)i + 1; j < f; j++)
			a[j] = a[j - 1] + 1;
	}
	ck_assert_uint_gt(count, 0);
}

START_TEST(test_invariant_exhaustive)
{
	unsigned r = (unsigned)_i;

	for (unsigned n = 1; n <= MAXN; n++) {
		make_names(n);
		place_all(n, r, n * 131u + r);
		/* Each node holds the copies of exactly min(r, n-1) others. */
		unsigned held[MAXN] = { 0 };
		for (unsigned x = 0; x < n; x++)
			for (unsigned j = 0; j < npeers[x]; j++)
				held[peers[x][j]]++;
		for (unsigned x = 0; x < n; x++)
			ck_assert_msg(held[x] == (r < n - 1 ? r : n - 1), "n %u r %u: node %u holds "
				      "%u nodes' copies", n, r, x, held[x]);
		/* Any r nodes lost (and fewer), when the job has more than r nodes. */
		for (unsigned f = 1; f <= r && f < n; f++)
			check_losses(n, f, r);
	}
}
END_TEST

START_TEST(test_edges)
{
	const char *hosts[] = { "b", "a", "c", "a" }, *out[4];

	/* One node: no peer. */
	ck_assert_int_eq(peer_place(hosts, 1, "b", 2, out, 4), 0);
	/* Duplicates count once; the ring is a → b → c → a. */
	ck_assert_int_eq(peer_place(hosts, 4, "c", 1, out, 4), 1);
	ck_assert_str_eq(out[0], "a");
	ck_assert_int_eq(peer_place(hosts, 4, "a", 5, out, 4), 2);
	ck_assert_str_eq(out[0], "b");
	ck_assert_str_eq(out[1], "c");
	ck_assert_int_eq(peer_place_owners(hosts, 4, "a", 1, out, 4), 1);
	ck_assert_str_eq(out[0], "c");
	/* cap bounds what is written. */
	ck_assert_int_eq(peer_place(hosts, 4, "a", 2, out, 1), 1);
	/* A node not of the job, and replicas 0. */
	ck_assert_int_eq(peer_place(hosts, 4, "d", 1, out, 4), -ENOENT);
	ck_assert_int_eq(peer_place(hosts, 4, "a", 0, out, 4), 0);
}
END_TEST

/* The suite. */
static Suite *peer_place_suite(void)
{
	Suite *s = suite_create("peer_place");
	TCase *tc = tcase_create("peer_place");
	tcase_set_timeout(tc, 120);
	tcase_add_loop_test(tc, test_invariant_exhaustive, 0, MAXR + 1);
	tcase_add_test(tc, test_edges);
	suite_add_tcase(s, tc);
	return s;
}

CHECK_MAIN(peer_place_suite)
