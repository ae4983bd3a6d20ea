/*
 * prefetch.c — PREFETCH (dsckptctl pull): a tag read ahead of its load, so that a launcher
 * turns a cold restore into a hot one while the trainer's Python and CUDA start. Two steps in
 * libuv's threadpool:
 *
 *   resolve: the request's directory is a tag when it is committed here or in its root's
 *   remote tier, else a job directory whose tag is its local `latest`, else its remote one
 *   (pull_latest: only a tag whose remote manifest is there and names the user). PREFETCH
 *   without wait is answered here, the tag named: the rest runs on.
 *   fetch: a tag only the remote holds is pulled into the local tier (pull.c: checksums
 *   checked, owned by its user); then each safetensors file of the tag is read into the
 *   daemon's cache as a resident copy (resident.c), which a later load of the file pins and
 *   restores from without the disk. The copy takes only chunks free or evictable now
 *   (cache_tryget) and at most seven eighths of the cache, so it never waits for nor holds
 *   what saves need; like every resident copy it is evicted oldest first. PREFETCH with wait
 *   is answered here, with what was pulled and cached and how long it took.
 *
 * Trust: a prefetch is a load of its user's (it counts against max_loads_per_user until it
 * ends), opens only that user's files (as load_file.c does) and pulls only that user's remote
 * tags (pull.c). One prefetch of a user runs at a time and PREFETCH_MAX_RUNNING of all users
 * (the others wait in order), so that prefetches never hold the threadpool's threads that
 * commits and loads' parses need. Loop thread, but for the two work functions, which alone
 * touch their prefetch while they run.
 */
#include "dsckptd.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

struct prefetch {
	uint64_t conn, req;
	uid_t uid;
	gid_t gid;
	int wait;
	struct config *cfg;            /* referenced for the work */
	char dir[PULL_DIR_MAX];        /* asked; the tag directory once resolved */
	char tag[256];
	int code;
	char error[ERRLEN];
	struct pull_info pulled;
	uint64_t cached, files;        /* data bytes put in the cache, files read there */
	double t0, seconds;
	int started;                   /* its work was queued (else it waits its turn) */
	uv_work_t work;
	struct prefetch *next;
};

#define PREFETCH_MAX_RUNNING 4

static const struct daemon *daemon_ctx;  /* prefetch_start's */
static struct prefetch *prefetches;      /* oldest first */
static unsigned running;                 /* of them started */

/* Keeps d for the cache and the config. */
void prefetch_start(const struct daemon *d)
{
	daemon_ctx = d;
}

/* Prefetches not yet ended, started or waiting (a drain waits for them). */
unsigned prefetch_running(void)
{
	unsigned n = 0;

	for (struct prefetch *p = prefetches; p; p = p->next)
		n++;
	return n;
}

/* Opens the job directory dir for uid: as store_open_tag opens a tag's, or, one level below
 * its allowed root, reached without a link and owned by uid (any for root); an fd or -1. */
static int open_job(const struct config *cfg, const char *dir, uid_t uid, gid_t gid)
{
	char why[ERRLEN], parent[PULL_DIR_MAX];
	int jobfd = -1, dfd = store_open_tag(cfg, dir, uid, gid, &jobfd, why, sizeof(why));
	const char *slash = strrchr(dir, '/');
	struct stat st;

	if (jobfd >= 0)
		close(jobfd);
	if (dfd >= 0 || dfd != ERR_EINVAL)
		return dfd;
	snprintf(parent, sizeof(parent), "%.*s", (int)(slash - dir), dir);
	for (size_t i = 0; i < cfg->n_roots; i++) {
		if (strcmp(cfg->allowed_roots[i], parent) != 0)
			continue;
		int rfd = open(parent, STORE_DIR_FLAGS);
		dfd = rfd < 0 ? -1 : openat(rfd, slash + 1, STORE_DIR_FLAGS);
		if (rfd >= 0)
			close(rfd);
		if (dfd >= 0 && (fstat(dfd, &st) < 0 || (uid != 0 && st.st_uid != uid))) {
			close(dfd);
			dfd = -1;
		}
		return dfd;
	}
	return -1;
}

/* The tag of p->dir (see the top): p->dir becomes the tag directory; 0 or a code. */
static int resolve(struct prefetch *p)
{
	char tag[256], dir[PULL_DIR_MAX];
	uint64_t ns = 0;
	int rc;

	snprintf(p->tag, sizeof(p->tag), "%s", strrchr(p->dir, '/') + 1);
	if (pull_committed_here(p->cfg, p->dir, p->uid, p->gid))
		return 0;
	if (pull_has_source(p->cfg, p->dir)) {
		rc = pull_check(p->cfg, p->dir, p->uid, p->error, sizeof(p->error));
		if (rc == 0 || rc == ERR_EACCES)
			return rc;	/* a tag the remote holds committed (for this user or not) */
	}
	/* A job directory: its latest, here first. */
	int jfd = open_job(p->cfg, p->dir, p->uid, p->gid);
	if (jfd >= 0) {
		ns = store_latest_get(jfd, tag, sizeof(tag));
		close(jfd);
	}
	if (!ns && (rc = pull_latest(p->cfg, p->dir, p->uid, tag, sizeof(tag), &ns, p->error,
				     sizeof(p->error))) < 0)
		return rc;
	if (strlen(p->dir) + 1 + strlen(tag) >= sizeof(dir))
		return err_set(p->error, sizeof(p->error), ERR_ENAMETOOLONG, "%s/%s: too long",
			       p->dir, tag);
	snprintf(p->tag, sizeof(p->tag), "%s", tag);
	memcpy(dir, p->dir, strlen(p->dir));
	snprintf(dir + strlen(p->dir), sizeof(dir) - strlen(p->dir), "/%s", tag);
	snprintf(p->dir, sizeof(p->dir), "%s", dir);
	return 0;
}

/* Reads the data of file fd (dir/name, size bytes, its data at data_start) into a resident
 * copy, taking at most *budget chunks; data bytes kept. */
static uint64_t warm_file(struct prefetch *p, int fd, const char *name, const struct stat *st,
			  uint64_t data_start, uint64_t *budget)
{
	struct cache *c = daemon_ctx->cache;
	uint64_t chunk = cache_chunk(c), len = (uint64_t)st->st_size - data_start, kept = 0;
	struct resident *r = resident_pin(p->dir, name, st->st_dev, st->st_ino);
	uint8_t *hdr, len8[8];
	uint64_t text = 0;
	char why[ERRLEN];

	if (r) {	/* held already (whole or in part): left as it is */
		kept = resident_held(r);
		resident_unpin(r);
		return kept;
	}
	/* The header as the file says (its manifest is the user's to edit): 8 + its length. */
	if (pread(fd, len8, 8, 0) != 8)
		return 0;
	for (int i = 7; i >= 0; i--)
		text = text << 8 | len8[i];
	if (text > ST_MAX_HEADER || 8 + text != data_start ||
	    quota_take(p->uid, QUOTA_HELD, data_start, why, sizeof(why)) < 0)
		return 0;
	if (!(hdr = malloc(data_start)) || pread(fd, hdr, data_start, 0) != (ssize_t)data_start ||
	    !(r = resident_begin(p->dir, name, p->uid, len))) {
		free(hdr);
		quota_give(p->uid, QUOTA_HELD, data_start);
		return 0;
	}
	for (uint64_t i = 0; i * chunk < len && *budget > 0; i++) {
		void *ck = cache_tryget(c, -1);
		size_t n = len - i * chunk < chunk ? (size_t)(len - i * chunk) : (size_t)chunk;
		if (!ck)
			break;
		if (pread(fd, ck, n, (off_t)(data_start + i * chunk)) != (ssize_t)n) {
			cache_put(c, ck);
			break;
		}
		if (!resident_keep(r, i, ck)) {
			cache_put(c, ck);
			break;
		}
		kept += n;
		--*budget;
	}
	resident_durable(r, st->st_dev, st->st_ino, hdr, data_start);	/* copies hdr */
	free(hdr);
	quota_give(p->uid, QUOTA_HELD, data_start);
	return kept;
}

/* Reads every safetensors file of the tag p->dir into the cache (what room allows). */
static void warm(struct prefetch *p)
{
	struct cache *c = daemon_ctx->cache;
	uint64_t budget = cache_total(c) / cache_chunk(c) * 7 / 8;
	char why[ERRLEN], name[160];
	int jobfd = -1, present;
	int dfd = store_open_tag(p->cfg, p->dir, p->uid, p->gid, &jobfd, why, sizeof(why));

	if (dfd < 0)
		return;
	struct manifest *m = manifest_load(dfd, &present, why, sizeof(why));
	for (size_t i = 0; m && i < m->nfiles && budget > 0; i++) {
		const struct manifest_file *f = &m->files[i];
		size_t n = f->name ? strlen(f->name) : 0, sl = strlen(FMT_SAFETENSORS);
		struct stat st;
		if (!f->kind || strcmp(f->kind, MANIFEST_KIND_ST) != 0 || n <= sl ||
		    !f->name || !store_valid_file(f->name) ||
		    f->header_len == MANIFEST_BAD || n - sl >= sizeof(name))
			continue;
		int fd = userfile_open(dfd, f->name, UINT64_MAX, 0, &st, why, sizeof(why));
		if (fd < 0)
			continue;
		if ((p->uid == 0 || st.st_uid == p->uid) && (uint64_t)st.st_size >= f->header_len) {
			snprintf(name, sizeof(name), "%.*s", (int)(n - sl), f->name);
			p->cached += warm_file(p, fd, name, &st, f->header_len, &budget);
			p->files++;
		}
		close(fd);
	}
	manifest_free(m);
	close(dfd);
	close(jobfd);
}

/* Threadpool: the tag pulled when only the remote holds it, then read into the cache. */
static void fetch_work(uv_work_t *w)
{
	struct prefetch *p = w->data;

	if (!pull_committed_here(p->cfg, p->dir, p->uid, p->gid))
		p->code = pull_tag(p->cfg, p->dir, p->uid, p->gid, &p->pulled, p->error,
				   sizeof(p->error));
	if (p->code == 0)
		warm(p);
	p->seconds = now_mono() - p->t0;
}

static void resolve_work(uv_work_t *w);
static void resolve_after(uv_work_t *w, int status);

/* Starts the prefetches whose turn it is: the oldest waiting of each user without one
 * running, while fewer than PREFETCH_MAX_RUNNING run. */
static void admit(void)
{
	for (struct prefetch *p = prefetches; p && running < PREFETCH_MAX_RUNNING; p = p->next) {
		struct prefetch *o = prefetches;
		while (o != p && o->uid != p->uid)
			o = o->next;
		if (p->started || o != p)
			continue;	/* running, or an older one of its user is there */
		p->started = 1;
		running++;
		uv_queue_work(daemon_ctx->loop, &p->work, resolve_work, resolve_after);
	}
}

/* Frees p, giving back its load, and starts the next in turn. */
static void prefetch_free(struct prefetch *p)
{
	for (struct prefetch **q = &prefetches; *q; q = &(*q)->next) {
		if (*q == p) {
			*q = p->next;
			break;
		}
	}
	running--;
	quota_give(p->uid, QUOTA_LOADS, 1);
	config_unref(p->cfg);
	free(p);
	admit();
}

/* Loop: the fetch is over; answered when PREFETCH waited, logged either way. */
static void fetch_after(uv_work_t *w, int status)
{
	struct prefetch *p = w->data;

	(void)status;
	if (p->code == 0) {
		resident_committed(p->dir);	/* the tag's copies are committed ones */
		log_info("prefetch of %s: %" PRIu64 " bytes pulled (peers, remote), %" PRIu64
			 " bytes of %" PRIu64 " files in the cache, %.3f s", p->dir,
			 p->pulled.bytes, p->cached, p->files, p->seconds);
	} else {
		log_info("prefetch of %s failed: %s", p->dir, p->error);
	}
	if (p->wait) {
		if (p->code < 0)
			reply_error(p->conn, p->req, p->code, "%s", p->error);
		else
			reply_prefetch(p->conn, p->req, p->dir, p->tag, p->pulled.bytes, p->cached,
				       (uint64_t)(p->seconds * 1000));
	}
	prefetch_free(p);
}

/* Threadpool: the tag the request names. */
static void resolve_work(uv_work_t *w)
{
	struct prefetch *p = w->data;

	p->code = resolve(p);
}

/* Loop: the tag is known; answered now without wait, and the fetch starts. */
static void resolve_after(uv_work_t *w, int status)
{
	struct prefetch *p = w->data;

	(void)status;
	if (p->code < 0) {
		reply_error(p->conn, p->req, p->code, "%s", p->error);
		return prefetch_free(p);
	}
	if (!p->wait)
		reply_prefetch(p->conn, p->req, p->dir, p->tag, 0, 0, 0);
	uv_queue_work(daemon_ctx->loop, &p->work, fetch_work, fetch_after);
}

/* Starts a prefetch of dir (a tag or job directory; tag: of that job, or NULL) for o. */
int prefetch_begin(const struct owner *o, uint64_t req, const char *dir, const char *tag,
		   int wait, char *err, size_t errlen)
{
	struct prefetch *p;
	char norm[PULL_DIR_MAX];
	int rc;

	store_norm_dir(norm, sizeof(norm), dir);
	if (norm[0] != '/' || strlen(norm) + (tag ? strlen(tag) + 1 : 0) >= sizeof(p->dir) - 1)
		return err_set(err, errlen, ERR_EINVAL, "'%s' is not an absolute directory", dir);
	if (tag && !store_valid_file(tag))
		return err_set(err, errlen, ERR_EINVAL, "tag '%s' must be 1-128 characters of "
			       "[A-Za-z0-9._-], not starting with '.'", tag);
	if ((rc = quota_take(o->uid, QUOTA_LOADS, 1, err, errlen)) < 0)
		return rc;
	if (!(p = calloc(1, sizeof(*p)))) {
		quota_give(o->uid, QUOTA_LOADS, 1);
		return err_set(err, errlen, ERR_ENOMEM, "out of memory");
	}
	*p = (struct prefetch){.conn = o->conn, .req = req, .uid = o->uid, .gid = o->gid,
			       .wait = wait, .cfg = config_ref(daemon_ctx->config),
			       .t0 = now_mono()};
	snprintf(p->dir, sizeof(p->dir), "%s%s%s", norm, tag ? "/" : "", tag ? tag : "");
	p->work.data = p;
	struct prefetch **q = &prefetches;
	while (*q)
		q = &(*q)->next;
	*q = p;
	admit();
	return 0;
}
