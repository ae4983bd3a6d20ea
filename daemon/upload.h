/*
 * upload.h — what upload.c (the scheduler: tags to upload, their files, the worker threads,
 * the loop's side) and upload_tag.c (the remote steps of one tag: its plan from the local
 * manifest, a file's upload, the node record, the remote manifest and latest, the local
 * REMOTE.json; the start-up pass), upload_version.c (which remote version a tag writes),
 * upload_files.c (a tag's files), upload_replace.c (a version replaced before it reached
 * REMOTE) and upload_retain.c (keep_last_remote) share; nothing else includes it but
 * check_upload_retain.c.
 */
#ifndef DSCKPTD_UPLOAD_H
#define DSCKPTD_UPLOAD_H

#include "dsckptd.h"

#include <limits.h>

enum upfile_state { UPF_WAIT, UPF_BUSY, UPF_DONE };

/* A file of this node in a tag: <dir>/<name> → <key>/<name>. */
struct upfile {
	char name[NAME_MAX + 1];
	char stem[NAME_MAX + 1];  /* the save's file (resident copies are kept by it) */
	enum upfile_state state;  /* (lock) */
	dev_t dev;                /* the file as uploaded (0: not yet) */
	ino_t ino;
	uint64_t size;
	char loc[24];             /* the version directory it went up under (upload_version.c) */
	int fd;                   /* in the plan (t->mine): the version's file, opened by the
				   * plan, read to the end whatever replaces it (-1: none) */
};

/* A committed (or committing) tag of this node whose files go to its root's remote tier.
 * The scheduler's lock guards the list and the fields marked (lock); while busy (a worker
 * on its tag step) that worker alone touches the fields below busy. */
struct uptag {
	struct uptag *next;       /* (lock) */
	char dir[PATH_MAX];       /* <root>/<job path>/<tag> */
	char key[PATH_MAX];       /* <job path>/<tag>, under the remote's prefix */
	char jobkey[PATH_MAX];    /* <job path> */
	char tag[NAME_MAX + 1];
	unsigned root;            /* index of the root */
	struct remote *r;         /* its remote */
	const int *stop;          /* nonzero: the daemon is stopping (an upload gives up) */
	uid_t uid;                /* the tag's owner (PENDING shows it to its user) */
	struct config *cfg;       /* a reference, dropped on the loop */
	struct store_dirid dirid; /* of the saves to mark REMOTE */
	int has_dirid;
	double t_commit;          /* when COMMITTED was seen (now_mono) */
	/* (lock) */
	int committed;            /* the manifest is written: plan, then finish */
	int busy;
	int done;                 /* REMOTE, handed to the loop */
	int stuck;                /* a failure no retry mends (a later version remotely) */
	int early_off;            /* its files wait for the plan (the remote holds a version) */
	int replan;               /* another version was committed here since the plan */
	int pinned;               /* the version planned (pin_id) is held open by its plan's
				   * descriptors and goes up to its end, even once replaced */
	struct store_dirid pin_id;
	int newer;                /* a newer version was committed since the plan: planned
				   * once the pinned one ends */
	int gone;                 /* the pinned version was deleted: its upload ends */
	int has_held;             /* the pinned version, replaced: its saves learn its upload's */
	struct store_dirid held;  /* outcome (REMOTE, or held_why) */
	char held_why[ERRLEN];
	struct upfile *files;
	size_t nfiles, cap;
	int code;                 /* the last failure (0: none) */
	char error[ERRLEN];       /* its message, or what the tag waits for */
	unsigned fails;
	double retry_at;          /* now_mono() before which it is not tried again */
	uint64_t bytes_total, bytes_done;  /* bytes_done: atomic */
	int cancel;               /* atomic: a newer version replaced the one uploading: a file's
				   * upload in flight gives up (and is aborted) */
	struct workq_item wi;
	/* the worker's, while busy */
	int planned;
	char *manifest;           /* the local MANIFEST.json's bytes */
	size_t manifest_len;
	uint64_t created_ns;
	char **hosts;             /* the nodes whose files the tag holds */
	size_t nhosts;
	struct upfile *mine;      /* the plan: this node's files as the manifest lists them */
	size_t nmine;
	int wrote;                /* this node wrote the remote manifest (its finish) */
	int reached;              /* the finish moved the remote latest to this version: REMOTE */
	int recorded;             /* this node's record of the version planned went up */
	char loc[24];             /* the version's directory below key ("" or v<created_ns>) */
	char fkey[PATH_MAX + 32]; /* key[/loc]: where its files and node records go */
	char *rmanifest;          /* the remote manifest's bytes */
	size_t rmanifest_len;
	struct store_dirid dir_id; /* the tag directory planned (an exchange replaces it) */
};

/* upload_tag.c */
/* Reads t's manifest: which nodes' files it holds, and this node's (t->mine). */
int uptag_plan(struct uptag *t, char *err, size_t errlen);
/* Uploads file f of t (from its resident copy when whole in the cache, else the file: the
 * plan's descriptor when planned, t->planned as the caller saw it): 0, 1 when it waits for
 * the plan, 2 when the tag was replaced while the file went up (t->cancel), 3 when the
 * version planned was deleted (its upload ends), or a code. */
int uptag_file(struct uptag *t, struct upfile *f, int planned, char *err, size_t errlen);
/* Once t's files are up: the node record, then (every node's there) the remote manifest,
 * latest and the local REMOTE.json. 0 done, 1 waiting for other nodes, 2 plan again (the tag
 * or the remote changed since the plan; t->reached when the version planned is in the remote
 * all the same), 3 the version planned was deleted, or a negative code. */
int uptag_finish(struct uptag *t, char *err, size_t errlen);
/* upload_version.c */
/* Plan: t's version directory, files' key and remote manifest bytes, from its local
 * manifest m and the remote manifest; 0 or a code. */
int uptag_version(struct uptag *t, const struct manifest *m, char *err, size_t errlen);
/* Before t's commit: 0 when its files may go up now, 1 when they wait for the plan (the
 * remote holds a version of the tag), or a code. */
int uptag_early(struct uptag *t, char *err, size_t errlen);
/* Writes t's remote manifest (first version: created; later: replacing the one there by its
 * etag, the old version's keys and every older version directory deleted after); 0, 2 (plan
 * again) or a code. */
int uptag_put_manifest(struct uptag *t, char *err, size_t errlen);
/* Deletes this node's files f[0..n) of a version of t given up (uptag_abandoned's) below
 * their version directories, but where the remote manifest names one; a failure is logged
 * (the keys stay, named by no manifest). */
void uptag_drop_abandoned(struct uptag *t, const struct upfile *f, size_t n);
/* upload_retain.c */
/* Deletes jobkey's committed remote tags of r beyond the newest keep (0: all kept), never
 * the one the remote latest names nor one without a manifest; 0 or a code with err. */
int upload_retain(struct remote *r, const char *jobkey, unsigned keep, char *err,
		  size_t errlen);
/* Applies keep_last_remote to t's job once t is REMOTE, when this node wrote t's manifest;
 * a failure is logged and counted (the job's next REMOTE tries again). */
void uptag_retain(struct uptag *t);

/* upload_files.c (upload.c's lock held) */
/* Adds name (of the save's file stem, size bytes) to t unless there; 0 or -1. */
int uptag_file_add(struct uptag *t, const char *name, const char *stem, uint64_t size);
/* Queues dir/name of a save's file stem when it exists, its size counted. */
void uptag_queue_file(struct uptag *t, const char *dir, const char *name, const char *stem);
/* Makes t's files those of its plan (t->mine): a file queued that the commit left out is
 * dropped before it goes up; 0 or ERR_ENOMEM. */
int uptag_plan_files(struct uptag *t, char *err, size_t errlen);
/* upload_replace.c */
#define UP_DONE 1     /* upload.c's workq events: a struct uptag reached REMOTE; */
#define UP_VERDICT 2  /* upload_replace.c's verdict on a replaced version */
/* Loop, lock held: t's committed version is replaced by the newer one of v's save (now t's):
 * the pinned version goes on (its saves wait for its outcome), else the upload plans the
 * newer one at once. *old is the version replaced, why what its saves hear; 1 when they are
 * to hear it now (uptag_tell_saves), 0 when not (held, or no version to tell). */
int uptag_replace(struct uptag *t, const struct save_view *v, struct store_dirid *old,
		  char *why, size_t len);
/* Loop, lock dropped: tells the saves of old why they will never be REMOTE when how is 1. */
void uptag_tell_saves(int how, const struct store_dirid *old, const char *why);
/* Worker, lock held: t's pinned version's upload ended, in the remote (reached) or given up;
 * the verdict on its saves, when a newer version replaced it or it was deleted (t->gone),
 * goes to the loop through q. */
void uptag_pin_ended(struct uptag *t, int reached, struct workq *q);
/* Worker, lock held, t to be planned again: copies of this node's files of the version
 * given up that went up below its own version directory while no manifest could name them
 * (this node's record of it not written, its finish not in the remote), *n of them; NULL
 * when none. */
struct upfile *uptag_abandoned(const struct uptag *t, size_t *n);
/* Loop: a verdict pushed with UP_VERDICT reaches its saves (and is freed). */
void uptag_verdict(struct workq_item *it);

/* Frees what the worker's steps held. */
void uptag_clear(struct uptag *t);
/* Aborts this node's uploads left open (a daemon killed mid-upload) in the remote of each
 * root i of cfg (remotes[i], NULL: none) whose done[i] is 0, but those busy(key) says are
 * in flight now; done[i] set once the remote could be listed (quiet: a failure is logged
 * at debug level); how many remain. */
unsigned uptag_orphans(const struct config *cfg, struct remote *const *remotes, int *done,
		       int (*busy)(const char *key), int quiet);
/* Start-up: calls resume(dir) for each committed tag below a root with a remote (remotes[i])
 * that has no REMOTE.json. */
void uptag_startup(const struct config *cfg, struct remote *const *remotes,
		   int (*resume)(const char *dir));

#endif /* DSCKPTD_UPLOAD_H */
