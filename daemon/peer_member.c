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
 *
 * What a name resolved to is remembered for MEMBER_TTL_S seconds, a name that does not exist
 * too (a failure that may pass, EAI_AGAIN, is not): a tag's check resolves each of its
 * thousands of seal records' hosts, and the next tag's check names the same hosts. The table
 * is bounded (MEMBER_SLOTS names; a name takes its hash's slot, replacing the one there), and
 * a name of more than MEMBER_ADDRS addresses is asked every time.
 */
#include "dsckptd.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MEMBER_TTL_S 30       /* seconds a name's addresses are used again */
#define MEMBER_SLOTS 4096     /* names remembered at most */
#define MEMBER_ADDRS 8        /* addresses remembered of one name */

/* An IPv4 or IPv6 address, an IPv4-mapped IPv6 one read as IPv4; family 0: none. */
struct member_addr {
	int family;
	uint8_t a[16];
};

/* A name and what it resolved to; name NULL: a free slot. */
struct member_entry {
	char *name;
	uint64_t until_ns;                      /* CLOCK_MONOTONIC: used before then */
	unsigned n;                             /* 0: the name does not exist */
	struct member_addr a[MEMBER_ADDRS];
};

/* The names remembered: MEMBER_SLOTS entries, made at the first one. */
static struct {
	pthread_mutex_t lock;
	struct member_entry *slot;
} member_cache = { PTHREAD_MUTEX_INITIALIZER, NULL };

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

/* The monotonic clock in nanoseconds. */
static uint64_t member_now_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* The slot of name (FNV-1a). */
static struct member_entry *member_slot(const char *name)
{
	uint32_t h = 2166136261u;

	for (const unsigned char *p = (const unsigned char *)name; *p; p++)
		h = (h ^ *p) * 16777619u;
	return &member_cache.slot[h % MEMBER_SLOTS];
}

/* Copies what name resolved to into *out while it is fresh: 1, or 0 when it is not there. */
static int member_cache_get(const char *name, struct member_entry *out)
{
	int hit = 0;

	pthread_mutex_lock(&member_cache.lock);
	if (member_cache.slot) {
		const struct member_entry *e = member_slot(name);
		hit = e->name && strcmp(e->name, name) == 0 && e->until_ns > member_now_ns();
		if (hit)
			*out = *e;
	}
	pthread_mutex_unlock(&member_cache.lock);
	return hit;
}

/* Remembers what name resolved to (e's addresses) for MEMBER_TTL_S seconds; without memory,
 * nothing. */
static void member_cache_put(const char *name, const struct member_entry *e)
{
	char *copy = strdup(name);

	pthread_mutex_lock(&member_cache.lock);
	if (!member_cache.slot)
		member_cache.slot = calloc(MEMBER_SLOTS, sizeof(*member_cache.slot));
	if (member_cache.slot && copy) {
		struct member_entry *s = member_slot(name);
		free(s->name);
		*s = *e;
		s->name = copy;
		s->until_ns = member_now_ns() + MEMBER_TTL_S * 1000000000ull;
		copy = NULL;
	}
	pthread_mutex_unlock(&member_cache.lock);
	free(copy);
}

/* Asks the system what name resolves to: whether match(arg, address) accepts one of its
 * addresses; what it said is remembered (member_cache_put) unless it may pass or is too
 * long. */
static int member_ask(const char *name, int (*match)(void *, const struct member_addr *),
		      void *arg)
{
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *res, *ai;
	struct member_entry e = { .n = 0 };
	int yes = 0, all = 1, rc = getaddrinfo(name, NULL, &hints, &res);

	if (rc == EAI_NONAME || rc == EAI_NODATA)
		member_cache_put(name, &e);
	if (rc != 0)
		return 0;
	for (ai = res; ai; ai = ai->ai_next) {
		struct member_addr m = member_addr_of(ai->ai_addr);
		yes = yes || match(arg, &m);
		if (e.n < MEMBER_ADDRS)
			e.a[e.n++] = m;
		else
			all = 0;
	}
	freeaddrinfo(res);
	if (all)
		member_cache_put(name, &e);
	return yes;
}

/* Whether name resolves to an address that match(arg, address) accepts: what it resolved to
 * within MEMBER_TTL_S, else asked (member_ask). */
static int member_resolves(const char *name, int (*match)(void *, const struct member_addr *),
			   void *arg)
{
	struct member_entry e;
	int yes = 0;

	if (name[0] == '\0')
		return 0;
	if (!member_cache_get(name, &e))
		return member_ask(name, match, arg);
	for (unsigned i = 0; i < e.n && !yes; i++)
		yes = match(arg, &e.a[i]);
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

/* Calls fn(arg, host) for the host each seal record in dir names (seal_record_host) until it
 * returns non-zero; that value, or 0 (also when dir is not here). */
int peer_member_hosts(const char *dir, int (*fn)(void *arg, const char *host), void *arg)
{
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
		if (seal_record_host(e->d_name, host, sizeof(host)) == 0)
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
