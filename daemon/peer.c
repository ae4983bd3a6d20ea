/*
 * peer.c — peer copies in the daemon (DESIGN.md §9, issue 35), on when the configuration
 * names a peer_secret_file (config_peer_on): the service that takes other nodes' copies on
 * peer_port (peer_serve.c into replica_store.c), and the sending of this node's committed
 * files to their placement peers. It observes save levels (save_observe): when a save of a
 * sealed tag is COMMITTED, its directory is queued for the sender thread, which reads the
 * tag's manifest and seal records there (the job's hosts, this node's ranks), places the
 * copies (peer_place.c) and sends this node's files, from the cache's resident copy where it
 * still holds one (resident.c, pinned while sent) and from the files otherwise, to the first
 * `replicas` peers of the ring that take them (a peer down or refusing: the next one). A tag
 * committed without seal records (a coordinator's COMMIT) names no hosts and is not sent.
 * Once every peer that could was sent its copy, the tag's replication is settled: how many
 * peers acknowledged a copy (their RESULT 0 after checking every byte) goes back to the loop
 * thread through a workq, where save.c moves its saves to REPLICATED (all `replicas` held) or
 * ends their waits for it short. The last PEER_SENT_KEPT tags sent are remembered (which
 * peers hold them: PENDING and STATUS show it) and not sent twice.
 *
 * Threads: peer_on_save and the settling run on the loop thread; the sender thread does the
 * reading and sending; peer_ucx.c's threads serve. peer.lock guards the queue, the stop flag
 * and the tags sent. The peer_* keys are read at start (a reload does not change them).
 */
#include "dsckptd.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define PEER_TIMEOUT_S 30      /* one call on a link (a peer that never answers) */
#define PEER_MAX_CONNS 64
#define PEER_SENT_KEPT 64      /* copies remembered as sent (not sent twice) */

/* A tag to send: its directory, as SAVE_BEGIN opened it; once sent, how many peers hold it,
 * back to the loop thread. */
struct peer_job {
	struct workq_item wi;         /* first: pushed to peer.settled once sent */
	struct peer_job *next;
	char *dir;
	double t0;                    /* when it was COMMITTED (the replication's start) */
	struct store_dirid id;
	uid_t uid;
	unsigned copies;              /* peers that kept a copy */
	char why[600];                /* copies < replicas: why no more */
};

/* A tag sent (or being sent): what PENDING and dsckptctl list show of it. */
struct peer_sent {
	char dir[4096];
	uint64_t created_ns;
	uid_t uid;
	int done;                     /* settled (else still being sent) */
	unsigned copies;
	uint64_t bytes;               /* of one copy */
	char holders[512];            /* the peers that kept it, ", " between */
	char why[600];
	double t0;
};

static struct {
	int on;
	struct peer_net *net;
	struct replica_store *rs;
	struct peer_service svc;
	struct rate_cap *cap;
	char *secret;
	size_t secret_len;
	unsigned port, replicas;
	uint64_t chunk;               /* the cache's chunk: a resident copy's piece */
	pthread_t sender;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct peer_job *head;        /* lock */
	int stop;                     /* lock */
	struct workq *settled;        /* sent jobs back to the loop (peer_wire) */
	struct peer_sent sent[PEER_SENT_KEPT]; /* lock: the last tags sent, a ring */
	unsigned nsent;
	_Atomic unsigned long copies_out, send_failures;
} peer = { .lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER };

/* Whether j's tag of created_ns was sent already (then j takes its copies); when not, it is
 * remembered as being sent, its record into *rec (sender thread). */
static int peer_sent_before(struct peer_job *j, uint64_t created_ns, struct peer_sent **rec)
{
	pthread_mutex_lock(&peer.lock);
	for (unsigned i = 0; i < peer.nsent && i < PEER_SENT_KEPT; i++) {
		struct peer_sent *e = &peer.sent[i];
		if (e->created_ns == created_ns && strcmp(e->dir, j->dir) == 0 && e->done) {
			j->copies = e->copies;
			snprintf(j->why, sizeof(j->why), "%s", e->why);
			pthread_mutex_unlock(&peer.lock);
			return 1;
		}
	}
	*rec = &peer.sent[peer.nsent++ % PEER_SENT_KEPT];
	memset(*rec, 0, sizeof(**rec));
	snprintf((*rec)->dir, sizeof((*rec)->dir), "%s", j->dir);
	(*rec)->created_ns = created_ns;
	(*rec)->uid = j->uid;
	(*rec)->t0 = j->t0;
	pthread_mutex_unlock(&peer.lock);
	return 0;
}

/* Sends a copy of t to the first `replicas` peers after this node on the ring that take
 * it, each one that did added to rec; how many did, with why no more into why when fewer. */
static unsigned peer_send_tag(struct peer_tag *t, const char *dir, double since,
			      struct peer_sent *rec, char *why, size_t whylen)
{
	const char *ring[PEER_MAX_HOSTS];
	struct replica_id id = { store_host(), t->job, t->run, t->m->tag, dir,
				 t->m->created_ns };
	unsigned done = 0;
	char err[512];
	int n = peer_place((const char *const *)t->hosts, t->nhosts, store_host(),
			   PEER_MAX_HOSTS, ring, PEER_MAX_HOSTS);
	uint64_t bytes = 0;

	for (unsigned k = 0; k < t->nfiles; k++)
		bytes += t->files[k]->size;
	pthread_mutex_lock(&peer.lock);
	rec->bytes = bytes;
	pthread_mutex_unlock(&peer.lock);
	snprintf(why, whylen, "the job has %d other node%s to hold one", n > 0 ? n : 0,
		 n == 1 ? "" : "s");
	for (int i = 0; i < n && done < peer.replicas; i++) {
		struct peer_link *l;
		double t0 = now_mono();
		int rc = peer_open(peer.net, ring[i], peer.port, peer.secret, peer.secret_len,
				   PEER_TIMEOUT_S, &l, err, sizeof(err));
		if (rc == 0) {
			rc = peer_put(l, &id, t->ranks, t->nranks, t->manifest, t->mlen, t->files,
				      t->nfiles, peer_read_file, t, peer.cap, err, sizeof(err));
			peer_link_close(l);
		}
		if (rc == 0) {
			pthread_mutex_lock(&peer.lock);
			size_t at = strlen(rec->holders);
			snprintf(rec->holders + at, sizeof(rec->holders) - at, "%s%s", at ? ", " : "",
				 ring[i]);
			rec->copies = ++done;
			pthread_mutex_unlock(&peer.lock);
			atomic_fetch_add(&peer.copies_out, 1);
			metrics_peer_add(METRIC_PEER_COPIES_SENT, 1);
			metrics_peer_add(METRIC_PEER_BYTES_SENT, bytes);
			metrics_peer_replicated(now_mono() - since);
			log_info("peer: %s's copy of %s (%u files) kept by %s in %.2f s", store_host(),
				 dir, t->nfiles, ring[i], now_mono() - t0);
		} else {
			atomic_fetch_add(&peer.send_failures, 1);
			snprintf(why, whylen, "%s", err);
			log_warnx("peer: %s not copied to %s: %s%s", dir, ring[i], err,
				  i + 1 < n ? "; trying the next node" : "");
		}
	}
	return done;
}

/* Sends one queued tag (sender thread); j's copies and why are set for its settling. */
static void peer_send_job(struct peer_job *j)
{
	struct peer_tag *t = calloc(1, sizeof(*t));
	struct peer_sent *rec;
	struct store_dirid id;
	char err[512];
	int dirfd = open(j->dir, STORE_DIR_FLAGS);

	if (t == NULL || dirfd < 0 || store_dir_id(dirfd, &id, err, sizeof(err)) != 0 ||
	    id.dev != j->id.dev || id.ino != j->id.ino) {
		snprintf(j->why, sizeof(j->why), "not sent: the directory is gone or replaced");
		log_warnx("peer: %s %s", j->dir, j->why);
		goto out;
	}
	if (peer_tag_read(dirfd, j->dir, peer.chunk, t, err, sizeof(err)) != 0) {
		snprintf(j->why, sizeof(j->why), "not sent: %s", err);
		log_info("peer: %s %s", j->dir, j->why);
		goto out;
	}
	if (peer_sent_before(j, t->m->created_ns, &rec))
		goto out;
	j->copies = peer_send_tag(t, j->dir, j->t0, rec, j->why, sizeof(j->why));
	pthread_mutex_lock(&peer.lock);
	rec->done = 1;
	snprintf(rec->why, sizeof(rec->why), "%s", j->copies < peer.replicas ? j->why : "");
	pthread_mutex_unlock(&peer.lock);
	if (j->copies < peer.replicas)
		log_warnx("peer: %s is held by %u of %u peers: %s", j->dir, j->copies,
			  peer.replicas, j->why);
	log_info("peer: %s: %llu bytes read for its copies, %llu of them from the cache", j->dir,
		 (unsigned long long)t->bytes_read, (unsigned long long)t->bytes_cached);
out:
	if (t)
		peer_tag_free(t);
	free(t);
	if (dirfd >= 0)
		close(dirfd);
}

/* Frees a job. */
static void peer_job_free(struct peer_job *j)
{
	free(j->dir);
	free(j);
}

/* workq_fn (loop thread): a sent job's copies told to its saves (REPLICATED, or short). */
static void peer_on_settled(struct workq_item *it, unsigned events)
{
	struct peer_job *j = (struct peer_job *)it;

	(void)events;
	save_mark_replicated(&j->id, j->copies, peer.replicas, j->why);
	peer_job_free(j);
}

/* The sender thread: sends queued tags, one at a time, until told to stop. */
static void *peer_sender_main(void *arg)
{
	pthread_mutex_lock(&peer.lock);
	for (;;) {
		while (!peer.stop && peer.head == NULL)
			pthread_cond_wait(&peer.cond, &peer.lock);
		if (peer.stop)
			break;
		struct peer_job *j = peer.head;
		peer.head = j->next;
		pthread_mutex_unlock(&peer.lock);
		peer_send_job(j);
		pthread_mutex_lock(&peer.lock);
		if (peer.settled)
			workq_push(peer.settled, &j->wi, 1);
		else
			peer_job_free(j);
	}
	pthread_mutex_unlock(&peer.lock);
	return NULL;
}

/* save_change_cb (loop thread): a COMMITTED save's directory queued for sending, once. */
void peer_on_save(struct save *s)
{
	struct save_view v;
	struct peer_job *j, **p;

	if (!peer.on)
		return;
	save_view(s, &v);
	if (v.level != LEVEL_COMMITTED)
		return;
	pthread_mutex_lock(&peer.lock);
	for (p = &peer.head; *p; p = &(*p)->next)
		if (strcmp((*p)->dir, v.dir) == 0)
			break;
	if (*p == NULL && (j = calloc(1, sizeof(*j))) != NULL) {
		if ((j->dir = strdup(v.dir)) == NULL) {
			free(j);
		} else {
			j->id = v.dirid;
			j->uid = v.uid;
			j->t0 = now_mono();
			*p = j;
			pthread_cond_signal(&peer.cond);
		}
	}
	pthread_mutex_unlock(&peer.lock);
}

/* Opens the queue that brings sent tags back to loop's thread, to settle their saves' level
 * (main.c, once the loop exists); 0 (also when off) or a negative ERR_E* with err. */
int peer_wire(struct uv_loop_s *loop, char *err, size_t errlen)
{
	return peer.on ? workq_open(&peer.settled, loop, peer_on_settled, err, errlen) : 0;
}

/* Calls fn with each tag of this node queued, being sent, or sent to fewer peers than
 * `replicas` (loop thread, under peer.lock: fn must not call into peer.c). */
void peer_each(void (*fn)(void *arg, const struct peer_view *v), void *arg)
{
	double now = now_mono();

	if (!peer.on)
		return;
	pthread_mutex_lock(&peer.lock);
	for (struct peer_job *j = peer.head; j; j = j->next) {
		struct peer_view v = { .dir = j->dir, .uid = j->uid, .state = "queued",
				       .replicas = peer.replicas, .holders = "",
				       .age_s = now - j->t0 };
		fn(arg, &v);
	}
	for (unsigned i = 0; i < peer.nsent && i < PEER_SENT_KEPT; i++) {
		const struct peer_sent *e = &peer.sent[i];
		if (e->done && e->copies >= peer.replicas)
			continue;
		struct peer_view v = { .dir = e->dir, .uid = e->uid,
				       .state = e->done ? "short" : "sending", .copies = e->copies,
				       .replicas = peer.replicas, .bytes = e->bytes,
				       .holders = e->holders, .error = e->done ? e->why : NULL,
				       .age_s = now - e->t0 };
		fn(arg, &v);
	}
	pthread_mutex_unlock(&peer.lock);
}

/* Calls fn with each tag remembered as held by peers (of the last PEER_SENT_KEPT sent since
 * the start): its directory, its owner and the peers that acknowledged a copy, ", " between
 * (loop thread, under peer.lock: fn must not call into peer.c). */
void peer_each_held(void (*fn)(void *arg, const char *dir, uid_t uid, const char *peers),
		    void *arg)
{
	if (!peer.on)
		return;
	pthread_mutex_lock(&peer.lock);
	for (unsigned i = 0; i < peer.nsent && i < PEER_SENT_KEPT; i++)
		if (peer.sent[i].copies > 0)
			fn(arg, peer.sent[i].dir, peer.sent[i].uid, peer.sent[i].holders);
	pthread_mutex_unlock(&peer.lock);
}

/* Starts peer copies when cfg turns them on (config_peer_on): the replica store, the
 * listener on peer_port and the sender thread; 0 (also when off) or -1 with err. */
int peer_start(const struct config *cfg, char *err, size_t errlen)
{
	if (!config_peer_on(cfg))
		return 0;
	int probe = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (probe < 0 && (errno == EAFNOSUPPORT || errno == EPERM)) {
		snprintf(err, errlen, "peer copies need the network (AF_INET), which this process "
			 "may not use: under systemd, a drop-in with RestrictAddressFamilies=AF_UNIX "
			 "AF_INET AF_INET6 AF_NETLINK (dsckptd.8)");
		return -1;
	}
	if (probe >= 0)
		close(probe);
	peer.secret = malloc(cfg->peer_secret_len);
	if (peer.secret == NULL || (peer.cap = rate_cap_new(cfg->peer_max_mib_per_s)) == NULL) {
		snprintf(err, errlen, "peer copies: out of memory");
		goto fail;
	}
	memcpy(peer.secret, cfg->peer_secret, cfg->peer_secret_len);
	peer.secret_len = cfg->peer_secret_len;
	peer.port = cfg->peer_port;
	peer.replicas = cfg->replicas;
	peer.chunk = cfg->chunk_bytes;
	if (replica_store_open(cfg->replica_cache_bytes, cfg->replica_root, &peer.rs, err,
			       errlen) != 0 ||
	    peer_net_open(PEER_TIMEOUT_S, &peer.net, err, errlen) != 0)
		goto fail;
	replica_recover(peer.rs);  /* the copies left on replica_root, checked again */
	unsigned held;
	uint64_t mem, evictions;
	replica_stats(peer.rs, &held, &mem, &evictions);
	metrics_peer_set(METRIC_PEER_COPIES_HELD, held);
	metrics_peer_add(METRIC_PEER_COPIES_RECEIVED, held);
	peer.svc = (struct peer_service){ .secret = peer.secret, .secret_len = peer.secret_len,
					  .rs = peer.rs };
	if (peer_listen(peer.net, peer.port, PEER_MAX_CONNS, peer_serve, &peer.svc, err,
			errlen) != 0)
		goto fail;
	if (pthread_create(&peer.sender, NULL, peer_sender_main, NULL) != 0) {
		snprintf(err, errlen, "peer copies: no thread");
		goto fail;
	}
	peer.on = 1;
	log_info("peer copies: listening on port %u (UCX), %u per node, %.2f GiB of memory%s%s",
		 peer.port, peer.replicas, cfg->replica_cache_gib,
		 cfg->replica_root[0] ? " then " : " only", cfg->replica_root);
	return 0;

fail:
	peer_net_close(peer.net);
	replica_store_close(peer.rs);
	rate_cap_free(peer.cap);
	if (peer.secret)
		explicit_bzero(peer.secret, peer.secret_len);
	free(peer.secret);
	peer.net = NULL;
	peer.rs = NULL;
	peer.cap = NULL;
	peer.secret = NULL;
	return -1;
}

/* Stops peer copies (shutdown): what is queued is dropped, a send in flight broken, the
 * sender and every connection's thread joined, the copies held freed. No-op when off. */
void peer_stop(void)
{
	if (!peer.on)
		return;
	pthread_mutex_lock(&peer.lock);
	peer.stop = 1;
	pthread_cond_signal(&peer.cond);
	while (peer.head) {
		struct peer_job *j = peer.head;
		peer.head = j->next;
		peer_job_free(j);
	}
	pthread_mutex_unlock(&peer.lock);
	peer_net_stop(peer.net);
	pthread_join(peer.sender, NULL);
	workq_close(peer.settled);  /* the last job sent settled */
	peer.settled = NULL;
	peer_net_close(peer.net);
	replica_store_close(peer.rs);
	rate_cap_free(peer.cap);
	explicit_bzero(peer.secret, peer.secret_len);
	free(peer.secret);
	peer.on = 0;
}

/* Whether peer copies run. */
int peer_on(void)
{
	return peer.on;
}

/* Opens an authenticated link to host's daemon for a restore (see dsckptd.h). */
int peer_restore_open(const char *host, struct peer_link **out, char *err, size_t errlen)
{
	if (!peer.on) {
		snprintf(err, errlen, "peer copies are off");
		return -ENOTCONN;
	}
	return peer_open(peer.net, host, peer.port, peer.secret, peer.secret_len, PEER_TIMEOUT_S,
			 out, err, errlen);
}

/* Checks that UCX opens with a transport (dsckptd -n) when cfg turns peer copies on; 0, or
 * -1 with err. */
int peer_check(const struct config *cfg, char *err, size_t errlen)
{
	struct peer_net *n;

	if (!config_peer_on(cfg))
		return 0;
	if (peer_net_open(1, &n, err, errlen) != 0)
		return -1;
	peer_net_close(n);
	return 0;
}
