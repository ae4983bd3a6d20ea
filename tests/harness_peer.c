/* harness_peer.c — what the peer suites share (harness_peer.h). */
#include "harness_peer.h"
#include "harness.h"
#include "harness_daemon.h"
#include "../daemon/dsckptd.h"

#include <check.h>
#include <cjson/cJSON.h>
#include <fcntl.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* Makes the suite's namespaces, or says why it skips. */
int hp_netns(struct netns *ns, const char *suite, unsigned n)
{
	if (!netns_usable(suite))
		return 0;
	if (netns_make(ns, n) != 0) {
		printf("SKIP: %s: ip netns/veth failed here\n", suite);
		return 0;
	}
	return 1;
}

/* Writes a secret file (0600) into dir; its path. */
const char *hp_secret_file(const char *dir, int slot, const char *secret)
{
	static char path[2][512];
	snprintf(path[slot], sizeof(path[slot]), "%s/secret%d", dir, slot);
	int fd = open(path[slot], O_WRONLY | O_CREAT | O_TRUNC, 0600);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, secret, strlen(secret)), (ssize_t)strlen(secret));
	close(fd);
	return path[slot];
}

/* Fetches job's copy of rank from the daemon at addr; the result. */
int hp_fetch(const char *addr, unsigned port, const char *secret, const char *job,
	     unsigned rank, struct replica_store *into, struct replica **r, char *err,
	     size_t errlen)
{
	struct peer_net *net;
	struct peer_link *l;
	int rc = peer_net_open(10, &net, err, errlen);
	ck_assert_int_eq(rc, 0);
	rc = peer_open(net, addr, port, secret, strlen(secret), 10, &l, err, errlen);
	if (rc == 0) {
		rc = peer_fetch(l, job, &rank, 1, into, r, err, errlen);
		peer_link_close(l);
	}
	peer_net_close(net);
	return rc;
}

/* Commits tag dir of job on the daemons n, two ranks a node (see harness_peer.h). */
void hp_commit_job(struct hdaemon *n, unsigned nodes, const char *dir, const char *job,
		   const char *run, size_t nbytes, uint64_t base)
{
	unsigned ranks = 2 * nodes;
	dsckpt_conn_t **c = calloc(ranks, sizeof(*c));
	dsckpt_save_t **s = calloc(ranks, sizeof(*s));
	void **mem = calloc(ranks, sizeof(*mem));

	ck_assert(c && s && mem);
	for (unsigned r = 0; r < ranks; r++) {
		char file[16];
		ck_assert_int_eq(dsckpt_connect(n[r / 2].socket, &c[r]), 0);
		CK_DS(c[r], dsckpt_identify_run(c[r], job, r, ranks, run));
		snprintf(file, sizeof(file), "rank%u", r);
		s[r] = save_pattern(c[r], dir, file, nbytes, base + r, &mem[r]);
	}
	for (unsigned r = 0; r < ranks; r++) {
		ck_assert_int_ge(dsckpt_wait(s[r], DSCKPT_DURABLE, 60000), DSCKPT_DURABLE);
		CK_DS(c[r], dsckpt_seal(c[r], dir));
	}
	for (unsigned r = 0; r < ranks; r++)
		ck_assert_int_ge(dsckpt_wait(s[r], DSCKPT_COMMITTED, 60000), DSCKPT_COMMITTED);
	for (unsigned r = 0; r < ranks; r++) {
		dsckpt_save_free(s[r]);
		dsckpt_host_free(mem[r]);
		dsckpt_close(c[r]);
	}
	free(mem);
	free(s);
	free(c);
}

/* Loads dir/file's "t" and compares it with seed's pattern (see harness_peer.h). */
int hp_load_t(dsckpt_conn_t *c, const char *dir, const char *file, size_t n, uint64_t seed,
	      char *src, int *exact)
{
	int64_t shape[1] = {(int64_t)n};
	uint8_t *mem = dsckpt_host_alloc(n);
	dsckpt_tensor_t t = {"t", "U8", shape, 1, mem, n};
	dsckpt_load_t *l = NULL;
	int rc;

	ck_assert_ptr_nonnull(mem);
	memset(mem, 0xee, n);
	*exact = 0;
	src[0] = '\0';
	if ((rc = dsckpt_load_begin(c, dir, file, &l)) < 0)
		goto out;
	snprintf(src, 16, "%s", dsckpt_load_source(l));
	if ((rc = dsckpt_load_add_tensors(l, &t, 1, NULL)) < 0 || (rc = dsckpt_load_end(l)) < 0)
		goto out;
	rc = dsckpt_load_wait(l, 60000);
	*exact = h_pattern_diff(mem, n, seed) == n;
out:
	dsckpt_load_free(l);
	dsckpt_host_free(mem);
	return rc;
}

/* The peer case's namespaces, for its fixtures (one case a suite). */
static struct {
	char suite[64];
	unsigned n;
	struct netns *ns;
	int *usable;
} hp_ns_case;

/* Makes the case's namespaces, or says why it skips. */
static void hp_ns_setup(void)
{
	*hp_ns_case.usable = hp_netns(hp_ns_case.ns, hp_ns_case.suite, hp_ns_case.n);
}

/* Removes them. */
static void hp_ns_teardown(void)
{
	if (*hp_ns_case.usable)
		netns_destroy(hp_ns_case.ns);
}

/* Adds a peer suite's test case (see harness_peer.h). */
TCase *hp_case(Suite *s, const char *name, unsigned n, struct netns *ns, int *usable,
	       int timeout)
{
	TCase *tc = tcase_create(name);

	snprintf(hp_ns_case.suite, sizeof(hp_ns_case.suite), "check_%s", name);
	hp_ns_case.n = n;
	hp_ns_case.ns = ns;
	hp_ns_case.usable = usable;
	tcase_add_unchecked_fixture(tc, hp_ns_setup, hp_ns_teardown);
	tcase_add_checked_fixture(tc, NULL, h_leftovers);
	tcase_set_timeout(tc, timeout);
	suite_add_tcase(s, tc);
	return tc;
}

/* Starts node i of a ring (see harness_peer.h). */
void hp_start_node(struct hdaemon *n, const struct netns *ns, unsigned i, const char *secret)
{
	char json[1024];

	ck_assert_int_eq(netns_enter(ns, i), 0);
	snprintf(json, sizeof(json), CHUNK_1M "\"host\": \"%s\", \"peer_secret_file\": "
		 "\"%s\", \"replica_cache_size\": 0.0625,", ns->addr[i], secret);
	if (i == 0) {
		d_start(0.0625, json);
		*n = *D;
	} else {
		char name[16];
		snprintf(name, sizeof(name), "n%u", i);
		h_daemon_start_peer(n, D, name, 0.0625, json);
	}
}

/* Waits for job's copy of rank at addr (see harness_peer.h). */
struct replica *hp_wait_fetch(const char *addr, unsigned port, const char *secret,
			      const char *job, unsigned rank, struct replica_store **store)
{
	struct replica *r = NULL;
	char err[512] = "";
	int rc = -1;

	ck_assert_int_eq(replica_store_open(64 * MIB, NULL, store, err, sizeof(err)), 0);
	for (int i = 0; i < 600 && rc != 0; i++)
		if ((rc = hp_fetch(addr, port, secret, job, rank, *store, &r, err,
				   sizeof(err))) != 0)
			h_sleep_ms(100);
	ck_assert_msg(rc == 0, "no copy of rank %u at %s: %s", rank, addr, err);
	return r;
}

/* Waits for job's copy of rank at addr, from owner (see harness_peer.h). */
void hp_wait_copy(const char *addr, unsigned port, const char *secret, const char *job,
		  unsigned rank, const char *owner)
{
	struct replica_store *mine;
	struct replica *r = hp_wait_fetch(addr, port, secret, job, rank, &mine);
	const char *text;
	size_t len;
	unsigned nfiles;

	ck_assert_str_eq(replica_id(r, &text, &len, &nfiles)->owner, owner);
	replica_put(r);
	replica_store_close(mine);
}

/* A daemon's metric (see harness_peer.h). */
double hp_metric(const char *socket, const char *key)
{
	char cmd[1024], out[65536];
	snprintf(cmd, sizeof(cmd), "%s -s %s metrics --json", h_bin("dsckptctl"), socket);
	FILE *p = popen(cmd, "r");
	ck_assert_ptr_nonnull(p);
	size_t n = fread(out, 1, sizeof(out) - 1, p);
	out[n] = '\0';
	ck_assert_int_eq(pclose(p), 0);
	cJSON *doc = cJSON_Parse(out), *v = cJSON_GetObjectItem(doc, key);
	ck_assert_msg(v != NULL, "no %s in %s", key, out);
	if (cJSON_IsObject(v))
		v = cJSON_GetObjectItem(v, "count");
	double x = cJSON_GetNumberValue(v);
	cJSON_Delete(doc);
	return x;
}
