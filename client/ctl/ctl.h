/*
 * ctl.h — dsckptctl's modules, one section each: the command line (main.c), the connection
 * to the daemon and status (query.c), its counters (metrics.c), the saves it holds
 * (pending.c) and its uploads to remote tiers (uploads.c), offline listing (list.c) and verification (verify*.c) of checkpoints, one tag
 * (tagdir.c) described (info.c) and removed (remove.c), export through Python (export.c), and
 * the output helpers they share (output.c).
 *
 * Every command returns the process exit status: CTL_OK, CTL_FAIL (an error, already printed
 * on stderr) or CTL_USAGE.
 */
#ifndef DSCKPTCTL_H
#define DSCKPTCTL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <cjson/cJSON.h>

#include "../dsckpt.h"

#define CTL_OK 0
#define CTL_FAIL 1
#define CTL_USAGE 2

/* The parsed command line. */
struct ctl {
	const char *socket;       /* -s, else dsckpt_default_socket's */
	int json;                 /* --json: JSON on stdout instead of tables */
	const char *arg;          /* the command's operand (list ROOT, verify DIR) */
	const char *dir;          /* wait --dir */
	double timeout;           /* wait --timeout in seconds; 0: none */
	int allow_uncommitted;    /* verify --allow-uncommitted */
	unsigned keep;            /* prune --keep N */
	int dry_run;              /* rm/prune --dry-run */
	int force;                /* rm/prune --force: no daemon to ask about saves in flight */
	int rm_latest;            /* rm --latest: the tag `latest` names may go */
	int wait;                 /* pull --wait */
};

/* The staging directory of an overwrite of tag T lies beside it as .T.dsckpt-next; names of
 * this form (hidden, with ".dsckpt-") are the daemon's, never a tag of their own. */
#define TAG_NEXT_SUFFIX ".dsckpt-next"
#define TAG_HIDDEN_MARK ".dsckpt-"

/* query.c — the daemon's socket, through libdsckpt's connection code (client/lib/conn.c). */
struct lib_reply;
/* Connects to ctl->socket and introduces dsckptctl (HELLO); NULL once why is printed. */
dsckpt_conn_t *query_open(const struct ctl *ctl);
/* Sends a query without arguments (STATUS, PENDING) and reads its reply; 0, or -1 once why
 * is printed. */
int query_send(dsckpt_conn_t *c, unsigned type, struct lib_reply *r);
/* Frees a query's reply; 0, or -1 once the malformed key is printed. */
int query_end(dsckpt_conn_t *c, struct lib_reply *r);
/* Prints the daemon's state (STATUS). */
int query_status(struct ctl *ctl);
/* A file the daemon keeps in its host cache (STATUS's resident list). */
struct ctl_resident {
	char *dir;
	char *file;
	uint64_t bytes;
	int committed;
};
/* A tag of the daemon's node whose files peers hold (STATUS's peer_copies). */
struct ctl_held {
	char *dir;
	char *peers;    /* those that acknowledged a copy, ", " between */
};
/* Asks the daemon at ctl->socket, printing nothing, for the resident files this user may see:
 * how many (*out, query_residents_free), or -1 when it cannot say (not running, older); and
 * the tags peers hold (*held, *nheld: none from an older daemon; query_held_free). */
long query_residents(const struct ctl *ctl, struct ctl_resident **out, struct ctl_held **held,
		     long *nheld);
/* Frees what query_residents returned in held. */
void query_held_free(struct ctl_held *v, long n);
/* Frees what query_residents returned. */
void query_residents_free(struct ctl_resident *v, long n);
/* Asks the daemon at ctl->socket for its allowed roots: how many (*out, query_roots_free), or
 * -1 once why is printed. */
long query_roots(const struct ctl *ctl, char ***out);
/* Frees what query_roots returned. */
void query_roots_free(char **roots, long n);

/* pull.c — a checkpoint read ahead into the daemon's cache (PREFETCH), pulled from the
 * remote tier first when only that holds it. */
/* pull [--wait] JOB[/TAG]. */
int pull_run(struct ctl *ctl);

/* metrics.c */
struct ctl_metrics;
/* Asks an open connection for the daemon's counters (METRICS); NULL once why is printed. */
struct ctl_metrics *metrics_query(dsckpt_conn_t *c);
/* Frees what metrics_query returned. */
void metrics_free(struct ctl_metrics *m);
/* The counters as a JSON object (metrics --json, status --json's "metrics"). */
cJSON *metrics_json(const struct ctl_metrics *m);
/* Prints the daemon's metrics in Prometheus' text format (JSON with --json). */
int metrics_run(struct ctl *ctl);

/* pending.c */
/* Prints one row per save the daemon holds (PENDING). */
int pending_run(struct ctl *ctl);
/* Asks the daemon at ctl->socket, printing nothing, how many saves into tag directory dir
 * (absolute; or its .<tag>.dsckpt-next) it holds that are neither COMMITTED nor FAILED; the
 * first one in what. -1 when no daemon answers. With PENDING_LIVE, only the saves still live
 * count: below DURABLE (being written), or whose trainer is still connected (it may seal);
 * a DURABLE save of a trainer gone (a killed run) does not. */
#define PENDING_ANY 0
#define PENDING_LIVE 1
long pending_in_tag(const struct ctl *ctl, const char *dir, int which, char *what, size_t len);
/* Waits until no save (of ctl->dir) is below DURABLE; fails if one FAILED or on timeout. */
int pending_wait(struct ctl *ctl);

/* list.c */
/* Lists the checkpoint tags under ctl->arg without the daemon, or, without ROOT, under the
 * allowed roots of the daemon that answers. */
int list_run(struct ctl *ctl);

/* verify.c */
/* Re-reads and checks every file of the checkpoint directory ctl->arg without the daemon
 * (its parts: verify.h). */
int verify_run(struct ctl *ctl);

struct manifest;
/* tagdir.c — one tag directory opened without following links, for info, rm and prune. */
struct tagdir {
	int fd;                  /* the tag directory, opened O_NOFOLLOW */
	int parentfd;            /* its parent, where `latest` lives (borrowed or owned) */
	int own_parent;          /* parentfd is closed with the tag */
	char name[256];          /* its base name */
	char *path;              /* its absolute path */
	int is_tag;              /* holds *.safetensors, *.partial, SEAL.*.json or MANIFEST.json */
	int manifest;            /* MANIFEST.json is there */
	struct manifest *m;      /* and parses (committed), else NULL */
	unsigned partial;        /* *.partial files: unfinished writes */
	unsigned files;          /* regular files and links directly inside */
	uint64_t bytes;          /* their total size */
	int latest;              /* ../latest names it */
	int next;                /* .<name>.dsckpt-next lies beside it (an overwrite) */
	unsigned uid;            /* its owner */
	uint64_t changed_ns;     /* when its directory last changed (mtime) */
};
/* Whether a directory entry's name is one of the daemon's hidden ones (TAG_HIDDEN_MARK). */
int tagdir_hidden(const char *name);
/* Opens the tag directory path (a link there is refused, not followed) and reads what it
 * holds; 0, or -1 once why is printed. */
int tagdir_open(const char *path, struct tagdir *t);
/* Opens directory name inside parentfd (absolute path parent) the same way; 0, or -1 with
 * why (nothing printed). */
int tagdir_openat(int parentfd, const char *parent, const char *name, struct tagdir *t,
		  char *why, size_t len);
/* Closes what tagdir_open* opened. */
void tagdir_close(struct tagdir *t);
/* Whether this user may remove t: root, or the owner of the directory; else 0 with why. */
int tagdir_mine(const struct tagdir *t, char *why, size_t len);
/* The name the `latest` file in directory fd holds (into buf), or NULL when there is none. */
const char *tagdir_latest(int fd, char *buf, size_t len);
/* Whether a save into t may be in flight: 0 when not (the daemon says so, or, with no daemon,
 * t is committed with nothing unfinished); TAG_BUSY when the daemon holds one (in what; which
 * saves count: pending_in_tag's which); TAG_MAYBE_BUSY when no daemon answers to tell and t
 * is not plainly finished (what says so). */
#define TAG_BUSY 1
#define TAG_MAYBE_BUSY 2
int tagdir_busy(const struct ctl *ctl, const struct tagdir *t, int which, char *what,
		size_t len);

/* info.c */
/* Describes the tag directory ctl->arg: state, files, ranks, dtypes, run, checksums. */
int info_run(struct ctl *ctl);

/* remove.c */
/* Removes the tag directory ctl->arg (rm), printing what went. */
int remove_run(struct ctl *ctl);
/* Removes the committed tags of job directory ctl->arg but the ctl->keep newest and the one
 * `latest` names (prune), printing what went and what was kept. */
int prune_run(struct ctl *ctl);

/* export.c */
/* Replaces this process with python -m dsckpt export and the n arguments args ($DSCKPT_PYTHON,
 * else python3; -s as $DSCKPT_SOCKET); returns only when that cannot start (CTL_FAIL, once
 * why is printed). */
int export_exec(const struct ctl *ctl, int n, char **args);

/* output.c */
/* Prints "dsckptctl: message" on stderr, or, after out_set_json(1), {"error": "message"} on
 * stdout. */
void out_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Whether out_err writes JSON (--json). */
void out_set_json(int on);
/* Formats a byte count in binary units ("512 B", "1.5 GiB") into buf. */
const char *out_bytes(uint64_t n, char *buf, size_t len);
/* Formats a rate in bytes/s in out_bytes' binary units ("850 MiB/s", "2.33 GiB/s") into buf. */
const char *out_rate(uint64_t bytes_per_s, char *buf, size_t len);
/* Formats a duration in milliseconds ("850ms", "12.3s", "5m02s", "2h03m", "3d04h") into buf. */
const char *out_duration(uint64_t ms, char *buf, size_t len);
/* Prints a JSON document on stdout and frees it; CTL_FAIL if it could not be printed. */
int out_json(cJSON *doc);

/* A table of text cells printed with aligned columns; the last column is not padded. */
struct table;
/* Starts a table with ncols column headings (given as ncols strings). */
struct table *table_new(unsigned ncols, ...);
/* Right-aligns column col (numbers). */
void table_right(struct table *t, unsigned col);
/* Appends a row of ncols cells (copied). */
void table_row(struct table *t, ...);
/* Attaches a line printed indented below the last row (e.g. a failure's reason). */
void table_note(struct table *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prints the table on f and frees it. */
void table_print(struct table *t, FILE *f);

/* uploads.c — PENDING's tags not yet REMOTE (dsckptctl pending). */
struct proto_map;
struct pupload {
	char *dir, *remote, *error;   /* error: the last failure, or what the tag waits for */
	uint64_t files, files_done, total, done, age_ms;
	int64_t code;                 /* the last failure's DSCKPT_E*, or 0 */
	int committed;
};
struct pupload_list {
	struct pupload *v;
	size_t n;
};
/* Decodes PENDING's "uploads" from m into l (a failure is m's error). */
void pupload_decode(struct proto_map *m, struct pupload_list *l);
/* Frees the list. */
void pupload_free(struct pupload_list *l);
/* The list as a JSON array. */
cJSON *pupload_json(const struct pupload_list *l);
/* Prints one row per tag (with its error below it) after a blank line and a summary. */
void pupload_print(const struct pupload_list *l, FILE *f);

/* copies.c — PENDING's tags whose peer copies are not all held (dsckptctl pending). */
struct prepl {
	char *dir, *peers, *error;    /* peers: those holding a copy, ", " between; error: why
				       * no more (state "short") */
	char state[16];               /* "queued", "sending" or "short" */
	uint64_t copies, replicas, bytes, age_ms;
};
struct prepl_list {
	struct prepl *v;
	size_t n;
};
/* Decodes PENDING's "replications" from m into l (a failure is m's error). */
void prepl_decode(struct proto_map *m, struct prepl_list *l);
/* Frees the list. */
void prepl_free(struct prepl_list *l);
/* The list as a JSON array. */
cJSON *prepl_json(const struct prepl_list *l);
/* Prints one row per tag (why no more below one left short) after a blank line. */
void prepl_print(const struct prepl_list *l, FILE *f);

#endif /* DSCKPTCTL_H */
