/* netns.c — network namespaces and veth links for multi-node suites (netns.h): a bridge in
 * <prefix>sw and, per node, <prefix><i> with NETNS_IF linked to it. Names carry the suite's
 * pid so that parallel runs do not meet; netns_destroy removes them even after a failure
 * (callers run it from an unchecked fixture, in the parent). */
#include "netns.h"
#include "harness.h"

#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <unistd.h>

/* Whether namespaces can be made here; else prints SKIP and returns 0. */
int netns_usable(const char *suite)
{
	if (geteuid() != 0) {
		printf("SKIP: %s: network namespaces need root\n", suite);
		return 0;
	}
	if (h_system("ip -V >/dev/null 2>&1") != 0) {
		printf("SKIP: %s: no ip(8) (iproute2)\n", suite);
		return 0;
	}
	return 1;
}

/* Removes every namespace ns names (quietly: some may not exist). */
void netns_destroy(struct netns *ns)
{
	for (unsigned i = 0; i < ns->n; i++)
		h_system("ip netns del %s%u 2>/dev/null", ns->prefix, i);
	h_system("ip netns del %ssw 2>/dev/null", ns->prefix);
}

/* Makes the switch and n nodes; 0 or -1 having removed them. */
int netns_make(struct netns *ns, unsigned n)
{
	const char *p = ns->prefix;
	unsigned net = (unsigned)getpid() % 250 + 1;

	if (n > NETNS_MAX)
		return -1;
	snprintf(ns->prefix, sizeof(ns->prefix), "dp%u-", (unsigned)getpid() % 100000);
	ns->n = n;
	netns_destroy(ns);
	if (h_system("ip netns add %ssw && ip -n %ssw link add br0 type bridge && "
		     "ip -n %ssw link set br0 up", p, p, p) != 0)
		goto fail;
	for (unsigned i = 0; i < n; i++) {
		snprintf(ns->addr[i], sizeof(ns->addr[i]), "10.35.%u.%u", net, i + 1);
		if (h_system("ip netns add %s%u && ip -n %s%u link set lo up && "
			     "ip link add " NETNS_IF " netns %s%u type veth peer name v%u netns %ssw && "
			     "ip -n %ssw link set v%u master br0 up && "
			     "ip -n %s%u addr add %s/24 dev " NETNS_IF " && "
			     "ip -n %s%u link set " NETNS_IF " up", p, i, p, i, p, i, i, p, p, i, p,
			     i, ns->addr[i], p, i) != 0)
			goto fail;
	}
	return 0;

fail:
	netns_destroy(ns);
	return -1;
}

/* Moves the calling process (one thread) into node i's namespace, with a /sys of its own
 * that shows the namespace's interfaces (UCX finds devices there), as ip netns exec does;
 * 0 or -1. */
int netns_enter(const struct netns *ns, unsigned i)
{
	char path[128];

	snprintf(path, sizeof(path), "/var/run/netns/%s%u", ns->prefix, i);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	int rc = setns(fd, CLONE_NEWNET);
	close(fd);
	if (rc != 0 || unshare(CLONE_NEWNS) != 0 ||
	    mount(NULL, "/", NULL, MS_SLAVE | MS_REC, NULL) != 0 ||
	    umount2("/sys", MNT_DETACH) != 0 || mount("sysfs", "/sys", "sysfs", 0, NULL) != 0)
		return -1;
	return 0;
}

/* Forces UCX onto TCP over the node's one interface (inherited by what is started). */
void netns_ucx_env(void)
{
	setenv("UCX_TLS", "tcp", 1);
	setenv("UCX_NET_DEVICES", NETNS_IF, 1);
}
