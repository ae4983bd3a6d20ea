/* harness_peer.c — what the peer suites share (harness_peer.h). */
#include "harness_peer.h"
#include "harness.h"
#include "../daemon/dsckptd.h"

#include <check.h>
#include <fcntl.h>
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
