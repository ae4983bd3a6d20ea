/*
 * commit.c — COMMITs in progress: wait until every save into the directory is DURABLE, then
 * write the manifest, `latest` and retention (store_commit) in libuv's threadpool, then mark
 * the directory's saves COMMITTED. Loop thread only, but for commit_work.
 *
 * A commit is owned by the registry from commit_request until it is answered. While it waits
 * for durability its request is parked in waiter.c (by the commit's id, with its deadline);
 * commits_check publishes there when it may run (its saves durable, its user's previous
 * commit done) or a save failed, and commit_wait_end moves it on. A commit goes on when its
 * client leaves: its answer, by connection id, is dropped by reply.c. While "running" it
 * belongs to the threadpool and nothing else touches it. One commit per user runs at a time:
 * a user's expensive commits queue behind each other and never hold every threadpool thread
 * against other users.
 */
#include "dsckptd.h"
#include "../proto/proto.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#define COMMIT_READY 1     /* the level a commit's wait waits for: it may run */

struct commit {
	uint64_t id;
	struct config *cfg;   /* a reference: the config as of the request, across reloads */
	uint64_t conn, req;   /* the request, once its wait ended: what the answer goes to */
	char dir[PROTO_MAX_STR + 1];
	struct store_dirid dirid;  /* dir as the request found it */
	char run[PROTO_MAX_RUN + 1];
	unsigned world;
	uid_t uid;
	gid_t gid;
	int running;          /* in the threadpool (or just back, until commit_free) */
	int rc;
	char err[ERRLEN + 300];  /* store_commit's error, or which save failed */
	struct store_commit_info info;
	uv_work_t work;
	struct commit *next;
};

static const struct daemon *daemon_ctx;  /* commit_init's: its loop, the config of the moment */
static struct commit *commits;
static uint64_t next_commit_id = 1;

static void commits_check(void);

/* Unlinks and frees a commit. */
static void commit_free(struct commit *cm)
{
	for (struct commit **p = &commits; *p; p = &(*p)->next) {
		if (*p == cm) {
			*p = cm->next;
			break;
		}
	}
	config_unref(cm->cfg);
	free(cm);
}

/* Threadpool: writes the manifest, latest and retention. */
static void commit_work(uv_work_t *w)
{
	struct commit *cm = w->data;
	cm->rc = store_commit(cm->cfg, cm->dir, cm->world, cm->run, &cm->dirid, cm->uid, cm->gid,
			      &cm->info, cm->err, sizeof(cm->err));
}

/* Loop: the commit is done; marks the directory's saves (and resident files) COMMITTED. */
static void commit_after(uv_work_t *w, int status)
{
	struct commit *cm = w->data;

	/* cm stays "running" until commit_free unlinks it, so the observer call that marking
	 * the saves makes cannot start it a second time. */
	if (cm->rc < 0) {
		log_warnx("commit of %s failed: %s", cm->dir, cm->err);
		reply_error(cm->conn, cm->req, cm->rc, "%s", cm->err);
	} else {
		log_info("committed %s: %u files, %llu bytes", cm->dir, cm->info.files,
			 (unsigned long long)cm->info.bytes);
		save_mark_committed(&cm->dirid, cm->uid, cm->run);
		resident_committed(cm->dir);
		reply_committed(cm->conn, cm->req, &cm->info);
	}
	commit_free(cm);
	commits_check();	/* the user's next commit may start */
}

/* Whether a commit of uid is in the threadpool. */
static int user_busy(uid_t uid)
{
	for (struct commit *o = commits; o; o = o->next)
		if (o->running && o->uid == uid)
			return 1;
	return 0;
}

/* Publishes, for every waiting commit, that it may run (its saves all durable, its user's
 * previous commit done) or that a save of it failed. */
static void commits_check(void)
{
	struct commit *cm = commits, *next;

	for (; cm; cm = next) {
		next = cm->next;	/* the publication may free cm, never another commit */
		if (cm->running)
			continue;
		int pending;
		struct save_view v;
		struct save *bad = save_dir_state(&cm->dirid, cm->uid, cm->run, &pending);
		if (bad) {
			save_view(bad, &v);
			snprintf(cm->err, sizeof(cm->err), "save of %s (rank %u) failed: %s", v.file,
				 v.rank, v.error);
			waiter_publish(WAITER_COMMIT, cm->id, LEVEL_FAILED);
		} else if (!pending && !user_busy(cm->uid)) {
			waiter_publish(WAITER_COMMIT, cm->id, COMMIT_READY);
		}
	}
}

/* The commit of id, or NULL. */
static struct commit *commit_find(uint64_t id)
{
	for (struct commit *cm = commits; cm; cm = cm->next)
		if (cm->id == id)
			return cm;
	return NULL;
}

/* waiter_fn of WAITER_COMMIT: starts a commit that may run, or answers one that cannot. */
void commit_wait_end(const struct waiter_end *e)
{
	struct commit *cm = commit_find(e->on.key);

	if (!cm)
		return;
	if (e->how == WAITER_REACHED && e->level == COMMIT_READY) {
		cm->conn = e->conn;
		cm->req = e->req;
		cm->running = 1;
		cm->work.data = cm;
		uv_queue_work(daemon_ctx->loop, &cm->work, commit_work, commit_after);
		return;
	}
	if (e->how == WAITER_REACHED)
		reply_error(e->conn, e->req, ERR_EFAILED, "%s", cm->err);
	else if (e->how == WAITER_TIMEOUT)
		reply_error(e->conn, e->req, ERR_ETIMEDOUT,
			    "timed out waiting for saves to be durable");
	else
		reply_error(e->conn, e->req, ERR_ESHUTDOWN, "daemon shutting down");
	commit_free(cm);
}

/* Observer of save levels: a save reaching DURABLE or failing may let a commit go on. */
void commit_on_save(struct save *s)
{
	int level = save_level(s);

	if (level == LEVEL_FAILED || level == LEVEL_DURABLE)
		commits_check();
}

/* Handles COMMIT of dir for o (auth_check'ed for AUTH_COMMIT by the caller); of the version
 * want when given (a staging directory's, which the daemon may have exchanged with its tag
 * and moved aside since: the commit then finds it under the tag). */
void commit_request(const struct owner *o, uint64_t req, const char *dir, unsigned world,
		    int64_t timeout_ms, const struct store_dirid *want)
{
	struct commit *cm = calloc(1, sizeof(*cm));
	char err[ERRLEN], tag[PATH_MAX];
	int dfd, jobfd, rc;

	if (!cm) {
		reply_error(o->conn, req, ERR_ENOMEM, "out of memory");
		return;
	}
	store_norm_dir(cm->dir, sizeof(cm->dir), dir);
	dfd = store_open_tag(daemon_ctx->config, cm->dir, o->uid, o->gid, &jobfd, err,
			     sizeof(err));
	if (dfd == ERR_ENOENT && want && store_staged_tag(cm->dir, tag, sizeof(tag))) {
		snprintf(cm->dir, sizeof(cm->dir), "%s", tag);	/* moved aside: the tag now */
		dfd = store_open_tag(daemon_ctx->config, cm->dir, o->uid, o->gid, &jobfd, err,
				     sizeof(err));
	}
	if (dfd < 0) {
		free(cm);
		reply_error(o->conn, req, dfd, "%s", err);
		return;
	}
	rc = store_dir_id(dfd, &cm->dirid, err, sizeof(err));
	if (rc == 0 && want)
		cm->dirid = *want;	/* the version, whatever its name holds now */
	close(dfd);
	close(jobfd);
	if (rc < 0) {
		free(cm);
		reply_error(o->conn, req, rc, "%s", err);
		return;
	}
	cm->id = next_commit_id++;
	struct waiter_on on = {.tag = WAITER_COMMIT, .key = cm->id, .level = COMMIT_READY};
	if (waiter_add(o->conn, req, &on, timeout_ms) < 0) {
		free(cm);
		reply_error(o->conn, req, ERR_ENOMEM, "out of memory");
		return;
	}
	snprintf(cm->run, sizeof(cm->run), "%s", o->run);
	cm->cfg = config_ref(daemon_ctx->config);
	cm->world = world;
	cm->uid = o->uid;
	cm->gid = o->gid;
	cm->next = commits;
	commits = cm;
	commits_check();
}

/* Hands the module the daemon it commits for (start-up). */
void commit_init(const struct daemon *d)
{
	daemon_ctx = d;
}

/* Commits in the threadpool now. */
unsigned commit_running(void)
{
	unsigned n = 0;
	for (struct commit *cm = commits; cm; cm = cm->next)
		n += cm->running;
	return n;
}
