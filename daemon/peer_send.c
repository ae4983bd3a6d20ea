/*
 * peer_send.c — the connecting side of the peer protocol (peer_int.h): open a link to a peer
 * and prove membership both ways, send it a copy of this node's committed files (PUT), ask
 * it which copies of a job it holds (LIST) and for one of them or a job's newest copy of some
 * ranks (FETCH). Blocking calls on the caller's thread
 * (never the loop's), one link per thread. What a fetch brings is checked as a PUT's is, by
 * receiving it into a replica store (replica_store.c): nothing unchecked is handed on.
 *
 * The sending bandwidth cap (peer_max_mib_per_s) is a rate_cap.c bucket shared by every thread
 * that sends.
 */
#include "peer_int.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxh_x86dispatch.h>

/* Receives a RESULT; its code (the peer's word) with its message in err, or a negative errno
 * of the link. */
static int peer_result(struct peer_link *l, const char *what, char *err, size_t errlen)
{
	struct peer_result res;
	uint64_t tag;
	size_t len;
	int rc = peer_recv(l, &tag, &res, sizeof(res), &len);

	if (rc != 0) {
		snprintf(err, errlen, "peer %s: %s: %s", peer_link_who(l), what, strerror(-rc));
		return rc;
	}
	if (tag != PEER_RESULT || len != sizeof(res) || !peer_str_ok(res.msg, sizeof(res.msg)) ||
	    res.code > 0) {
		snprintf(err, errlen, "peer %s: %s: a reply out of the protocol", peer_link_who(l),
			 what);
		return -EPROTO;
	}
	if (res.code != 0)
		snprintf(err, errlen, "peer %s: %s: %s", peer_link_who(l), what,
			 res.msg[0] ? res.msg : strerror(-res.code));
	return res.code;
}

/* Connects to host:port and proves membership both ways with secret: the peer's proof is
 * checked before ours is sent. 0 with the link, or a negative errno with err (EACCES: the
 * peer does not hold the secret, or refused ours). */
int peer_open(struct peer_net *n, const char *host, unsigned port, const void *secret,
	      size_t slen, double timeout_s, struct peer_link **out, char *err, size_t errlen)
{
	struct peer_hello hello = { .magic = PEER_MAGIC, .version = PEER_VERSION };
	struct peer_challenge ch;
	struct peer_response resp;
	struct peer_link *l;
	uint64_t tag;
	size_t len;
	int rc;

	if ((rc = peer_connect(n, host, port, timeout_s, &l, err, errlen)) != 0)
		return rc;
	if ((rc = peer_auth_nonce(hello.nonce)) != 0 ||
	    (rc = peer_send(l, PEER_HELLO, &hello, sizeof(hello))) != 0 ||
	    (rc = peer_recv(l, &tag, &ch, sizeof(ch), &len)) != 0) {
		snprintf(err, errlen, "peer %s: %s", peer_link_who(l), strerror(-rc));
		goto fail;
	}
	if (tag != PEER_CHALLENGE || len != sizeof(ch)) {
		snprintf(err, errlen, "peer %s: not a dsckptd of this version", peer_link_who(l));
		rc = -EPROTO;
		goto fail;
	}
	rc = peer_auth_check(secret, slen, PEER_SERVER, hello.nonce, ch.nonce, ch.mac);
	if (rc != 0) {
		snprintf(err, errlen, "peer %s: does not hold the cluster's secret "
			 "(peer_secret_file)", peer_link_who(l));
		goto fail;
	}
	if ((rc = peer_auth_mac(secret, slen, PEER_CLIENT, hello.nonce, ch.nonce, resp.mac)) ||
	    (rc = peer_send(l, PEER_RESPONSE, &resp, sizeof(resp))) != 0) {
		snprintf(err, errlen, "peer %s: %s", peer_link_who(l), strerror(-rc));
		goto fail;
	}
	if ((rc = peer_result(l, "authentication", err, errlen)) != 0)
		goto fail;
	*out = l;
	return 0;

fail:
	peer_link_close(l);
	return rc;
}

/* Fills the wire's identity of a copy; -ENAMETOOLONG when a string does not fit. */
static int peer_ids_set(struct peer_ids *w, const struct replica_id *id, const unsigned *ranks,
			unsigned nranks, size_t manifest_len)
{
	memset(w, 0, sizeof(*w));
	if (nranks > PEER_MAX_RANKS ||
	    snprintf(w->owner, sizeof(w->owner), "%s", id->owner) >= (int)sizeof(w->owner) ||
	    snprintf(w->job, sizeof(w->job), "%s", id->job) >= (int)sizeof(w->job) ||
	    snprintf(w->run, sizeof(w->run), "%s", id->run) >= (int)sizeof(w->run) ||
	    snprintf(w->tag, sizeof(w->tag), "%s", id->tag) >= (int)sizeof(w->tag) ||
	    snprintf(w->dir, sizeof(w->dir), "%s", id->dir) >= (int)sizeof(w->dir))
		return -ENAMETOOLONG;
	w->created_ns = id->created_ns;
	w->manifest_len = manifest_len;
	w->nranks = nranks;
	for (unsigned i = 0; i < nranks; i++)
		w->ranks[i] = ranks[i];
	return 0;
}

/* Sends the nfiles files of a copy and PUT_END, each read through read(arg, i, off, buf,
 * len) in PEER_CHUNK pieces under cap, pipelined through a window (peer_window.c): the next
 * piece is read and hashed while those before travel. 0 or a negative errno with err. */
static int peer_put_files(struct peer_link *l, const struct manifest_file *const *files,
			  unsigned nfiles, peer_read_fn read, void *arg, struct rate_cap *cap,
			  char *err, size_t errlen)
{
	XXH3_state_t *st = XXH3_createState();
	struct peer_window *w = NULL;
	int rc = st ? peer_window_open(l, 0, PEER_CHUNK, &w) : -ENOMEM;
	const char *what = NULL;
	void *buf;

	for (unsigned i = 0; rc == 0 && i < nfiles; i++) {
		struct peer_file f = { .size = files[i]->size };
		struct peer_file_end end;
		snprintf(f.name, sizeof(f.name), "%s", files[i]->name);
		XXH3_64bits_reset(st);
		rc = peer_window_post(w, PEER_FILE, &f, sizeof(f));
		for (uint64_t off = 0; rc == 0 && off < f.size; off += PEER_CHUNK) {
			size_t n = f.size - off < PEER_CHUNK ? (size_t)(f.size - off) : PEER_CHUNK;
			if ((rc = peer_window_next(w, &buf)) != 0)
				break;
			if ((rc = read(arg, i, off, buf, n)) != 0) {
				what = files[i]->name;
				rc = peer_window_fail(w, rc);
				break;
			}
			XXH3_64bits_update(st, buf, n);
			rate_cap_take(cap, n);
			rc = peer_window_send(w, PEER_DATA, n);
		}
		end.xxh3 = XXH3_64bits_digest(st);
		if (rc == 0)
			rc = peer_window_post(w, PEER_FILE_END, &end, sizeof(end));
	}
	if (rc == 0 && (rc = peer_window_post(w, PEER_PUT_END, NULL, 0)) == 0)
		rc = peer_window_flush(w);
	if (w) {
		int ended = peer_window_end(w);
		rc = rc ? rc : ended;
	}
	XXH3_freeState(st);
	if (rc != 0 && what)
		snprintf(err, errlen, "reading %s: %s", what, strerror(-rc));
	else if (rc != 0)
		snprintf(err, errlen, "peer %s: %s", peer_link_who(l), strerror(-rc));
	return rc;
}

/* Sends a copy of a committed tag to the peer: its identity, the ranks it holds, the tag's
 * manifest text and the files (of those ranks, in order), read through read; 0 once the peer
 * checked and kept it all, else a negative errno with err. */
int peer_put(struct peer_link *l, const struct replica_id *id, const unsigned *ranks,
	     unsigned nranks, const char *manifest, size_t mlen,
	     const struct manifest_file *const *files, unsigned nfiles, peer_read_fn read,
	     void *arg, struct rate_cap *cap, char *err, size_t errlen)
{
	struct peer_ids *w = malloc(sizeof(*w));
	int rc = w ? 0 : -ENOMEM;

	if (rc == 0 && (rc = peer_ids_set(w, id, ranks, nranks, mlen)) != 0)
		snprintf(err, errlen, "a copy of %s: a name too long for the peer protocol",
			 id->tag);
	else if (rc == 0 && ((rc = peer_send(l, PEER_PUT, w, sizeof(*w))) != 0 ||
			     (rc = peer_send(l, PEER_MANIFEST, manifest, mlen)) != 0))
		snprintf(err, errlen, "peer %s: %s", peer_link_who(l), strerror(-rc));
	else if (rc == 0 && (rc = peer_result(l, "a copy refused", err, errlen)) == 0 &&
		 (rc = peer_put_files(l, files, nfiles, read, arg, cap, err, errlen)) == 0)
		rc = peer_result(l, "the copy", err, errlen);
	free(w);
	return rc;
}

/* Receives the files a HAVE announced into the incoming copy r through a window of
 * receives posted ahead (peer_window.c); 0 or a negative errno with err. */
static int peer_fetch_files(struct peer_link *l, struct replica *r, unsigned nfiles,
			    char *err, size_t errlen)
{
	struct peer_window *w = NULL;
	int rc = peer_window_open(l, 1, PEER_CHUNK, &w), checked = 0, ended;

	for (unsigned i = 0; rc == 0 && i < nfiles; i++) {
		struct peer_file f;
		struct peer_file_end end;
		unsigned idx = 0;
		uint64_t tag;
		size_t len;
		void *buf;
		if ((rc = peer_window_recv(w, &tag, &buf, &len)) == 0 &&
		    (tag != PEER_FILE || len != sizeof(f) ||
		     !peer_str_ok(((struct peer_file *)buf)->name, sizeof(f.name))))
			rc = -EPROTO;
		if (rc == 0) {
			memcpy(&f, buf, sizeof(f));
			checked = (rc = replica_in_file(r, f.name, f.size, &idx, err, errlen)) != 0;
		}
		for (uint64_t got = 0; rc == 0 && got < f.size; got += len) {
			rc = peer_window_recv(w, &tag, &buf, &len);
			if (rc == 0 && (tag != PEER_DATA || len == 0 || len > f.size - got))
				rc = -EPROTO;
			if (rc == 0)
				checked = (rc = replica_in_write(r, idx, buf, len, err, errlen)) != 0;
		}
		if (rc == 0 && (rc = peer_window_recv(w, &tag, &buf, &len)) == 0 &&
		    (tag != PEER_FILE_END || len != sizeof(end)))
			rc = -EPROTO;
		if (rc == 0) {
			memcpy(&end, buf, sizeof(end));
			checked = (rc = replica_in_file_end(r, idx, end.xxh3, err, errlen)) != 0;
		}
	}
	if (w) {
		if (rc != 0)
			peer_window_fail(w, rc);
		ended = peer_window_end(w);
		rc = rc ? rc : ended;
	}
	if (rc != 0 && !checked)
		snprintf(err, errlen, "peer %s: %s", peer_link_who(l), strerror(-rc));
	return rc;
}

/* Sends fetch q and receives the copy it names into the store into, checked as a PUT's copy
 * is: 0 with the copy (a reference, for replica_put), -ENOENT when the peer holds none, or a
 * negative errno with err. */
static int peer_fetch_q(struct peer_link *l, const struct peer_fetch *q,
			struct replica_store *into, struct replica **out, char *err, size_t errlen)
{
	struct peer_ids *w = malloc(sizeof(*w));
	char *manifest = NULL;
	struct replica *r = NULL;
	uint64_t tag;
	size_t len;
	int rc = w ? 0 : -ENOMEM;

	if (rc == 0 && (rc = peer_send(l, PEER_FETCH, q, sizeof(*q))) == 0 &&
	    (rc = peer_recv(l, &tag, w, sizeof(*w), &len)) == 0 &&
	    (tag != PEER_HAVE || len != sizeof(*w) || w->code > 0 || w->nranks > PEER_MAX_RANKS ||
	     w->manifest_len > PEER_MAX_MANIFEST || !peer_str_ok(w->owner, sizeof(w->owner)) ||
	     !peer_str_ok(w->job, sizeof(w->job)) || !peer_str_ok(w->run, sizeof(w->run)) ||
	     !peer_str_ok(w->tag, sizeof(w->tag)) || !peer_str_ok(w->dir, sizeof(w->dir))))
		rc = -EPROTO;
	if (rc == 0 && w->code != 0) {
		rc = w->code;
		snprintf(err, errlen, "peer %s holds no copy of job %s%s%s", peer_link_who(l),
			 q->job, q->tag[0] ? " tag " : " with those ranks", q->tag);
		goto out;
	}
	if (rc == 0 && q->tag[0] &&
	    (strcmp(w->tag, q->tag) != 0 || strcmp(w->owner, q->owner) != 0 ||
	     strcmp(w->run, q->run) != 0 || w->created_ns != q->created_ns))
		rc = -EPROTO;  /* not the copy asked for */
	if (rc == 0 && (manifest = malloc(w->manifest_len + 1)) == NULL)
		rc = -ENOMEM;
	if (rc == 0 && (rc = peer_recv(l, &tag, manifest, w->manifest_len, &len)) == 0 &&
	    (tag != PEER_MANIFEST || len != w->manifest_len))
		rc = -EPROTO;
	if (rc != 0) {
		snprintf(err, errlen, "peer %s: fetch: %s", peer_link_who(l), strerror(-rc));
		goto out;
	}
	struct replica_id id = { w->owner, w->job, w->run, w->tag, w->dir, w->created_ns };
	if ((rc = replica_in_begin(into, &id, manifest, len, w->ranks, w->nranks, &r, err,
				   errlen)) != 0 ||
	    (rc = peer_fetch_files(l, r, w->nfiles, err, errlen)) != 0 ||
	    (rc = replica_in_commit(r, err, errlen)) != 0) {
		replica_in_abort(r);
		goto out;
	}
	replica_hold(r);
	*out = r;
out:
	free(manifest);
	free(w);
	return rc;
}

/* Asks the peer for the newest copy it holds of job with a file of each of the n ranks (see
 * peer_fetch_q). */
int peer_fetch(struct peer_link *l, const char *job, const unsigned *ranks, unsigned n,
	       struct replica_store *into, struct replica **out, char *err, size_t errlen)
{
	struct peer_fetch *q = calloc(1, sizeof(*q));
	int rc = q ? 0 : -ENOMEM;

	if (rc == 0 && (n == 0 || n > PEER_MAX_RANKS ||
			snprintf(q->job, sizeof(q->job), "%s", job) >= (int)sizeof(q->job)))
		rc = -EINVAL;
	for (unsigned i = 0; rc == 0 && i < n; i++)
		q->ranks[i] = ranks[i];
	if (rc == 0) {
		q->nranks = n;
		rc = peer_fetch_q(l, q, into, out, err, errlen);
	} else {
		snprintf(err, errlen, "fetch: %s", strerror(-rc));
	}
	free(q);
	return rc;
}

/* Asks the peer for owner's copy of job's tag of run and commit time created_ns, the files
 * of the n ranks (0: every rank of it) (see peer_fetch_q). */
int peer_fetch_copy(struct peer_link *l, const char *job, const char *tag, const char *owner,
		    const char *run, uint64_t created_ns, const unsigned *ranks, unsigned n,
		    struct replica_store *into, struct replica **out, char *err, size_t errlen)
{
	struct peer_fetch *q = calloc(1, sizeof(*q));
	int rc = q ? 0 : -ENOMEM;

	if (rc == 0 && (snprintf(q->job, sizeof(q->job), "%s", job) >= (int)sizeof(q->job) ||
			snprintf(q->tag, sizeof(q->tag), "%s", tag) >= (int)sizeof(q->tag) ||
			!tag[0] || n > PEER_MAX_RANKS ||
			snprintf(q->owner, sizeof(q->owner), "%s", owner) >=
				(int)sizeof(q->owner) ||
			snprintf(q->run, sizeof(q->run), "%s", run) >= (int)sizeof(q->run)))
		rc = -EINVAL;
	if (rc == 0) {
		q->created_ns = created_ns;
		q->nranks = n;
		for (unsigned i = 0; i < n; i++)
			q->ranks[i] = ranks[i];
		rc = peer_fetch_q(l, q, into, out, err, errlen);
	} else {
		snprintf(err, errlen, "fetch: %s", strerror(-rc));
	}
	free(q);
	return rc;
}

/* Asks the peer which copies of job (of tag; "": any) of uid's files (PEER_ANY_UID: any
 * user's) it holds, into *c; 0 or a negative errno with err. */
int peer_list(struct peer_link *l, const char *job, const char *tag, uint32_t uid,
	      struct peer_copies *c, char *err, size_t errlen)
{
	struct peer_list q;
	uint64_t type;
	size_t len;
	int rc = 0;

	memset(&q, 0, sizeof(q));
	if (snprintf(q.job, sizeof(q.job), "%s", job) >= (int)sizeof(q.job) ||
	    snprintf(q.tag, sizeof(q.tag), "%s", tag) >= (int)sizeof(q.tag))
		rc = -EINVAL;
	q.uid = uid;
	if (rc == 0 && (rc = peer_send(l, PEER_LIST, &q, sizeof(q))) == 0 &&
	    (rc = peer_recv(l, &type, c, sizeof(*c), &len)) == 0 &&
	    (type != PEER_COPIES || len != sizeof(*c) || c->n > PEER_LIST_MAX))
		rc = -EPROTO;
	for (unsigned i = 0; rc == 0 && i < c->n; i++)
		if (!peer_str_ok(c->c[i].owner, sizeof(c->c[i].owner)) ||
		    !peer_str_ok(c->c[i].run, sizeof(c->c[i].run)) ||
		    !peer_str_ok(c->c[i].tag, sizeof(c->c[i].tag)) ||
		    (uid != PEER_ANY_UID && c->c[i].uid != uid))
			rc = -EPROTO;
	if (rc != 0)
		snprintf(err, errlen, "peer %s: list: %s", peer_link_who(l), strerror(-rc));
	return rc;
}
