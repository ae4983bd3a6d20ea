/*
 * commit.c — COMMITs in progress: wait until every save into the directory is DURABLE, then
 * write the manifest, `latest` and retention (store_commit) in libuv's threadpool, then mark
 * the directory's saves COMMITTED. Loop thread only, but for commit_work.
 *
 * A commit names its client by connection id and is answered through reply.c (dropped when
 * the client has left). It is owned by the list from commit_request until its timer's close
 * callback; while "running" it belongs to the threadpool and nothing else touches it. One
 * commit per user runs at a time: a user's expensive commits queue behind each other and
 * never hold every threadpool thread against other users.
 */
#include "dsckptd.h"
#include "../proto/proto.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

struct commit {
	struct config *cfg;   /* a reference: the config as of the request, across reloads */
	uint64_t conn;
	uint64_t req;
	char dir[PROTO_MAX_STR + 1];
	struct store_dirid dirid;  /* dir as the request found it */
	char run[PROTO_MAX_RUN + 1];
	unsigned world;
	uid_t uid;
	gid_t gid;
	int running;          /* in the threadpool (or just back, until commit_finish) */
	int rc;
	char err[ERRLEN];
	struct store_commit_info info;
	uv_timer_t timer;
	uv_work_t work;
	struct commit *next;
};

static struct commit *commits;

static void commits_check(void);

/* Frees a commit once its timer is closed. */
static void commit_closed(uv_handle_t *h)
{
	struct commit *cm = h->data;
	config_unref(cm->cfg);
	free(cm);
}

/* Unlinks, answers and frees a commit. */
static void commit_finish(struct commit *cm, int code, const char *msg)
{
	for (struct commit **p = &commits; *p; p = &(*p)->next) {
		if (*p == cm) {
			*p = cm->next;
			break;
		}
	}
	if (code < 0)
		reply_error(cm->conn, cm->req, code, "%s", msg);
	else
		reply_committed(cm->conn, cm->req, &cm->info);
	uv_timer_stop(&cm->timer);
	uv_close((uv_handle_t *)&cm->timer, commit_closed);
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

	/* cm stays "running" until commit_finish unlinks it, so the observer call that marking
	 * the saves makes cannot start it a second time. */
	if (cm->rc < 0) {
		log_warnx("commit of %s failed: %s", cm->dir, cm->err);
		commit_finish(cm, cm->rc, cm->err);
	} else {
		log_info("committed %s: %u files, %llu bytes", cm->dir, cm->info.files,
			 (unsigned long long)cm->info.bytes);
		save_mark_committed(&cm->dirid, cm->uid, cm->run);
		resident_committed(cm->dir);
		commit_finish(cm, 0, NULL);
	}
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

/* Starts every waiting commit whose saves are all durable; fails those with a failed save. */
static void commits_check(void)
{
	struct commit *cm = commits, *next;

	for (; cm; cm = next) {
		next = cm->next;
		if (cm->running)
			continue;
		int pending;
		struct save_view v;
		struct save *bad = save_dir_state(&cm->dirid, cm->uid, cm->run, &pending);
		if (bad) {
			char msg[ERRLEN + 300];
			save_view(bad, &v);
			snprintf(msg, sizeof(msg), "save of %s (rank %u) failed: %s", v.file, v.rank,
				 v.error);
			commit_finish(cm, ERR_EFAILED, msg);
		} else if (!pending && !user_busy(cm->uid)) {
			cm->running = 1;
			uv_timer_stop(&cm->timer);
			cm->work.data = cm;
			uv_queue_work(loop, &cm->work, commit_work, commit_after);
		}
	}
}

/* Observer of save levels: a save reaching DURABLE or failing may let a commit go on. */
void commit_on_save(struct save *s)
{
	int level = save_level(s);

	if (level == LEVEL_FAILED || level == LEVEL_DURABLE)
		commits_check();
}

/* Fires when a commit waited too long for durability. */
static void on_commit_timeout(uv_timer_t *t)
{
	struct commit *cm = t->data;
	if (!cm->running)
		commit_finish(cm, ERR_ETIMEDOUT, "timed out waiting for saves to be durable");
}

/* Handles COMMIT of dir for o (auth_check'ed for AUTH_COMMIT by the caller). */
void commit_request(const struct owner *o, uint64_t req, const char *dir, unsigned world,
		    int64_t timeout_ms)
{
	struct commit *cm = calloc(1, sizeof(*cm));
	char err[ERRLEN];
	int dfd, jobfd, rc;

	if (!cm) {
		reply_error(o->conn, req, ERR_ENOMEM, "out of memory");
		return;
	}
	store_norm_dir(cm->dir, sizeof(cm->dir), dir);
	if ((dfd = store_open_tag(config, cm->dir, o->uid, o->gid, &jobfd, err,
				  sizeof(err))) < 0) {
		free(cm);
		reply_error(o->conn, req, dfd, "%s", err);
		return;
	}
	rc = store_dir_id(dfd, &cm->dirid, err, sizeof(err));
	close(dfd);
	close(jobfd);
	if (rc < 0) {
		free(cm);
		reply_error(o->conn, req, rc, "%s", err);
		return;
	}
	snprintf(cm->run, sizeof(cm->run), "%s", o->run);
	cm->cfg = config_ref(config);
	cm->conn = o->conn;
	cm->req = req;
	cm->world = world;
	cm->uid = o->uid;
	cm->gid = o->gid;
	uv_timer_init(loop, &cm->timer);
	cm->timer.data = cm;
	if (timeout_ms >= 0)
		uv_timer_start(&cm->timer, on_commit_timeout, (uint64_t)timeout_ms, 0);
	cm->next = commits;
	commits = cm;
	commits_check();
}

/* Commits in the threadpool now. */
unsigned commit_running(void)
{
	unsigned n = 0;
	for (struct commit *cm = commits; cm; cm = cm->next)
		n += cm->running;
	return n;
}

/* Fails every commit that is not running (shutdown, nothing in flight). */
void commit_free_all(void)
{
	while (commits)
		commit_finish(commits, ERR_ESHUTDOWN, "daemon shutting down");
}
