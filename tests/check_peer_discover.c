/* check_peer_discover.c — a replacement node with an empty disk, a new host name and a new
 * address finds and restores its ranks' files from the peers once the job's trainers told
 * their daemons the job's nodes (NODES, dsckpt_job_nodes: what dsckpt.torch.tell_nodes
 * gathers from the process group; issue 35 items 1, 3, 6). Real daemons, each in a network
 * namespace of its own named by its address (tests/netns.c), UCX forced onto TCP over veths,
 * one peer_secret_file. A 4-node, 8-rank job commits; node 2's files reach node 3; node 2
 * is destroyed (SIGKILL). A fresh daemon in a fifth namespace (a new address), named
 * "node-new", on an empty root, without peer_hosts, told the job's nodes and its ranks 4
 * and 5: while only it was told, every peer refuses it and nothing is restored; once the
 * other nodes' trainers told theirs, its loads of ranks 4 and 5 come from the peers (source
 * "peer"), bytes exact, and no other rank's file is written. A sixth namespace holding the
 * secret, not among the nodes told, is listed none of the job's copies and refused a fetch,
 * and its own daemon, told a list naming itself, restores nothing. SKIP without root or
 * ip(8). */
#include "harness_daemon.h"
#include "harness_peer.h"
#include "../daemon/dsckptd.h"
#include "../daemon/peer_int.h"

#include <check.h>
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define N_BYTES (2 * MIB + 777)
#define SECRET "discover-suite-secret-0123456789"
#define PORT 18540
#define NODES 4
#define NEW NODES             /* the replacement's namespace */
#define OUTSIDER (NODES + 1)  /* a daemon of the cluster, not of the job */

static struct netns ns;
static int usable;

/* Starts a daemon in namespace i named host on root (made here), without peer_hosts. */
static void start_node(struct hdaemon *n, unsigned i, const char *root, const char *secret_path,
		       const char *host)
{
	struct hdaemon at = *D;
	char json[1024];

	snprintf(at.root, sizeof(at.root), "%s", root);
	ck_assert_int_eq(mkdir(root, 0755), 0);
	ck_assert_int_eq(netns_enter(&ns, i), 0);
	snprintf(json, sizeof(json), CHUNK_1M "\"host\": \"%s\", \"peer_secret_file\": \"%s\", "
		 "\"replica_cache_size\": 0.0625,", host, secret_path);
	h_daemon_start_peer(n, &at, host, 0.0625, json);
}

/* Tells the daemon on socket that job directory dir's job runs on the nodes, and that ranks
 * 2 * node and 2 * node + 1 are this node's (what every rank's tell_nodes sends). */
static void tell(const char *socket, const char *dir, const char *const *nodes, unsigned node)
{
	unsigned ranks[2] = { 2 * node, 2 * node + 1 };
	dsckpt_conn_t *c;

	ck_assert_int_eq(dsckpt_connect(socket, &c), 0);
	CK_DS(c, dsckpt_identify(c, "pj", ranks[0], 2 * NODES));
	CK_DS(c, dsckpt_job_nodes(c, dir, nodes, NODES, ranks, 2));
	dsckpt_close(c);
}

/* From the outsider's namespace, node 3 (holding node 2's copy) lists none of the job's
 * copies and refuses a fetch of rank 4, nothing sent. */
static void outsider_refused(void)
{
	struct peer_copies *cp = calloc(1, sizeof(*cp));
	struct replica_store *mine;
	struct replica *r = NULL;
	struct peer_net *net;
	struct peer_link *l;
	unsigned rank = 4, copies;
	uint64_t bytes, ev;
	char err[512];

	ck_assert_int_eq(netns_enter(&ns, OUTSIDER), 0);
	ck_assert_int_eq(replica_store_open(64 * MIB, NULL, &mine, err, sizeof(err)), 0);
	ck_assert_int_eq(peer_net_open(10, &net, err, sizeof(err)), 0);
	ck_assert_msg(peer_open(net, ns.addr[3], PORT, SECRET, strlen(SECRET), 10, &l, err,
				sizeof(err)) == 0, "%s", err);
	ck_assert_msg(peer_list(l, "pj", "", PEER_ANY_UID, cp, err, sizeof(err)) == 0, "%s", err);
	ck_assert_uint_eq(cp->n, 0);
	ck_assert_int_eq(peer_fetch(l, "pj", &rank, 1, mine, &r, err, sizeof(err)), -EACCES);
	ck_assert_ptr_null(r);
	peer_link_close(l);
	peer_net_close(net);
	replica_stats(mine, &copies, &bytes, &ev);
	ck_assert_uint_eq(copies, 0);
	replica_store_close(mine);
	free(cp);
}

/* Whether each of the job's eight rank files is in root's tag dir: bit r for rank r. */
static unsigned files_in(const char *root)
{
	unsigned bits = 0;
	for (int r = 0; r < 2 * NODES; r++)
		if (access(h_path("%s/pj/step0/rank%d.safetensors", root, r), F_OK) == 0)
			bits |= 1u << r;
	return bits;
}

START_TEST(test_new_name_new_address)
{
	char dir[PATH_MAX], scratch[256], root[PATH_MAX], src[16];
	struct hdaemon n[NODES], fresh, other;
	const char *nodes[NODES];
	dsckpt_conn_t *c;
	int exact;

	if (!usable)
		return;
	netns_ucx_env();
	h_tmpdir(scratch, sizeof(scratch));
	const char *secret = hp_secret_file(scratch, 0, SECRET);
	for (unsigned i = 0; i < NODES; i++)
		hp_start_node(&n[i], &ns, i, secret);
	snprintf(dir, sizeof(dir), "%s/pj/step0", D->root);
	hp_commit_job(n, NODES, dir, "pj", "run-b", N_BYTES, 600);
	ck_assert_int_eq(netns_enter(&ns, 3), 0);
	/* node 2's files on node 3 (the ring's next) */
	hp_wait_copy(ns.addr[3], PORT, SECRET, "pj", 4, ns.addr[2]);
	h_daemon_kill(&n[2], SIGKILL);

	/* The replacement: a new address (its own namespace), a new name, an empty root, no
	 * peer_hosts; the job now runs on nodes 0, 1, 3 and it. */
	nodes[0] = ns.addr[0];
	nodes[1] = ns.addr[1];
	nodes[2] = ns.addr[NEW];
	nodes[3] = ns.addr[3];
	snprintf(root, sizeof(root), "%s/root-new", scratch);
	start_node(&fresh, NEW, root, secret, "node-new");
	tell(fresh.socket, h_path("%s/pj", root), nodes, 2);
	/* Only it was told: the peers know it for no node of the job. */
	ck_assert_int_eq(dsckpt_connect(fresh.socket, &c), 0);
	CK_DS(c, dsckpt_identify(c, "pj", 4, 2 * NODES));
	ck_assert_int_lt(hp_load_t(c, h_path("%s/pj/step0", root), "rank4", N_BYTES, 604, src,
				   &exact), 0);
	ck_assert_uint_eq(files_in(root), 0);
	ck_assert_int_ne(access(h_path("%s/pj/step0/MANIFEST.json", root), F_OK), 0);

	/* The other nodes' trainers tell theirs (as every rank's tell_nodes does before the
	 * job loads): ranks 4 and 5 from node 2's copy on node 3, exact, and no other rank's. */
	for (unsigned i = 0; i < NODES; i++)
		if (i != 2)
			tell(n[i].socket, h_path("%s/pj", D->root), nodes, i);
	ck_assert_int_eq(hp_load_t(c, h_path("%s/pj/step0", root), "rank4", N_BYTES, 604, src,
				   &exact), DSCKPT_LOADED);
	ck_assert_str_eq(src, "peer");
	ck_assert(exact);
	ck_assert_int_eq(hp_load_t(c, h_path("%s/pj/step0", root), "rank5", N_BYTES, 605, src,
				   &exact), DSCKPT_LOADED);
	ck_assert(exact);
	ck_assert_uint_eq(files_in(root), (1u << 4) | (1u << 5));
	ck_assert_msg(h_file_has(fresh.log, "from 1 peer copies"), "%s", h_text(fresh.log));
	dsckpt_close(c);

	/* A daemon of the cluster that is no node told: refused, and its own telling (naming
	 * itself) restores nothing. */
	outsider_refused();
	snprintf(root, sizeof(root), "%s/root-other", scratch);
	start_node(&other, OUTSIDER, root, secret, "intruder");
	nodes[2] = ns.addr[OUTSIDER];
	tell(other.socket, h_path("%s/pj", root), nodes, 2);
	ck_assert_int_eq(dsckpt_connect(other.socket, &c), 0);
	CK_DS(c, dsckpt_identify(c, "pj", 4, 2 * NODES));
	ck_assert_int_lt(hp_load_t(c, h_path("%s/pj/step0", root), "rank4", N_BYTES, 604, src,
				   &exact), 0);
	ck_assert_uint_eq(files_in(root), 0);
	dsckpt_close(c);

	ck_assert_int_eq(h_daemon_kill(&other, SIGTERM), 0);
	ck_assert_int_eq(h_daemon_kill(&fresh, SIGTERM), 0);
	for (int i = 1; i < NODES; i++)
		if (i != 2)
			ck_assert_int_eq(h_daemon_kill(&n[i], SIGTERM), 0);
	d_stop();
	h_rm_rf(scratch);
}
END_TEST

/* NODES with peer copies off: ENOTSUP, said at once. */
START_TEST(test_nodes_without_peer_copies)
{
	const char *nodes[1] = { "node-a" };
	unsigned rank = 0;
	dsckpt_conn_t *c;

	d_start(0.0625, NULL);
	ck_assert_int_eq(dsckpt_connect(D->socket, &c), 0);
	CK_DS(c, dsckpt_identify(c, "pj", 0, 1));
	ck_assert_int_eq(dsckpt_job_nodes(c, h_path("%s/pj", D->root), nodes, 1, &rank, 1),
			 DSCKPT_ENOTSUP);
	dsckpt_close(c);
	d_stop();
}
END_TEST

/* The suite. */
static Suite *peer_discover_suite(void)
{
	Suite *s = suite_create("peer_discover");
	TCase *tc = hp_case(s, "peer_discover", NODES + 2, &ns, &usable, 300);
	tcase_add_test(tc, test_new_name_new_address);
	tcase_add_test(tc, test_nodes_without_peer_copies);
	return s;
}

CHECK_MAIN(peer_discover_suite)
