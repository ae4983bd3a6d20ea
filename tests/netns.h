/* netns.h — the network namespaces multi-node suites run their "nodes" in (tests/netns.c):
 * n namespaces, each with one interface (NETNS_IF) joined by a veth pair to a bridge in a
 * namespace of its own, addressed 10.35.<net>.<i + 1>/24. Root and ip(8) are needed. */
#ifndef NETNS_H
#define NETNS_H

#include <sys/types.h>

#define NETNS_MAX 16
#define NETNS_IF "peer0"

struct netns {
	unsigned n;
	char prefix[16];          /* names: <prefix>sw, <prefix>0 ... */
	char addr[NETNS_MAX][16]; /* node i's address */
};

/* Whether namespaces can be made here (root, ip(8)); else prints "SKIP: <why>" for suite
 * and returns 0. */
int netns_usable(const char *suite);
/* Makes n nodes' namespaces (removing leftovers of the same names first); 0 or -1, having
 * removed what it made. */
int netns_make(struct netns *ns, unsigned n);
/* Removes every namespace ns made (the veths and bridge go with them). */
void netns_destroy(struct netns *ns);
/* Moves the calling process into node i's namespace; 0 or -1. */
int netns_enter(const struct netns *ns, unsigned i);
/* Sets the environment that forces UCX onto TCP over the node's interface. */
void netns_ucx_env(void);

#endif
