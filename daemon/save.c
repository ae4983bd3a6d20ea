/*
 * save.c — saves and their levels (ACCEPTED → SNAPSHOT → DURABLE → COMMITTED, or FAILED),
 * waiters, commits and the PENDING listing. Everything here runs on the loop thread.
 *
 * A save is owned by the registry from SAVE_BEGIN until it is forgotten: a minute after its
 * last change once finished, or at once when its client leaves before SAVE_END. From SAVE_END
 * to its final event its job belongs to the engine; the save keeps only the handle.
 */
#include "dsckptd.h"
#include "../proto/proto.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>
#include <xxhash.h>

#define LINGER_S 60.0          /* finished saves stay listed this long */
#define MAX_BLOB_BYTES (1ull << 30)

/* A tensor as the client described it. */
struct tensor_in {
	char *name;
	char dtype[16];
	uint64_t shape[PROTO_MAX_DIMS];
	unsigned ndim;
	uint64_t nbytes;
	struct source *src;   /* reference held until SAVE_END hands it to the engine */
	uint64_t off;
};

/* A named blob, appended piecewise. */
struct blob {
	char *name;
	uint8_t *data;
	size_t len;
};

/* A WAIT in progress. */
struct waiter {
	struct conn *conn;
	uint64_t req;
	int level;
	struct save *save;
	uv_timer_t timer;
	struct waiter *next;
};

/* A COMMIT in progress (waiting for durability, then in the threadpool). */
struct commit {
	struct conn *conn;    /* NULL once the client left */
	uint64_t req;
	char dir[PROTO_MAX_STR + 1];
	unsigned world;
	uid_t uid;
	gid_t gid;
	int running;          /* in the threadpool */
	int rc;
	char err[ERRLEN];
	struct store_commit_info info;
	uv_timer_t timer;
	uv_work_t work;
	struct commit *next;
};

struct save {
	uint64_t id;
	uint64_t client;
	struct conn *conn;    /* NULL once the client left */
	pid_t pid;
	uid_t uid;
	gid_t gid;
	char jobname[PROTO_MAX_NAME + 1];
	unsigned rank, world;
	char dir[PROTO_MAX_STR + 1];
	char file[129];
	int dirfd;
	struct store_root root;  /* the allowed root dirfd was opened under */
	int level;
	char error[ERRLEN];
	struct tensor_in *t;
	size_t n, cap;
	uint32_t *names;         /* open-addressing set of tensor indexes + 1, by name */
	size_t names_cap;        /* a power of two, at least twice n */
	uint64_t bytes;
	uint64_t hdr_bytes;      /* at most this much header for the tensors so far */
	struct blob *b;
	size_t nb;
	uint64_t blob_bytes;     /* charged to uid as QUOTA_BLOB until DURABLE or FAILED */
	int counted;             /* one QUOTA_SAVES charged to uid until DURABLE or FAILED */
	struct job *job;
	struct st_tensor *st;    /* the header's description, lent to the job */
	const char *meta[16];    /* __metadata__ pairs, lent to the job */
	char rank_str[16], world_str[16];
	char meta_size[24];      /* the .meta file's size, recorded in the header */
	char meta_xxh3[17];      /* its checksum, filled in by the flush thread */
	uint64_t snap, flushed;  /* final counts, once the job is gone */
	double t_accept, t_change;
	struct waiter *waiters;
	struct save *next;
};

static struct save *saves;
static struct commit *commits;
static uint64_t next_save_id = 1;
static uv_timer_t *gc_timer;

static void commits_check(void);

/* Gives back what the save holds of its user's limits (at DURABLE or FAILED, or when it is
 * forgotten before that). */
static void save_uncharge(struct save *s)
{
	quota_give(s->uid, QUOTA_BLOB, s->blob_bytes);
	s->blob_bytes = 0;
	if (s->counted)
		quota_give(s->uid, QUOTA_SAVES, 1);
	s->counted = 0;
}

/* Frees the blobs (packed into the .meta file's bytes at SAVE_END). */
static void save_free_blobs(struct save *s)
{
	for (size_t i = 0; i < s->nb; i++) {
		free(s->b[i].name);
		free(s->b[i].data);
	}
	free(s->b);
	s->b = NULL;
	s->nb = 0;
}

/* Frees a save's client-side description. */
static void save_free(struct save *s)
{
	save_uncharge(s);
	for (size_t i = 0; i < s->n; i++) {
		free(s->t[i].name);
		if (s->t[i].src)
			source_unref(s->t[i].src);
	}
	free(s->t);
	free(s->names);
	save_free_blobs(s);
	if (s->dirfd >= 0)
		close(s->dirfd);
	if (s->job)
		engine_job_free(s->job);
	free(s->st);
	free(s);
}

/* Unlinks and frees a save. */
static void save_forget(struct save *s)
{
	for (struct save **p = &saves; *p; p = &(*p)->next) {
		if (*p == s) {
			*p = s->next;
			break;
		}
	}
	save_free(s);
}

/* Abandons a save still open for adding. */
void save_drop(struct save *s)
{
	save_forget(s);
}

/* Drops finished saves nobody waits on after LINGER_S. */
static void on_gc(uv_timer_t *t)
{
	double now = now_mono();
	struct save *s = saves, *next;

	for (; s; s = next) {
		next = s->next;
		int done = s->level == LEVEL_FAILED || s->level >= LEVEL_DURABLE;
		if (done && !s->waiters && now - s->t_change > LINGER_S)
			save_forget(s);
	}
}

/* Frees a closed waiter (its timer's data). */
static void waiter_closed(uv_handle_t *h)
{
	free(h->data);
}

/* Frees a closed handle that was malloc'd on its own. */
static void handle_free(uv_handle_t *h)
{
	free(h);
}

/* Packs the WAIT reply for s. */
static void send_state(struct conn *c, uint64_t req, struct save *s)
{
	struct proto_out o;
	uint64_t snap = s->snap, flushed = s->flushed;

	if (s->job)
		engine_progress(s->job, &snap, &flushed);
	proto_out_init(&o, PROTO_REPLY, req);
	msgpack_pack_map(&o.pk, s->level == LEVEL_FAILED ? 6 : 5);
	proto_kv_u64(&o.pk, "save", s->id);
	proto_kv_i64(&o.pk, "level", s->level);
	proto_kv_u64(&o.pk, "bytes_total", s->bytes);
	proto_kv_u64(&o.pk, "bytes_snapshot", snap);
	proto_kv_u64(&o.pk, "bytes_flushed", flushed);
	if (s->level == LEVEL_FAILED)
		proto_kv_str(&o.pk, "error", s->error);
	conn_send(c, &o);
}

/* Answers and removes a waiter. */
static void waiter_finish(struct waiter *w, int reply)
{
	struct save *s = w->save;

	for (struct waiter **p = &s->waiters; *p; p = &(*p)->next) {
		if (*p == w) {
			*p = w->next;
			break;
		}
	}
	if (reply && w->conn)
		send_state(w->conn, w->req, s);
	uv_timer_stop(&w->timer);
	uv_close((uv_handle_t *)&w->timer, waiter_closed);
}

/* Answers every waiter of s whose level is reached (or all, on failure). */
static void wake(struct save *s)
{
	struct waiter *w = s->waiters, *next;

	for (; w; w = next) {
		next = w->next;
		if (s->level == LEVEL_FAILED || s->level >= w->level)
			waiter_finish(w, 1);
	}
}

/* Moves s to level (or FAILED with error) and tells whoever waits. */
static void set_level(struct save *s, int level, const char *error)
{
	if (s->level == LEVEL_FAILED)
		return;
	s->level = level;
	s->t_change = now_mono();
	if (level == LEVEL_FAILED || level >= LEVEL_DURABLE)
		save_uncharge(s);
	if (level == LEVEL_FAILED) {
		snprintf(s->error, sizeof(s->error), "%s", error ? error : "unknown error");
		log_warnx("save %llu (%s/%s, rank %u) failed: %s", (unsigned long long)s->id,
			  s->dir, s->file, s->rank, s->error);
	} else {
		log_debug("save %llu (%s/%s) %s", (unsigned long long)s->id, s->dir, s->file,
			  level_name(level));
	}
	wake(s);
	commits_check();
}

/* Engine events, on the loop thread. */
static void on_engine(void *owner, struct job *j, int event, int code, const char *error)
{
	struct save *s = owner;

	switch (event) {
	case ENGINE_SNAPSHOT:
		engine_release_sources(j);	/* a source its client let go of closes now */
		if (s->level == LEVEL_ACCEPTED)
			set_level(s, LEVEL_SNAPSHOT, NULL);
		return;
	case ENGINE_DURABLE:
	case ENGINE_FAILED:
		engine_progress(j, &s->snap, &s->flushed);
		s->job = NULL;
		engine_job_free(j);
		if (event == ENGINE_DURABLE) {
			log_info("save %llu durable: %s/%s.safetensors, %llu bytes in %.3f s",
				 (unsigned long long)s->id, s->dir, s->file,
				 (unsigned long long)s->bytes, now_mono() - s->t_accept);
			set_level(s, LEVEL_DURABLE, NULL);
		} else {
			set_level(s, LEVEL_FAILED, error);
		}
		daemon_maybe_exit();
		return;
	}
}

/* Starts the engine with this module's event handler and the forget timer. */
int save_engine_start(char *err, size_t errlen)
{
	gc_timer = malloc(sizeof(*gc_timer));
	if (!gc_timer) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	uv_timer_init(loop, gc_timer);
	uv_timer_start(gc_timer, on_gc, 10000, 10000);
	uv_unref((uv_handle_t *)gc_timer);
	return engine_start(cache, config->copy_threads, config->flush_threads, on_engine, err,
			    errlen);
}

/* Whether name is a plain file name we accept. */
static int valid_file(const char *f)
{
	size_t n = strlen(f);
	if (n == 0 || n > 128 || f[0] == '.')
		return 0;
	for (size_t i = 0; i < n; i++) {
		char ch = f[i];
		if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
		      (ch >= '0' && ch <= '9') || ch == '.' || ch == '_' || ch == '-'))
			return 0;
	}
	return 1;
}

/* Copies dir without trailing slashes (so "a/b/" and "a/b" name one checkpoint). */
static void norm_dir(char *out, size_t len, const char *dir)
{
	snprintf(out, len, "%s", dir);
	size_t n = strlen(out);
	while (n > 1 && out[n - 1] == '/')
		out[--n] = 0;
}

/* Opens a save for a client. */
int64_t save_begin(struct conn *c, const char *dir, const char *file, char *err,
		   size_t errlen)
{
	char d[PROTO_MAX_STR + 1];

	if (conn_role(c) != CONN_TRAINER) {
		return seterr(err, errlen, ERR_ESTATE, "only an identified trainer may save");
	}
	if (!valid_file(file)) {
		snprintf(err, errlen,
			 "file name '%s' must be 1-128 characters of [A-Za-z0-9._-], not "
			 "starting with '.'", file);
		return ERR_EINVAL;
	}
	norm_dir(d, sizeof(d), dir);
	for (struct save *s = saves; s; s = s->next) {
		int busy = s->level == LEVEL_NONE || s->level == LEVEL_ACCEPTED ||
			   s->level == LEVEL_SNAPSHOT;
		if (busy && strcmp(s->dir, d) == 0 && strcmp(s->file, file) == 0) {
			return seterr(err, errlen, ERR_EBUSY,
				      "%s/%s is already being saved (save %llu)", d, file,
				      (unsigned long long)s->id);
		}
	}
	int rc = quota_take(conn_uid(c), QUOTA_SAVES, 1, err, errlen);
	if (rc < 0)
		return rc;
	struct store_root root;
	int fd = store_open_dir(config, d, conn_uid(c), conn_gid(c), &root, err, errlen);
	if (fd < 0) {
		quota_give(conn_uid(c), QUOTA_SAVES, 1);
		return fd;
	}
	struct save *s = calloc(1, sizeof(*s));
	if (!s) {
		quota_give(conn_uid(c), QUOTA_SAVES, 1);
		close(fd);
		return seterr(err, errlen, ERR_ENOMEM, "out of memory");
	}
	s->counted = 1;
	s->id = next_save_id++;
	s->client = conn_id(c);
	s->conn = c;
	s->pid = conn_pid(c);
	s->uid = conn_uid(c);
	s->gid = conn_gid(c);
	snprintf(s->jobname, sizeof(s->jobname), "%s", conn_job(c));
	s->rank = conn_rank(c);
	s->world = conn_world(c);
	snprintf(s->dir, sizeof(s->dir), "%s", d);
	snprintf(s->file, sizeof(s->file), "%s", file);
	s->dirfd = fd;
	s->root = root;
	s->t_change = now_mono();
	s->next = saves;
	saves = s;
	return (int64_t)s->id;
}

/* Finds a save of this connection by id. */
struct save *save_find(struct conn *c, uint64_t id)
{
	for (struct save *s = saves; s; s = s->next)
		if (s->id == id && s->client == conn_id(c))
			return s;
	return NULL;
}

/* Finds a save of this connection still open for adding. */
struct save *save_find_open(struct conn *c, uint64_t id)
{
	struct save *s = save_find(c, id);
	return s && s->level == LEVEL_NONE ? s : NULL;
}

/* Slot of name in the set: where it is, or the empty slot where it would go. */
static size_t name_slot(const struct save *s, const char *name)
{
	size_t mask = s->names_cap - 1;
	size_t i = XXH3_64bits(name, strlen(name)) & mask;

	while (s->names[i] && strcmp(s->t[s->names[i] - 1].name, name) != 0)
		i = (i + 1) & mask;
	return i;
}

/* Grows the name set to hold at least twice n + 1 names; -1 when out of memory. */
static int names_grow(struct save *s)
{
	if (2 * (s->n + 1) <= s->names_cap)
		return 0;
	size_t cap = s->names_cap ? s->names_cap * 2 : 256;
	uint32_t *old = s->names;
	if (!(s->names = calloc(cap, sizeof(*s->names)))) {
		s->names = old;
		return -1;
	}
	s->names_cap = cap;
	for (size_t i = 0; i < s->n; i++)
		s->names[name_slot(s, s->t[i].name)] = (uint32_t)i + 1;
	free(old);
	return 0;
}

/* Adds a tensor to an open save. */
int save_add_tensor(struct save *s, const char *name, const char *dtype,
		    const uint64_t *shape, unsigned ndim, struct source *src, uint64_t off,
		    uint64_t nbytes, char *err, size_t errlen)
{
	unsigned esize = dtype_size(dtype);
	uint64_t count = 1;

	if (!*name) {
		return seterr(err, errlen, ERR_EINVAL, "tensor with an empty name");
	}
	if (esize == 0) {
		return seterr(err, errlen, ERR_EINVAL, "tensor '%s': unknown dtype '%s'",
			      name, dtype);
	}
	for (unsigned i = 0; i < ndim; i++) {
		if (shape[i] && count > UINT64_MAX / shape[i]) {
			return seterr(err, errlen, ERR_ERANGE, "tensor '%s': shape overflows",
				      name);
		}
		count *= shape[i];
	}
	if (count > UINT64_MAX / esize || count * esize != nbytes) {
		return seterr(err, errlen, ERR_EINVAL,
			      "tensor '%s': nbytes %llu does not match its shape and dtype", name,
			      (unsigned long long)nbytes);
	}
	if (!source_complete(src)) {
		return seterr(err, errlen, ERR_ESTATE,
			      "tensor '%s': its region is not fully mapped yet", name);
	}
	if (off > source_size(src) || nbytes > source_size(src) - off) {
		snprintf(err, errlen,
			 "tensor '%s': bytes [%llu, +%llu) lie outside its %llu-byte region", name,
			 (unsigned long long)off, (unsigned long long)nbytes,
			 (unsigned long long)source_size(src));
		return ERR_ERANGE;
	}
	if (s->n >= config->max_tensors_per_save) {
		return seterr(err, errlen, ERR_ELIMIT, "tensor '%s': a save holds at most "
			      "max_tensors_per_save (%u) tensors", name,
			      config->max_tensors_per_save);
	}
	uint64_t hdr = st_tensor_header_bytes(name, dtype, ndim);
	if (s->hdr_bytes + hdr > ST_MAX_HEADER - ST_HEADER_FIXED) {
		return seterr(err, errlen, ERR_ELIMIT, "tensor '%s': the file's header would "
			      "exceed safetensors' %u-byte limit (%zu tensors so far)", name,
			      ST_MAX_HEADER, s->n);
	}
	if (names_grow(s) < 0)
		return seterr(err, errlen, ERR_ENOMEM, "out of memory");
	size_t slot = name_slot(s, name);
	if (s->names[slot])
		return seterr(err, errlen, ERR_EINVAL, "tensor '%s' is named twice", name);
	if (s->n == s->cap) {
		size_t cap = s->cap ? s->cap * 2 : 64;
		struct tensor_in *t = realloc(s->t, cap * sizeof(*t));
		if (!t) {
			return seterr(err, errlen, ERR_ENOMEM, "out of memory");
		}
		s->t = t;
		s->cap = cap;
	}
	struct tensor_in *t = &s->t[s->n];
	memset(t, 0, sizeof(*t));
	t->name = strdup(name);
	if (!t->name) {
		return seterr(err, errlen, ERR_ENOMEM, "out of memory");
	}
	snprintf(t->dtype, sizeof(t->dtype), "%s", dtype);
	memcpy(t->shape, shape, ndim * sizeof(*shape));
	t->ndim = ndim;
	t->nbytes = nbytes;
	t->off = off;
	t->src = src;
	source_ref(src);
	s->names[slot] = (uint32_t)s->n + 1;
	s->n++;
	s->bytes += nbytes;
	s->hdr_bytes += hdr;
	return 0;
}

/* Appends to a named blob. */
int save_add_blob(struct save *s, const char *name, const void *data, size_t len, char *err,
		  size_t errlen)
{
	struct blob *b = NULL;
	uint64_t total = len;

	for (size_t i = 0; i < s->nb; i++) {
		total += s->b[i].len;
		if (strcmp(s->b[i].name, name) == 0)
			b = &s->b[i];
	}
	if (!*name) {
		return seterr(err, errlen, ERR_EINVAL, "blob with an empty name");
	}
	if (total > MAX_BLOB_BYTES) {
		return seterr(err, errlen, ERR_ERANGE, "blobs of one save exceed %llu bytes",
			 (unsigned long long)MAX_BLOB_BYTES);
	}
	int rc = quota_take(s->uid, QUOTA_BLOB, len, err, errlen);
	if (rc < 0)
		return rc;
	s->blob_bytes += len;
	if (!b) {
		struct blob *nb = realloc(s->b, (s->nb + 1) * sizeof(*nb));
		if (!nb) {
			return seterr(err, errlen, ERR_ENOMEM, "out of memory");
		}
		s->b = nb;
		b = &s->b[s->nb];
		memset(b, 0, sizeof(*b));
		if (!(b->name = strdup(name))) {
			return seterr(err, errlen, ERR_ENOMEM, "out of memory");
		}
		s->nb++;
	}
	uint8_t *d = realloc(b->data, b->len + len + 1);
	if (!d) {
		return seterr(err, errlen, ERR_ENOMEM, "out of memory");
	}
	memcpy(d + b->len, data, len);
	b->data = d;
	b->len += len;
	return 0;
}

/* Totals so far. */
void save_totals(struct save *s, uint64_t *tensors, uint64_t *bytes)
{
	*tensors = s->n;
	*bytes = s->bytes;
}

/* Packs the blobs as the .meta file: a msgpack map name → bin. */
static int pack_meta(struct save *s, uint8_t **out, size_t *len)
{
	msgpack_sbuffer sb;
	msgpack_packer pk;

	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	msgpack_pack_map(&pk, s->nb);
	for (size_t i = 0; i < s->nb; i++) {
		proto_str(&pk, s->b[i].name);
		msgpack_pack_bin(&pk, s->b[i].len);
		msgpack_pack_bin_body(&pk, s->b[i].data, s->b[i].len);
	}
	*out = (uint8_t *)sb.data;
	*len = sb.size;
	return sb.data ? 0 : -1;
}

/* Plans the file and submits it to the engine; the header is laid out by a flush thread. */
int save_end(struct save *s, struct cuda_fence *fence, char *err, size_t errlen)
{
	struct engine_req r = {.n = s->n, .dirfd = -1, .uid = s->uid, .gid = s->gid,
			       .mode = config->file_mode, .root = s->root, .fence = fence,
			       .owner = s};
	char name[160];
	int rc = ERR_ENOMEM;

	if ((rc = store_dir_within(s->dirfd, &s->root, err, errlen)) < 0)
		goto fail;
	rc = ERR_ENOMEM;
	snprintf(s->rank_str, sizeof(s->rank_str), "%u", s->rank);
	snprintf(s->world_str, sizeof(s->world_str), "%u", s->world);
	if (s->nb > 0) {
		snprintf(name, sizeof(name), "%s.meta", s->file);
		if (!(r.meta_name = strdup(name)) || pack_meta(s, &r.meta_bytes, &r.meta_len) < 0) {
			seterr(err, errlen, rc, "out of memory");
			goto fail;
		}
		snprintf(s->meta_size, sizeof(s->meta_size), "%zu", r.meta_len);
		r.meta_xxh3 = s->meta_xxh3;
	}
	/* The .meta file's size and checksum travel in the header: a commit checks the file
	 * against them instead of hashing whatever a client left in its place. */
	const char *meta[] = {"format", "pt", "dsckpt.version", DSCKPTD_VERSION,
			      "dsckpt.job", s->jobname, "dsckpt.rank", s->rank_str,
			      "dsckpt.world", s->world_str, "dsckpt.host", store_host(),
			      "dsckpt.meta_size", s->meta_size, "dsckpt.meta_xxh3", s->meta_xxh3};
	_Static_assert(sizeof(meta) == sizeof(s->meta), "struct save's meta holds these pairs");
	memcpy(s->meta, meta, sizeof(meta));
	s->st = calloc(s->n ? s->n : 1, sizeof(*s->st));
	r.t = calloc(s->n ? s->n : 1, sizeof(*r.t));
	if (!s->st || !r.t) {
		seterr(err, errlen, rc, "out of memory");
		goto fail;
	}
	uint64_t off = 0;
	for (size_t i = 0; i < s->n; i++) {
		s->st[i] = (struct st_tensor){s->t[i].name, s->t[i].dtype, s->t[i].shape,
					      s->t[i].ndim, s->t[i].nbytes};
		r.t[i] = (struct engine_tensor){off, s->t[i].nbytes, s->t[i].src, s->t[i].off};
		off += s->t[i].nbytes;
	}
	r.st = s->st;
	r.meta = s->meta;
	r.nmeta = (sizeof(meta) / sizeof(meta[0])) / 2 - (s->meta_size[0] ? 0 : 2);
	snprintf(name, sizeof(name), "%s.safetensors", s->file);
	rc = store_file_create(s->dirfd, name, s->uid, s->gid, config->file_mode,
			       config->o_direct, &r.file, err, errlen);
	if (rc < 0)
		goto fail;
	r.dirfd = s->dirfd;
	if ((rc = engine_submit(&r, &s->job, err, errlen)) < 0) {
		store_file_abort(r.file);
		goto fail;
	}
	/* Ownership: sources, file, directory and fence went to the engine. */
	for (size_t i = 0; i < s->n; i++)
		s->t[i].src = NULL;
	s->dirfd = -1;
	s->t_accept = now_mono();
	s->level = LEVEL_ACCEPTED;
	s->t_change = s->t_accept;
	save_free_blobs(s);	/* their bytes went to the engine as the .meta file's */
	log_debug("save %llu accepted: %s/%s, %zu tensors, %llu bytes",
		  (unsigned long long)s->id, s->dir, s->file, s->n,
		  (unsigned long long)s->bytes);
	return 0;
fail:
	if (fence)
		cuda_fence_free(fence);
	free(s->st);
	s->st = NULL;
	free(r.t);
	free(r.meta_name);
	free(r.meta_bytes);
	return rc;
}

/* Fires when a WAIT's time is up: answers with the level reached so far. */
static void on_wait_timeout(uv_timer_t *t)
{
	waiter_finish(t->data, 1);
}

/* Answers a WAIT now or later. */
void save_wait(struct conn *c, uint64_t req, struct save *s, int level, int64_t timeout_ms)
{
	if (s->level == LEVEL_FAILED || s->level >= level || timeout_ms == 0 ||
	    s->level == LEVEL_NONE) {
		send_state(c, req, s);
		return;
	}
	struct waiter *w = calloc(1, sizeof(*w));
	if (!w) {
		conn_error(c, req, ERR_ENOMEM, 0, "out of memory");
		return;
	}
	w->conn = c;
	w->req = req;
	w->level = level;
	w->save = s;
	uv_timer_init(loop, &w->timer);
	w->timer.data = w;
	if (timeout_ms > 0)
		uv_timer_start(&w->timer, on_wait_timeout, (uint64_t)timeout_ms, 0);
	w->next = s->waiters;
	s->waiters = w;
}

/* Frees a commit once its timer is closed. */
static void commit_closed(uv_handle_t *h)
{
	free(h->data);
}

/* Unlinks, answers (when its client is still there) and frees a commit. */
static void commit_finish(struct commit *cm, int code, const char *msg)
{
	for (struct commit **p = &commits; *p; p = &(*p)->next) {
		if (*p == cm) {
			*p = cm->next;
			break;
		}
	}
	if (cm->conn) {
		if (code < 0) {
			conn_error(cm->conn, cm->req, code, 0, "%s", msg);
		} else {
			struct proto_out o;
			proto_out_init(&o, PROTO_REPLY, cm->req);
			msgpack_pack_map(&o.pk, 4);
			proto_kv_i64(&o.pk, "level", LEVEL_COMMITTED);
			proto_kv_str(&o.pk, "tag", cm->info.tag);
			proto_kv_u64(&o.pk, "files", cm->info.files);
			proto_kv_u64(&o.pk, "bytes", cm->info.bytes);
			conn_send(cm->conn, &o);
		}
	}
	uv_timer_stop(&cm->timer);
	uv_close((uv_handle_t *)&cm->timer, commit_closed);
	daemon_maybe_exit();
}

/* Threadpool: writes the manifest, latest and retention. */
static void commit_work(uv_work_t *w)
{
	struct commit *cm = w->data;
	cm->rc = store_commit(config, cm->dir, cm->world, cm->uid, cm->gid, &cm->info, cm->err,
			      sizeof(cm->err));
}

/* Loop: the commit is done; marks the directory's saves COMMITTED. */
static void commit_after(uv_work_t *w, int status)
{
	struct commit *cm = w->data;

	/* cm stays "running" until commit_finish unlinks it, so set_level's re-check of
	 * waiting commits below cannot start it a second time. */
	if (cm->rc < 0) {
		log_warnx("commit of %s failed: %s", cm->dir, cm->err);
		commit_finish(cm, cm->rc, cm->err);
		commits_check();
		return;
	}
	log_info("committed %s: %u files, %llu bytes", cm->dir, cm->info.files,
		 (unsigned long long)cm->info.bytes);
	for (struct save *s = saves; s; s = s->next)
		if (s->level == LEVEL_DURABLE && strcmp(s->dir, cm->dir) == 0)
			set_level(s, LEVEL_COMMITTED, NULL);
	commit_finish(cm, 0, NULL);
	commits_check();	/* the user's next commit may start */
}

/* Starts every waiting commit whose saves are all durable; fails those with a failed save. */
static void commits_check(void)
{
	struct commit *cm = commits, *next;

	for (; cm; cm = next) {
		next = cm->next;
		if (cm->running)
			continue;
		/* One commit per user at a time: a user's expensive commits queue behind each
		 * other and never hold every threadpool thread against other users. */
		int busy = 0;
		for (struct commit *o = commits; o; o = o->next)
			busy |= o->running && o->uid == cm->uid;
		int waiting = busy;
		struct save *bad = NULL;
		for (struct save *s = saves; s; s = s->next) {
			if (strcmp(s->dir, cm->dir) != 0)
				continue;
			if (s->level == LEVEL_FAILED)
				bad = s;
			else if (s->level < LEVEL_DURABLE)
				waiting = 1;
		}
		if (bad) {
			char msg[ERRLEN + 300];
			snprintf(msg, sizeof(msg), "save of %s (rank %u) failed: %s", bad->file,
				 bad->rank, bad->error);
			commit_finish(cm, ERR_EFAILED, msg);
		} else if (!waiting) {
			cm->running = 1;
			uv_timer_stop(&cm->timer);
			cm->work.data = cm;
			uv_queue_work(loop, &cm->work, commit_work, commit_after);
		}
	}
}

/* Fires when a commit waited too long for durability. */
static void on_commit_timeout(uv_timer_t *t)
{
	struct commit *cm = t->data;
	if (!cm->running)
		commit_finish(cm, ERR_ETIMEDOUT, "timed out waiting for saves to be durable");
}

/* Handles COMMIT. */
void save_commit(struct conn *c, uint64_t req, const char *dir, unsigned world,
		 int64_t timeout_ms)
{
	struct commit *cm = calloc(1, sizeof(*cm));
	if (!cm) {
		conn_error(c, req, ERR_ENOMEM, 0, "out of memory");
		return;
	}
	cm->conn = c;
	cm->req = req;
	norm_dir(cm->dir, sizeof(cm->dir), dir);
	cm->world = world;
	cm->uid = conn_uid(c);
	cm->gid = conn_gid(c);
	uv_timer_init(loop, &cm->timer);
	cm->timer.data = cm;
	if (timeout_ms >= 0)
		uv_timer_start(&cm->timer, on_commit_timeout, (uint64_t)timeout_ms, 0);
	cm->next = commits;
	commits = cm;
	commits_check();
}

/* Drops a departed connection's waits, open saves and commit replies. */
void save_conn_gone(struct conn *c)
{
	struct save *s = saves, *next;

	for (; s; s = next) {
		next = s->next;
		for (struct waiter *w = s->waiters, *wn; w; w = wn) {
			wn = w->next;
			if (w->conn == c)
				waiter_finish(w, 0);
		}
		if (s->conn != c)
			continue;
		s->conn = NULL;
		if (s->level == LEVEL_NONE) {
			log_debug("save %llu dropped: client left before SAVE_END",
				  (unsigned long long)s->id);
			save_forget(s);
		}
	}
	for (struct commit *cm = commits; cm; cm = cm->next)
		if (cm->conn == c)
			cm->conn = NULL;
}

/* Saves in flight, plus running commits. */
unsigned save_inflight(void)
{
	unsigned n = 0;
	for (struct save *s = saves; s; s = s->next)
		n += s->job != NULL;
	for (struct commit *cm = commits; cm; cm = cm->next)
		n += cm->running;
	return n;
}

/* Whether PENDING shows save s to a client of uid: its own saves, every save to root. */
static int pending_shows(const struct save *s, uid_t uid)
{
	return s->level != LEVEL_NONE && (uid == 0 || s->uid == uid);
}

/* Packs the PENDING reply's "saves" array: uid's saves (every save for root). */
void save_pack_pending(struct msgpack_packer *pk, uid_t uid)
{
	unsigned n = 0;
	double now = now_mono();

	for (struct save *s = saves; s; s = s->next)
		n += pending_shows(s, uid);
	msgpack_pack_array(pk, n);
	for (struct save *s = saves; s; s = s->next) {
		if (!pending_shows(s, uid))
			continue;
		uint64_t snap = s->snap, flushed = s->flushed;
		if (s->job)
			engine_progress(s->job, &snap, &flushed);
		double age = now - s->t_accept;
		double busy = (s->job ? now : s->t_change) - s->t_accept;
		msgpack_pack_map(pk, s->level == LEVEL_FAILED ? 15 : 14);
		proto_kv_u64(pk, "id", s->id);
		proto_kv_u64(pk, "client", s->client);
		proto_kv_u64(pk, "pid", (uint64_t)s->pid);
		proto_kv_str(pk, "job", s->jobname);
		proto_kv_u64(pk, "rank", s->rank);
		proto_kv_str(pk, "dir", s->dir);
		proto_kv_str(pk, "file", s->file);
		proto_kv_i64(pk, "level", s->level);
		proto_kv_u64(pk, "bytes_total", s->bytes);
		proto_kv_u64(pk, "bytes_snapshot", snap);
		proto_kv_u64(pk, "bytes_flushed", flushed);
		proto_kv_u64(pk, "rate", busy > 0 ? (uint64_t)(flushed / busy) : 0);
		proto_kv_u64(pk, "age_ms", (uint64_t)(age * 1000));
		proto_kv_bool(pk, "client_alive", s->conn != NULL);
		if (s->level == LEVEL_FAILED)
			proto_kv_str(pk, "error", s->error);
	}
}

/* Frees every save and commit (shutdown, nothing in flight). */
void save_free_all(void)
{
	while (saves) {
		for (struct waiter *w = saves->waiters, *wn; w; w = wn) {
			wn = w->next;
			waiter_finish(w, 0);
		}
		save_forget(saves);
	}
	while (commits)
		commit_finish(commits, ERR_ESHUTDOWN, "daemon shutting down");
	if (gc_timer) {
		uv_close((uv_handle_t *)gc_timer, handle_free);
		gc_timer = NULL;
	}
}
