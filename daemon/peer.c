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
 *
 * Threads: peer_on_save runs on the loop thread and only queues; the sender thread does the
 * reading and sending; peer_ucx.c's threads serve. peer.lock guards the queue, the stop flag
 * and the list of copies sent. The peer_* keys are read at start (a reload does not change
 * them).
 */
#include "dsckptd.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#define PEER_TIMEOUT_S 30      /* one call on a link (a peer that never answers) */
#define PEER_MAX_CONNS 64
#define PEER_MAX_HOSTS 4096    /* seal records read from one tag */
#define PEER_MAX_MINE 512      /* this node's ranks and files of one tag (the protocol takes
				* 256 ranks a copy: peer_int.h) */
#define PEER_SENT_KEPT 64      /* copies remembered as sent (not sent twice) */

/* A tag to send: its directory, as SAVE_BEGIN opened it. */
struct peer_job {
	struct peer_job *next;
	char *dir;
	double t0;                    /* when it was COMMITTED (the replication's start) */
	struct store_dirid id;
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
	struct { char dir[4096]; uint64_t created_ns; } sent[PEER_SENT_KEPT]; /* sender only */
	unsigned nsent;
	_Atomic unsigned long copies_out, send_failures;
} peer = { .lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER };

/* A tag's files of this node, open for sending. */
struct peer_tag {
	char *manifest;
	size_t mlen;
	struct manifest *m;
	const struct manifest_file *files[PEER_MAX_MINE];
	int fds[PEER_MAX_MINE];
	unsigned nfiles;
	unsigned ranks[PEER_MAX_MINE];
	unsigned nranks;
	struct resident *res[PEER_MAX_MINE]; /* a file's pinned resident copy, or NULL */
	char *hosts[PEER_MAX_HOSTS];
	unsigned nhosts;
	char job[513], run[256];
	uint64_t bytes_read, bytes_cached; /* what the sends read, and of it from the cache */
};

/* peer_read_fn: bytes of file i of the tag being sent: its data from the cache's resident
 * copy where a piece is held, the rest (the header, pieces given up) from the file. */
static int peer_read_file(void *arg, unsigned i, uint64_t off, void *buf, size_t len)
{
	struct peer_tag *t = arg;
	uint64_t hl = t->files[i]->header_len;
	uint8_t *out = buf;
	ssize_t n;

	t->bytes_read += len;
	if (t->res[i] && off < hl) {  /* the header, from the file */
		size_t h = len < hl - off ? len : (size_t)(hl - off);
		if ((n = userfile_pread(t->fds[i], out, h, off)) != (ssize_t)h)
			return n < 0 ? (int)n : -EIO;
		out += h;
		off += h;
		len -= h;
	}
	while (len > 0 && t->res[i]) {
		uint64_t d = off - hl, in = d % peer.chunk;
		const uint8_t *piece = resident_piece(t->res[i], d / peer.chunk);
		size_t k = len < peer.chunk - in ? len : (size_t)(peer.chunk - in);
		if (piece == NULL)
			break;
		memcpy(out, piece + in, k);
		out += k;
		off += k;
		len -= k;
		t->bytes_cached += k;
	}
	n = len ? userfile_pread(t->fds[i], out, len, off) : 0;
	return n == (ssize_t)len ? 0 : n < 0 ? (int)n : -EIO;
}

/* Pins the resident copy of file i (dir/<name>.safetensors, opened as fd) when the cache
 * still holds one of this very file: the same inode and the same header bytes. */
static void peer_tag_resident(struct peer_tag *t, unsigned i, const char *dir)
{
	const struct manifest_file *f = t->files[i];
	size_t n = strlen(f->name), sfx = strlen(FMT_SAFETENSORS), hlen;
	struct stat st;
	char base[256];

	if (strcmp(f->kind, MANIFEST_KIND_ST) != 0 || n <= sfx || n - sfx >= sizeof(base) ||
	    fstat(t->fds[i], &st) != 0)
		return;
	memcpy(base, f->name, n - sfx);
	base[n - sfx] = '\0';
	if ((t->res[i] = resident_pin(dir, base, st.st_dev, st.st_ino)) == NULL) {
		log_debug("peer: %s/%s: no resident copy; sent from the file", dir, f->name);
		return;
	}
	const uint8_t *hdr = resident_header(t->res[i], &hlen);
	uint8_t *disk = hlen == f->header_len ? malloc(hlen) : NULL;
	if (disk == NULL || userfile_pread(t->fds[i], disk, hlen, 0) != (ssize_t)hlen ||
	    memcmp(disk, hdr, hlen) != 0) {
		log_debug("peer: %s/%s: its resident copy is stale; sent from the file", dir,
			  f->name);
		resident_unpin(t->res[i]);  /* rewritten since: the copy is stale */
		t->res[i] = NULL;
	}
	free(disk);
}

/* Frees what peer_tag_read read. */
static void peer_tag_free(struct peer_tag *t)
{
	for (unsigned i = 0; i < t->nfiles; i++) {
		if (t->res[i])
			resident_unpin(t->res[i]);
		close(t->fds[i]);
	}
	for (unsigned i = 0; i < t->nhosts; i++)
		free(t->hosts[i]);
	manifest_free(t->m);
	free(t->manifest);
}

/* Reads the seal records of dirfd of the manifest's run: the job's hosts and this node's
 * ranks into t; 0, or -ENOENT when this node sealed nothing there. */
static int peer_tag_seals(int dirfd, struct peer_tag *t)
{
	int fd = dup(dirfd);
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	const char *run = t->m->run ? t->m->run : "";
	struct dirent *e;

	if (d == NULL) {
		if (fd >= 0)
			close(fd);
		return -errno;
	}
	while ((e = readdir(d)) != NULL && t->nhosts < PEER_MAX_HOSTS) {
		struct seal_record r;
		char why[128];
		if (!seal_record_name(e->d_name) ||
		    seal_record_load(dirfd, e->d_name, &r, why, sizeof(why)) != 0)
			continue;
		if (strcmp(r.run ? r.run : "", run) == 0 && (t->hosts[t->nhosts] = strdup(r.host))) {
			t->nhosts++;
			if (strcmp(r.host, store_host()) == 0 && t->nranks == 0) {
				snprintf(t->job, sizeof(t->job), "%s", r.job);
				for (unsigned i = 0; i < r.nranks && i < PEER_MAX_MINE; i++)
					t->ranks[t->nranks++] = r.ranks[i];
			}
		}
		seal_record_free(&r);
	}
	closedir(d);
	snprintf(t->run, sizeof(t->run), "%s", run);
	return t->nranks > 0 ? 0 : -ENOENT;
}

/* Reads a committed tag's manifest, seal records and this node's files, opened, with their
 * resident copies pinned where the cache holds them; 0 or a negative errno with err. */
static int peer_tag_read(int dirfd, const char *dir, struct peer_tag *t, char *err,
			 size_t errlen)
{
	char why[256];
	int e;

	t->manifest = userfile_read(dirfd, FMT_MANIFEST, MANIFEST_MAX_BYTES, 0, &t->mlen, &e, why,
				    sizeof(why));
	if (t->manifest == NULL ||
	    (t->m = manifest_parse(t->manifest, t->mlen, why, sizeof(why))) == NULL) {
		snprintf(err, errlen, "its manifest: %s", why);
		return -EINVAL;
	}
	if (peer_tag_seals(dirfd, t) != 0) {
		snprintf(err, errlen, "no seal record of this node (%s)", store_host());
		return -ENOENT;
	}
	for (size_t i = 0; i < t->m->nfiles && t->nfiles < PEER_MAX_MINE; i++) {
		const struct manifest_file *f = &t->m->files[i];
		int mine = 0;
		for (unsigned k = 0; k < t->nranks; k++)
			mine |= f->rank == t->ranks[k];
		if (!mine)
			continue;
		int fd = userfile_open(dirfd, f->name, f->size, 0, NULL, why, sizeof(why));
		if (fd < 0) {
			snprintf(err, errlen, "%s: %s", f->name, why);
			return fd;
		}
		t->files[t->nfiles] = f;
		t->fds[t->nfiles] = fd;
		peer_tag_resident(t, t->nfiles++, dir);
	}
	return 0;
}

/* Whether dir's tag of created_ns was sent already; remembers it as sent when not. */
static int peer_sent_before(const char *dir, uint64_t created_ns)
{
	for (unsigned i = 0; i < peer.nsent && i < PEER_SENT_KEPT; i++)
		if (peer.sent[i].created_ns == created_ns && strcmp(peer.sent[i].dir, dir) == 0)
			return 1;
	unsigned at = peer.nsent++ % PEER_SENT_KEPT;
	snprintf(peer.sent[at].dir, sizeof(peer.sent[at].dir), "%s", dir);
	peer.sent[at].created_ns = created_ns;
	return 0;
}

/* Sends a copy of t to the first `replicas` peers after this node on the ring that take
 * it; how many did. */
static unsigned peer_send_tag(struct peer_tag *t, const char *dir, double since)
{
	const char *ring[PEER_MAX_HOSTS];
	struct replica_id id = { store_host(), t->job, t->run, t->m->tag, dir,
				 t->m->created_ns };
	unsigned done = 0;
	char err[512];
	int n = peer_place((const char *const *)t->hosts, t->nhosts, store_host(),
			   PEER_MAX_HOSTS, ring, PEER_MAX_HOSTS);

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
			uint64_t bytes = 0;
			for (unsigned k = 0; k < t->nfiles; k++)
				bytes += t->files[k]->size;
			done++;
			atomic_fetch_add(&peer.copies_out, 1);
			metrics_peer_add(METRIC_PEER_COPIES_SENT, 1);
			metrics_peer_add(METRIC_PEER_BYTES_SENT, bytes);
			metrics_peer_replicated(now_mono() - since);
			log_info("peer: %s's copy of %s (%u files) kept by %s in %.2f s", store_host(),
				 dir, t->nfiles, ring[i], now_mono() - t0);
		} else {
			atomic_fetch_add(&peer.send_failures, 1);
			log_warnx("peer: %s not copied to %s: %s%s", dir, ring[i], err,
				  i + 1 < n ? "; trying the next node" : "");
		}
	}
	return done;
}

/* Sends one queued tag (sender thread). */
static void peer_send_job(struct peer_job *j)
{
	struct peer_tag *t = calloc(1, sizeof(*t));
	struct store_dirid id;
	char err[512];
	int dirfd = open(j->dir, STORE_DIR_FLAGS);

	if (t == NULL || dirfd < 0 || store_dir_id(dirfd, &id, err, sizeof(err)) != 0 ||
	    id.dev != j->id.dev || id.ino != j->id.ino) {
		log_warnx("peer: %s not copied: the directory is gone or replaced", j->dir);
		goto out;
	}
	if (peer_tag_read(dirfd, j->dir, t, err, sizeof(err)) != 0) {
		log_info("peer: %s not copied: %s", j->dir, err);
		goto out;
	}
	if (peer_sent_before(j->dir, t->m->created_ns))
		goto out;
	unsigned done = peer_send_tag(t, j->dir, j->t0);
	if (done < peer.replicas)
		log_warnx("peer: %s is held by %u of %u peers", j->dir, done, peer.replicas);
	log_info("peer: %s: %llu bytes read for its copies, %llu of them from the cache", j->dir,
		 (unsigned long long)t->bytes_read, (unsigned long long)t->bytes_cached);
out:
	if (t)
		peer_tag_free(t);
	free(t);
	if (dirfd >= 0)
		close(dirfd);
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
		free(j->dir);
		free(j);
		pthread_mutex_lock(&peer.lock);
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
			j->t0 = now_mono();
			*p = j;
			pthread_cond_signal(&peer.cond);
		}
	}
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
		free(j->dir);
		free(j);
	}
	pthread_mutex_unlock(&peer.lock);
	peer_net_stop(peer.net);
	pthread_join(peer.sender, NULL);
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
