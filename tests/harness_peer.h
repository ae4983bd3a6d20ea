/* harness_peer.h — what the peer suites (check_peer_replicate, check_peer_restore,
 * check_peer_discover, check_peer_cap) share: their network namespaces (tests/netns.c) and
 * test case, a secret file, the job's nodes started in a ring, and a fetch of a copy from a
 * daemon as another node's daemon asks for one. */
#ifndef HARNESS_PEER_H
#define HARNESS_PEER_H

#include "netns.h"
#include "../client/dsckpt.h"

#include <check.h>
#include <stddef.h>
#include <stdint.h>

struct replica_store;
struct replica;
struct hdaemon;

/* Makes n namespaces into ns when they can be made here (root, ip(8)): 1; else prints
 * "SKIP: <suite>: <why>" and returns 0. */
int hp_netns(struct netns *ns, const char *suite, unsigned n);
/* Writes secret into a file of mode 0600 in dir; its path (a static buffer per slot, 0 or
 * 1). */
const char *hp_secret_file(const char *dir, int slot, const char *secret);
/* Fetches the newest copy of job holding rank from the daemon at addr:port, authenticated
 * with secret, into the store into (the copy, referenced, into *r); the result (0, -EACCES,
 * -ENOENT ...) with err. */
int hp_fetch(const char *addr, unsigned port, const char *secret, const char *job,
	     unsigned rank, struct replica_store *into, struct replica **r, char *err,
	     size_t errlen);
/* Commits tag dir of job (run run) of 2 * nodes ranks on the daemons n: rank r on node
 * r / 2, file rank<r>, a U8 tensor "t" of nbytes of seed base + r. */
void hp_commit_job(struct hdaemon *n, unsigned nodes, const char *dir, const char *job,
		   const char *run, size_t nbytes, uint64_t base);
/* Loads dir/file's U8 "t" (n bytes) into host memory: the load's code, its source into src
 * (16 bytes), and whether the bytes are seed's pattern into *exact. */
int hp_load_t(dsckpt_conn_t *c, const char *dir, const char *file, size_t n, uint64_t seed,
	      char *src, int *exact);

/* Adds to s the test case of a peer suite, name (its namespaces' SKIP line says
 * check_<name>): n namespaces made into *ns once before its tests (in the parent: removed
 * even after a crash), *usable telling whether they were; leftovers checked after each test,
 * timeout seconds a test. The caller adds its tests to the case returned. */
TCase *hp_case(Suite *s, const char *name, unsigned n, struct netns *ns, int *usable,
	       int timeout);
/* Starts node i of a ring in namespace i of ns, named by its address (host), with the secret
 * file secret and a 1/16 GiB replica cache: node 0 is the test's D (d_start), node i > 0 a
 * daemon named n<i> beside it. */
void hp_start_node(struct hdaemon *n, const struct netns *ns, unsigned i, const char *secret);
/* Waits (60 s at most) until the daemon at addr:port holds job's copy of rank, fetched with
 * secret into a new 64 MiB store (into *store); the copy, referenced. */
struct replica *hp_wait_fetch(const char *addr, unsigned port, const char *secret,
			      const char *job, unsigned rank, struct replica_store **store);
/* Waits as hp_wait_fetch, and checks that the copy came from owner. */
void hp_wait_copy(const char *addr, unsigned port, const char *secret, const char *job,
		  unsigned rank, const char *owner);
/* The value of key in the METRICS of the daemon on socket (dsckptctl metrics --json); for a
 * histogram, its count. */
double hp_metric(const char *socket, const char *key);

#endif
