/* check_peer_level.c — the level REPLICATED from the trainer's side, between real daemons:
 * each node a dsckptd in a network namespace of its own (tests/netns.c) named by its address
 * ("host"), one shared root, UCX forced onto TCP over veths, a peer_secret_file. A 4-node,
 * 8-rank job commits and every rank's dsckpt_wait(REPLICATED) returns REPLICATED (dsckptctl
 * list names the peer holding node 0's files); a node whose daemon was SIGKILLed before the
 * commit is passed for the next node of the ring, and with `replicas: 2` on 3 nodes the wait
 * fails with EINCOMPLETE naming how many peers hold the copies (dsckptctl pending says so
 * too); under a root with a remote tier REPLICATED comes after REMOTE; a daemon with peer
 * copies off refuses the wait at once (ENOTSUP). SKIP without root or ip(8). */
#include "harness_daemon.h"
#include "netns.h"
#include "../daemon/dsckptd.h"

#include <check.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define N_BYTES (MIB + 4321)
#define SECRET "level-suite-secret-0123456789abcdef"
#define NODES 4
#define WAIT_MS 120000

static struct netns ns;
static int usable;

/* Makes the namespaces once for the case (in the parent: removed even after a crash). */
static void ns_setup(void)
{
	usable = netns_usable("check_peer_level");
	if (usable && netns_make(&ns, NODES) != 0) {
		printf("SKIP: check_peer_level: ip netns/veth failed here\n");
		usable = 0;
	}
}

/* Removes them. */
static void ns_teardown(void)
{
	if (usable)
		netns_destroy(&ns);
}

/* Writes the secret file (0600) into dir; its path (a static buffer). */
static const char *secret_file(const char *dir)
{
	static char path[512];
	snprintf(path, sizeof(path), "%s/secret", dir);
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, SECRET, strlen(SECRET)), (ssize_t)strlen(SECRET));
	close(fd);
	return path;
}

/* Starts nodes daemons, node i in namespace i with `replicas` (node 0 is the test's D). */
static void start_nodes(struct hdaemon *n, unsigned nodes, unsigned replicas,
			const char *secret)
{
	char json[1024];

	netns_ucx_env();
	for (unsigned i = 0; i < nodes; i++) {
		ck_assert_int_eq(netns_enter(&ns, i), 0);
		snprintf(json, sizeof(json), CHUNK_1M "\"host\": \"%s\", \"peer_secret_file\": "
			 "\"%s\", \"replica_cache_size\": 0.0625, \"replicas\": %u,", ns.addr[i],
			 secret, replicas);
		if (i == 0) {
			d_start(0.0625, json);
			n[0] = *D;
		} else {
			char name[8];
			snprintf(name, sizeof(name), "n%u", i);
			h_daemon_start_peer(&n[i], D, name, 0.0625, json);
		}
	}
}

/* A job of `ranks` ranks, rank r on node r % nodes, saving into dir. */
struct job {
	unsigned ranks;
	dsckpt_conn_t *c[2 * NODES];
	dsckpt_save_t *s[2 * NODES];
	void *mem[2 * NODES];
};

/* Rank r of job j saves its file into dir through its node's daemon and waits DURABLE. */
static void rank_save(struct job *j, const struct hdaemon *n, unsigned nodes, const char *jobn,
		      const char *dir, unsigned r)
{
	char file[16];

	ck_assert_int_eq(dsckpt_connect(n[r % nodes].socket, &j->c[r]), 0);
	CK_DS(j->c[r], dsckpt_identify(j->c[r], jobn, (int)r, (int)j->ranks));
	snprintf(file, sizeof(file), "rank%u", r);
	j->s[r] = save_pattern(j->c[r], dir, file, N_BYTES, 500 + r, &j->mem[r]);
	ck_assert_int_ge(dsckpt_wait(j->s[r], DSCKPT_DURABLE, WAIT_MS), DSCKPT_DURABLE);
}

/* Frees the job's saves and connections. */
static void job_free(struct job *j)
{
	for (unsigned r = 0; r < j->ranks; r++) {
		dsckpt_save_free(j->s[r]);
		dsckpt_host_free(j->mem[r]);
		dsckpt_close(j->c[r]);
	}
}

/* Four nodes, eight ranks: every rank's wait for REPLICATED returns REPLICATED, dsckptctl
 * pending lists no tag left to replicate and list names the peer holding node 0's files. */
START_TEST(test_every_rank_replicated)
{
	char dir[PATH_MAX], scratch[256];
	struct hdaemon n[NODES];
	struct job j = { .ranks = 2 * NODES };

	if (!usable)
		return;
	h_tmpdir(scratch, sizeof(scratch));
	start_nodes(n, NODES, 1, secret_file(scratch));
	snprintf(dir, sizeof(dir), "%s/lj/step1", D->root);
	for (unsigned r = 0; r < j.ranks; r++)
		rank_save(&j, n, NODES, "lj", dir, r);
	for (unsigned r = 0; r < j.ranks; r++)
		CK_DS(j.c[r], dsckpt_seal(j.c[r], dir));
	for (unsigned r = 0; r < j.ranks; r++)	/* REPLICATED already, the later ones may be */
		ck_assert_int_ge(dsckpt_wait(j.s[r], DSCKPT_COMMITTED, WAIT_MS), DSCKPT_COMMITTED);
	double t0 = h_now_us();
	for (unsigned r = 0; r < j.ranks; r++) {
		int rc = dsckpt_wait(j.s[r], DSCKPT_REPLICATED, WAIT_MS);
		ck_assert_msg(rc == DSCKPT_REPLICATED, "rank %u: %s: %s", r, dsckpt_err_name(rc),
			      dsckpt_last_error(j.c[r]));
	}
	printf("every rank REPLICATED %.3f s after every rank was COMMITTED (%u nodes, 2 files "
	       "of %.1f MiB each, TCP over veths)\n", (h_now_us() - t0) / 1e6, NODES,
	       N_BYTES / (double)MIB);
	char *out = NULL;
	ck_assert_int_eq(ctl(&out, "pending"), 0);
	ck_assert_msg(!strstr(out, "not yet REPLICATED"), "%s", out);
	free(out);
	/* dsckptctl list says which peer holds node 0's files: the next host of the ring. */
	ck_assert_int_eq(ctl(&out, "list '%s'", D->root), 0);
	ck_assert_msg(strstr(out, "local peers") && strstr(out, h_path("peer copies: %s",
								  ns.addr[1])), "%s", out);
	free(out);
	job_free(&j);
	for (unsigned i = 1; i < NODES; i++)
		ck_assert_int_eq(h_daemon_kill(&n[i], SIGTERM), 0);
	d_stop();
	h_rm_rf(scratch);
}
END_TEST

/* Whether the seal record at path reads whole (a JSON object with its ranks): the file is
 * made under its name first and written then, and a daemon killed in between leaves a
 * record its readers take for none. */
static int record_whole(const char *path)
{
	cJSON *r = cJSON_Parse(file_text(path));
	int whole = r && cJSON_IsArray(cJSON_GetObjectItem(r, "ranks"));
	cJSON_Delete(r);
	return whole;
}

/* Three nodes; node 1's daemon is SIGKILLed once its rank sealed, before the commit: node 0's
 * copy goes to node 2, the next node of the ring, and with replicas 1 its rank's wait returns
 * REPLICATED; with replicas 2 (node 2 the only peer alive) it fails with EINCOMPLETE naming
 * one copy of two, at once for a wait asked again, and dsckptctl pending shows it short. */
static void killed_peer(unsigned replicas)
{
	char dir[PATH_MAX], scratch[256];
	struct hdaemon n[3];
	struct job j = { .ranks = 3 };

	h_tmpdir(scratch, sizeof(scratch));
	start_nodes(n, 3, replicas, secret_file(scratch));
	snprintf(dir, sizeof(dir), "%s/kj/step1", D->root);
	for (unsigned r = 0; r < 3; r++)
		rank_save(&j, n, 3, "kj", dir, r);
	CK_DS(j.c[0], dsckpt_seal(j.c[0], dir));
	CK_DS(j.c[1], dsckpt_seal(j.c[1], dir));
	for (int i = 0; i < 600 && !record_whole(h_seal_record(dir, ns.addr[1])); i++)
		h_sleep_ms(100);  /* node 1's record written: its part of the commit is done */
	ck_assert(record_whole(h_seal_record(dir, ns.addr[1])));
	h_daemon_kill(&n[1], SIGKILL);
	CK_DS(j.c[2], dsckpt_seal(j.c[2], dir));
	ck_assert_msg(dsckpt_wait(j.s[0], DSCKPT_COMMITTED, WAIT_MS) >= DSCKPT_COMMITTED,
		      "not COMMITTED: %s\n%s", dsckpt_last_error(j.c[0]), h_text(D->log));
	int rc = dsckpt_wait(j.s[0], DSCKPT_REPLICATED, WAIT_MS);
	if (replicas == 1) {
		ck_assert_msg(rc == DSCKPT_REPLICATED, "%s: %s", dsckpt_err_name(rc),
			      dsckpt_last_error(j.c[0]));
		ck_assert_int_eq(dsckpt_wait(j.s[2], DSCKPT_REPLICATED, WAIT_MS),
				 DSCKPT_REPLICATED);
	} else {
		ck_assert_msg(rc == DSCKPT_EINCOMPLETE, "%s: %s", dsckpt_err_name(rc),
			      dsckpt_last_error(j.c[0]));
		ck_assert_msg(strstr(dsckpt_last_error(j.c[0]), "held by 1 of 2 peers"), "%s",
			      dsckpt_last_error(j.c[0]));
		ck_assert_int_eq(dsckpt_wait(j.s[0], DSCKPT_REPLICATED, WAIT_MS),
				 DSCKPT_EINCOMPLETE);
		char *out = NULL;
		ck_assert_int_eq(ctl(&out, "pending"), 0);
		ck_assert_msg(strstr(out, "short") && strstr(out, "1/2") &&
			      strstr(out, ns.addr[2]), "%s", out);
		free(out);
	}
	ck_assert_msg(h_file_has(D->log, "trying the next node"), "%s", h_text(D->log));
	ck_assert_msg(h_file_has(D->log, h_path("kept by %s", ns.addr[2])), "%s",
		      h_text(D->log));
	job_free(&j);
	ck_assert_int_eq(h_daemon_kill(&n[2], SIGTERM), 0);
	d_stop();
	h_rm_rf(scratch);
}

START_TEST(test_killed_peer_next_node)
{
	if (usable)
		killed_peer(1);
}
END_TEST

START_TEST(test_killed_peer_fewer_copies)
{
	if (usable)
		killed_peer(2);
}
END_TEST

/* A root with a remote tier (file://, uploads capped at 1 MiB/s so that the copies are held
 * first): two nodes' ranks reach REPLICATED only after REMOTE, so that REPLICATED implies
 * REMOTE: when the wait returns, the tag's REMOTE.json is there. */
START_TEST(test_replicated_after_remote)
{
	char dir[PATH_MAX], scratch[256], url[300], json[1024];
	struct hdaemon n[2];
	struct job j = { .ranks = 2 };

	if (!usable)
		return;
	h_tmpdir(scratch, sizeof(scratch));
	const char *secret = secret_file(scratch);
	snprintf(url, sizeof(url), "file://%s/remote", scratch);
	ck_assert_int_eq(mkdir(h_path("%s/remote", scratch), 0700), 0);
	h_root_remote = url;
	netns_ucx_env();
	for (unsigned i = 0; i < 2; i++) {
		ck_assert_int_eq(netns_enter(&ns, i), 0);
		snprintf(json, sizeof(json), CHUNK_1M "\"host\": \"%s\", \"peer_secret_file\": "
			 "\"%s\", \"replica_cache_size\": 0.0625, \"upload_max_mib_per_s\": 1,",
			 ns.addr[i], secret);
		if (i == 0) {
			d_start(0.0625, json);
			n[0] = *D;
		} else {
			h_daemon_start_peer(&n[1], D, "n1", 0.0625, json);
		}
	}
	snprintf(dir, sizeof(dir), "%s/rj/step1", D->root);
	for (unsigned r = 0; r < 2; r++)
		rank_save(&j, n, 2, "rj", dir, r);
	for (unsigned r = 0; r < 2; r++)
		CK_DS(j.c[r], dsckpt_seal(j.c[r], dir));
	for (unsigned r = 0; r < 2; r++) {
		int rc = dsckpt_wait(j.s[r], DSCKPT_REPLICATED, WAIT_MS);
		ck_assert_msg(rc == DSCKPT_REPLICATED, "rank %u: %s: %s", r, dsckpt_err_name(rc),
			      dsckpt_last_error(j.c[r]));
		ck_assert_msg(h_exists(h_path("%s/" FMT_REMOTE, dir)), "REPLICATED before REMOTE");
	}
	ck_assert_msg(h_file_has(D->log, "kept by"), "%s", h_text(D->log));
	job_free(&j);
	ck_assert_int_eq(h_daemon_kill(&n[1], SIGTERM), 0);
	d_stop();
	h_root_remote = NULL;
	h_rm_rf(scratch);
}
END_TEST

/* A daemon with peer copies off (no peer_secret_file) refuses a wait for REPLICATED at once
 * with ENOTSUP; the save is COMMITTED as before. */
START_TEST(test_peer_copies_off)
{
	char dir[PATH_MAX];
	void *mem;

	d_start(0.0625, CHUNK_1M);
	dsckpt_conn_t *c = conn_open("oj", 0, 1);
	snprintf(dir, sizeof(dir), "%s/oj/step1", D->root);
	dsckpt_save_t *s = save_pattern(c, dir, "rank0", N_BYTES, 7, &mem);
	ck_assert_int_ge(dsckpt_wait(s, DSCKPT_DURABLE, WAIT_MS), DSCKPT_DURABLE);
	CK_DS(c, dsckpt_seal(c, dir));
	ck_assert_int_eq(dsckpt_wait(s, DSCKPT_COMMITTED, WAIT_MS), DSCKPT_COMMITTED);
	ck_assert_int_eq(dsckpt_wait(s, DSCKPT_REPLICATED, -1), DSCKPT_ENOTSUP);
	ck_assert_msg(strstr(dsckpt_last_error(c), "peer copies are off"), "%s",
		      dsckpt_last_error(c));
	ck_assert_int_eq(dsckpt_wait(s, DSCKPT_COMMITTED, 0), DSCKPT_COMMITTED);
	dsckpt_save_free(s);
	dsckpt_host_free(mem);
	dsckpt_close(c);
	d_stop();
}
END_TEST

/* The suite. */
static Suite *peer_level_suite(void)
{
	Suite *s = suite_create("peer_level");
	TCase *tc = tcase_create("peer_level");
	tcase_add_unchecked_fixture(tc, ns_setup, ns_teardown);
	tcase_add_checked_fixture(tc, NULL, h_leftovers);
	tcase_set_timeout(tc, 400);
	tcase_add_test(tc, test_every_rank_replicated);
	tcase_add_test(tc, test_killed_peer_next_node);
	tcase_add_test(tc, test_killed_peer_fewer_copies);
	tcase_add_test(tc, test_replicated_after_remote);
	tcase_add_test(tc, test_peer_copies_off);
	suite_add_tcase(s, tc);
	return s;
}

CHECK_MAIN(peer_level_suite)
