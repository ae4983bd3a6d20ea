/*
 * load.c — the registry of loads (restores) and their levels; loop thread only, but for
 * parse_work (libuv's threadpool), which alone touches its load while it runs.
 *
 * LOAD_BEGIN opens the file for its client — a regular file below an allowed root, reached
 * without symbolic links and owned by the client's user; a tag not on this node whose root
 * has a remote tier is first pulled into the local tier in the parse (pull.c: only the
 * user's, checksums checked) and the file opened then — then, in libuv's threadpool
 * (parse_work), reads and checks its header and pins the resident copy the cache may still
 * hold of it (resident.c; the same file, the same header): load_file.c does both, and
 * LOAD_BEGIN is answered when that is done. Until then the load has no id its client knows
 * and is found by no request: a LOAD_ADD naming it is answered ENOENT, as for any load not
 * open. One parse of a user runs at a time (the others wait in the list), so that one user's
 * headers never hold every threadpool thread; a parse's client gone meanwhile frees the load
 * once the parse is over.
 *
 * Memory: a load charges its user's max_held_mib_per_user for what it holds: the header's
 * text and cJSON's estimated peak while parsing (st_parse_cost, before the parse), then the
 * parsed header (st_header's held) and, per destination, its entry and what the restore
 * threads keep for it. A header describing more tensors than max_tensors_per_save, more than
 * a save may write, is refused.
 *
 * LOAD_ADD names destinations: each is looked up in the header, and a name the file lacks,
 * another dtype or shape, or a name given twice is only noted, so that LOAD_END can refuse
 * them all at once before any byte is written. LOAD_END hands the destinations, in
 * file order, to the restore threads (restore.c); their final event makes the load LOADED or
 * FAILED, which a LOAD_WAIT reports once and then the load is forgotten. A LOAD_WAIT not
 * answered at once parks in waiter.c by the load's id; load.c publishes the final level there.
 */
#include "load.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#define MISMATCH_SHOWN 16  /* mismatches named in LOAD_END's error; the rest are counted */
/* Held per destination: its entry, the restore job's description of it and its XXH3 state
 * (576 bytes, aligned), charged at LOAD_ADD. */
#define DST_HELD (sizeof(struct load_dst) + sizeof(struct restore_dst) + 640)

static const struct daemon *daemon_ctx;  /* load_start's */
static struct load *loads;
static uint64_t next_load_id = 1;

/* Frees a load whose job is gone, giving back what it holds. */
static void load_free(struct load *l)
{
	for (struct load **p = &loads; *p; p = &(*p)->next) {
		if (*p == l) {
			*p = l->next;
			break;
		}
	}
	for (size_t i = 0; i < l->n; i++)
		if (l->d[i].src)
			source_unref(l->d[i].src);
	free(l->d);
	free(l->named);
	st_header_free(l->h);
	if (l->fd >= 0)
		close(l->fd);
	if (l->dfd >= 0)
		close(l->dfd);
	if (l->res)
		resident_unpin(l->res);
	if (l->pull)
		config_unref(l->pull);
	quota_give(l->uid, QUOTA_LOADS, 1);
	quota_give(l->uid, QUOTA_HELD, l->held);
	free(l);
}

/* Threadpool: the header of a load begun, its tag pulled first from the remote tier when
 * only that holds it. */
static void parse_work(uv_work_t *w)
{
	struct load *l = w->data;
	struct pull_info info;

	if (l->pull) {
		l->code = pull_tag_file(l->pull, l->dir, l->file, l->uid, l->gid, &info,
					l->error, sizeof(l->error));
		if (l->code < 0)
			return;
		l->pulled = info.pulled;
		l->fd = load_file_open(l->pull, l->dir, l->file, l->uid, l->gid, &l->st, l->error,
				       sizeof(l->error));
		if ((l->code = l->fd < 0 ? l->fd : 0) < 0)
			return;
	}
	l->code = load_file_read(l, l->error, sizeof(l->error));
}

static void parse_after(uv_work_t *w, int status);

/* Starts the parse of l, or queues it behind another of its user's. */
static void parse_start(struct load *l)
{
	for (struct load *o = loads; o; o = o->next) {
		if (o->parse == PARSE_RUNNING && o->uid == l->uid) {
			l->parse = PARSE_QUEUED;
			return;
		}
	}
	l->parse = PARSE_RUNNING;
	l->work.data = l;
	uv_queue_work(daemon_ctx->loop, &l->work, parse_work, parse_after);
}

/* Loop: a parse is over; LOAD_BEGIN is answered (or the load freed, its client gone), and
 * the user's next parse, the oldest queued, starts. */
static void parse_after(uv_work_t *w, int status)
{
	struct load *l = w->data, *next = NULL;
	struct load_view v;

	(void)status;
	l->parse = PARSE_DONE;
	for (struct load *o = loads; o; o = o->next)
		if (o->parse == PARSE_QUEUED && o->uid == l->uid)
			next = o;	/* the list is newest first */
	if (next)
		parse_start(next);
	if (l->client == 0) {
		load_free(l);
	} else if (l->code < 0) {
		reply_error(l->client, l->req, l->code, "%s", l->error);
		load_free(l);
	} else {
		l->code = 0;
		if (!l->h->checksummed)
			log_info("load %llu of %s: the file has no checksums (not written by "
				 "dsckptd); its bytes are loaded unchecked", (unsigned long long)l->id,
				 l->path);
		load_view(l, &v);
		reply_load_begun(l->client, l->req, &v);
	}
}

/* Opens a load of dir/file.safetensors for o (see dsckptd.h). */
int load_begin(const struct owner *o, uint64_t req, const char *dir, const char *file,
	       char *err, size_t errlen)
{
	int rc;

	if (!store_valid_file(file))
		return err_set(err, errlen, ERR_EINVAL, "file name '%s' must be 1-128 characters "
			       "of [A-Za-z0-9._-], not starting with '.'", file);
	if ((rc = quota_take(o->uid, QUOTA_LOADS, 1, err, errlen)) < 0)
		return rc;
	struct load *l = calloc(1, sizeof(*l));
	if (!l) {
		quota_give(o->uid, QUOTA_LOADS, 1);
		return err_set(err, errlen, ERR_ENOMEM, "out of memory");
	}
	l->uid = o->uid;
	l->client = o->conn;
	l->req = req;
	l->fd = l->dfd = -1;
	l->max_tensors = daemon_ctx->config->max_tensors_per_save;
	l->next = loads;
	loads = l;
	store_norm_dir(l->dir, sizeof(l->dir), dir);
	snprintf(l->file, sizeof(l->file), "%s", file);
	snprintf(l->path, sizeof(l->path), "%s/%s%s", l->dir, file, FMT_SAFETENSORS);
	l->gid = o->gid;
	l->fd = load_file_open(daemon_ctx->config, l->dir, file, l->uid, o->gid, &l->st, err,
			       errlen);
	if (l->fd == ERR_ENOENT && pull_has_source(daemon_ctx->config, l->dir)) {
		l->fd = -1;	/* not on this node: the parse pulls it (peers, remote tier) */
		l->pull = config_ref(daemon_ctx->config);
	} else if (l->fd < 0) {
		rc = l->fd;
		load_free(l);
		return rc;
	}
	l->id = next_load_id++;
	parse_start(l);
	return 0;
}

/* Finds a load of client by id, open for adding when open is set. */
static struct load *find(uint64_t client, uint64_t id, int open)
{
	for (struct load *l = loads; l; l = l->next)
		if (l->id == id && l->client == client && l->parse == PARSE_DONE &&
		    (!open || l->level == LOAD_OPEN))
			return l;
	return NULL;
}

struct load *load_find_open(uint64_t client, uint64_t id)
{
	return find(client, id, 1);
}

struct load *load_find(uint64_t client, uint64_t id)
{
	return find(client, id, 0);
}

/* Writes a shape as "[2, 3]" into out. */
static void shape_str(char *out, size_t len, const uint64_t *shape, unsigned ndim)
{
	size_t used = (size_t)snprintf(out, len, "[");
	for (unsigned i = 0; i < ndim && used < len; i++)
		used += (size_t)snprintf(out + used, len - used, "%s%llu", i ? ", " : "",
					 (unsigned long long)shape[i]);
	if (used < len)
		snprintf(out + used, len - used, "]");
}

/* Notes a destination that does not match the file (named at LOAD_END). */
static void __attribute__((format(printf, 2, 3))) mismatch(struct load *l, const char *fmt, ...)
{
	size_t used = strlen(l->mismatch);
	va_list ap;

	if (l->nmismatch++ >= MISMATCH_SHOWN || used + 8 >= sizeof(l->mismatch))
		return;
	if (used)
		used += (size_t)snprintf(l->mismatch + used, sizeof(l->mismatch) - used, "; ");
	va_start(ap, fmt);
	vsnprintf(l->mismatch + used, sizeof(l->mismatch) - used, fmt, ap);
	va_end(ap);
}

/* Whether a destination's dtype and shape are those of header tensor e; notes why not. */
static int matches(struct load *l, const struct st_entry *e, const char *name,
		   const char *dtype, const uint64_t *shape, unsigned ndim)
{
	char want[256], got[256];

	if (strcmp(e->dtype, dtype) != 0) {
		mismatch(l, "'%s': dtype %s given, %s in the file", name, dtype, e->dtype);
		return 0;
	}
	if (ndim != e->ndim || (ndim && memcmp(shape, e->shape, ndim * sizeof(*shape)) != 0)) {
		shape_str(got, sizeof(got), shape, ndim);
		shape_str(want, sizeof(want), e->shape, e->ndim);
		mismatch(l, "'%s': shape %s given, %s in the file", name, got, want);
		return 0;
	}
	return 1;
}

/* Names a destination (see dsckptd.h). */
int load_add_tensor(struct load *l, const char *name, const char *dtype,
		    const uint64_t *shape, unsigned ndim, struct source *dst, uint64_t off,
		    uint64_t nbytes, char *err, size_t errlen)
{
	unsigned esize = dtype_size(dtype);
	uint64_t count = 1;

	if (!esize)
		return err_set(err, errlen, ERR_EINVAL, "tensor '%s': unknown dtype '%s'", name,
			       dtype);
	for (unsigned i = 0; i < ndim; i++)
		if (__builtin_mul_overflow(count, shape[i], &count))
			return err_set(err, errlen, ERR_EINVAL, "tensor '%s': shape overflows", name);
	if (__builtin_mul_overflow(count, esize, &count) || count != nbytes)
		return err_set(err, errlen, ERR_EINVAL, "tensor '%s': nbytes %llu is not its "
			       "shape times the dtype's size", name, (unsigned long long)nbytes);
	if (off > source_size(dst) || nbytes > source_size(dst) - off)
		return err_set(err, errlen, ERR_ERANGE, "tensor '%s': bytes %llu..%llu lie outside "
			       "its region (%llu bytes)", name, (unsigned long long)off,
			       (unsigned long long)(off + nbytes),
			       (unsigned long long)source_size(dst));
	if (!source_complete(dst))
		return err_set(err, errlen, ERR_ESTATE, "tensor '%s': its region is not mapped "
			       "whole yet", name);
	int rc = source_writable(dst, err, errlen);
	if (rc < 0)
		return rc;
	long t = st_header_find(l->h, name);
	if (t < 0) {
		mismatch(l, "'%s': not in the file", name);
		return 0;
	}
	if (l->named[t]) {
		mismatch(l, "'%s': named twice", name);
		return 0;
	}
	l->named[t] = 1;
	if (!matches(l, &l->h->t[t], name, dtype, shape, ndim))
		return 0;
	if ((rc = load_hold(l, DST_HELD, err, errlen)) < 0)
		return rc;
	if (l->n == l->cap) {
		size_t cap = l->cap ? 2 * l->cap : 64;
		struct load_dst *d = realloc(l->d, cap * sizeof(*d));
		if (!d) {
			load_unhold(l, DST_HELD);
			return err_set(err, errlen, ERR_ENOMEM, "out of memory");
		}
		l->d = d;
		l->cap = cap;
	}
	source_ref(dst);
	l->d[l->n++] = (struct load_dst){.t = t, .src = dst, .off = off};
	l->bytes += nbytes;
	return 0;
}

/* Totals of the destinations so far (mismatched ones are not counted). */
void load_totals(const struct load *l, uint64_t *tensors, uint64_t *bytes)
{
	*tensors = l->n;
	*bytes = l->bytes;
}

/* Abandons a load that was never started. */
void load_drop(struct load *l)
{
	load_free(l);
}

static const struct st_header *sort_header;

/* Orders destinations by their place in the file. */
static int by_begin(const void *a, const void *b)
{
	uint64_t x = sort_header->t[((const struct load_dst *)a)->t].begin;
	uint64_t y = sort_header->t[((const struct load_dst *)b)->t].begin;
	return x < y ? -1 : x > y;
}

/* The restore job's destinations, in file order; overlapping tensors (a crafted header) are
 * refused. NULL with err set. */
static struct restore_dst *plan(struct load *l, char *err, size_t errlen)
{
	struct restore_dst *rd = calloc(l->n ? l->n : 1, sizeof(*rd));

	if (!rd) {
		err_set(err, errlen, ERR_ENOMEM, "out of memory");
		return NULL;
	}
	sort_header = l->h;
	if (l->n > 0)	/* l->d is NULL without destinations, which qsort may not be given */
		qsort(l->d, l->n, sizeof(*l->d), by_begin);
	for (size_t i = 0; i < l->n; i++) {
		const struct st_entry *e = &l->h->t[l->d[i].t];
		if (i > 0 && e->begin < rd[i - 1].end) {
			err_set(err, errlen, ERR_EINVAL, "%s: tensors '%s' and '%s' overlap in the "
				"file", l->path, rd[i - 1].name, e->name);
			free(rd);
			return NULL;
		}
		rd[i] = (struct restore_dst){.begin = e->begin, .end = e->end,
					     .dst = l->d[i].src, .dst_off = l->d[i].off,
					     .name = e->name};
		/* The parse refused a checksum it could not read: the one there is good, and
		 * none is there only in a file without checksums (reported at LOAD_BEGIN). */
		rd[i].has_xxh3 = checksum_parse(e->xxh3, &rd[i].xxh3) == 0;
	}
	return rd;
}

/* Starts filling the destinations (see dsckptd.h). */
int load_end(struct load *l, struct cuda_fence *fence, char *err, size_t errlen)
{
	struct restore_dst *rd;
	int rc;

	if (l->nmismatch > 0) {
		rc = err_set(err, errlen, ERR_EINVAL, "%u tensor%s do%s not match %s: %s%s",
			     l->nmismatch, l->nmismatch > 1 ? "s" : "", l->nmismatch > 1 ? "" : "es",
			     l->path, l->mismatch, l->nmismatch > MISMATCH_SHOWN ? "; …" : "");
		goto fail;
	}
	if (!(rd = plan(l, err, errlen))) {
		rc = ERR_EINVAL;
		goto fail;
	}
	struct restore_req r = {
		.d = rd, .n = l->n, .fd = l->fd, .dfd = l->dfd,
		.data_start = l->h->data_start, .data_len = l->data_len, .path = l->path,
		.res = l->res, .fence = fence, .ondev = daemon_ctx->config->gpu_checksums,
		.owner = l,
	};
	if ((rc = restore_submit(&r, &l->job, err, errlen)) < 0) {
		free(rd);
		goto fail;
	}
	/* Ownership: the job has the descriptors, the pin, the fence and the references. */
	for (size_t i = 0; i < l->n; i++)
		l->d[i].src = NULL;
	l->fd = l->dfd = -1;
	l->res = NULL;
	l->level = LOAD_ACCEPTED;
	metrics_add(METRIC_LOADS_STARTED, 1);
	return 0;

fail:
	if (fence)
		copier_fence_free(fence);
	load_free(l);
	return rc;
}

/* Fills v with what a reply shows of l. */
void load_view(const struct load *l, struct load_view *v)
{
	*v = (struct load_view){
		.id = l->id, .level = l->level, .code = l->code,
		.error = l->level == LOAD_FAILED ? l->error : NULL,
		.read_from = l->pulled == PULL_PEER ? "peer" : l->pulled ? "remote" :
			     l->cached >= l->data_len ? "cache" : "file",
		.tensors = l->h->n, .bytes = l->data_len, .bytes_cached = l->cached,
		.bytes_total = l->bytes,
		.bytes_done = l->job ? restore_progress(l->job) : l->done,
	};
}

/* Answers LOAD_WAIT req of l with its state; forgets l once its final level is told. */
static void answer(struct load *l, uint64_t req)
{
	struct load_view v;

	load_view(l, &v);
	reply_load_state(l->client, req, &v);
	if (l->level == LOAD_LOADED || l->level == LOAD_FAILED)
		load_free(l);
}

/* Answers a LOAD_WAIT now or later (see dsckptd.h). */
void load_wait(struct load *l, uint64_t req, int64_t timeout_ms)
{
	if (waiter_parked(WAITER_LOAD, l->id))
		return reply_error(l->client, req, ERR_EBUSY, "load %llu already has a LOAD_WAIT",
				   (unsigned long long)l->id);
	if (l->level != LOAD_ACCEPTED || timeout_ms == 0)
		return answer(l, req);
	struct waiter_on on = {.tag = WAITER_LOAD, .key = l->id, .level = LOAD_LOADED};
	if (waiter_add(l->client, req, &on, timeout_ms) < 0)
		reply_error(l->client, req, ERR_ENOMEM, "out of memory");
}

/* waiter_fn of WAITER_LOAD: a LOAD_WAIT ended (the load done or failed, or time up). */
void load_wait_end(const struct waiter_end *e)
{
	struct load *l = find(e->conn, e->on.key, 0);

	if (l && e->how != WAITER_DROPPED)
		answer(l, e->req);
}

/* The restore threads' final event: the load is LOADED or FAILED. */
static void on_restore(void *owner, struct restore_job *j, int code, const char *error)
{
	struct load *l = owner;

	l->done = restore_progress(j);
	restore_job_free(j);
	l->job = NULL;
	l->level = code < 0 ? LOAD_FAILED : LOAD_LOADED;
	l->code = code;
	if (code < 0)
		snprintf(l->error, sizeof(l->error), "%s", error);
	if (code < 0) {
		metrics_fail(METRIC_LOADS_FAILED, code);
		log_info("load %llu of %s failed: %s", (unsigned long long)l->id, l->path, error);
	} else {
		metrics_add(METRIC_LOADS_DONE, 1);
		log_debug("load %llu of %s done: %llu bytes", (unsigned long long)l->id, l->path,
			  (unsigned long long)l->done);
	}
	if (l->client == 0)
		load_free(l);	/* its client is gone */
	else
		waiter_publish(WAITER_LOAD, l->id, l->level);
}

/* Starts the restore threads of d with load.c's event handler. */
int load_start(const struct daemon *d, unsigned threads, char *err, size_t errlen)
{
	daemon_ctx = d;
	return restore_start(d->loop, d->cache, threads, on_restore, err, errlen);
}

/* Cancels and forgets a departed client's loads (running ones once their job ends). */
void load_client_gone(uint64_t client)
{
	struct load *l = loads, *next;

	for (; l; l = next) {
		next = l->next;
		if (l->client != client)
			continue;
		l->client = 0;	/* its LOAD_WAIT, if any, waiter.c dropped */
		if (l->job)
			restore_cancel(l->job, ERR_EPIPE, "the client went away");
		else if (l->parse != PARSE_RUNNING)
			load_free(l);	/* a running parse's parse_after frees it */
	}
}

/* Loads whose header is being parsed or waits to be (the drain waits for them). */
unsigned load_parsing(void)
{
	unsigned n = 0;

	for (struct load *l = loads; l; l = l->next)
		n += l->parse != PARSE_DONE;
	return n;
}

/* Loads not yet forgotten. */
unsigned load_count(void)
{
	unsigned n = 0;

	for (struct load *l = loads; l; l = l->next)
		n++;
	return n;
}

/* Cancels every running load (shutdown; their events come from restore_stop). */
void load_cancel_all(void)
{
	for (struct load *l = loads; l; l = l->next)
		if (l->job)
			restore_cancel(l->job, ERR_ESHUTDOWN, "the daemon is shutting down");
}

/* Frees every load (shutdown, the restore threads stopped). */
void load_free_all(void)
{
	while (loads)
		load_free(loads);
}
