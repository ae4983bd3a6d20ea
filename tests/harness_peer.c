/* harness_peer.c — what the peer suites share (harness_peer.h). */
#include "harness_peer.h"
#include "harness.h"
#include "harness_daemon.h"
#include "../daemon/dsckptd.h"

#include <check.h>
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
