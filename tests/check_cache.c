/*
 * check_cache.c — the pinned host cache (daemon/cache.c): chunks handed out and back, its
 * geometry, takers waiting for a chunk and woken at shutdown, the misuses that abort, and its
 * NUMA pools on a fake sysfs tree (one per node with CPUs, preferences and fallbacks, each pool
 * bound to its node, a PCI device's node). Host memory sources are check_source.c's.
 */
#include "../daemon/dsckptd.h"
#include "harness.h"
#include "harness_unit.h"

#include <check.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <linux/mempolicy.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define MIB (1024ULL * 1024)

/* The message of the last failed call. */
static char err[ERRLEN];

/* Quiet logs in every forked test. */
static void setup(void)
{
	log_init("check_cache", LOG_LVL_ERROR);
}

/* Sleeps ms milliseconds. */
static void sleep_ms(long ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000 };
	nanosleep(&ts, NULL);
}

/* Every chunk handed out is aligned, in the mapping, apart from the others, then back. */
START_TEST(test_get_put_all)
{
	struct cache *c = h_mkcache(4 * MIB, MIB);
	unsigned char *base = cache_base(c);
	void *chunks[4];

	ck_assert_uint_eq(cache_total(c), 4 * MIB);
	ck_assert_uint_eq(cache_chunk(c), MIB);
	ck_assert_uint_eq(cache_used(c), 0);
	ck_assert(cache_touch_ms(c) >= 0);
	for (int i = 0; i < 4; i++) {
		chunks[i] = cache_tryget(c, -1);
		ck_assert_ptr_nonnull(chunks[i]);
		unsigned char *p = chunks[i];
		ck_assert(p >= base && p + MIB <= base + 4 * MIB);
		ck_assert_uint_eq((uintptr_t)p % 4096, 0);
		ck_assert_uint_eq((uint64_t)(p - base) % MIB, 0);
		for (int j = 0; j < i; j++)
			ck_assert_ptr_ne(chunks[i], chunks[j]);
		memset(p, i + 1, MIB);
		ck_assert_uint_eq(cache_used(c), (uint64_t)(i + 1) * MIB);
	}
	ck_assert_ptr_null(cache_tryget(c, -1));
	/* Chunks do not overlap: each still holds what was written to it. */
	for (int i = 0; i < 4; i++)
		ck_assert_int_eq(((unsigned char *)chunks[i])[MIB - 1], i + 1);
	for (int i = 0; i < 4; i++)
		cache_put(c, chunks[i]);
	ck_assert_uint_eq(cache_used(c), 0);
	void *p = cache_get(c, -1);
	ck_assert_ptr_nonnull(p);
	cache_put(c, p);
	cache_destroy(c);
}
END_TEST

/* The tail that is no whole chunk is dropped; bad geometries and huge sizes are refused. */
START_TEST(test_geometry)
{
	struct cache *c = h_mkcache(5 * MIB + 100, MIB); /* the tail that is no chunk is dropped */
	ck_assert_uint_eq(cache_total(c), 5 * MIB);
	cache_destroy(c);

	c = h_mkcache(4096, 4096);
	ck_assert_uint_eq(cache_total(c), 4096);
	cache_destroy(c);

	ck_assert_int_eq(cache_create(4 * MIB, 0, NULL, &c, err, sizeof(err)), ERR_EINVAL);
	ck_assert_ptr_null(c);
	ck_assert_int_eq(cache_create(4 * MIB, 1000, NULL, &c, err, sizeof(err)), ERR_EINVAL);
	ck_assert_int_eq(cache_create(MIB, 2 * MIB, NULL, &c, err, sizeof(err)), ERR_EINVAL);
	ck_assert_msg(strstr(err, "bad cache geometry") != NULL, "%s", err);
	/* More than the address space: mmap fails whatever the overcommit policy. */
	ck_assert_int_eq(cache_create(1ULL << 48, 1ULL << 30, NULL, &c, err, sizeof(err)),
			 ERR_ENOMEM);
	ck_assert_msg(strstr(err, "cannot allocate") != NULL, "%s", err);
}
END_TEST

/* A thread taking a chunk: the cache, the node it prefers, what it got and when. */
struct waiter {
	struct cache *c;
	int node;   /* preferred NUMA node (-1: any) */
	void *got;
	atomic_int done;
};

/* Thread: blocks in cache_get and records what it got. */
static void *waiter_run(void *arg)
{
	struct waiter *w = arg;
	w->got = cache_get(w->c, w->node);
	atomic_store(&w->done, 1);
	return NULL;
}

/* cache_get waits while every chunk is out and takes the one put back. */
START_TEST(test_get_blocks_until_put)
{
	struct waiter w = { .c = h_mkcache(2 * MIB, MIB), .node = -1 };
	void *a = cache_get(w.c, -1), *b = cache_get(w.c, -1);
	pthread_t t;

	ck_assert_int_eq(pthread_create(&t, NULL, waiter_run, &w), 0);
	sleep_ms(100);
	ck_assert_int_eq(atomic_load(&w.done), 0);
	cache_put(w.c, b);
	pthread_join(t, NULL);
	ck_assert_ptr_eq(w.got, b);
	ck_assert_uint_eq(cache_used(w.c), 2 * MIB);
	cache_put(w.c, a);
	cache_put(w.c, w.got);
	cache_destroy(w.c);
}
END_TEST

/* cache_shutdown wakes every waiter empty-handed; chunks still come back after it. */
START_TEST(test_shutdown_wakes_waiters)
{
	struct cache *c = h_mkcache(MIB, 256 * 1024);
	struct waiter w[3];
	pthread_t t[3];
	void *chunks[4];

	for (int i = 0; i < 4; i++)
		chunks[i] = cache_get(c, -1);
	for (int i = 0; i < 3; i++) {
		w[i] = (struct waiter){ .c = c, .node = -1, .got = chunks[0] };
		ck_assert_int_eq(pthread_create(&t[i], NULL, waiter_run, &w[i]), 0);
	}
	sleep_ms(50);
	cache_shutdown(c);
	for (int i = 0; i < 3; i++) {
		pthread_join(t[i], NULL);
		ck_assert_ptr_null(w[i].got);
	}
	/* Chunks still come back after shutdown, but are no longer handed out. */
	cache_put(c, chunks[0]);
	ck_assert_ptr_null(cache_get(c, -1));
	ck_assert_ptr_null(cache_tryget(c, -1));
	for (int i = 1; i < 4; i++)
		cache_put(c, chunks[i]);
	ck_assert_uint_eq(cache_used(c), 0);
	cache_destroy(c);
}
END_TEST

/* An evict hook that holds its first caller until the test lets it go, then finds nothing. */
static sem_t hook_in, hook_go;
static atomic_int hook_calls;

/* The hook: the first call says it is in and waits for go; every call gives nothing. */
static int hook_hold(struct cache *c)
{
	(void)c;
	if (atomic_fetch_add(&hook_calls, 1) == 0) {
		sem_post(&hook_in);
		sem_wait(&hook_go);
	}
	return 0;
}

/* A chunk put back (_i 0) or a shutdown (_i 1) while a taker of cache_get is inside the evict
 * hook wakes nobody (the taker is not waiting yet): the taker still sees it as the hook
 * returns, and gets the chunk or NULL instead of sleeping with a chunk free. A resident file
 * dropped after a failed save puts its chunks back just so. */
START_TEST(test_put_during_evict)
{
	struct waiter w = { .c = h_mkcache(2 * MIB, MIB), .node = -1 };
	void *a = cache_get(w.c, -1), *b = cache_get(w.c, -1);
	pthread_t t;

	ck_assert_int_eq(sem_init(&hook_in, 0, 0), 0);
	ck_assert_int_eq(sem_init(&hook_go, 0, 0), 0);
	cache_set_evict(w.c, hook_hold);
	ck_assert_int_eq(pthread_create(&t, NULL, waiter_run, &w), 0);
	sem_wait(&hook_in);
	if (_i == 0)
		cache_put(w.c, b);
	else
		cache_shutdown(w.c);
	sem_post(&hook_go);
	pthread_join(t, NULL);	/* before the fix: never (the suite's timeout fails it) */
	if (_i == 0) {
		ck_assert_ptr_eq(w.got, b);
		cache_put(w.c, w.got);
	} else {
		ck_assert_ptr_null(w.got);
		cache_put(w.c, b);
	}
	cache_put(w.c, a);
	ck_assert_uint_eq(cache_used(w.c), 0);
	cache_destroy(w.c);
}
END_TEST

/* Putting back memory that is not the cache's aborts. */
START_TEST(test_put_foreign_aborts)
{
	struct cache *c = h_mkcache(2 * MIB, MIB);
	static char other[4096];
	cache_put(c, other);
}
END_TEST

/* Putting back a pointer inside a chunk, not its start, aborts. */
START_TEST(test_put_misaligned_aborts)
{
	struct cache *c = h_mkcache(2 * MIB, MIB);
	unsigned char *p = cache_get(c, -1);
	cache_put(c, p + 4096);
}
END_TEST

/* Putting back a chunk twice aborts. */
START_TEST(test_put_twice_aborts)
{
	struct cache *c = h_mkcache(2 * MIB, MIB);
	void *p = cache_get(c, -1);
	cache_put(c, p);
	cache_put(c, p);
}
END_TEST

/* Destroying the cache with a chunk still out aborts. */
START_TEST(test_destroy_in_use_aborts)
{
	struct cache *c = h_mkcache(2 * MIB, MIB);
	ck_assert_ptr_nonnull(cache_get(c, -1));
	cache_destroy(c);
}
END_TEST

/* ---- NUMA pools, on a fake sysfs tree ---- */

/* Writes text to dir/rel, creating the directories on the way. */
static void put_file(const char *dir, const char *rel, const char *text)
{
	ck_assert_int_eq(h_system("mkdir -p \"$(dirname '%s/%s')\" && printf '%%s' '%s' > '%s/%s'",
				  dir, rel, text, dir, rel), 0);
}

/* Makes a fake sysfs tree whose online nodes are online, node i having CPUs cpus[i] (n of
 * them; NULL: no cpulist file), and points the cache at it; dir gets its path. */
static void fake_sysfs(char *dir, size_t len, const char *online, const char *const *cpus,
		       unsigned n)
{
	char rel[64];

	h_tmpdir(dir, len);
	put_file(dir, "devices/system/node/online", online);
	for (unsigned i = 0; i < n; i++) {
		snprintf(rel, sizeof(rel), "devices/system/node/node%u/cpulist", i);
		if (cpus[i])
			put_file(dir, rel, cpus[i]);
	}
	cache_set_sysfs(dir);
}

/* Pool i's node, size and bytes in use, checked against the expected values. */
static void expect_pool(struct cache *c, unsigned i, int node, uint64_t total, uint64_t used)
{
	int n;
	uint64_t t, u;

	cache_pool_info(c, i, &n, &t, &u);
	ck_assert_int_eq(n, node);
	ck_assert_uint_eq(t, total);
	ck_assert_uint_eq(u, used);
}

/* Index of the pool a chunk belongs to (pools are consecutive slices of the mapping). */
static unsigned pool_of(struct cache *c, void *chunk)
{
	uint64_t off = (uint64_t)((unsigned char *)chunk - (unsigned char *)cache_base(c)), t;

	for (unsigned i = 0; i < cache_pools(c); i++) {
		cache_pool_info(c, i, NULL, &t, NULL);
		if (off < t)
			return i;
		off -= t;
	}
	ck_abort_msg("%p is in no pool", chunk);
	return 0;
}

/* Two nodes: two pools of half the chunks; a preferred node is served from its pool first,
 * then from the other; "any" takes from the fuller pool; the capacity is the whole cache. */
START_TEST(test_numa_two_pools)
{
	static const char *const cpus[] = { "0", "0" };
	char dir[256];
	void *chunks[8];

	fake_sysfs(dir, sizeof(dir), "0-1\n", cpus, 2);
	struct cache *c = h_mkcache(8 * 65536, 65536);
	ck_assert_uint_eq(cache_pools(c), 2);
	ck_assert_uint_eq(cache_total(c), 8 * 65536);
	expect_pool(c, 0, 0, 4 * 65536, 0);
	expect_pool(c, 1, 1, 4 * 65536, 0);
	for (int i = 0; i < 4; i++) {
		chunks[i] = cache_tryget(c, 1);
		ck_assert_uint_eq(pool_of(c, chunks[i]), 1);
	}
	expect_pool(c, 1, 1, 4 * 65536, 4 * 65536);
	expect_pool(c, 0, 0, 4 * 65536, 0);
	/* Node 1 is empty: its takers fall back to node 0's pool. */
	chunks[4] = cache_get(c, 1);
	ck_assert_uint_eq(pool_of(c, chunks[4]), 0);
	cache_put(c, chunks[0]);
	expect_pool(c, 1, 1, 4 * 65536, 3 * 65536);
	/* "Any" goes to the pool with the most free chunks (node 0: 3, node 1: 1). */
	chunks[0] = cache_tryget(c, -1);
	ck_assert_uint_eq(pool_of(c, chunks[0]), 0);
	/* An unknown node behaves as "any"; the last chunk of node 1 still serves node 1. */
	chunks[5] = cache_tryget(c, 7);
	ck_assert_uint_eq(pool_of(c, chunks[5]), 0);
	chunks[6] = cache_tryget(c, 1);
	ck_assert_uint_eq(pool_of(c, chunks[6]), 1);
	chunks[7] = cache_tryget(c, 1);
	ck_assert_uint_eq(pool_of(c, chunks[7]), 0);
	ck_assert_ptr_null(cache_tryget(c, 0));
	ck_assert_ptr_null(cache_tryget(c, -1));
	ck_assert_uint_eq(cache_used(c), cache_total(c));
	expect_pool(c, 0, 0, 4 * 65536, 4 * 65536);
	expect_pool(c, 1, 1, 4 * 65536, 4 * 65536);
	for (int i = 0; i < 8; i++) {
		for (int j = 0; j < i; j++)
			ck_assert_ptr_ne(chunks[i], chunks[j]);
		cache_put(c, chunks[i]);
	}
	expect_pool(c, 0, 0, 4 * 65536, 0);
	expect_pool(c, 1, 1, 4 * 65536, 0);
	cache_destroy(c);
	cache_set_sysfs(NULL);
	h_rm_rf(dir);
}
END_TEST

/* A taker of an empty node waits only while the whole cache is empty, and is woken by a chunk
 * of another node coming back (no deadlock on a preference). */
START_TEST(test_numa_wait_any_pool)
{
	static const char *const cpus[] = { "0", "0" };
	char dir[256];
	void *chunks[2];

	fake_sysfs(dir, sizeof(dir), "0-1", cpus, 2);
	struct waiter w = { .c = h_mkcache(2 * 65536, 65536), .node = 1 };
	pthread_t t;

	ck_assert_uint_eq(cache_pools(w.c), 2);
	chunks[0] = cache_get(w.c, 0);
	chunks[1] = cache_get(w.c, 1);
	ck_assert_uint_eq(pool_of(w.c, chunks[0]), 0);
	ck_assert_uint_eq(pool_of(w.c, chunks[1]), 1);
	ck_assert_int_eq(pthread_create(&t, NULL, waiter_run, &w), 0);
	sleep_ms(100);
	ck_assert_int_eq(atomic_load(&w.done), 0);
	cache_put(w.c, chunks[0]);
	pthread_join(t, NULL);
	ck_assert_ptr_eq(w.got, chunks[0]);
	cache_put(w.c, w.got);
	cache_put(w.c, chunks[1]);
	cache_destroy(w.c);
	cache_set_sysfs(NULL);
	h_rm_rf(dir);
}
END_TEST

/* Only online nodes with CPUs get pools (a memory-only node, such as a GPU's own memory on
 * Grace Hopper, does not); chunks are shared as evenly as whole chunks allow. */
START_TEST(test_numa_nodes_with_cpus)
{
	static const char *const cpus[] = { "0", NULL, "", "0-1,3" };
	char dir[256];

	fake_sysfs(dir, sizeof(dir), "0,2-3", cpus, 4);
	struct cache *c = h_mkcache(5 * 65536, 65536);
	ck_assert_uint_eq(cache_pools(c), 2);
	expect_pool(c, 0, 0, 3 * 65536, 0);
	expect_pool(c, 1, 3, 2 * 65536, 0);
	cache_destroy(c);

	/* Fewer chunks than nodes: at most one pool per chunk (one chunk: not split). */
	c = h_mkcache(65536, 65536);
	ck_assert_uint_eq(cache_pools(c), 1);
	expect_pool(c, 0, -1, 65536, 0);
	cache_destroy(c);
	cache_set_sysfs(NULL);
	h_rm_rf(dir);
}
END_TEST

/* One node, a malformed list or no sysfs at all: one pool of every chunk, on no node. */
START_TEST(test_numa_single)
{
	static const char *const cpus[] = { "0-1" };
	const char *lists[] = { "0\n", "0-", "x", "1-0" };
	char dir[256];

	for (unsigned i = 0; i < sizeof(lists) / sizeof(lists[0]); i++) {
		fake_sysfs(dir, sizeof(dir), lists[i], cpus, 1);
		struct cache *c = h_mkcache(4 * 65536, 65536);
		ck_assert_uint_eq(cache_pools(c), 1);
		expect_pool(c, 0, -1, 4 * 65536, 0);
		void *p = cache_tryget(c, 0);
		ck_assert_ptr_eq(p, cache_base(c));
		cache_put(c, p);
		cache_destroy(c);
		h_rm_rf(dir);
	}
	cache_set_sysfs("/nonexistent");
	struct cache *c = h_mkcache(4 * 65536, 65536);
	ck_assert_uint_eq(cache_pools(c), 1);
	cache_destroy(c);
	cache_set_sysfs(NULL);
}
END_TEST

/* Each pool is bound to its node: node 0's pool (a node this machine has) reads back as
 * MPOL_BIND to node 0; binding to a node the machine lacks only warns. */
START_TEST(test_numa_bound)
{
	static const char *const cpus[] = { "0", "0" };
	unsigned long mask = 0;
	char dir[256];
	int mode = -1;

	fake_sysfs(dir, sizeof(dir), "0-1", cpus, 2);
	struct cache *c = h_mkcache(4 * 65536, 65536);
	ck_assert_uint_eq(cache_pools(c), 2);
	ck_assert_int_eq(syscall(SYS_get_mempolicy, &mode, &mask, 64 + 1, cache_base(c),
				 MPOL_F_ADDR), 0);
	ck_assert_int_eq(mode, MPOL_BIND);
	ck_assert_uint_eq(mask, 1);
	cache_destroy(c);
	cache_set_sysfs(NULL);
	h_rm_rf(dir);
}
END_TEST

/* A PCI device's node comes from bus/pci/devices/<lowercase address>/numa_node. */
START_TEST(test_numa_pci_node)
{
	char dir[256];

	h_tmpdir(dir, sizeof(dir));
	put_file(dir, "bus/pci/devices/0000:3b:00.0/numa_node", "1\n");
	put_file(dir, "bus/pci/devices/0000:5d:00.0/numa_node", "-1\n");
	put_file(dir, "bus/pci/devices/0000:5e:00.0/numa_node", "junk");
	cache_set_sysfs(dir);
	ck_assert_int_eq(cache_pci_node("0000:3B:00.0"), 1);
	ck_assert_int_eq(cache_pci_node("0000:3b:00.0"), 1);
	ck_assert_int_eq(cache_pci_node("0000:5d:00.0"), -1);
	ck_assert_int_eq(cache_pci_node("0000:5e:00.0"), -1);
	ck_assert_int_eq(cache_pci_node("0000:01:00.0"), -1);
	cache_set_sysfs(NULL);
	h_rm_rf(dir);
}
END_TEST

/* The suite. */
static Suite *cache_suite(void)
{
	Suite *s = suite_create("cache");
	TCase *tc = tcase_create("cache");
	tcase_add_checked_fixture(tc, setup, NULL);
	tcase_add_test(tc, test_get_put_all);
	tcase_add_test(tc, test_geometry);
	tcase_add_test(tc, test_get_blocks_until_put);
	tcase_add_test(tc, test_shutdown_wakes_waiters);
	tcase_add_loop_test(tc, test_put_during_evict, 0, 2);
	tcase_add_test_raise_signal(tc, test_put_foreign_aborts, SIGABRT);
	tcase_add_test_raise_signal(tc, test_put_misaligned_aborts, SIGABRT);
	tcase_add_test_raise_signal(tc, test_put_twice_aborts, SIGABRT);
	tcase_add_test_raise_signal(tc, test_destroy_in_use_aborts, SIGABRT);
	suite_add_tcase(s, tc);

	tc = tcase_create("numa");
	tcase_add_checked_fixture(tc, setup, NULL);
	tcase_add_test(tc, test_numa_two_pools);
	tcase_add_test(tc, test_numa_wait_any_pool);
	tcase_add_test(tc, test_numa_nodes_with_cpus);
	tcase_add_test(tc, test_numa_single);
	tcase_add_test(tc, test_numa_bound);
	tcase_add_test(tc, test_numa_pci_node);
	suite_add_tcase(s, tc);
	return s;
}

CHECK_MAIN(cache_suite)
