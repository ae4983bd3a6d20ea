/* check_peer_restore.c — a lost node restored from its peers' copies (issue 35 items 3, 6,
 * 7), between real daemons, each in a network namespace of its own (tests/netns.c) named by
 * its address, UCX forced onto TCP over veths, one peer_secret_file. A 4-node, 8-rank job
 * (two ranks a node, run "run-b") commits step0, then step1, on a shared root; every node's
 * files reach the next node of the ring; a stale copy of node 2's ranks from an earlier run
 * ("run-a") is placed on node 1. A fifth namespace is a node of another job holding the
 * secret: node 3 lists it none of the job's copies and refuses it node 2's copy (nothing
 * sent), and its daemon restores nothing. Node 2 is destroyed (SIGKILL); a fresh daemon of
 * node 2 on an empty root: with another secret it restores nothing; with the secret, told
 * one node (peer_hosts) and a remote tier whose directory is gone by then (any read of it
 * fails), it finds node 3 through the copies' owners and loads its ranks through libdsckpt:
 * source "peer", bytes exact (checked again by the load), the tag committed there with
 * run-b's manifest, not run-a's. A replacement of a new host name at node 2's address,
 * without peer_hosts, whose disk kept the job's step0 directory, prefetches the job's
 * latest (find_latest's path): the peers found through step0's seal records, and only node
 * 2's files (its ranks'), no other node's. A node whose copies lie on replica_root keeps
 * them over a restart, checked. A peer that breaks off mid-file leaves nothing of the tag
 * behind. SKIP without root or ip(8). */
#include "harness_daemon.h"
#include "harness_peer.h"
#include "../daemon/dsckptd.h"
#include "../daemon/peer_int.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#define N_BYTES (2 * MIB + 4321)
#define SECRET "restore-suite-secret-0123456789"
#define PORT 18540
#define NODES 4

static struct netns ns;
static int usable;

/* peer_read_fn over files open in arg (an array of descriptors). */
static int read_fds(void *arg, unsigned i, uint64_t off, void *buf, size_t len)
{
	const int *fds = arg;
	return pread(fds[i], buf, len, (off_t)off) == (ssize_t)len ? 0 : -EIO;
}

/* Places on the daemon at addr a copy of owner's ranks 4 and 5 of dir (their files, checked
 * against the manifest) as of run "run-a", committed a second before run-b's: what an earlier
 * run of the job left under the same tag name, from the current namespace: 0 or why it
 * failed (a code and err). */
static int put_stale(const char *addr, const char *dir, const char *owner, char *err,
		     size_t errlen)
{
	size_t len;
	char *text = h_read_file(h_path("%s/MANIFEST.json", dir), &len), why[256];
	int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	/* Every file listed, as a daemon sends it (a multi-node commit names seal records). */
	ck_assert_msg(manifest_text_expand(dfd, &text, &len, why, sizeof(why)) == 0, "%s", why);
	close(dfd);
	char *at = strstr(text, "\"run-b\"");
	ck_assert_ptr_nonnull(at);
	at[5] = 'a';
	struct manifest *m = manifest_parse(text, len, why, sizeof(why));
	ck_assert_ptr_nonnull(m);
	const struct manifest_file *files[8];
	int fds[8];
	unsigned n = 0, ranks[2] = {4, 5};
	for (size_t i = 0; i < m->nfiles; i++)
		if (m->files[i].rank == 4 || m->files[i].rank == 5) {
			files[n] = &m->files[i];
			fds[n] = open(h_path("%s/%s", dir, m->files[i].name), O_RDONLY);
			ck_assert_int_ge(fds[n++], 0);
		}
	struct replica_id id = { owner, "pj", "run-a", "step1", dir, m->created_ns - 1000000000 };
	struct peer_net *net;
	struct peer_link *l;
	ck_assert_int_eq(peer_net_open(10, &net, err, errlen), 0);
	ck_assert_int_eq(peer_open(net, addr, PORT, SECRET, strlen(SECRET), 10, &l, err, errlen),
			 0);
	int rc = peer_put(l, &id, ranks, 2, text, len, files, n, read_fds, fds, NULL, err, errlen);
	peer_link_close(l);
	peer_net_close(net);
	for (unsigned i = 0; i < n; i++)
		close(fds[i]);
	manifest_free(m);
	free(text);
	return rc;
}

/* Starts a daemon in namespace i on root (made here), named host (NULL: the namespace's
 * address), asking peers (may be ""). */
static void start_node(struct hdaemon *n, unsigned i, const char *root, const char *secret_path,
		       const char *host, const char *peers)
{
	struct hdaemon at = *D;
	char json[1024];

	snprintf(at.root, sizeof(at.root), "%s", root);
	if (access(root, F_OK) != 0)
		ck_assert_int_eq(mkdir(root, 0755), 0);
	ck_assert_int_eq(netns_enter(&ns, i), 0);
	snprintf(json, sizeof(json), CHUNK_1M "\"host\": \"%s\", \"peer_secret_file\": \"%s\", "
		 "\"replica_cache_size\": 0.0625, \"peer_hosts\": \"%s\",",
		 host ? host : ns.addr[i], secret_path, peers);
	h_daemon_start_peer(n, &at, "fresh", 0.0625, json);
}

/* Waits (60 s at most) until metric key of the daemon on socket is at least v. */
static void wait_metric(const char *socket, const char *key, double v)
{
	for (int i = 0; i < 600 && hp_metric(socket, key) < v; i++)
		h_sleep_ms(100);
	ck_assert_double_ge(hp_metric(socket, key), v);
}

/* A node of another job (namespace NODES) holding the cluster's secret asks node 3, which
 * holds node 2's copy of pj: none listed, the fetch refused with nothing of it sent (its
 * store holds nothing); its daemon, told of node 3, restores nothing of pj. */
static void other_job_refused(const char *scratch, const char *good, const char *log3)
{
	struct replica_store *mine;
	struct replica *r = NULL;
	struct peer_net *net;
	struct peer_link *l;
	struct peer_copies *cp = calloc(1, sizeof(*cp));
	unsigned rank = 4, copies;
	uint64_t bytes, ev;
	char err[512], src[16];
	int exact;

	ck_assert_int_eq(netns_enter(&ns, NODES), 0);
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
	ck_assert_uint_eq(bytes, 0);
	replica_store_close(mine);
	free(cp);
	ck_assert_msg(h_file_has(log3, "refused a fetch"), "%s", h_text(log3));

	struct hdaemon other;
	dsckpt_conn_t *c;
	char root[PATH_MAX];
	snprintf(root, sizeof(root), "%s/root-other", scratch);
	start_node(&other, NODES, root, good, NULL, ns.addr[3]);
	ck_assert_int_eq(dsckpt_connect(other.socket, &c), 0);
	CK_DS(c, dsckpt_identify(c, "pj", 4, 2 * NODES));
	ck_assert_int_lt(hp_load_t(c, h_path("%s/pj/step1", root), "rank4", N_BYTES, 504, src,
				&exact), 0);
	ck_assert_int_ne(access(h_path("%s/pj/step1/rank4.safetensors", root), F_OK), 0);
	ck_assert_int_ne(access(h_path("%s/pj/step1/MANIFEST.json", root), F_OK), 0);
	dsckpt_close(c);
	ck_assert_int_eq(h_daemon_kill(&other, SIGTERM), 0);
}

/* Restarts n with its root root given a remote tier in directory remote, which is then
 * removed: any read of the remote fails. */
static void with_remote(struct hdaemon *n, const char *root, const char *remote)
{
	char key[PATH_MAX + 32], url[PATH_MAX + 64];
	ck_assert_int_eq(h_daemon_kill(n, SIGTERM), 0);
	ck_assert_int_eq(mkdir(remote, 0700), 0);
	char *cfg = h_read_file(n->config, NULL);
	snprintf(key, sizeof(key), "[\"%s\"]", root);
	char *at = strstr(cfg, key);
	ck_assert_ptr_nonnull(at);
	snprintf(url, sizeof(url), "[{\"path\": \"%s\", \"remote\": \"file://%s\"}]", root,
		 remote);
	FILE *f = fopen(n->config, "w");
	ck_assert_ptr_nonnull(f);
	fprintf(f, "%.*s%s%s", (int)(at - cfg), cfg, url, at + strlen(key));
	fclose(f);
	free(cfg);
	h_daemon_restart(n);
	ck_assert_int_eq(rmdir(remote), 0);
}

START_TEST(test_lost_node_restored_from_peers)
{
	char dir[PATH_MAX], json[1024], scratch[256], root2[PATH_MAX], src[16];
	struct hdaemon n[NODES], fresh;
	int exact;

	if (!usable)
		return;
	netns_ucx_env();
	h_tmpdir(scratch, sizeof(scratch));
	const char *good = hp_secret_file(scratch, 0, SECRET);
	for (unsigned i = 0; i < NODES; i++)
		hp_start_node(&n[i], &ns, i, good);
	snprintf(dir, sizeof(dir), "%s/pj/step0", D->root);
	hp_commit_job(n, NODES, dir, "pj", "run-b", N_BYTES, 400);
	for (int i = 0; i < NODES; i++)
		wait_metric(n[(i + 1) % NODES].socket, "peer_copies_received", 1);
	snprintf(dir, sizeof(dir), "%s/pj/step1", D->root);
	hp_commit_job(n, NODES, dir, "pj", "run-b", N_BYTES, 500);
	/* Every node's ranks reach the next node of the ring (addresses sort as the nodes). */
	for (int i = 0; i < NODES; i++) {
		wait_metric(n[(i + 1) % NODES].socket, "peer_copies_received", 2);
		hp_wait_copy(ns.addr[(i + 1) % NODES], PORT, SECRET, "pj", 2 * (unsigned)i,
			     ns.addr[i]);
	}
	/* A daemon of the cluster offering node 2's files from node 3's address: refused,
	 * nothing kept (node 1 holds node 0's two copies); from node 2's own, kept. */
	char err[512];
	ck_assert_int_eq(put_stale(ns.addr[1], dir, ns.addr[2], err, sizeof(err)), -EACCES);
	ck_assert_msg(strstr(err, "copies of its own files only"), "%s", err);
	ck_assert_double_eq(hp_metric(n[1].socket, "peer_copies_held"), 2);
	ck_assert_int_eq(netns_enter(&ns, 2), 0);
	ck_assert_msg(put_stale(ns.addr[1], dir, ns.addr[2], err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(netns_enter(&ns, NODES - 1), 0);
	/* The peer block of the metrics: node 2 sent two copies (two files each), node 3 keeps
	 * them; node 1 holds node 0's two and the stale one. */
	ck_assert_double_eq(hp_metric(n[2].socket, "peer_copies_sent"), 2);
	ck_assert_double_ge(hp_metric(n[2].socket, "peer_bytes_sent"), 4.0 * N_BYTES);
	ck_assert_double_eq(hp_metric(n[2].socket, "peer_replication_seconds"), 2);
	ck_assert_double_eq(hp_metric(n[3].socket, "peer_copies_received"), 2);
	ck_assert_double_ge(hp_metric(n[3].socket, "peer_bytes_received"), 4.0 * N_BYTES);
	ck_assert_double_eq(hp_metric(n[1].socket, "peer_copies_held"), 3);
	ck_assert_double_eq(hp_metric(n[1].socket, "peer_evictions"), 0);
	other_job_refused(scratch, good, n[3].log);

	/* Node 2 is lost; its replacement starts on an empty root. */
	h_daemon_kill(&n[2], SIGKILL);
	/* One with another secret: refused by every peer, nothing restored. */
	snprintf(root2, sizeof(root2), "%s/root-wrong", scratch);
	snprintf(json, sizeof(json), "%s,%s,%s", ns.addr[0], ns.addr[1], ns.addr[3]);
	start_node(&fresh, 2, root2, hp_secret_file(scratch, 1, "another-cluster-secret-987654321"),
		   NULL, json);
	dsckpt_conn_t *c2;
	ck_assert_int_eq(dsckpt_connect(fresh.socket, &c2), 0);
	CK_DS(c2, dsckpt_identify(c2, "pj", 4, 2 * NODES));
	ck_assert_int_lt(hp_load_t(c2, h_path("%s/pj/step1", root2), "rank4", N_BYTES, 504, src,
				&exact), 0);
	ck_assert_int_ne(access(h_path("%s/pj/step1/MANIFEST.json", root2), F_OK), 0);
	ck_assert_int_ne(access(h_path("%s/pj/step1/rank4.safetensors", root2), F_OK), 0);
	dsckpt_close(c2);
	ck_assert_int_eq(h_daemon_kill(&fresh, SIGTERM), 0);

	/* With the secret, told node 0 alone (which holds node 3's copies), and a remote tier
	 * (file://) that is gone by the load: node 3 found as a copy's owner, both ranks from
	 * it, exact, run-b's commit, the remote never read. */
	snprintf(root2, sizeof(root2), "%s/root2", scratch);
	start_node(&fresh, 2, root2, good, NULL, ns.addr[0]);
	with_remote(&fresh, root2, h_path("%s/remote", scratch));
	ck_assert_int_eq(dsckpt_connect(fresh.socket, &c2), 0);
	CK_DS(c2, dsckpt_identify(c2, "pj", 4, 2 * NODES));
	ck_assert_int_eq(hp_load_t(c2, h_path("%s/pj/step1", root2), "rank4", N_BYTES, 504, src,
				&exact), DSCKPT_LOADED);
	ck_assert_str_eq(src, "peer");
	ck_assert(exact);
	ck_assert_int_eq(hp_load_t(c2, h_path("%s/pj/step1", root2), "rank5", N_BYTES, 505, src,
				&exact), DSCKPT_LOADED);
	ck_assert_str_ne(src, "peer");	/* local since the first load's pull */
	ck_assert(exact);
	ck_assert_msg(h_file_has(h_path("%s/pj/step1/MANIFEST.json", root2), "run-b"), "%s",
		      h_text(h_path("%s/pj/step1/MANIFEST.json", root2)));
	ck_assert(!h_file_has(h_path("%s/pj/step1/MANIFEST.json", root2), "run-a"));
	ck_assert_msg(h_file_has(fresh.log, "from 1 peer copies"), "%s", h_text(fresh.log));
	ck_assert_double_ge(hp_metric(fresh.socket, "peer_restored_bytes"), 2.0 * N_BYTES);
	dsckpt_close(c2);
	ck_assert_int_eq(h_daemon_kill(&fresh, SIGTERM), 0);

	/* A replacement of a new name at node 2's address, with no peer_hosts, whose disk kept
	 * the job's step0 directory (its seal records), as find_latest asks: the job's latest,
	 * node 2's files alone. */
	snprintf(root2, sizeof(root2), "%s/root3", scratch);
	ck_assert_int_eq(mkdir(root2, 0755), 0);
	ck_assert_int_eq(mkdir(h_path("%s/pj", root2), 0755), 0);
	ck_assert_int_eq(system(h_path("cp -a %s/pj/step0 %s/pj/", D->root, root2)), 0);
	ck_assert_int_eq(system(h_path("rm -f %s/pj/step0/*.safetensors %s/pj/step0/MANIFEST.json",
				       root2, root2)), 0);
	start_node(&fresh, 2, root2, good, "replacement-node", "");
	dsckpt_prefetch_info_t info;
	ck_assert_int_eq(dsckpt_connect(fresh.socket, &c2), 0);
	CK_DS(c2, dsckpt_identify(c2, "pj", 4, 2 * NODES));
	CK_DS(c2, dsckpt_prefetch(c2, h_path("%s/pj", root2), NULL, 1, &info));
	ck_assert_str_eq(info.tag, "step1");
	ck_assert_uint_ge(info.bytes_pulled, 2 * (uint64_t)N_BYTES);
	ck_assert_uint_lt(info.bytes_pulled, 3 * (uint64_t)N_BYTES);
	for (int r = 0; r < 2 * NODES; r++)
		ck_assert_int_eq(access(h_path("%s/pj/step1/rank%d.safetensors", root2, r),
					F_OK) == 0, r / 2 == 2);
	ck_assert_int_eq(hp_load_t(c2, h_path("%s/pj/step1", root2), "rank5", N_BYTES, 505, src,
				&exact), DSCKPT_LOADED);
	ck_assert(exact);
	dsckpt_close(c2);

	ck_assert_int_eq(h_daemon_kill(&fresh, SIGTERM), 0);
	for (int i = 1; i < NODES; i++)
		if (i != 2)
			ck_assert_int_eq(h_daemon_kill(&n[i], SIGTERM), 0);
	d_stop();
	h_rm_rf(scratch);
}
END_TEST

/* Puts the files of rank 0 of the committed tag dir into rs as owner's copy; the spilled
 * file's path under rootdir into spilled. */
static void hold_copy(struct replica_store *rs, const char *dir, const char *owner,
		      const char *rootdir, char *spilled, size_t len)
{
	size_t mlen, flen;
	char *text = h_read_file(h_path("%s/MANIFEST.json", dir), &mlen), why[256], err[512];
	struct manifest *m = manifest_parse(text, mlen, why, sizeof(why));
	struct replica *r;
	unsigned rank = 0, idx;
	ck_assert_ptr_nonnull(m);
	struct replica_id id = { owner, "mj", m->run ? m->run : "", "step1", dir, m->created_ns };
	ck_assert_int_eq(replica_in_begin(rs, &id, text, mlen, &rank, 1, &r, err, sizeof(err)), 0);
	for (size_t i = 0; i < m->nfiles; i++) {
		if (m->files[i].rank != 0)
			continue;
		char *bytes = h_read_file(h_path("%s/%s", dir, m->files[i].name), &flen);
		ck_assert_int_eq(replica_in_file(r, m->files[i].name, flen, &idx, err, sizeof(err)),
				 0);
		ck_assert_int_eq(replica_in_write(r, idx, bytes, flen, err, sizeof(err)), 0);
		ck_assert_msg(replica_in_file_end(r, idx, XXH3_64bits(bytes, flen), err,
						  sizeof(err)) == 0, "%s", err);
		free(bytes);
	}
	ck_assert_msg(replica_in_commit(r, err, sizeof(err)) == 0, "%s", err);
	snprintf(spilled, len, "%s/1/rank0.safetensors", rootdir);
	manifest_free(m);
	free(text);
}

/* A peer that breaks off mid-file: the one holder of a lost node's copy (this test process's
 * own peer service, in namespace 1) cannot read its spilled file past half (truncated), so it
 * closes the link after the first 4 MiB of the file's data; the replacement restores nothing
 * (no file, no .partial, no manifest) and the load fails. With the file whole again, the same
 * load restores it. */
START_TEST(test_peer_dies_mid_transfer)
{
	char scratch[256], rootdir[300], spilled[600], json[2048], src[16], err[512];
	struct hdaemon fresh;
	dsckpt_conn_t *c;
	void *mem;
	int exact;

	if (!usable)
		return;
	netns_ucx_env();
	h_tmpdir(scratch, sizeof(scratch));
	/* A committed one-node tag to copy from (no peer copies on this daemon). */
	d_start(0.0625, CHUNK_1M);
	const char *dir = h_path("%s/mj/step1", D->root);
	ck_assert_int_eq(dsckpt_connect(D->socket, &c), 0);
	CK_DS(c, dsckpt_identify(c, "mj", 0, 1));
	dsckpt_save_t *s = save_pattern(c, dir, "rank0", 10 * MIB + 99, 71, &mem);
	ck_assert_int_ge(dsckpt_wait(s, DSCKPT_DURABLE, 60000), DSCKPT_DURABLE);
	CK_DS(c, dsckpt_seal(c, dir));
	ck_assert_int_ge(dsckpt_wait(s, DSCKPT_COMMITTED, 60000), DSCKPT_COMMITTED);
	dsckpt_save_free(s);
	dsckpt_host_free(mem);
	dsckpt_close(c);
	/* This process holds the copy, spilled to disk, and serves it from namespace 1. */
	struct peer_service svc = { .secret = SECRET, .secret_len = strlen(SECRET) };
	struct peer_net *net;
	snprintf(rootdir, sizeof(rootdir), "%s/held", scratch);
	ck_assert_int_eq(mkdir(rootdir, 0700), 0);
	ck_assert_int_eq(replica_store_open(0, rootdir, &svc.rs, err, sizeof(err)), 0);
	hold_copy(svc.rs, dir, ns.addr[2], rootdir, spilled, sizeof(spilled));
	size_t whole_len;
	char *whole = h_read_file(spilled, &whole_len);
	ck_assert_int_eq(truncate(spilled, (off_t)(whole_len / 2)), 0);
	ck_assert_int_eq(netns_enter(&ns, 1), 0);
	ck_assert_int_eq(peer_net_open(10, &net, err, sizeof(err)), 0);
	ck_assert_msg(peer_listen(net, PORT, 4, peer_serve, &svc, err, sizeof(err)) == 0, "%s",
		      err);
	/* The replacement (the lost node's name) asks it alone. */
	struct hdaemon at = *D;
	snprintf(at.root, sizeof(at.root), "%s/root2", scratch);
	const char *root2 = at.root;
	ck_assert_int_eq(mkdir(root2, 0755), 0);
	ck_assert_int_eq(netns_enter(&ns, 2), 0);
	snprintf(json, sizeof(json), CHUNK_1M "\"host\": \"%s\", \"peer_secret_file\": "
		 "\"%s\", \"peer_hosts\": \"%s\",", ns.addr[2], hp_secret_file(scratch, 0, SECRET),
		 ns.addr[1]);
	h_daemon_start_peer(&fresh, &at, "fresh", 0.0625, json);
	ck_assert_int_eq(dsckpt_connect(fresh.socket, &c), 0);
	CK_DS(c, dsckpt_identify(c, "mj", 0, 1));
	ck_assert_int_lt(hp_load_t(c, h_path("%s/mj/step1", root2), "rank0", 10 * MIB + 99, 71, src,
				&exact), 0);
	ck_assert_int_ne(access(h_path("%s/mj/step1/MANIFEST.json", root2), F_OK), 0);
	ck_assert_int_ne(access(h_path("%s/mj/step1/rank0.safetensors", root2), F_OK), 0);
	ck_assert_int_ne(access(h_path("%s/mj/step1/rank0.safetensors.partial", root2), F_OK), 0);
	/* Whole again: restored, exact. */
	int fd = open(spilled, O_WRONLY);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(pwrite(fd, whole, whole_len, 0), (ssize_t)whole_len);
	close(fd);
	ck_assert_int_eq(hp_load_t(c, h_path("%s/mj/step1", root2), "rank0", 10 * MIB + 99, 71, src,
				&exact), DSCKPT_LOADED);
	ck_assert_str_eq(src, "peer");
	ck_assert(exact);
	dsckpt_close(c);
	ck_assert_int_eq(h_daemon_kill(&fresh, SIGTERM), 0);
	peer_net_close(net);
	replica_store_close(svc.rs);
	free(whole);
	d_stop();
	h_rm_rf(scratch);
}
END_TEST

/* A node whose copies spill to replica_root (no memory for them) takes them back, checked,
 * after a restart: node 1 holds node 0's rank before and after it is SIGKILLed and started
 * again. */
START_TEST(test_replica_root_recovered)
{
	char dir[PATH_MAX], json[8192], scratch[256], reps[1024];
	struct hdaemon n1;
	dsckpt_conn_t *c[2];
	dsckpt_save_t *s[2];
	void *mem[2];

	if (!usable)
		return;
	netns_ucx_env();
	h_tmpdir(scratch, sizeof(scratch));
	const char *good = hp_secret_file(scratch, 0, SECRET);
	snprintf(reps, sizeof(reps), "%s/replicas", scratch);
	ck_assert_int_eq(mkdir(reps, 0700), 0);
	ck_assert_int_eq(netns_enter(&ns, 0), 0);
	snprintf(json, sizeof(json), CHUNK_1M "\"host\": \"%s\", \"peer_secret_file\": \"%s\", "
		 "\"replica_cache_size\": 0.0625,", ns.addr[0], good);
	d_start(0.0625, json);
	ck_assert_int_eq(netns_enter(&ns, 1), 0);
	snprintf(json, sizeof(json), CHUNK_1M "\"host\": \"%s\", \"peer_secret_file\": \"%s\", "
		 "\"replica_cache_size\": 0, \"replica_root\": \"%s\",", ns.addr[1], good, reps);
	h_daemon_start_peer(&n1, D, "n1", 0.0625, json);
	snprintf(dir, sizeof(dir), "%s/kj/step1", D->root);
	const char *socks[2] = { D->socket, n1.socket };
	for (int r = 0; r < 2; r++) {
		char file[16];
		ck_assert_int_eq(dsckpt_connect(socks[r], &c[r]), 0);
		CK_DS(c[r], dsckpt_identify(c[r], "kj", r, 2));
		snprintf(file, sizeof(file), "rank%d", r);
		s[r] = save_pattern(c[r], dir, file, N_BYTES, 60 + (uint64_t)r, &mem[r]);
	}
	for (int r = 0; r < 2; r++) {
		ck_assert_int_ge(dsckpt_wait(s[r], DSCKPT_DURABLE, 60000), DSCKPT_DURABLE);
		CK_DS(c[r], dsckpt_seal(c[r], dir));
	}
	for (int r = 0; r < 2; r++)
		ck_assert_int_ge(dsckpt_wait(s[r], DSCKPT_COMMITTED, 60000), DSCKPT_COMMITTED);
	hp_wait_copy(ns.addr[1], PORT, SECRET, "kj", 0, ns.addr[0]);
	dsckpt_close(c[1]);
	h_daemon_kill(&n1, SIGKILL);
	h_daemon_restart(&n1);
	hp_wait_copy(ns.addr[1], PORT, SECRET, "kj", 0, ns.addr[0]);
	ck_assert_msg(h_file_has(n1.log, "1 of the 1 copies on replica_root taken back"), "%s",
		      h_text(n1.log));
	for (int r = 0; r < 2; r++) {
		dsckpt_save_free(s[r]);
		dsckpt_host_free(mem[r]);
	}
	dsckpt_close(c[0]);
	ck_assert_int_eq(h_daemon_kill(&n1, SIGTERM), 0);
	d_stop();
	h_rm_rf(scratch);
}
END_TEST

/* The suite. */
static Suite *peer_restore_suite(void)
{
	Suite *s = suite_create("peer_restore");
	TCase *tc = hp_case(s, "peer_restore", NODES + 1, &ns, &usable, 300);
	tcase_add_test(tc, test_lost_node_restored_from_peers);
	tcase_add_test(tc, test_replica_root_recovered);
	tcase_add_test(tc, test_peer_dies_mid_transfer);
	return s;
}

CHECK_MAIN(peer_restore_suite)
