/*
 * peer_serve.c — the listening side of the peer protocol (peer_int.h), run by peer_ucx.c on
 * each connection's own thread: the peer proves it holds the cluster's secret (and is shown
 * that we do) before anything else is read; then it may place copies in the replica store
 * (PUT: of its own files only, the owner it names resolving to its address), list those of
 * a job (LIST) and fetch them (FETCH), nothing more. A copy is kept
 * only once whole and checked (replica_store.c); one that fails is answered with why and
 * dropped, and one whose sender vanishes mid-way is dropped without a word. A LIST or FETCH
 * sees only the copies whose job the asking daemon is a node of (peer_member.c: its address
 * is the owner's or that of a host of the tag's seal records here; or peer_nodes.c: the
 * copy's user told this daemon the job runs on it, and then a FETCH gets only the ranks it
 * names); a FETCH of another's is answered -EACCES and nothing of it is sent, and a LIST
 * leaves such copies out, and those of users other than the one it asks for (a restore's:
 * another user's job of the same name is not its). The service's counters are atomics.
 */
#include "peer_int.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxh_x86dispatch.h>

/* Sends RESULT code with a message (may be ""); the link's result. */
static int peer_serve_result(struct peer_link *l, int code, const char *msg)
{
	struct peer_result res = { .code = code };

	snprintf(res.msg, sizeof(res.msg), "%s", msg);
	return peer_send(l, PEER_RESULT, &res, sizeof(res));
}

/* The challenge: the peer's HELLO, our nonce and proof, its proof checked in constant time;
 * 0 when it holds the secret (told RESULT 0), else a negative errno (told when refused). */
static int peer_serve_auth(struct peer_service *svc, struct peer_link *l)
{
	struct peer_hello hello;
	struct peer_challenge ch;
	struct peer_response resp;
	uint64_t tag;
	size_t len;
	int rc;

	if ((rc = peer_recv(l, &tag, &hello, sizeof(hello), &len)) != 0)
		return rc;
	if (tag != PEER_HELLO || len != sizeof(hello) ||
	    memcmp(hello.magic, PEER_MAGIC, sizeof(hello.magic)) != 0 ||
	    hello.version != PEER_VERSION) {
		log_warnx("peer %s: refused: not a dsckptd of peer protocol %d",
			  peer_link_who(l), PEER_VERSION);
		return -EPROTO;
	}
	if ((rc = peer_auth_nonce(ch.nonce)) != 0 ||
	    (rc = peer_auth_mac(svc->secret, svc->secret_len, PEER_SERVER, hello.nonce, ch.nonce,
				ch.mac)) != 0 ||
	    (rc = peer_send(l, PEER_CHALLENGE, &ch, sizeof(ch))) != 0 ||
	    (rc = peer_recv(l, &tag, &resp, sizeof(resp), &len)) != 0)
		return rc;
	if (tag != PEER_RESPONSE || len != sizeof(resp) ||
	    peer_auth_check(svc->secret, svc->secret_len, PEER_CLIENT, hello.nonce, ch.nonce,
			    resp.mac) != 0) {
		atomic_fetch_add(&svc->refused, 1);
		log_warnx("peer %s: refused: it does not hold the cluster's secret "
			  "(peer_secret_file)", peer_link_who(l));
		peer_serve_result(l, -EACCES, "refused: not a member of the cluster (the "
				  "peer_secret_file differs)");
		return -EACCES;
	}
	return peer_serve_result(l, 0, "");
}

/* Whether every string of a copy's identity ends within its array and the counts fit. */
static int peer_ids_ok(const struct peer_ids *w)
{
	return peer_str_ok(w->owner, sizeof(w->owner)) && peer_str_ok(w->job, sizeof(w->job)) &&
	       peer_str_ok(w->run, sizeof(w->run)) && peer_str_ok(w->tag, sizeof(w->tag)) &&
	       peer_str_ok(w->dir, sizeof(w->dir)) && w->nranks <= PEER_MAX_RANKS &&
	       w->manifest_len > 0 && w->manifest_len <= PEER_MAX_MANIFEST;
}

/* Counts a copy kept (its bytes) and the store's gauges in the metrics. */
static void peer_serve_count(struct peer_service *svc, const struct replica *r)
{
	const char *text;
	size_t len;
	unsigned nfiles, copies;
	uint64_t bytes = 0, mem, evictions;

	replica_id(r, &text, &len, &nfiles);
	for (unsigned i = 0; i < nfiles; i++)
		bytes += replica_file(r, i)->size;
	metrics_peer_add(METRIC_PEER_COPIES_RECEIVED, 1);
	metrics_peer_add(METRIC_PEER_BYTES_RECEIVED, bytes);
	replica_stats(svc->rs, &copies, &mem, &evictions);
	metrics_peer_set(METRIC_PEER_COPIES_HELD, copies);
	metrics_peer_set(METRIC_PEER_MEMORY_BYTES, mem);
	metrics_peer_set(METRIC_PEER_EVICTIONS, evictions);
}

/* Takes one message of a PUT's files into r: 0, or a code with err (the copy refused). */
static int peer_serve_msg(struct replica *r, uint64_t tag, const void *buf, size_t len,
			  unsigned *idx, char *err, size_t errlen)
{
	if (tag == PEER_FILE && len == sizeof(struct peer_file)) {
		struct peer_file f;
		memcpy(&f, buf, sizeof(f));
		if (!peer_str_ok(f.name, sizeof(f.name)))
			return err_set(err, errlen, -EPROTO, "a file name out of the protocol");
		return replica_in_file(r, f.name, f.size, idx, err, errlen);
	}
	if (tag == PEER_DATA)
		return replica_in_write(r, *idx, buf, len, err, errlen);
	if (tag == PEER_FILE_END && len == sizeof(struct peer_file_end)) {
		struct peer_file_end end;
		memcpy(&end, buf, sizeof(end));
		return replica_in_file_end(r, *idx, end.xxh3, err, errlen);
	}
	return err_set(err, errlen, -EPROTO, "a message out of the protocol");
}

/* Receives a PUT's files and PUT_END into r through a window of receives posted ahead
 * (peer_window.c), so the next pieces travel while one is checked and stored; 0 when all
 * arrived checked, a negative errno of the link (r to drop quietly), or 1 with *code and
 * err: the copy is refused, and what the peer still sent up to PUT_END was read and
 * dropped. */
static int peer_serve_files(struct peer_link *l, struct replica *r, int *code, char *err,
			    size_t errlen)
{
	struct peer_window *w;
	unsigned idx = 0;
	int bad = 0, rc = peer_window_open(l, 1, PEER_CHUNK, &w);

	while (rc == 0) {
		uint64_t tag;
		size_t len;
		void *buf;
		if ((rc = peer_window_recv(w, &tag, &buf, &len)) != 0 || tag == PEER_PUT_END)
			break;
		if (!bad && (*code = peer_serve_msg(r, tag, buf, len, &idx, err, errlen)) != 0)
			bad = 1;
	}
	if (rc == 0)
		return (rc = peer_window_end(w)) ? rc : bad;
	if (w)
		peer_window_end(w);
	return rc;
}

/* A PUT: the copy's identity and manifest, checked; its files; kept once whole. 0 to go on
 * serving, or a negative errno to close. */
static int peer_serve_put(struct peer_service *svc, struct peer_link *l,
			  const struct peer_ids *w)
{
	char err[512] = "", *manifest = NULL;
	struct replica *r = NULL;
	uint64_t tag;
	size_t len;
	int rc, code = 0;

	if (!peer_ids_ok(w) || (manifest = malloc(w->manifest_len)) == NULL)
		return -EPROTO;
	if ((rc = peer_recv(l, &tag, manifest, w->manifest_len, &len)) != 0 ||
	    tag != PEER_MANIFEST || len != w->manifest_len) {
		free(manifest);
		return rc ? rc : -EPROTO;
	}
	struct replica_id id = { w->owner, w->job, w->run, w->tag, w->dir, w->created_ns };
	/* A daemon places copies of its own files only: the owner it names is its address. */
	if (!peer_member_is(w->owner, peer_link_who(l))) {
		code = err_set(err, sizeof(err), -EACCES, "a copy of %s's files offered by %s: a "
			       "daemon places copies of its own files only", w->owner,
			       peer_link_who(l));
		atomic_fetch_add(&svc->refused, 1);
		log_warnx("peer %s: refused %s's copy of %s: not its owner", peer_link_who(l),
			  w->owner, w->tag);
	} else {
		code = replica_in_begin(svc->rs, &id, manifest, len, w->ranks, w->nranks, &r,
					err, sizeof(err));
	}
	free(manifest);
	if ((rc = peer_serve_result(l, code, err)) != 0 || code != 0) {
		replica_in_abort(r);
		return rc ? rc : 0;
	}
	rc = peer_serve_files(l, r, &code, err, sizeof(err));
	if (rc < 0) {
		log_warnx("peer %s: %s's copy of %s dropped: %s", peer_link_who(l), w->owner,
			  w->tag, strerror(-rc));
		replica_in_abort(r);
		return rc;
	}
	if (rc == 0 && (code = replica_in_commit(r, err, sizeof(err))) == 0) {
		atomic_fetch_add(&svc->copies_in, 1);
		peer_serve_count(svc, r);
		log_info("peer %s: kept %s's copy of %s (job %s)", peer_link_who(l), w->owner,
			 w->tag, w->job);
		return peer_serve_result(l, 0, "");
	}
	log_warnx("peer %s: %s", peer_link_who(l), err);
	replica_in_abort(r);
	return peer_serve_result(l, code, err);
}

/* Whether file f of a copy is of one of the n ranks. */
static int peer_rank_in(const struct manifest_file *f, const uint32_t *ranks, unsigned n)
{
	for (unsigned i = 0; i < n; i++)
		if (f->rank == ranks[i])
			return 1;
	return 0;
}

/* Sends the files of copy r of the HAVE's ranks, each checksummed as it goes, pipelined
 * through a window (peer_window.c): the next piece is read while those before travel. */
static int peer_serve_send(struct peer_link *l, struct replica *r, unsigned nfiles,
			   const struct peer_ids *q)
{
	XXH3_state_t *st = XXH3_createState();
	struct peer_window *w = NULL;
	int rc = st ? peer_window_open(l, 0, PEER_CHUNK, &w) : -ENOMEM, ended;

	for (unsigned i = 0; rc == 0 && i < nfiles; i++) {
		const struct manifest_file *mf = replica_file(r, i);
		struct peer_file f = { .size = mf->size };
		struct peer_file_end end;
		if (!peer_rank_in(mf, q->ranks, q->nranks))
			continue;
		snprintf(f.name, sizeof(f.name), "%s", mf->name);
		XXH3_64bits_reset(st);
		rc = peer_window_post(w, PEER_FILE, &f, sizeof(f));
		for (uint64_t off = 0; rc == 0 && off < f.size; off += PEER_CHUNK) {
			size_t n = f.size - off < PEER_CHUNK ? (size_t)(f.size - off) : PEER_CHUNK;
			void *buf;
			if ((rc = peer_window_next(w, &buf)) == 0 &&
			    (rc = peer_window_fail(w, replica_read(r, i, off, buf, n))) == 0) {
				XXH3_64bits_update(st, buf, n);
				rc = peer_window_send(w, PEER_DATA, n);
			}
		}
		end.xxh3 = XXH3_64bits_digest(st);
		if (rc == 0)
			rc = peer_window_post(w, PEER_FILE_END, &end, sizeof(end));
	}
	if (rc == 0)
		rc = peer_window_flush(w);
	if (w) {
		ended = peer_window_end(w);
		rc = rc ? rc : ended;
	}
	XXH3_freeState(st);
	return rc;
}

/* A FETCH: the newest copy of the job holding those ranks, or -ENOENT in HAVE. */
static int peer_serve_fetch(struct peer_service *svc, struct peer_link *l,
			    const struct peer_fetch *q, struct peer_ids *w)
{
	const char *manifest;
	struct replica *r;
	unsigned nfiles;
	size_t mlen;
	int rc;

	if (!peer_str_ok(q->job, sizeof(q->job)) || !peer_str_ok(q->tag, sizeof(q->tag)) ||
	    !peer_str_ok(q->owner, sizeof(q->owner)) || !peer_str_ok(q->run, sizeof(q->run)) ||
	    q->nranks > PEER_MAX_RANKS || (q->nranks == 0 && q->tag[0] == '\0'))
		return -EPROTO;
	memset(w, 0, sizeof(*w));
	r = q->tag[0] ? replica_find_copy(svc->rs, q->job, q->tag, q->owner, q->run,
					  q->created_ns) :
			replica_find(svc->rs, q->job, q->ranks, q->nranks);
	if (r == NULL) {
		w->code = -ENOENT;
		return peer_send(l, PEER_HAVE, w, sizeof(*w));
	}
	const struct replica_id *id = replica_id(r, &manifest, &mlen, &nfiles);
	/* A node its user told of (NODES) gets the ranks it names, not a whole copy. */
	if (!peer_member_of(id, peer_link_who(l)) &&
	    !(q->nranks > 0 && replica_uid(r) <= UINT32_MAX &&
	      peer_nodes_member(q->job, (uid_t)replica_uid(r), peer_link_who(l)))) {
		atomic_fetch_add(&svc->refused, 1);
		log_warnx("peer %s: refused a fetch of %s's copy of %s (job %s): not a node of the "
			  "job (neither its owner, nor a host of the tag's seal records here, nor a "
			  "node its user told of)", peer_link_who(l), id->owner, id->tag, id->job);
		replica_put(r);
		w->code = -EACCES;
		return peer_send(l, PEER_HAVE, w, sizeof(*w));
	}
	w->manifest_len = mlen;
	snprintf(w->owner, sizeof(w->owner), "%s", id->owner);
	snprintf(w->job, sizeof(w->job), "%s", id->job);
	snprintf(w->run, sizeof(w->run), "%s", id->run);
	snprintf(w->tag, sizeof(w->tag), "%s", id->tag);
	snprintf(w->dir, sizeof(w->dir), "%s", id->dir);
	w->created_ns = id->created_ns;
	for (unsigned i = 0; i < nfiles && w->nranks < PEER_MAX_RANKS; i++) {
		const struct manifest_file *mf = replica_file(r, i);
		if ((q->nranks == 0 || peer_rank_in(mf, q->ranks, q->nranks)) &&
		    !peer_rank_in(mf, w->ranks, w->nranks))  /* those asked that it holds */
			w->ranks[w->nranks++] = (uint32_t)mf->rank;
	}
	for (unsigned i = 0; i < nfiles; i++)
		w->nfiles += peer_rank_in(replica_file(r, i), w->ranks, w->nranks);
	if (w->nfiles == 0) {  /* none of the ranks asked for */
		replica_put(r);
		memset(w, 0, sizeof(*w));
		w->code = -ENOENT;
		return peer_send(l, PEER_HAVE, w, sizeof(*w));
	}
	if ((rc = peer_send(l, PEER_HAVE, w, sizeof(*w))) == 0 &&
	    (rc = peer_send(l, PEER_MANIFEST, manifest, w->manifest_len)) == 0)
		rc = peer_serve_send(l, r, nfiles, w);
	if (rc == 0)
		atomic_fetch_add(&svc->fetches, 1);
	replica_put(r);
	return rc;
}

/* The copies a LIST matched (of its uid's files), with their directories, before they are
 * sifted. */
#define SERVE_LIST_MAX 1024
struct serve_found {
	uint32_t want;                     /* the LIST's uid (PEER_ANY_UID: any) */
	unsigned n;
	struct peer_copy c[SERVE_LIST_MAX];
	char *dir[SERVE_LIST_MAX];
	uint64_t uid[SERVE_LIST_MAX];      /* whose files (the manifest's uid) */
};

/* replica_each_fn: one copy of the uid asked for into the found ones, while there is room
 * (under the store's lock: no name is resolved here). */
static void peer_serve_one(void *arg, const struct replica_id *id, unsigned nranks,
			   uint64_t uid)
{
	struct serve_found *f = arg;
	struct peer_copy *e = &f->c[f->n];
	uint32_t whose = uid < PEER_ANY_UID ? (uint32_t)uid : PEER_ANY_UID;

	if ((f->want != PEER_ANY_UID && whose != f->want) || f->n == SERVE_LIST_MAX ||
	    (f->dir[f->n] = strdup(id->dir)) == NULL)
		return;
	snprintf(e->owner, sizeof(e->owner), "%s", id->owner);
	snprintf(e->run, sizeof(e->run), "%s", id->run);
	snprintf(e->tag, sizeof(e->tag), "%s", id->tag);
	e->created_ns = id->created_ns;
	e->nranks = nranks;
	e->uid = whose;
	f->uid[f->n] = uid;
	f->n++;
}

/* Moves into c the found copies (at most PEER_LIST_MAX) whose job the daemon at who is a
 * node of (its owner, a host of the seal records of its directory, each directory read once,
 * or a node the copy's user told of job, each user asked once); how many were left out for
 * that. */
static unsigned peer_serve_sift(struct serve_found *f, const char *job, const char *who,
				struct peer_copies *c)
{
	int *in_dir = malloc(f->n * sizeof(*in_dir) + 1), *told = malloc(f->n * sizeof(*told) + 1);
	unsigned out = 0;

	for (unsigned i = 0; in_dir && told && i < f->n && c->n < PEER_LIST_MAX; i++) {
		unsigned k = 0, u = 0;
		while (k < i && strcmp(f->dir[k], f->dir[i]) != 0)
			k++;
		while (u < i && f->uid[u] != f->uid[i])
			u++;
		in_dir[i] = k < i ? in_dir[k] : peer_member_dir(f->dir[i], who);
		told[i] = u < i ? told[u] : f->uid[i] <= UINT32_MAX &&
				  peer_nodes_member(job, (uid_t)f->uid[i], who);
		if (in_dir[i] || told[i] || peer_member_is(f->c[i].owner, who))
			c->c[c->n++] = f->c[i];
		else
			out++;
	}
	free(told);
	free(in_dir);
	return out;
}

/* A LIST: the copies held of the job (of the tag) that the asking daemon may fetch, in
 * COPIES. */
static int peer_serve_list(struct peer_service *svc, struct peer_link *l,
			   const struct peer_list *q)
{
	struct peer_copies *c = calloc(1, sizeof(*c));
	struct serve_found *f = calloc(1, sizeof(*f));
	unsigned n;
	int rc = -ENOMEM;

	if (c == NULL || f == NULL)
		goto out;
	rc = -EPROTO;
	if (!peer_str_ok(q->job, sizeof(q->job)) || !peer_str_ok(q->tag, sizeof(q->tag)))
		goto out;
	f->want = q->uid;
	replica_list(svc->rs, q->job, q->tag, peer_serve_one, f);
	if ((n = peer_serve_sift(f, q->job, peer_link_who(l), c)) > 0)
		log_info("peer %s: %u copies of job %s held here not listed to it: not a node of "
			 "their job", peer_link_who(l), n, q->job);
	rc = peer_send(l, PEER_COPIES, c, sizeof(*c));
out:
	for (unsigned i = 0; f && i < f->n; i++)
		free(f->dir[i]);
	free(f);
	free(c);
	return rc;
}

/* peer_serve_fn: one connection, from the challenge until it closes or breaks the protocol. */
void peer_serve(void *arg, struct peer_link *l)
{
	struct peer_service *svc = arg;
	union {
		struct peer_ids put;
		struct peer_fetch fetch;
		struct peer_list list;
	} *msg = malloc(sizeof(*msg));
	struct peer_ids *w = malloc(sizeof(*w));
	uint64_t tag;
	size_t len;
	int rc;

	if (msg == NULL || w == NULL || peer_serve_auth(svc, l) != 0)
		goto out;
	while ((rc = peer_recv(l, &tag, msg, sizeof(*msg), &len)) == 0) {
		if (tag == PEER_PUT && len == sizeof(msg->put))
			rc = peer_serve_put(svc, l, &msg->put);
		else if (tag == PEER_FETCH && len == sizeof(msg->fetch))
			rc = peer_serve_fetch(svc, l, &msg->fetch, w);
		else if (tag == PEER_LIST && len == sizeof(msg->list))
			rc = peer_serve_list(svc, l, &msg->list);
		else
			rc = -EPROTO;
		if (rc != 0)
			break;
	}
	if (rc == -EPROTO)
		log_warnx("peer %s: closed: a message out of the protocol", peer_link_who(l));
out:
	free(w);
	free(msg);
}
