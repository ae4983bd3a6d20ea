/* harness_peer.h — what the peer suites (check_peer_replicate, check_peer_restore) share:
 * their network namespaces (tests/netns.c), a secret file, and a fetch of a copy from a
 * daemon as another node's daemon asks for one. */
#ifndef HARNESS_PEER_H
#define HARNESS_PEER_H

#include "netns.h"
#include "../client/dsckpt.h"

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

#endif
