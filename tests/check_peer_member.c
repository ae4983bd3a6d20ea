/* check_peer_member.c — peer_member.c, whom a daemon lists and serves a copy to: a name is
 * the daemon at a link's address ("address:port") when it resolves to that address (IPv4,
 * IPv6, an IPv4-mapped IPv6 link address read as IPv4); a copy's nodes are its owner and the
 * hosts of the seal records (SEAL.<host>.json) in its tag directory, other files there not;
 * this node is its `host` or a name of one of its interfaces' addresses, loopback aside. */
#include "../daemon/dsckptd.h"
#include "harness.h"

#include <arpa/inet.h>
#include <check.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

/* The suite. */
static Suite *peer_member_suite(void)
{
	Suite *s = suite_create("peer_member");
	TCase *tc = tcase_create("peer_member");
	tcase_add_test(tc, test_name_against_link_address);
	tcase_add_test(tc, test_copy_nodes_are_owner_and_seal_hosts);
	tcase_add_test(tc, test_self);
	suite_add_tcase(s, tc);
	return s;
}

CHECK_MAIN(peer_member_suite)
