/* check_peer_member.c — peer_member.c, whom a daemon lists and serves a copy to: a name is
 * the daemon at a link's address ("address:port") when it resolves to that address (IPv4,
 * IPv6, an IPv4-mapped IPv6 link address read as IPv4); a copy's nodes are its owner and the
 * hosts of the seal records (SEAL.<host>.json) in its tag directory, other files there not;
 * this node is its `host` or a name of one of its interfaces' addresses, loopback aside; what
 * a name resolved to is used again for 30 s, a name that does not exist too, a failure that
 * may pass not, and the table is bounded. getaddrinfo and clock_gettime are interposed for
 * the whole binary: names under .member-test are answered here and counted, and the
 * monotonic clock can be moved ahead. */
#include "../daemon/dsckptd.h"
#include "harness.h"

#include <arpa/inet.h>
#include <check.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define SUFFIX ".member-test"   /* names answered by the getaddrinfo below */
#define SLOTS 4096              /* peer_member.c's MEMBER_SLOTS */

static unsigned resolved;       /* names under SUFFIX asked */
static int64_t mono_skew_ns;    /* added to CLOCK_MONOTONIC */

/* The monotonic clock, moved mono_skew_ns ahead (peer_member.c calls it; this definition takes
 * the place of libc's in the binary). */
int clock_gettime(clockid_t id, struct timespec *t)
{
	int rc = (int)syscall(SYS_clock_gettime, id, t);
	if (rc == 0 && id == CLOCK_MONOTONIC && mono_skew_ns) {
		int64_t ns = (int64_t)t->tv_nsec + mono_skew_ns % 1000000000;
		t->tv_sec += mono_skew_ns / 1000000000 + ns / 1000000000;
		t->tv_nsec = ns % 1000000000;
	}
	return rc;
}

/* The resolver: under SUFFIX (counted), "gone" does not exist, "flaky" fails as a DNS server
 * down does, "many" has 12 addresses (10.97.0.1-12), "<letter><k>" is 10.99.k/256.k%256; any
 * other name goes to libc's. */
int getaddrinfo(const char *node, const char *service, const struct addrinfo *hints,
		struct addrinfo **res)
{
	static int (*real)(const char *, const char *, const struct addrinfo *,
			   struct addrinfo **);
	struct addrinfo num = { .ai_flags = AI_NUMERICHOST, .ai_socktype = SOCK_STREAM };
	size_t n = node ? strlen(node) : 0, k = strlen(SUFFIX);
	char addr[32];

	if (!real)
		real = (int (*)(const char *, const char *, const struct addrinfo *,
				struct addrinfo **))dlsym(RTLD_NEXT, "getaddrinfo");
	if (n <= k || strcmp(node + n - k, SUFFIX) != 0)
		return real(node, service, hints, res);
	resolved++;
	if (strncmp(node, "gone.", 5) == 0)
		return EAI_NONAME;
	if (strncmp(node, "flaky.", 6) == 0)
		return EAI_AGAIN;
	if (strncmp(node, "many.", 5) == 0) {
		*res = NULL;
		for (int i = 12; i >= 1; i--) {
			struct addrinfo *one;
			snprintf(addr, sizeof(addr), "10.97.0.%d", i);
			ck_assert_int_eq(real(addr, NULL, &num, &one), 0);
			one->ai_next = *res;
			*res = one;
		}
		return 0;
	}
	unsigned long v = strtoul(node + 1, NULL, 10);
	snprintf(addr, sizeof(addr), "10.99.%lu.%lu", v / 256, v % 256);
	return real(addr, NULL, &num, res);
}

/* Makes an empty file dir/name. */
static void touch(const char *dir, const char *name)
{
	int fd = open(h_path("%s/%s", dir, name), O_WRONLY | O_CREAT | O_TRUNC, 0644);
	ck_assert_int_ge(fd, 0);
	close(fd);
}

/* peer_member_hosts' fn: appends host and a space to arg (a buffer of 256). */
static int collect(void *arg, const char *host)
{
	char *out = arg;
	snprintf(out + strlen(out), 256 - strlen(out), "%s ", host);
	return 0;
}

START_TEST(test_name_against_link_address)
{
	ck_assert(peer_member_is("10.35.7.2", "10.35.7.2:40312"));
	ck_assert(!peer_member_is("10.35.7.3", "10.35.7.2:40312"));
	ck_assert(peer_member_is("10.35.7.2", "::ffff:10.35.7.2:40312"));
	ck_assert(peer_member_is("fd00::5", "fd00::5:7000"));
	ck_assert(!peer_member_is("fd00::6", "fd00::5:7000"));
	ck_assert(peer_member_is("localhost", "127.0.0.1:9"));
	ck_assert(!peer_member_is("no-such-host.invalid", "10.35.7.2:1"));
	ck_assert(!peer_member_is("10.35.7.2", "?:?"));
	ck_assert(!peer_member_is("", "10.35.7.2:1"));
}
END_TEST

START_TEST(test_copy_nodes_are_owner_and_seal_hosts)
{
	char dir[256], hosts[256] = "";
	h_tmpdir(dir, sizeof(dir));
	touch(dir, "SEAL.10.35.7.1.json");
	touch(dir, "SEAL.10.35.7.4.json");
	touch(dir, "rank0.safetensors");
	touch(dir, "SEAL.10.35.7.9.json.partial");  /* not a record */
	touch(dir, "10.35.7.8.json");
	peer_member_hosts(dir, collect, hosts);
	ck_assert_msg(strcmp(hosts, "10.35.7.1 10.35.7.4 ") == 0 ||
		      strcmp(hosts, "10.35.7.4 10.35.7.1 ") == 0, "%s", hosts);
	struct replica_id id = { "10.35.7.2", "job", "run", "step1", dir, 1 };
	ck_assert(peer_member_of(&id, "10.35.7.2:5000"));   /* the owner */
	ck_assert(peer_member_of(&id, "10.35.7.4:5000"));   /* a node of the commit */
	ck_assert(!peer_member_of(&id, "10.35.7.8:5000"));  /* another job's node */
	ck_assert(!peer_member_of(&id, "10.35.7.9:5000"));
	ck_assert(peer_member_dir(dir, "10.35.7.1:1"));
	ck_assert(!peer_member_dir(dir, "10.35.7.2:1"));
	/* The tag's directory gone: the owner alone. */
	h_rm_rf(dir);
	ck_assert(peer_member_of(&id, "10.35.7.2:5000"));
	ck_assert(!peer_member_of(&id, "10.35.7.4:5000"));
	ck_assert(!peer_member_dir("relative/dir", "10.35.7.4:1"));
}
END_TEST

START_TEST(test_self)
{
	struct ifaddrs *ifs;
	char addr[INET6_ADDRSTRLEN] = "";

	store_set_host("node-under-test");
	ck_assert(peer_member_self("node-under-test"));
	ck_assert(!peer_member_self("127.0.0.1"));	/* loopback is every node's */
	ck_assert(!peer_member_self("192.0.2.77"));
	ck_assert(!peer_member_self("another-node.invalid"));
	ck_assert_int_eq(getifaddrs(&ifs), 0);
	for (struct ifaddrs *i = ifs; i && !addr[0]; i = i->ifa_next)
		if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET &&
		    !(i->ifa_flags & IFF_LOOPBACK))
			inet_ntop(AF_INET, &((struct sockaddr_in *)i->ifa_addr)->sin_addr, addr,
				  sizeof(addr));
	freeifaddrs(ifs);
	if (addr[0])
		ck_assert_msg(peer_member_self(addr), "%s, an address of this node", addr);
	else
		printf("check_peer_member: no IPv4 interface but loopback: self by address not run\n");
}
END_TEST

/* The address "10.99.k/256.k%256:port" of the name <letter><k> under SUFFIX. */
static const char *who_of(unsigned k)
{
	static char who[40];
	snprintf(who, sizeof(who), "10.99.%u.%u:7000", k / 256, k % 256);
	return who;
}

/* A name is resolved once however often it is checked, a tag's seal records' hosts once for
 * every check of the tag and of the next (the same hosts), and again once 30 s have passed. */
START_TEST(test_resolutions_remembered)
{
	char dir[256], name[64];

	resolved = 0;
	ck_assert(peer_member_is("a1" SUFFIX, "10.99.0.1:5"));
	ck_assert(peer_member_is("a1" SUFFIX, "10.99.0.1:6"));
	ck_assert(!peer_member_is("a1" SUFFIX, "10.99.0.2:5"));
	ck_assert_uint_eq(resolved, 1);
	h_tmpdir(dir, sizeof(dir));
	for (unsigned k = 1; k <= 300; k++) {
		snprintf(name, sizeof(name), "SEAL.a%u" SUFFIX ".json", k);
		touch(dir, name);
	}
	ck_assert(!peer_member_dir(dir, "10.98.0.1:5"));	/* every host asked */
	ck_assert_uint_eq(resolved, 300);
	ck_assert(peer_member_dir(dir, who_of(150)));
	ck_assert(!peer_member_dir(dir, "10.98.0.1:5"));
	ck_assert(!peer_member_self("a7" SUFFIX));
	ck_assert_uint_eq(resolved, 300);
	mono_skew_ns = 31 * 1000000000ll;
	ck_assert(peer_member_is("a1" SUFFIX, "10.99.0.1:5"));
	ck_assert(!peer_member_is("a2" SUFFIX, "10.99.0.1:5"));
	ck_assert_uint_eq(resolved, 302);
	ck_assert(peer_member_is("a1" SUFFIX, "10.99.0.1:5"));
	ck_assert_uint_eq(resolved, 302);
	mono_skew_ns = 0;
	h_rm_rf(dir);
}
END_TEST

/* A name that does not exist is remembered, a failure that may pass (EAI_AGAIN) is not, nor a
 * name of more addresses than are kept (its last still matches); more names than the table
 * holds are all answered right, the ones it had no room for asked again. */
START_TEST(test_failures_and_bound)
{
	resolved = 0;
	ck_assert(!peer_member_is("gone" SUFFIX, "10.99.0.1:5"));
	ck_assert(!peer_member_is("gone" SUFFIX, "10.99.0.1:5"));
	ck_assert_uint_eq(resolved, 1);
	ck_assert(!peer_member_is("flaky" SUFFIX, "10.99.0.1:5"));
	ck_assert(!peer_member_is("flaky" SUFFIX, "10.99.0.1:5"));
	ck_assert_uint_eq(resolved, 3);
	ck_assert(peer_member_is("many" SUFFIX, "10.97.0.12:1"));
	ck_assert(peer_member_is("many" SUFFIX, "10.97.0.12:1"));
	ck_assert(!peer_member_is("many" SUFFIX, "10.97.0.13:1"));
	ck_assert_uint_eq(resolved, 6);

	char name[64];
	resolved = 0;
	for (int pass = 0; pass < 2; pass++) {
		for (unsigned k = 1; k <= 3 * SLOTS; k++) {
			snprintf(name, sizeof(name), "b%u" SUFFIX, k);
			ck_assert_msg(peer_member_is(name, who_of(k)), "%s", name);
			ck_assert_msg(!peer_member_is(name, who_of(k + 1)), "%s", name);
		}
		if (pass == 0)
			ck_assert_uint_eq(resolved, 3 * SLOTS);
	}
	ck_assert_uint_ge(resolved, 5 * SLOTS);	/* SLOTS held at most: 2 * SLOTS asked again */
}
END_TEST

/* The suite. */
static Suite *peer_member_suite(void)
{
	Suite *s = suite_create("peer_member");
	TCase *tc = tcase_create("peer_member");
	tcase_add_test(tc, test_name_against_link_address);
	tcase_add_test(tc, test_copy_nodes_are_owner_and_seal_hosts);
	tcase_add_test(tc, test_self);
	tcase_add_test(tc, test_resolutions_remembered);
	tcase_add_test(tc, test_failures_and_bound);
	suite_add_tcase(s, tc);
	return s;
}

CHECK_MAIN(peer_member_suite)
