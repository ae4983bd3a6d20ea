/* check_peer_ucx.c — two "nodes", each in a network namespace of its own joined by veth
 * links (tests/netns.c), UCX forced onto TCP over them: a node's peer service (peer_ucx.c,
 * peer_serve.c, replica_store.c) in one, a sender (peer_send.c) in the other. A committed
 * tag's files go across and come back by a fetch byte for byte, checked at the receiver; a
 * corrupted byte, a sender without the secret or with a wrong one, a forged answer to the
 * challenge, a server with a wrong one, a sender that skips the challenge, a server that
 * never answers (its timeout), a sender killed mid-transfer (nothing stored, nothing partial
 * ever visible), a sender posting its next piece while the receiver takes none. SKIP
 * without root or ip(8). */
#include "../daemon/dsckptd.h"
#include "harness.h"
#include "netns.h"
#include "../daemon/peer_int.h"

#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#define PORT 18540
#define SECRET "the-cluster-secret-0123456789abcdef"
#define NFILES 3

static struct netns ns;
static int usable;
static char rootdir[256];    /* the server's replica_root */
static pid_t server = -1;

/* A committed tag of one node: rank 4's safetensors file and .meta, rank 5's file. */
static struct tag {
	uint8_t *bytes[NFILES];
	struct manifest_file f[NFILES];
	char names[NFILES][32], sums[NFILES][CHECKSUM_HEX + 1];
	char *manifest;
	struct replica_id id;
} tag;

/* Makes the namespaces once for the test case (in the parent: removed even after a crash). */
static void ns_setup(void)
{
	usable = netns_usable("check_peer_ucx");
	if (usable && netns_make(&ns, 2) != 0) {
		printf("SKIP: check_peer_ucx: ip netns/veth failed here\n");
		usable = 0;
	}
}

/* Removes the namespaces. */
static void ns_teardown(void)
{
	if (usable)
		netns_destroy(&ns);
}

/* Builds the tag: sizes past one chunk and not multiples of it, the manifest's checksums. */
static void make_tag(uint64_t seed, uint64_t big)
{
	static const uint64_t hl = 4096;
	uint64_t sizes[NFILES] = { hl + big, 1000, hl + 12345 };
	struct manifest m = { .tag = "step-100", .dsckptd_version = "test", .world_size = 8,
			      .run = "run-a",
			      .created_ns = 1700000000000000000ull + seed, .files = tag.f,
			      .nfiles = NFILES };

	for (int i = 0; i < NFILES; i++) {
		struct manifest_file *f = &tag.f[i];
		free(tag.bytes[i]);
		tag.bytes[i] = malloc(sizes[i]);
		ck_assert_ptr_nonnull(tag.bytes[i]);
		h_pattern_fill(tag.bytes[i], sizes[i], seed * 10 + (uint64_t)i);
		f->size = sizes[i];
		f->rank = i < 2 ? 4 : 5;
		f->name = tag.names[i];
		f->xxh3 = f->data_xxh3 = tag.sums[i];
		if (i == 1) {
			snprintf(tag.names[i], sizeof(tag.names[i]), "rank4.meta");
			f->kind = MANIFEST_KIND_META;
			checksum_hex(XXH3_64bits(tag.bytes[i], sizes[i]), tag.sums[i]);
		} else {
			snprintf(tag.names[i], sizeof(tag.names[i]), "rank%d.safetensors",
				 (int)f->rank);
			f->kind = MANIFEST_KIND_ST;
			f->header_len = hl;
			f->has_tensors = 1;
			checksum_hex(XXH3_64bits(tag.bytes[i] + hl, sizes[i] - hl), tag.sums[i]);
		}
	}
	free(tag.manifest);
	tag.manifest = manifest_write(&m);
	ck_assert_ptr_nonnull(tag.manifest);
	/* node 1's own copy: the one node 0's service lets it fetch back (peer_member.c) */
	tag.id = (struct replica_id){ ns.addr[1], "gpt", "run-a", "step-100", "/ckpt/gpt/step-100",
				      m.created_ns };
}

/* peer_read_fn over the tag's bytes; arg: a file index one byte of whose checksummed bytes
 * (a safetensors file's data region) is flipped, or -1. */
static int read_tag(void *arg, unsigned i, uint64_t off, void *buf, size_t len)
{
	long flip = (long)(intptr_t)arg;
	uint64_t at = tag.f[i].size > 4100 ? 4100 : 500;

	memcpy(buf, tag.bytes[i] + off, len);
	if ((long)i == flip && off <= at && at < off + len)
		((uint8_t *)buf)[at - off] ^= 0x20;
	return 0;
}

/* peer_read_fn that holds back after the first chunk until killed (a sender dying). */
static int read_then_hang(void *arg, unsigned i, uint64_t off, void *buf, size_t len)
{
	int *ready = arg;

	if (off > 0) {
		ck_assert_int_eq(write(*ready, "x", 1), 1);
		pause();
	}
	return read_tag((void *)(intptr_t)-1, i, off, buf, len);
}

/* What read_counted reports to: a pipe it writes a byte to for each piece read, and one it
 * waits on for a byte before the second piece. */
struct counted {
	int report, go;
};

/* peer_read_fn that reports each piece it reads, holding the first back until told to go. */
static int read_counted(void *arg, unsigned i, uint64_t off, void *buf, size_t len)
{
	struct counted *c = arg;
	char x;

	ck_assert_int_eq(write(c->report, "x", 1), 1);
	if (i == 0 && off == 0)
		ck_assert_int_eq(read(c->go, &x, 1), 1);
	return read_tag((void *)(intptr_t)-1, i, off, buf, len);
}

/* The server: node 0's peer service with the given secret, spilling everything to rootdir
 * (no memory budget), until killed. */
static void start_server(const char *secret)
{
	h_tmpdir(rootdir, sizeof(rootdir));
	server = fork();
	ck_assert_int_ge(server, 0);
	if (server == 0) {
		struct peer_service svc = { .secret = secret, .secret_len = strlen(secret) };
		struct peer_net *net;
		char err[512];
		if (netns_enter(&ns, 0) != 0 ||
		    replica_store_open(0, rootdir, &svc.rs, err, sizeof(err)) != 0 ||
		    peer_net_open(20, &net, err, sizeof(err)) != 0 ||
		    peer_listen(net, PORT, 16, peer_serve, &svc, err, sizeof(err)) != 0) {
			fprintf(stderr, "server: %s\n", err);
			_exit(1);
		}
		for (;;)
			pause();
	}
}

/* Kills the server and removes its directory. */
static void stop_server(void)
{
	if (server > 0) {
		kill(server, SIGKILL);
		waitpid(server, NULL, 0);
		server = -1;
	}
	h_rm_rf(rootdir);
}

/* Each test: node 1's side runs in this (forked) test process. */
static void setup(void)
{
	netns_ucx_env();
	log_init("check_peer_ucx", LOG_LVL_ERROR);
	if (usable)
		ck_assert_int_eq(netns_enter(&ns, 1), 0);
	make_tag(1, (5u << 20) + 777);
}

/* Stops the server. */
static void teardown(void)
{
	stop_server();
}

/* Opens an authenticated link to node 0 with secret, retrying while its listener starts. */
static int open_peer(struct peer_net *net, const char *secret, struct peer_link **l, char *err,
		     size_t errlen)
{
	int rc;
	for (int tries = 0; tries < 200; tries++) {
		rc = peer_open(net, ns.addr[0], PORT, secret, strlen(secret), 10, l, err, errlen);
		if (rc != -ECONNREFUSED && rc != -ECONNRESET)
			return rc;
		h_sleep_ms(50);
	}
	return rc;
}

/* Fetches ranks 4 and 5 of job gpt from node 0 with the right secret; the result. */
static int fetch(struct peer_net *net, struct replica_store *into, struct replica **r)
{
	const unsigned ranks[] = { 4, 5 };
	struct peer_link *l;
	char err[512];
	int rc = open_peer(net, SECRET, &l, err, sizeof(err));
	ck_assert_msg(rc == 0, "%s", err);
	rc = peer_fetch(l, "gpt", ranks, 2, into, r, err, sizeof(err));
	peer_link_close(l);
	return rc;
}

/* Entries of rootdir (copies, whole or partial). */
static int root_entries(int *partial)
{
	DIR *d = opendir(rootdir);
	struct dirent *e;
	int n = 0;
	*partial = 0;
	ck_assert_ptr_nonnull(d);
	while ((e = readdir(d)) != NULL) {
		if (e->d_name[0] == '.' && strncmp(e->d_name, ".partial-", 9) != 0)
			continue;
		n++;
		*partial += strncmp(e->d_name, ".partial-", 9) == 0;
	}
	closedir(d);
	return n;
}

START_TEST(test_put_fetch_exact)
{
	struct replica_store *mine;
	struct peer_net *net;
	struct peer_link *l;
	struct replica *r;
	const unsigned ranks[] = { 4, 5 };
	const struct manifest_file *files[NFILES] = { &tag.f[0], &tag.f[1], &tag.f[2] };
	char err[512];

	if (!usable)
		return;
	start_server(SECRET);
	ck_assert_int_eq(peer_net_open(10, &net, err, sizeof(err)), 0);
	ck_assert_int_eq(replica_store_open(64u << 20, NULL, &mine, err, sizeof(err)), 0);
	int rc = open_peer(net, SECRET, &l, err, sizeof(err));
	ck_assert_msg(rc == 0, "%s", err);
	double t0 = now_mono();
	rc = peer_put(l, &tag.id, ranks, 2, tag.manifest, strlen(tag.manifest), files, NFILES,
		      read_tag, (void *)(intptr_t)-1, NULL, err, sizeof(err));
	ck_assert_msg(rc == 0, "%s", err);
	double dt = now_mono() - t0;
	printf("check_peer_ucx: %.1f MiB sent over the veth in %.3f s\n",
	       (double)(tag.f[0].size + tag.f[1].size + tag.f[2].size) / 1048576, dt);
	peer_link_close(l);
	/* Kept whole on the server's disk: one directory, not partial. */
	int partial, n = root_entries(&partial);
	ck_assert_int_eq(n, 1);
	ck_assert_int_eq(partial, 0);

	ck_assert_int_eq(fetch(net, mine, &r), 0);
	const char *text;
	size_t len;
	unsigned nfiles;
	const struct replica_id *id = replica_id(r, &text, &len, &nfiles);
	ck_assert_str_eq(id->owner, ns.addr[1]);
	ck_assert_str_eq(id->run, "run-a");
	ck_assert_str_eq(id->dir, "/ckpt/gpt/step-100");
	ck_assert_uint_eq(id->created_ns, tag.id.created_ns);
	ck_assert_str_eq(text, tag.manifest);
	ck_assert_uint_eq(nfiles, NFILES);
	for (unsigned i = 0; i < nfiles; i++) {
		const struct manifest_file *f = replica_file(r, i);
		uint8_t *back = malloc(f->size);
		ck_assert_str_eq(f->name, tag.names[i]);
		ck_assert_int_eq(replica_read(r, i, 0, back, f->size), 0);
		ck_assert_msg(memcmp(back, tag.bytes[i], f->size) == 0, "%s differs", f->name);
		free(back);
	}
	replica_put(r);
	/* A rank it holds no copy of. */
	const unsigned other[] = { 6 };
	ck_assert_int_eq(open_peer(net, SECRET, &l, err, sizeof(err)), 0);
	ck_assert_int_eq(peer_fetch(l, "gpt", other, 1, mine, &r, err, sizeof(err)), -ENOENT);
	peer_link_close(l);
	replica_store_close(mine);
	peer_net_close(net);
}
END_TEST

START_TEST(test_corrupt_refused)
{
	struct replica_store *mine;
	struct peer_net *net;
	struct peer_link *l;
	struct replica *r;
	const unsigned ranks[] = { 4, 5 };
	const struct manifest_file *files[NFILES] = { &tag.f[0], &tag.f[1], &tag.f[2] };
	char err[512];

	if (!usable)
		return;
	start_server(SECRET);
	ck_assert_int_eq(peer_net_open(10, &net, err, sizeof(err)), 0);
	ck_assert_int_eq(replica_store_open(64u << 20, NULL, &mine, err, sizeof(err)), 0);
	/* One byte of each file in turn flipped on the way. */
	for (long flip = 0; flip < NFILES; flip++) {
		ck_assert_int_eq(open_peer(net, SECRET, &l, err, sizeof(err)), 0);
		int rc = peer_put(l, &tag.id, ranks, 2, tag.manifest, strlen(tag.manifest), files,
				  NFILES, read_tag, (void *)(intptr_t)flip, NULL, err,
				  sizeof(err));
		ck_assert_msg(rc == -EBADMSG && strstr(err, "does not match its checksums"),
			      "%d %s", rc, err);
		peer_link_close(l);
	}
	int partial;
	ck_assert_int_eq(root_entries(&partial), 0);
	ck_assert_int_eq(fetch(net, mine, &r), -ENOENT);
	replica_store_close(mine);
	peer_net_close(net);
}
END_TEST

START_TEST(test_secret_refused)
{
	struct replica_store *mine;
	struct peer_net *net;
	struct peer_link *l;
	struct replica *r;
	const unsigned ranks[] = { 4, 5 };
	const struct manifest_file *files[NFILES] = { &tag.f[0], &tag.f[1], &tag.f[2] };
	char err[512];
	uint64_t t;
	size_t len;

	if (!usable)
		return;
	start_server(SECRET);
	ck_assert_int_eq(peer_net_open(10, &net, err, sizeof(err)), 0);
	ck_assert_int_eq(replica_store_open(64u << 20, NULL, &mine, err, sizeof(err)), 0);
	/* A wrong secret (one byte off), and none at all: refused before anything is read. */
	ck_assert_int_eq(open_peer(net, SECRET "x", &l, err, sizeof(err)), -EACCES);
	ck_assert_msg(strstr(err, "does not hold the cluster's secret"), "%s", err);
	ck_assert_int_eq(open_peer(net, "", &l, err, sizeof(err)), -EACCES);
	/* A sender that skips the challenge and sends a PUT at once: closed, nothing read. */
	int rc = -1;
	for (int tries = 0; tries < 100 && rc != 0; tries++)
		rc = peer_connect(net, ns.addr[0], PORT, 10, &l, err, sizeof(err));
	ck_assert_int_eq(rc, 0);
	char junk[8192] = "DSCKPEER";
	peer_send(l, 16 /* PEER_PUT */, junk, sizeof(junk));
	ck_assert_int_ne(peer_recv(l, &t, junk, sizeof(junk), &len), 0);
	peer_link_close(l);
	/* Then a sender with the secret whose copy is fine still gets in, and only its copy is
	 * there. */
	ck_assert_int_eq(fetch(net, mine, &r), -ENOENT);
	ck_assert_int_eq(open_peer(net, SECRET, &l, err, sizeof(err)), 0);
	rc = peer_put(l, &tag.id, ranks, 2, tag.manifest, strlen(tag.manifest), files, NFILES,
		      read_tag, (void *)(intptr_t)-1, NULL, err, sizeof(err));
	ck_assert_msg(rc == 0, "%s", err);
	peer_link_close(l);
	ck_assert_int_eq(fetch(net, mine, &r), 0);
	replica_put(r);
	replica_store_close(mine);
	peer_net_close(net);
}
END_TEST

START_TEST(test_forged_response)
{
	struct peer_hello hello = { .magic = PEER_MAGIC, .version = PEER_VERSION };
	struct peer_challenge ch;
	struct peer_response resp;
	struct peer_result res;
	struct replica_store *mine;
	struct peer_net *net;
	struct peer_link *l;
	struct replica *r;
	char err[512], junk[sizeof(struct peer_ids)] = "";
	uint64_t t;
	size_t len;
	int rc = -1;

	if (!usable)
		return;
	/* A sender that ignores the listener's proof and answers with a made-up one: the
	 * listener refuses it (RESULT -EACCES) and reads nothing after. */
	start_server(SECRET);
	ck_assert_int_eq(peer_net_open(10, &net, err, sizeof(err)), 0);
	for (int tries = 0; tries < 100 && rc != 0; tries++) {
		if ((rc = peer_connect(net, ns.addr[0], PORT, 10, &l, err, sizeof(err))) == 0 &&
		    ((rc = peer_send(l, PEER_HELLO, &hello, sizeof(hello))) != 0 ||
		     (rc = peer_recv(l, &t, &ch, sizeof(ch), &len)) != 0)) {
			peer_link_close(l);
			h_sleep_ms(50);
		}
	}
	ck_assert_int_eq(rc, 0);
	ck_assert_uint_eq(t, PEER_CHALLENGE);
	/* The proof of a sender holding the secret, one bit off. */
	ck_assert_int_eq(peer_auth_mac(SECRET, strlen(SECRET), PEER_CLIENT, hello.nonce,
				       ch.nonce, resp.mac), 0);
	resp.mac[31] ^= 1;
	ck_assert_int_eq(peer_send(l, PEER_RESPONSE, &resp, sizeof(resp)), 0);
	ck_assert_int_eq(peer_recv(l, &t, &res, sizeof(res), &len), 0);
	ck_assert_uint_eq(t, PEER_RESULT);
	ck_assert_int_eq(res.code, -EACCES);
	/* A PUT after it is not read: the link is closed. */
	peer_send(l, PEER_PUT, junk, sizeof(junk));
	ck_assert_int_ne(peer_recv(l, &t, &res, sizeof(res), &len), 0);
	peer_link_close(l);
	ck_assert_int_eq(replica_store_open(64u << 20, NULL, &mine, err, sizeof(err)), 0);
	ck_assert_int_eq(fetch(net, mine, &r), -ENOENT);
	replica_store_close(mine);
	peer_net_close(net);
}
END_TEST

START_TEST(test_peer_never_answers)
{
	struct peer_net *net;
	struct peer_link *l;
	char err[512];

	if (!usable)
		return;
	/* A peer whose process stopped answering (SIGSTOP): its kernel still takes the
	 * connection, nothing more comes; the sender gives up at its timeout, never hangs. */
	start_server(SECRET);
	ck_assert_int_eq(peer_net_open(10, &net, err, sizeof(err)), 0);
	ck_assert_int_eq(open_peer(net, SECRET, &l, err, sizeof(err)), 0);
	peer_link_close(l);
	ck_assert_int_eq(kill(server, SIGSTOP), 0);
	int rc = peer_open(net, ns.addr[0], PORT, SECRET, strlen(SECRET), 2, &l, err, sizeof(err));
	ck_assert_msg(rc == -ETIMEDOUT, "%d %s", rc, err);
	kill(server, SIGCONT);
	peer_net_close(net);
}
END_TEST

START_TEST(test_server_without_secret)
{
	struct peer_net *net;
	struct peer_link *l;
	char err[512];

	if (!usable)
		return;
	/* The listening side holds another secret: the sender finds out before it proves
	 * anything of its own. */
	start_server("another-secret-of-another-cluster");
	ck_assert_int_eq(peer_net_open(10, &net, err, sizeof(err)), 0);
	ck_assert_int_eq(open_peer(net, SECRET, &l, err, sizeof(err)), -EACCES);
	ck_assert_msg(strstr(err, "does not hold the cluster's secret"), "%s", err);
	peer_net_close(net);
}
END_TEST

START_TEST(test_sender_killed)
{
	struct replica_store *mine;
	struct peer_net *net;
	struct replica *r;
	char err[512];
	int pipefd[2], partial = 0;

	if (!usable)
		return;
	make_tag(2, 64u << 20);  /* 16 chunks: the sender dies after the first */
	start_server(SECRET);
	ck_assert_int_eq(pipe(pipefd), 0);
	pid_t sender = fork();
	ck_assert_int_ge(sender, 0);
	if (sender == 0) {
		const unsigned ranks[] = { 4, 5 };
		const struct manifest_file *files[NFILES] = { &tag.f[0], &tag.f[1], &tag.f[2] };
		struct peer_link *l;
		close(pipefd[0]);
		if (peer_net_open(10, &net, err, sizeof(err)) != 0 ||
		    open_peer(net, SECRET, &l, err, sizeof(err)) != 0)
			_exit(1);
		peer_put(l, &tag.id, ranks, 2, tag.manifest, strlen(tag.manifest), files, NFILES,
			 read_then_hang, &pipefd[1], NULL, err, sizeof(err));
		_exit(2);
	}
	close(pipefd[1]);
	char c;
	ck_assert_int_eq(read(pipefd[0], &c, 1), 1);
	/* The first chunk was sent: the server has begun the copy on disk. */
	for (int i = 0; i < 600 && root_entries(&partial) == 0; i++)
		h_sleep_ms(50);
	ck_assert_int_eq(partial, 1);
	kill(sender, SIGKILL);
	waitpid(sender, NULL, 0);
	/* Never visible: no fetch finds it, and the server drops the partial once it sees the
	 * sender gone. */
	ck_assert_int_eq(peer_net_open(10, &net, err, sizeof(err)), 0);
	ck_assert_int_eq(replica_store_open(64u << 20, NULL, &mine, err, sizeof(err)), 0);
	ck_assert_int_eq(fetch(net, mine, &r), -ENOENT);
	for (int i = 0; i < 600 && root_entries(&partial) > 0; i++)
		h_sleep_ms(50);
	ck_assert_int_eq(root_entries(&partial), 0);
	ck_assert_int_eq(fetch(net, mine, &r), -ENOENT);
	replica_store_close(mine);
	peer_net_close(net);
}
END_TEST

/* Pipelined (issue 35 item 2): the receiving service stopped (SIGSTOP) once the copy was
 * accepted, the sender still reads and posts the piece after the first (one piece in flight
 * waited for the first to be taken); continued, the copy arrives whole and checked. */
START_TEST(test_put_pipelined)
{
	struct replica_store *mine;
	struct peer_net *net;
	struct replica *r;
	char err[512], x;
	int report[2], go[2], reads = 0;

	if (!usable)
		return;
	make_tag(3, 64u << 20);  /* 16 pieces and more in the first file */
	start_server(SECRET);
	ck_assert_int_eq(pipe(report), 0);
	ck_assert_int_eq(pipe(go), 0);
	pid_t sender = fork();
	ck_assert_int_ge(sender, 0);
	if (sender == 0) {
		const unsigned ranks[] = { 4, 5 };
		const struct manifest_file *files[NFILES] = { &tag.f[0], &tag.f[1], &tag.f[2] };
		struct counted c = { report[1], go[0] };
		struct peer_link *l;
		if (peer_net_open(30, &net, err, sizeof(err)) != 0 ||
		    open_peer(net, SECRET, &l, err, sizeof(err)) != 0)
			_exit(1);
		int rc = peer_put(l, &tag.id, ranks, 2, tag.manifest, strlen(tag.manifest), files,
				  NFILES, read_counted, &c, NULL, err, sizeof(err));
		peer_link_close(l);
		peer_net_close(net);
		_exit(rc == 0 ? 0 : 3);
	}
	close(report[1]);
	ck_assert_int_eq(read(report[0], &x, 1), 1);  /* the first piece read: accepted */
	ck_assert_int_eq(kill(server, SIGSTOP), 0);
	ck_assert_int_eq(write(go[1], "x", 1), 1);
	/* The receiver takes nothing now: a second piece read is the window's. */
	while (reads < 1 && read(report[0], &x, 1) == 1)
		reads++;
	ck_assert_int_eq(reads, 1);
	ck_assert_int_eq(kill(server, SIGCONT), 0);
	int st;
	ck_assert_int_eq(waitpid(sender, &st, 0), sender);
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "sender status %d", st);
	ck_assert_int_eq(peer_net_open(10, &net, err, sizeof(err)), 0);
	ck_assert_int_eq(replica_store_open(128u << 20, NULL, &mine, err, sizeof(err)), 0);
	ck_assert_int_eq(fetch(net, mine, &r), 0);
	for (unsigned i = 0; i < NFILES; i++) {
		uint8_t *back = malloc(tag.f[i].size);
		ck_assert_int_eq(replica_read(r, i, 0, back, tag.f[i].size), 0);
		ck_assert(memcmp(back, tag.bytes[i], tag.f[i].size) == 0);
		free(back);
	}
	replica_put(r);
	replica_store_close(mine);
	peer_net_close(net);
	close(report[0]);
	close(go[0]);
	close(go[1]);
}
END_TEST

/* The suite. */
static Suite *peer_ucx_suite(void)
{
	Suite *s = suite_create("peer_ucx");
	TCase *tc = tcase_create("peer_ucx");
	tcase_add_unchecked_fixture(tc, ns_setup, ns_teardown);
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_put_fetch_exact);
	tcase_add_test(tc, test_corrupt_refused);
	tcase_add_test(tc, test_secret_refused);
	tcase_add_test(tc, test_forged_response);
	tcase_add_test(tc, test_peer_never_answers);
	tcase_add_test(tc, test_server_without_secret);
	tcase_add_test(tc, test_sender_killed);
	tcase_add_test(tc, test_put_pipelined);
	suite_add_tcase(s, tc);
	return s;
}

CHECK_MAIN(peer_ucx_suite)
