/* check_peer_hostile.c — NODES (a job's nodes, told by its trainers) attacked by another user
 * of the cluster's nodes (issue 35 items 1, 3, 6). Real daemons, each in a network namespace
 * of its own (tests/netns.c), UCX on TCP over veths, one peer_secret_file; real users: the
 * victim (dsckpt-vic) and the attacker (dsckpt-atk) save, tell and load through the daemons'
 * sockets as themselves (tests/harness_hostile.c). Both commit a job named "pj" (each in a
 * directory of its own) on nodes A and B, the attacker's after the victim's, and A's files
 * reach B. A is destroyed; a replacement R (a new name, a new address, an empty root) is
 * told by the victim, as B is, that the job now runs on R and B. The attacker, on B and R:
 * tells the nodes of the victim's job directory, there or yet to be made in the victim's
 * directory, or outside the allowed roots, named or through a link (refused, EACCES); tells
 * B that its own "pj" runs on R and on a node O of its choosing (so that B lists its copies
 * there); tells
 * 70 other jobs (which used to push the victim's telling out of the daemon's table); tells
 * huge lists (refused with ELIMIT past max_held_mib_per_user); and keeps telling while the
 * victim's replacement restores. Then: O is listed only the attacker's copies and refused
 * the victim's; R is listed only the victim's; the victim's load on R comes from the
 * peers, bytes exact; and root's pull of the victim's tag on a second replacement (a
 * prolog's, root told the nodes) takes the victim's copy, not the attacker's newer one. SKIP without root or ip(8). */
#include "harness_daemon.h"
#include "harness_hostile.h"
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

#define N_BYTES (1 * MIB + 333)
#define SECRET "hostile-suite-secret-0123456789ab"
#define PORT 18540
#define NA 0        /* the namespaces: the lost node, */
#define NB 1        /* the node holding its copies, */
#define NR 2        /* the replacement, */
#define NO 3        /* a daemon of the cluster of the attacker's choosing, */
#define NP 4        /* and a second replacement, restored by root (a prolog's pull) */
#define FLOOD 70    /* jobs the attacker tells (more than the old table's 64) */
#define HUGE_N PEER_NODES_MAX

static struct netns ns;
static int usable;

/* Makes the namespaces once for the case (in the parent: removed even after a crash). */
static void ns_setup(void)
{
	usable = hp_netns(&ns, "check_peer_hostile", 5);
}

/* Removes them. */
static void ns_teardown(void)
{
	if (usable)
		netns_destroy(&ns);
}

/* A user's commit of one tag of a 2-rank job: rank r through socket[r], file rank<r>. */
struct commit_spec {
	const char *socket[2];
	const char *dir, *run;
	uint64_t seed;     /* rank r's bytes: seed + r's pattern */
	int slot;
};

/* Child (as a user): saves both ranks, waits DURABLE, seals, waits COMMITTED; 0 or a message
 * in the slot. */
static int commit_child(void *arg)
{
	const struct commit_spec *s = arg;
	dsckpt_conn_t *c[2] = { NULL, NULL };
	dsckpt_save_t *sv[2] = { NULL, NULL };
	int64_t shape[1] = {(int64_t)N_BYTES};
	int rc = 0;

	for (int r = 0; r < 2 && rc >= 0; r++) {
		char file[16];
		void *mem = dsckpt_host_alloc(N_BYTES);
		if (mem == NULL || (rc = dsckpt_connect(s->socket[r], &c[r])) < 0)
			return say(s->slot, 1, "rank %d: connect: %d", r, rc);
		h_pattern_fill(mem, N_BYTES, s->seed + (uint64_t)r);
		snprintf(file, sizeof(file), "rank%d", r);
		if ((rc = dsckpt_identify_run(c[r], "pj", r, 2, s->run)) < 0 ||
		    (rc = dsckpt_save_begin(c[r], s->dir, file, &sv[r])) < 0 ||
		    (rc = dsckpt_add_tensor(sv[r], "t", "U8", shape, 1, mem, N_BYTES)) < 0 ||
		    (rc = dsckpt_save_end(sv[r])) < 0)
			return say(s->slot, 1, "rank %d save: %s", r, dsckpt_last_error(c[r]));
	}
	for (int r = 0; r < 2; r++)
		if ((rc = dsckpt_wait(sv[r], DSCKPT_DURABLE, 60000)) < DSCKPT_DURABLE ||
		    (rc = dsckpt_seal(c[r], s->dir)) < 0)
			return say(s->slot, 1, "rank %d seal: %d %s", r, rc,
				   dsckpt_last_error(c[r]));
	for (int r = 0; r < 2; r++)
		if ((rc = dsckpt_wait(sv[r], DSCKPT_COMMITTED, 60000)) < DSCKPT_COMMITTED)
			return say(s->slot, 1, "rank %d commit: %d %s", r, rc,
				   dsckpt_last_error(c[r]));
	return 0;
}

/* A user's NODES: dir's job runs on the n nodes, this node's ranks are ranks. */
struct tell_spec {
	const char *socket, *dir;
	const char *const *nodes;
	unsigned n;
	unsigned rank;
	int slot;
};

/* Tells one NODES through a connection of its own: the reply's code into rc[slot] and the
 * daemon's message into msg[slot]; 0 unless it could not connect. */
static int tell_one(const struct tell_spec *t)
{
	dsckpt_conn_t *c;
	int rc;

	if ((rc = dsckpt_connect(t->socket, &c)) < 0) {
		B->rc[t->slot] = rc;
		return say(t->slot, 1, "connect %s: %s", t->socket, dsckpt_err_name(rc));
	}
	if ((rc = dsckpt_identify(c, "pj", (int)t->rank, 2)) >= 0)
		rc = dsckpt_job_nodes(c, t->dir, t->nodes, t->n, &t->rank, 1);
	B->rc[t->slot] = rc;
	snprintf(B->msg[t->slot], sizeof(B->msg[t->slot]), "%s",
		 rc < 0 ? dsckpt_last_error(c) : "");
	dsckpt_close(c);
	return 0;
}

/* Child (as a user): one NODES (tell_one). */
static int tell_child(void *arg)
{
	return tell_one(arg);
}

/* Tells as user and returns the reply's code (the daemon's message in msg[slot]). */
static int tell_as(const char *user, const char *socket, const char *dir,
		   const char *const *nodes, unsigned n, unsigned rank, int slot)
{
	struct tell_spec t = { socket, dir, nodes, n, rank, slot };

	ck_assert_int_eq(as_user(user, tell_child, &t), 0);
	return B->rc[slot];
}

/* What the attacker's flood tells: FLOOD jobs of its own on both daemons (among them, when
 * pj is set, its own "pj" again and again, so that it stays told), and two huge lists on B;
 * until F_STOP when looping (the race), once otherwise. */
struct flood_spec {
	const char *socket[2];     /* B's, R's */
	const char *root[2];       /* their roots */
	const char *const *nodes;  /* HUGE_N long names */
	const char *const *pj;     /* the nodes its own "pj" is told to run on (4) */
	int loop;
};

/* Child (as the attacker): the flood; 0 when every reply was 0 (or ELIMIT past the bound),
 * with the huge lists' codes in rc[2] and rc[3]. */
static int flood_child(void *arg)
{
	const struct flood_spec *f = arg;
	const char *other[1] = { "10.35.250.250" };
	char dir[PATH_MAX];

	do {
		for (int d = 0; d < 2; d++)
			for (int k = 0; k < FLOOD; k++) {
				snprintf(dir, sizeof(dir), "%s/atk/job%d", f->root[d], k);
				struct tell_spec t = { f->socket[d], dir, other, 1, 0, 1 };
				if (f->pj && k % 8 == 0) {  /* its own "pj" kept told */
					snprintf(dir, sizeof(dir), "%s/atk/pj", f->root[d]);
					t.nodes = f->pj;
					t.n = 4;
				}
				int failed = tell_one(&t);
				/* The attacker's own bounds answer it: ELIMIT; and while the daemon's
				 * loop is busy (the victim's restore, slow under TSan), the attacker's
				 * connections fill the socket's backlog (connect refused) or, closed
				 * by it but not yet read, count against max_conns_per_user, which
				 * refuses a new one at HELLO (ELIMIT, or EPIPE where the refusal
				 * raced its HELLO): the flood naps and goes on. */
				if (f->loop && ((failed && B->rc[1] == DSCKPT_ECONNREFUSED) ||
						(!failed && B->rc[1] == DSCKPT_EPIPE &&
						 strstr(B->msg[1], "instead of answering HELLO")))) {
					h_sleep_ms(5);
					continue;
				}
				if (failed || (B->rc[1] != 0 && B->rc[1] != DSCKPT_ELIMIT)) {
					char why[sizeof(B->msg[1])];
					snprintf(why, sizeof(why), "%s", B->msg[1]);
					return say(1, 1, "flood %s: %s: %s", dir,
						   dsckpt_err_name(B->rc[1]), why);
				}
				if (f->loop)
					flag_set(F_SENT);  /* under way: the restore may begin */
			}
		for (int k = 0; k < 2; k++) {
			snprintf(dir, sizeof(dir), "%s/atk/huge%d", f->root[0], k);
			struct tell_spec t = { f->socket[0], dir, f->nodes, HUGE_N, 0, 2 + k };
			if (tell_one(&t) != 0 && !f->loop)  /* looping: a busy daemon, as above */
				return 1;
		}
	} while (f->loop && !flag_get(F_STOP));
	return 0;
}

/* A user's load of dir/rank<rank> on socket: its code into rc[slot], source into msg[slot],
 * whether the bytes are seed's pattern into n[slot]. */
struct load_spec {
	const char *socket, *dir;
	unsigned rank;
	uint64_t seed;
	int slot;
};

/* Child (as the victim): the load; 0 unless it could not start. */
static int load_child(void *arg)
{
	const struct load_spec *s = arg;
	int64_t shape[1] = {(int64_t)N_BYTES};
	uint8_t *mem = dsckpt_host_alloc(N_BYTES);
	dsckpt_tensor_t t = {"t", "U8", shape, 1, mem, N_BYTES};
	dsckpt_load_t *l = NULL;
	dsckpt_conn_t *c;
	char file[16];
	int rc;

	if (mem == NULL || dsckpt_connect(s->socket, &c) < 0)
		return say(s->slot, 1, "connect");
	memset(mem, 0xee, N_BYTES);
	snprintf(file, sizeof(file), "rank%u", s->rank);
	if ((rc = dsckpt_identify(c, "pj", (int)s->rank, 2)) >= 0 &&
	    (rc = dsckpt_load_begin(c, s->dir, file, &l)) >= 0 &&
	    (rc = dsckpt_load_add_tensors(l, &t, 1, NULL)) >= 0 &&
	    (rc = dsckpt_load_end(l)) >= 0)
		rc = dsckpt_load_wait(l, 60000);
	B->rc[s->slot] = rc;
	B->n[s->slot] = h_pattern_diff(mem, N_BYTES, s->seed) == N_BYTES;
	snprintf(B->msg[s->slot], sizeof(B->msg[s->slot]), "%s",
		 rc < 0 ? dsckpt_last_error(c) : dsckpt_load_source(l));
	dsckpt_load_free(l);
	dsckpt_close(c);
	return 0;
}

/* Lists, from namespace i as a daemon of the cluster does, the copies of job pj of uid
 * (PEER_ANY_UID: any user's) that the daemon at addr holds for it, into c. */
static void list_from(unsigned i, const char *addr, uint32_t uid, struct peer_copies *c)
{
	struct peer_net *net;
	struct peer_link *l;
	char err[512];

	ck_assert_int_eq(netns_enter(&ns, i), 0);
	ck_assert_int_eq(peer_net_open(10, &net, err, sizeof(err)), 0);
	ck_assert_msg(peer_open(net, addr, PORT, SECRET, strlen(SECRET), 10, &l, err,
				sizeof(err)) == 0, "%s", err);
	ck_assert_msg(peer_list(l, "pj", "", uid, c, err, sizeof(err)) == 0, "%s", err);
	peer_link_close(l);
	peer_net_close(net);
}

/* How many of the copies c lists are owner's of user uid's run. */
static unsigned copies_of(const struct peer_copies *c, const char *owner, uid_t uid,
			  const char *run)
{
	unsigned n = 0;
	for (unsigned i = 0; i < c->n; i++)
		n += strcmp(c->c[i].owner, owner) == 0 && c->c[i].uid == uid &&
		     strcmp(c->c[i].run, run) == 0;
	return n;
}

/* Waits (120 s at most) until B holds A's copies of both users' tags, asked as A. */
static void wait_copies(uid_t vic, uid_t atk)
{
	struct peer_copies *c = calloc(1, sizeof(*c));
	int i;

	for (i = 0; i < 1200; i++) {
		list_from(NA, ns.addr[NB], PEER_ANY_UID, c);
		if (copies_of(c, ns.addr[NA], vic, "run-vic") == 1 &&
		    copies_of(c, ns.addr[NA], atk, "run-atk") == 1)
			break;
		h_sleep_ms(100);
	}
	ck_assert_msg(i < 1200, "B did not get A's copies (%u listed)", c->n);
	free(c);
}

/* From O, B lists none of the victim's copies (only the attacker's, whose telling names O)
 * and refuses a fetch of the victim's, nothing sent. */
static void outsider_refused(uid_t vic, uid_t atk, uint64_t vic_created)
{
	struct peer_copies *c = calloc(1, sizeof(*c));
	struct replica_store *mine;
	struct replica *r = NULL;
	struct peer_net *net;
	struct peer_link *l;
	unsigned rank = 0, copies;
	uint64_t bytes, ev;
	char err[512];

	list_from(NO, ns.addr[NB], PEER_ANY_UID, c);
	ck_assert_uint_eq(copies_of(c, ns.addr[NA], vic, "run-vic"), 0);
	ck_assert_uint_ge(copies_of(c, ns.addr[NA], atk, "run-atk"), 1);
	ck_assert_int_eq(replica_store_open(64 * MIB, NULL, &mine, err, sizeof(err)), 0);
	ck_assert_int_eq(peer_net_open(10, &net, err, sizeof(err)), 0);
	ck_assert_int_eq(peer_open(net, ns.addr[NB], PORT, SECRET, strlen(SECRET), 10, &l, err,
				   sizeof(err)), 0);
	ck_assert_int_eq(peer_fetch_copy(l, "pj", "step0", ns.addr[NA], "run-vic", vic_created,
					 &rank, 1, mine, &r, err, sizeof(err)), -EACCES);
	ck_assert_ptr_null(r);
	peer_link_close(l);
	peer_net_close(net);
	replica_stats(mine, &copies, &bytes, &ev);
	ck_assert_uint_eq(copies, 0);
	replica_store_close(mine);
	free(c);
}

/* Starts a peer daemon in namespace i named host on root (made here, users may enter it),
 * its socket open to every user. */
static void start_node(struct hdaemon *n, unsigned i, const char *root, const char *secret,
		       const char *host)
{
	struct hdaemon at = *D;
	char json[1024];

	snprintf(at.root, sizeof(at.root), "%s", root);
	ck_assert_int_eq(mkdir(root, 0755) == 0 || errno == EEXIST, 1);
	ck_assert_int_eq(chmod(root, 0755), 0);
	ck_assert_int_eq(netns_enter(&ns, i), 0);
	snprintf(json, sizeof(json), CHUNK_1M "\"host\": \"%s\", \"peer_secret_file\": \"%s\", "
		 "\"replica_cache_size\": 0.0625, \"max_held_mib_per_user\": 1,", host, secret);
	h_daemon_start_peer(n, &at, host, 0.0625, json);
	ck_assert_int_eq(chmod(n->socket, 0666), 0);
}

START_TEST(test_hostile_nodes)
{
	char scratch[256], root_r[288], root_p[288], vdir[PATH_MAX], adir[PATH_MAX], json[1024];
	struct hdaemon b, r, p;
	uid_t vic, atk;
	gid_t g;

	HOSTILE_BEGIN("check_peer_hostile");
	if (!usable)
		return;
	user_ids(VIC, &vic, &g);
	user_ids(ATK, &atk, &g);
	netns_ucx_env();
	h_tmpdir(scratch, sizeof(scratch));
	ck_assert_int_eq(chmod(scratch, 0755), 0);
	const char *secret = hp_secret_file(scratch, 0, SECRET);

	/* A and B share a root (each node's files under its own seal record). */
	ck_assert_int_eq(netns_enter(&ns, NA), 0);
	snprintf(json, sizeof(json), "\"host\": \"%s\", \"peer_secret_file\": \"%s\", "
		 "\"replica_cache_size\": 0.0625, \"max_held_mib_per_user\": 1,", ns.addr[NA],
		 secret);
	hd_start(0.0625, json);
	ck_assert_int_eq(netns_enter(&ns, NB), 0);
	snprintf(json, sizeof(json), CHUNK_1M "\"host\": \"%s\", \"peer_secret_file\": \"%s\", "
		 "\"replica_cache_size\": 0.0625, \"max_held_mib_per_user\": 1,", ns.addr[NB],
		 secret);
	h_daemon_start_peer(&b, D, "nb", 0.0625, json);
	ck_assert_int_eq(chmod(b.socket, 0666), 0);
	user_dir(h_path("%s/vic", D->root), VIC, 0755);
	user_dir(h_path("%s/atk", D->root), ATK, 0755);

	/* The victim's pj/step0, then the attacker's own "pj"'s step0, newer. */
	snprintf(vdir, sizeof(vdir), "%s/vic/pj/step0", D->root);
	snprintf(adir, sizeof(adir), "%s/atk/pj/step0", D->root);
	struct commit_spec cv = { { D->socket, b.socket }, vdir, "run-vic", 700, 0 };
	ck_assert_msg(as_user(VIC, commit_child, &cv) == 0, "victim: %s", B->msg[0]);
	struct commit_spec ca = { { D->socket, b.socket }, adir, "run-atk", 900, 1 };
	ck_assert_msg(as_user(ATK, commit_child, &ca) == 0, "attacker: %s", B->msg[1]);
	wait_copies(vic, atk);
	h_daemon_kill(D, SIGKILL);

	/* The replacement, told by the victim (as B is) that the job runs on R and B. */
	snprintf(root_r, sizeof(root_r), "%s/root-new", scratch);
	snprintf(root_p, sizeof(root_p), "%s/root-prolog", scratch);
	start_node(&r, NR, root_r, secret, "node-new");
	start_node(&p, NP, root_p, secret, "node-prolog");
	user_dir(h_path("%s/vic", root_r), VIC, 0755);
	user_dir(h_path("%s/atk", root_r), ATK, 0755);
	user_dir(h_path("%s/vic", root_p), VIC, 0755);
	const char *job_nodes[3] = { ns.addr[NR], ns.addr[NB], ns.addr[NP] };
	ck_assert_int_eq(tell_as(VIC, r.socket, h_path("%s/vic/pj", root_r), job_nodes, 2, 0, 0),
			 0);
	ck_assert_int_eq(tell_as(VIC, b.socket, h_path("%s/vic/pj", D->root), job_nodes, 3, 1,
				 0), 0);

	/* The attacker: the victim's job directory is not its to tell of. */
	const char *mine[4] = { ns.addr[NR], ns.addr[NO], ns.addr[NB], ns.addr[NP] };
	ck_assert_int_eq(tell_as(ATK, b.socket, h_path("%s/vic/pj", D->root), mine + 1, 1, 0, 1),
			 DSCKPT_EACCES);
	ck_assert_msg(strstr(B->msg[1], "another user's"), "%s", B->msg[1]);
	ck_assert_int_eq(tell_as(ATK, r.socket, h_path("%s/vic/pj", root_r), mine + 1, 1, 0, 1),
			 DSCKPT_EACCES);  /* not there yet, in the victim's directory */
	/* Nor anything outside the allowed roots, named or through a link of its own to a
	 * directory of its own out there (or to a hung mount: the daemon never looks). */
	char out[PATH_MAX];
	snprintf(out, sizeof(out), "%s/atk-out", scratch);
	ck_assert_int_eq(tell_as(ATK, b.socket, h_path("%s/pj", out), mine + 1, 1, 0, 1),
			 DSCKPT_EACCES);
	ck_assert_msg(strstr(B->msg[1], "not below an allowed root"), "%s", B->msg[1]);
	user_dir(out, ATK, 0755);
	ck_assert_int_eq(symlink(out, h_path("%s/atk/out", D->root)), 0);
	ck_assert_int_eq(lchown(h_path("%s/atk/out", D->root), atk, g), 0);
	ck_assert_int_eq(tell_as(ATK, b.socket, h_path("%s/atk/out/pj", D->root), mine + 1, 1, 0,
				 1), DSCKPT_EACCES);
	ck_assert_msg(strstr(B->msg[1], "symbolic link"), "%s", B->msg[1]);
	ck_assert_int_eq(unlink(h_path("%s/atk/out", D->root)), 0);
	/* Many jobs (more than its own 16 kept), and huge lists: past max_held_mib_per_user. */
	char (*names)[STORE_HOST_MAX] = calloc(HUGE_N, sizeof(*names));
	const char **huge = calloc(HUGE_N, sizeof(*huge));
	for (unsigned i = 0; i < HUGE_N; i++) {
		memset(names[i], 'h', STORE_HOST_MAX - 1);
		snprintf(names[i], 8, "%05u", i);
		names[i][5] = 'h';
		huge[i] = names[i];
	}
	struct flood_spec f = { { b.socket, r.socket }, { D->root, root_r }, huge, NULL, 0 };
	ck_assert_msg(as_user(ATK, flood_child, &f) == 0, "%s", B->msg[1]);
	ck_assert_msg(B->rc[3] == DSCKPT_ELIMIT, "%d %s", B->rc[3], B->msg[3]);
	ck_assert_msg(strstr(B->msg[3], "max_held_mib_per_user"), "%s", B->msg[3]);

	/* Its own "pj" runs on R, O and B: B lists its copies to R and O. */
	ck_assert_int_eq(tell_as(ATK, b.socket, h_path("%s/atk/pj", D->root), mine, 4, 1, 1), 0);
	ck_assert_int_eq(tell_as(ATK, r.socket, h_path("%s/atk/pj", root_r), mine, 3, 0, 1), 0);

	/* O sees only the attacker's copies; R only the victim's. */
	struct peer_copies *c = calloc(1, sizeof(*c));
	list_from(NR, ns.addr[NB], vic, c);
	ck_assert_uint_eq(copies_of(c, ns.addr[NA], vic, "run-vic"), 1);
	ck_assert_uint_eq(copies_of(c, ns.addr[NA], atk, "run-atk"), 0);
	uint64_t vic_created = 0;
	for (unsigned i = 0; i < c->n; i++)
		if (c->c[i].uid == vic && strcmp(c->c[i].run, "run-vic") == 0)
			vic_created = c->c[i].created_ns;
	outsider_refused(vic, atk, vic_created);
	free(c);

	/* The victim's replacement restores while the attacker keeps telling. */
	f.loop = 1;
	f.pj = mine;
	pid_t flood = as_user_spawn(ATK, flood_child, &f, 240);
	ck_assert(flag_wait(F_SENT, 60000));  /* telling before the restore, and until after */
	struct load_spec ls = { r.socket, h_path("%s/vic/pj/step0", root_r), 0, 700, 0 };
	ck_assert_int_eq(as_user(VIC, load_child, &ls), 0);
	flag_set(F_STOP);
	ck_assert_msg(as_user_wait(flood) == 0, "%s", B->msg[1]);
	ck_assert_msg(B->rc[0] == DSCKPT_LOADED, "victim's load on R: %d %s (R: %s)", B->rc[0],
		      B->msg[0], h_text(r.log));
	ck_assert_str_eq(B->msg[0], "peer");
	ck_assert(B->n[0]);
	check_pattern_file(h_path("%s/vic/pj/step0", root_r), "rank0", N_BYTES, 700);
	ck_assert_int_ne(access(h_path("%s/vic/pj/step0/rank1.safetensors", root_r), F_OK), 0);
	free(huge);
	free(names);

	/* Root's pull on the second replacement (a prolog's, root told the job's nodes and the
	 * rank): the victim's copy, not the attacker's newer one of the same name, as the
	 * victim's files. */
	unsigned rank0 = 0;
	const char *prolog_nodes[2] = { ns.addr[NP], ns.addr[NB] };
	dsckpt_conn_t *rc0;
	ck_assert_int_eq(dsckpt_connect(p.socket, &rc0), 0);
	CK_DS(rc0, dsckpt_identify(rc0, "pj", 0, 2));
	CK_DS(rc0, dsckpt_job_nodes(rc0, h_path("%s/vic/pj", root_p), prolog_nodes, 2, &rank0,
				    1));
	dsckpt_close(rc0);
	const char *pulled = h_path("%s/pull.out", scratch);
	int st = h_system("%s -s %s pull --wait %s/vic/pj/step0 >%s 2>&1", h_bin("dsckptctl"),
			  p.socket, root_p, pulled);
	ck_assert_msg(st == 0, "root's pull: %s\nP: %s", file_text(pulled), h_text(p.log));
	check_pattern_file(h_path("%s/vic/pj/step0", root_p), "rank0", N_BYTES, 700);
	struct stat fst;
	ck_assert_int_eq(stat(h_path("%s/vic/pj/step0/rank0.safetensors", root_p), &fst), 0);
	ck_assert_uint_eq(fst.st_uid, vic);

	ck_assert_int_eq(h_daemon_kill(&p, SIGTERM), 0);
	ck_assert_int_eq(h_daemon_kill(&r, SIGTERM), 0);
	ck_assert_int_eq(h_daemon_kill(&b, SIGTERM), 0);
	h_rm_rf(scratch);
	hd_stop();
}
END_TEST

/* The suite. */
static Suite *peer_hostile_suite(void)
{
	Suite *s = suite_create("peer_hostile");
	TCase *tc = tcase_create("peer_hostile");
	tcase_add_unchecked_fixture(tc, ns_setup, ns_teardown);
	tcase_add_checked_fixture(tc, NULL, h_leftovers);
	tcase_set_timeout(tc, 300);
	tcase_add_test(tc, test_hostile_nodes);
	suite_add_tcase(s, tc);
	return s;
}

CHECK_MAIN(peer_hostile_suite)
