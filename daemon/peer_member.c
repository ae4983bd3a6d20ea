/*
 * peer_member.c — which daemon a peer link is and whether it is a node of a copy's job
 * (issue 35 item 3). Every daemon holding the cluster's secret passes the challenge, so the
 * secret says "of the cluster", not "of this job": a daemon is told apart by the address its
 * link comes from (the fabric is trusted for source addresses as it is for confidentiality).
 * A host name is that daemon's when it resolves, as the system resolves names, to the link's
 * address. The nodes of a copy are its owner and the hosts of the seal records (SEAL.<host>
 * .json) in its tag directory on this node's root: the nodes that committed the tag. A
 * listing or a fetch of a copy is answered only to one of them. And a host name is this
 * node's when it is the configured `host` or resolves to one of this node's interfaces'
 * addresses (a replacement that took over a lost node's address, under a new name).
 * Blocking (name resolution, a directory read); any thread.
 */
#include "dsckptd.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* An IPv4 or IPv6 address, an IPv4-mapped IPv6 one read as IPv4; family 0: none. */
struct member_addr {
	int family;
	uint8_t a[16];
};

/* sa as a member_addr. */
static struct member_addr member_addr_of(const struct sockaddr *sa)
{
	static const uint8_t mapped[12] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff };
	struct member_addr m = { 0 };

	if (sa->sa_family == AF_INET) {
		m.family = AF_INET;
		memcpy(m.a, &((const struct sockaddr_in *)sa)->sin_addr, 4);
	} else if (sa->sa_family == AF_INET6) {
		const uint8_t *b = ((const struct sockaddr_in6 *)sa)->sin6_addr.s6_addr;
		m.family = memcmp(b, mapped, 12) == 0 ? AF_INET : AF_INET6;
		memcpy(m.a, m.family == AF_INET ? b + 12 : b, m.family == AF_INET ? 4 : 16);
	}
	return m;
}

/* Whether a and b are one address. */
static int member_addr_eq(const struct member_addr *a, const struct member_addr *b)
{
	return a->family != 0 && a->family == b->family &&
	       memcmp(a->a, b->a, a->family == AF_INET ? 4 : 16) == 0;
}

/* The address of who ("address:port", as peer_link_who writes an accepted link's); family 0
 * when it is none. */
static struct member_addr member_who(const char *who)
{
	struct member_addr m = { 0 };
	struct addrinfo hints = { .ai_flags = AI_NUMERICHOST }, *res;
	char host[80];
	const char *colon = strrchr(who, ':');
	size_t n = colon ? (size_t)(colon - who) : strlen(who);

	if (n == 0 || n >= sizeof(host))
		return m;
	memcpy(host, who, n);
	host[n] = '\0';
	if (getaddrinfo(host, NULL, &hints, &res) == 0) {
		m = member_addr_of(res->ai_addr);
		freeaddrinfo(res);
	}
	return m;
}

/* Whether name resolves to an address that match(arg, address) accepts. */
static int member_resolves(const char *name, int (*match)(void *, const struct member_addr *),
			   void *arg)
{
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *res, *ai;
	int yes = 0;

	if (name[0] == '\0' || getaddrinfo(name, NULL, &hints, &res) != 0)
		return 0;
	for (ai = res; ai && !yes; ai = ai->ai_next) {
		struct member_addr m = member_addr_of(ai->ai_addr);
		yes = match(arg, &m);
	}
	freeaddrinfo(res);
	return yes;
}

/* member_resolves' match: the address arg points to. */
static int member_match_one(void *arg, const struct member_addr *m)
{
	return member_addr_eq(arg, m);
}

/* member_resolves' match: an address of one of this node's interfaces but loopback (arg:
 * getifaddrs's list). */
static int member_match_local(void *arg, const struct member_addr *m)
{
	for (struct ifaddrs *i = arg; i; i = i->ifa_next) {
		struct member_addr a;
		if (i->ifa_addr == NULL || (i->ifa_flags & IFF_LOOPBACK))
			continue;
		a = member_addr_of(i->ifa_addr);
		if (member_addr_eq(&a, m))
			return 1;
	}
	return 0;
}

/* Calls fn(arg, host) for the host of each seal record in dir (SEAL.<host>.json) until it
 * returns non-zero; that value, or 0 (also when dir is not here). */
int peer_member_hosts(const char *dir, int (*fn)(void *arg, const char *host), void *arg)
{
	const size_t pre = strlen(FMT_SEAL_PREFIX), suf = strlen(FMT_SEAL_SUFFIX);
	int fd = dir && dir[0] == '/' ? open(dir, STORE_DIR_FLAGS) : -1, rc = 0;
	struct dirent *e;
	DIR *d;

	if (fd < 0)
		return 0;
	if ((d = fdopendir(fd)) == NULL) {
		close(fd);
		return 0;
	}
	while (rc == 0 && (e = readdir(d)) != NULL) {
		char host[STORE_HOST_MAX];
		size_t n = strlen(e->d_name);
		if (!seal_record_name(e->d_name) || n - pre - suf >= sizeof(host))
			continue;
		memcpy(host, e->d_name + pre, n - pre - suf);
		host[n - pre - suf] = '\0';
		rc = fn(arg, host);
	}
	closedir(d);
	return rc;
}

/* Whether name resolves to the address of who ("address:port"). */
int peer_member_is(const char *name, const char *who)
{
	struct member_addr a = member_who(who);

	return a.family != 0 && member_resolves(name, member_match_one, &a);
}

/* peer_member_hosts' fn: 1 when host is the daemon at arg's address. */
static int member_host_is(void *arg, const char *host)
{
	return member_resolves(host, member_match_one, arg);
}

/* Whether a host of a seal record in dir (a copy's tag directory here) is the daemon at
 * who. */
int peer_member_dir(const char *dir, const char *who)
{
	struct member_addr a = member_who(who);

	return a.family != 0 && peer_member_hosts(dir, member_host_is, &a) == 1;
}

/* Whether the daemon at who is a node of copy id: its owner, or a host of a seal record in
 * the copy's tag directory here. */
int peer_member_of(const struct replica_id *id, const char *who)
{
	return peer_member_is(id->owner, who) || peer_member_dir(id->dir, who);
}

/* Whether name is this node: its `host`, or a name of one of its interfaces' addresses
 * (loopback's aside). */
int peer_member_self(const char *name)
{
	struct ifaddrs *ifs;
	int yes;

	if (strcmp(name, store_host()) == 0)
		return 1;
	if (getifaddrs(&ifs) != 0)
		return 0;
	yes = member_resolves(name, member_match_local, ifs);
	freeifaddrs(ifs);
	return yes;
}
