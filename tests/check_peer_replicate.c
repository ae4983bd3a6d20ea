/* check_peer_replicate.c — peer copies between real daemons: two nodes, each dsckptd in a
 * network namespace of its own (tests/netns.c) named by its address ("host"), one shared
 * root, UCX forced onto TCP over veths, a peer_secret_file. A two-rank job (one rank per
 * node) saves and seals; once COMMITTED each node's daemon sends its rank's file to the other,
 * which keeps it checked: fetched back from each daemon (with the secret) it is byte for byte
 * the file on disk, its data read from the cache's resident copy. A third daemon with
 * another secret is refused both ways and holds nothing of the job; one of the job's nodes
 * with another secret is skipped for the next node of the ring. SKIP
 * without root or ip(8). */
#include "harness_daemon.h"
#include "harness_peer.h"
#include "../daemon/dsckptd.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define N_BYTES (3 * MIB + 12345)
#define SECRET "replicate-suite-secret-0123456789"
#define PORT 18540

static struct netns ns;
static int usable;

/* Waits (60 s at most) until the daemon at addr holds job's copy of rank; then checks that
 * it is path's bytes exactly, and from whom it came. */
static void check_copy(const char *addr, const char *job, unsigned rank, const char *path,
		       const char *owner)
{
	struct replica_store *mine;
	struct replica *r = hp_wait_fetch(addr, PORT, SECRET, job, rank, &mine);
	const char *text;
	size_t len, flen;
	unsigned nfiles;
	const struct replica_id *id = replica_id(r, &text, &len, &nfiles);
	ck_assert_str_eq(id->owner, owner);
	ck_assert_str_eq(id->job, job);
	ck_assert_uint_ge(nfiles, 1);
	char *want = h_read_file(path, &flen);
	ck_assert_ptr_nonnull(want);
	int found = 0;
	for (unsigned i = 0; i < nfiles; i++) {
		const struct manifest_file *f = replica_file(r, i);
		if (strcmp(f->kind, MANIFEST_KIND_ST) != 0)
			continue;
		uint8_t *got = malloc(f->size);
		ck_assert_uint_eq(f->size, flen);
		ck_assert_int_eq(replica_read(r, i, 0, got, f->size), 0);
		ck_assert_msg(memcmp(got, want, flen) == 0, "%s: the copy differs", path);
		free(got);
		found++;
	}
	ck_assert_int_eq(found, 1);
	free(want);
	replica_put(r);
	replica_store_close(mine);
}

/* The bytes a daemon's log says its copies of dir read in all, and from the cache. */
static void cached_bytes(const char *log, const char *dir, unsigned long long *all,
			 unsigned long long *cached)
{
	char *text = h_read_file(log, NULL), key[PATH_MAX + 16];
	snprintf(key, sizeof(key), "peer: %s: ", dir);
	const char *at = text ? strstr(text, key) : NULL;
	ck_assert_msg(at, "no line '%s' in %s", key, log);
	ck_assert_int_eq(sscanf(at + strlen(key), "%llu bytes read for its copies, %llu of them",
				all, cached), 2);
	free(text);
}

START_TEST(test_two_nodes_exchange)
{
	char dir[PATH_MAX], scratch[256];
	struct hdaemon n0, n1, n2;  /* n0: node 0's, the test's D */
	dsckpt_conn_t *c[2];
	dsckpt_save_t *s[2];
	void *mem[2];

	if (!usable)
		return;
	netns_ucx_env();
	h_tmpdir(scratch, sizeof(scratch));
	const char *good = hp_secret_file(scratch, 0, SECRET);
	/* Node 0 (the test's daemon D) in namespace 0, node 1 in namespace 1. */
	hp_start_node(&n0, &ns, 0, good);
	hp_start_node(&n1, &ns, 1, good);
	/* A node of another cluster (another secret) in namespace 2. */
	hp_start_node(&n2, &ns, 2, hp_secret_file(scratch, 1, "another-cluster-secret-9876543210"));

	snprintf(dir, sizeof(dir), "%s/pj/step1", D->root);
	const char *socks[2] = { D->socket, n1.socket };
	for (int r = 0; r < 2; r++) {
		int rc = dsckpt_connect(socks[r], &c[r]);
		ck_assert_int_eq(rc, 0);
		CK_DS(c[r], dsckpt_identify(c[r], "pj", r, 2));
		char file[16];
		snprintf(file, sizeof(file), "rank%d", r);
		s[r] = save_pattern(c[r], dir, file, N_BYTES, 77 + (uint64_t)r, &mem[r]);
	}
	for (int r = 0; r < 2; r++) {
		ck_assert_int_ge(dsckpt_wait(s[r], DSCKPT_DURABLE, 60000), DSCKPT_DURABLE);
		CK_DS(c[r], dsckpt_seal(c[r], dir));
	}
	for (int r = 0; r < 2; r++)
		ck_assert_int_ge(dsckpt_wait(s[r], DSCKPT_COMMITTED, 60000), DSCKPT_COMMITTED);

	/* Each node's file is kept by the other, checked, and comes back exactly, to a node of
	 * the job (node 0's address: the other cluster's is shown none). */
	ck_assert_int_eq(netns_enter(&ns, 0), 0);
	check_copy(ns.addr[1], "pj", 0, h_path("%s/rank0.safetensors", dir), ns.addr[0]);
	check_copy(ns.addr[0], "pj", 1, h_path("%s/rank1.safetensors", dir), ns.addr[1]);
	/* The data came from the cache's resident copy (keep_resident, a cache that holds it):
	 * all of it but the header. */
	unsigned long long all, cached;
	cached_bytes(D->log, dir, &all, &cached);
	ck_assert_uint_eq(cached, N_BYTES);
	ck_assert_uint_gt(all, cached);
	/* The other cluster's node: refused by both, and holding nothing of ours. */
	struct replica_store *mine;
	struct replica *rep;
	char err[512];
	ck_assert_int_eq(replica_store_open(MIB, NULL, &mine, err, sizeof(err)), 0);
	ck_assert_int_eq(hp_fetch(ns.addr[0], PORT, "another-cluster-secret-9876543210", "pj", 1,
				  mine, &rep, err, sizeof(err)), -EACCES);
	ck_assert_int_eq(hp_fetch(ns.addr[2], PORT, SECRET, "pj", 0, mine, &rep, err,
				  sizeof(err)), -EACCES);
	ck_assert_int_eq(hp_fetch(ns.addr[2], PORT, "another-cluster-secret-9876543210", "pj", 0,
				  mine, &rep, err, sizeof(err)), -ENOENT);
	replica_store_close(mine);

	for (int r = 0; r < 2; r++) {
		dsckpt_save_free(s[r]);
		dsckpt_host_free(mem[r]);
		dsckpt_close(c[r]);
	}
	ck_assert_int_eq(h_daemon_kill(&n1, SIGTERM), 0);
	ck_assert_int_eq(h_daemon_kill(&n2, SIGTERM), 0);
	d_stop();
	h_rm_rf(scratch);
}
END_TEST

/* The next node of the ring takes a copy when a peer refuses it: three nodes seal a job of
 * three ranks, but node 1 holds another secret; node 0's copy goes past it to node 2, and node
 * 2's to node 0 (its successor on the ring). */
START_TEST(test_next_node_when_refused)
{
	char dir[PATH_MAX], scratch[256];
	struct hdaemon n[3];
	dsckpt_conn_t *c[3];
	dsckpt_save_t *s[3];
	void *mem[3];

	if (!usable)
		return;
	netns_ucx_env();
	h_tmpdir(scratch, sizeof(scratch));
	const char *good = hp_secret_file(scratch, 0, SECRET);
	const char *other = hp_secret_file(scratch, 1, "another-cluster-secret-9876543210");
	for (unsigned i = 0; i < 3; i++)
		hp_start_node(&n[i], &ns, i, i == 1 ? other : good);
	snprintf(dir, sizeof(dir), "%s/rj/step1", D->root);
	for (int r = 0; r < 3; r++) {
		ck_assert_int_eq(dsckpt_connect(n[r].socket, &c[r]), 0);
		CK_DS(c[r], dsckpt_identify(c[r], "rj", r, 3));
		char file[16];
		snprintf(file, sizeof(file), "rank%d", r);
		s[r] = save_pattern(c[r], dir, file, N_BYTES, 90 + (uint64_t)r, &mem[r]);
	}
	for (int r = 0; r < 3; r++) {
		ck_assert_int_ge(dsckpt_wait(s[r], DSCKPT_DURABLE, 60000), DSCKPT_DURABLE);
		CK_DS(c[r], dsckpt_seal(c[r], dir));
	}
	for (int r = 0; r < 3; r++)
		ck_assert_int_ge(dsckpt_wait(s[r], DSCKPT_COMMITTED, 60000), DSCKPT_COMMITTED);
	check_copy(ns.addr[2], "rj", 0, h_path("%s/rank0.safetensors", dir), ns.addr[0]);
	check_copy(ns.addr[0], "rj", 2, h_path("%s/rank2.safetensors", dir), ns.addr[2]);
	ck_assert_msg(h_file_has(D->log, "trying the next node"), "%s", h_text(D->log));
	for (int r = 0; r < 3; r++) {
		dsckpt_save_free(s[r]);
		dsckpt_host_free(mem[r]);
		dsckpt_close(c[r]);
	}
	ck_assert_int_eq(h_daemon_kill(&n[1], SIGTERM), 0);
	ck_assert_int_eq(h_daemon_kill(&n[2], SIGTERM), 0);
	d_stop();
	h_rm_rf(scratch);
}
END_TEST

/* The suite. */
static Suite *peer_replicate_suite(void)
{
	Suite *s = suite_create("peer_replicate");
	TCase *tc = hp_case(s, "peer_replicate", 3, &ns, &usable, 300);
	tcase_add_test(tc, test_two_nodes_exchange);
	tcase_add_test(tc, test_next_node_when_refused);
	return s;
}

CHECK_MAIN(peer_replicate_suite)
