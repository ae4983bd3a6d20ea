/*
 * dsckptd.h — the daemon's internal API, one section per subsystem (file named for it). It
 * is over 600 lines on purpose: it is the one page a reader learns the daemon from.
 *
 * Data and control go one way, each layer calling only the ones below it:
 *
 *   server.c (listening socket) → conn.c (frames, descriptors, credentials)
 *     → request.c (dispatch, down to request_load.c and request_plan.c; request_decode.c
 *       their shared decoding; auth.c checks; session.c: identity and regions)
 *       → query.c (STATUS, PENDING, METRICS from the registries' read-only views)
 *       → overwrite.c (which version of a tag a save, seal, commit names: the tag or its
 *         staging directory .<tag>.dsckpt-next)
 *       → wait.c (WAITs) · commit.c (COMMITs) · seal.c (SEALs; seal_watch.c: a sealed tag
 *         watched for the manifest another node writes; seal_files.c: the files a node's
 *         seal record describes; seal_dirs.c: the tag directories SAVE_BEGINs opened, kept
 *         for their ranks' SEALs)
 *       → save_marks.c (the levels a tag directory's saves reach together: COMMITTED,
 *         REMOTE, REPLICATED; called by commit.c, seal.c, upload.c, peer.c)
 *       → save_gc.c (finished saves forgotten, or slimmed and kept for their client)
 *       → save.c (registry, levels; tensors.c, plan.c, blob.c, quota.c: lists, plans,
 *         blobs, per-user limits)
 *         → waiter.c (requests parked until a level or a deadline, by connection id)
 *         → engine.c: copy threads, each with a copier (source.c, cuda_source.c,
 *           cuda_copier.c, cuda.c: the bytes in)
 *           → cache.c (chunks; cache_numa.c: its NUMA pools) → flush threads (flush_file.c:
 *             a file's header, pieces, finish)
 *           → store_*.c, retention.c (files on disk, calling one way: store_commit.c →
 *             store_describe.c → store_seal_desc.c, store_seal.c; store_commit.c →
 *             store_latest.c → retention.c → store_tag.c; store_swap.c: a tag's staging
 *             directory and the exchange that replaces the tag; their format is format/'s)
 *           → resident.c (chunks of files just written, kept for restores while room lasts)
 *     → request_load.c → load.c (loads, destinations) → load_file.c (the file, its header)
 *         → restore.c: restore threads, each with a copier (the bytes out), their jobs and
 *           claims → restore_fill.c (restore_int.h): a claimed unit's pieces from the
 *           resident copy or the file (page cache or O_DIRECT), checked, written back
 *       → prefetch.c (PREFETCH: a tag read ahead into the cache's resident copies)
 *         → pull.c (load.c's and prefetch.c's: a remote-only tag brought into the local tier
 *           over remote.c, checked, then store_*.c's files, manifest and latest; asking
 *           pull_peer.c first: the same from other nodes' copies, found and fetched by
 *           peer_restore.c over peer.c's links; both write each file through pull_file.c)
 *
 * and state changes come back up as events: the engine's to save.c (engine_cb, on the loop
 * thread), save and load levels published to waiter.c (which ends the waits they satisfy
 * through their state machines' handlers), save levels to their observers (commit.c, seal.c,
 * metrics_save.c, peer.c; all wired in main.c), and every answer to the client through reply.c, by
 * connection id; reply.c encodes values it is handed (query.c's for the queries) and reads
 * no registry. conn.c knows no handler: main.c hands it request.c's dispatch and disconnect
 * callbacks. Below the request layer nothing holds a connection pointer or a struct session:
 * a request reaches the registries as a struct owner. tests/check-layers checks that no file
 * calls up.
 *
 * main.c makes the daemon's one context, struct daemon (the loop, the current config, the
 * cache, the GPU line, the start time), and hands it at start-up to the modules that read it
 * (server, service, request, query, save, load, commit, seal, tensors), which keep it in a
 * file-static daemon_ctx and read the config through it, so a reload's is the one they see;
 * the layers below get what they need as arguments. No file reads or calls anything of
 * main.c's (tests/check-layers fails on it). Beside the layers, main.c also calls config.c
 * (the option table; config_load.c and config_remote.c read it, userconf.c picks the file),
 * detach.c, lock.c, recover.c, service.c (notify.c speaks to systemd), log.c, and remote.c
 * (a root's remote tier: remote_s3.c → remote_s3_req.c over libcurl, remote_file.c,
 * rate_cap.c's upload cap, shared with peer_send.c; checked by dsckptd -n; read by pull.c for loads and PREFETCH;
 * written by upload.c, a save observer beside commit.c and seal.c with worker threads of
 * its own, upload_tag.c the remote steps of a tag, upload_version.c the remote version a tag
 * writes (a tag saved again replaces it), upload_orphans.c the uploads a killed daemon left
 * open, upload_files.c a tag's files, upload_replace.c what the saves of a version replaced
 * before its upload ended hear, upload_retain.c keep_last_remote after
 * them, upload.h what they share, calling
 * down into save.c (REMOTE), resident.c, store_*.c and remote.c), and
 * peer.c (peer copies, on with a peer_secret_file; also an observer of save levels): its
 * sender thread → peer_tag.c (the tag's files of this node; resident.c: the data sent from
 * the cache where it is kept), peer_place.c (where copies go: a pure function of the job's
 * host names) and peer_send.c (rate_cap.c caps it; peer_window.c: a file's pieces in flight
 * at once on a link, as peer_serve.c's), its settling → save.c (REPLICATED,
 * through workq.c); peer_listen.c's
 * listener and connection threads → peer_serve.c (→ peer_member.c: whether the asking
 * daemon is a node of a copy's job; peer_nodes.c: the job's nodes its trainers told,
 * NODES through request_load.c, also read by peer_restore.c); both → peer_auth.c (HMAC over the
 * shared secret), peer_ucx.c (UCX's ucp) and replica_store.c (other nodes' copies, checked,
 * in memory or replica_root; replica_list.c: LIST and FETCH by tag; replica_recover.c: those
 * on replica_root taken back at start). None runs on the loop thread but peer_on_save, which
 * only queues, the settling of a tag sent, and what PENDING reads (peer_each).
 *
 * Threads: the libuv loop thread owns connections, saves and their levels. Copy threads pull
 * bytes from sources into cache chunks; flush threads write chunks to files. Workers hand
 * completions back to the loop through workq.c (a locked queue + uv_async_send, shared by
 * engine.c and restore.c); commits run store_commit in libuv's threadpool.
 */
#ifndef DSCKPTD_H
#define DSCKPTD_H

#include <sched.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "../format/errors.h"
#include "../format/format.h"

/* DSCKPTD_VERSION comes from the Makefile, read out of client/dsckpt.h (one version). */
#define DSCKPTD_DEFAULT_CONFIG "/etc/dsckptd/dsckptd.json"
#define ERRLEN 1024

struct config;
struct cache;
struct source;
struct save;
struct conn;
struct store_file;
struct seal_seen;
struct resident;
struct uv_loop_s;
struct proto_out;
struct daemon;

/* log.c */
enum log_level { LOG_LVL_ERROR, LOG_LVL_WARN, LOG_LVL_INFO, LOG_LVL_DEBUG };
/* Sets the program name and threshold; messages go to stderr (the journal under systemd). */
void log_init(const char *prog, int level);
/* Changes the threshold at run time (SIGHUP reload). */
void log_set_level(int level);
/* Parses "error" … "debug"; -1 if unknown. */
int log_level_parse(const char *s);
/* Name of a level. */
const char *log_level_name(int level);
/* Logs at error level. */
void log_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Logs a warning followed by ": strerror(errno)"; errno is preserved. */
void log_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Logs a warning. */
void log_warnx(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Logs at info level. */
void log_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Logs at debug level (cheap when debug is off). */
void log_debug(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Writes "uid 1002 (alice)" (the name when known) into buf and returns buf. */
char *log_uid(unsigned uid, char *buf, size_t len);
/* Opens path (absolute) for appending: every line goes there too; 0 or -1 with err. */
int log_open(const char *path, char *err, size_t errlen);
/* Opens the log file again by its path (SIGHUP, after logrotate); no-op without one. */
void log_reopen(void);
/* Sends every line to syslog (facility daemon) too. */
void log_to_syslog(void);
/* Stops writing lines to stderr (a background daemon, once ready). */
void log_detach(void);
/* The log file's path, "syslog", or NULL when lines go to stderr alone. */
const char *log_target(void);
/* Seconds on the monotonic clock. */
double now_mono(void);

/* rate_cap.c — a bandwidth cap: a token bucket of bytes shared by threads (the remote tier's
 * uploads, peer copies' sends), so that they leave the trainer its network. */
struct rate_cap;
/* A cap of mib_per_s MiB/s (0: none); NULL without memory. */
struct rate_cap *rate_cap_new(double mib_per_s);
/* Frees a cap no thread takes from any more. NULL is fine. */
void rate_cap_free(struct rate_cap *c);
/* Waits until n more bytes may go under c (NULL: no cap); any thread. */
void rate_cap_take(struct rate_cap *c, size_t n);

/* userconf.c — the configuration of a dsckptd started without -c: root's
 * /etc/dsckptd/dsckptd.json, another user's ~/.config/dsckptd/dsckptd.json, else built-in
 * defaults (for another user, a per-user daemon's: socket and root of its own, a cache it
 * may lock). Into *out; the file read in *path (malloc'd; NULL: built-in defaults); the line
 * saying what was chosen without a file into say (else ""); -1 with err. */
int userconf_load(struct config **out, char **path, char *say, size_t saylen, char *err,
		  size_t errlen);

/* detach.c — starting in the background: the command returns once the daemon is ready. */
/* Forks; the parent waits for the child's word and exits 0 once it is ready, or with the
 * child's status when it fails first; the child, in a session of its own, returns 0. -1 with
 * err when it cannot fork. */
int detach_start(char *err, size_t errlen);
/* In the child: stdin, stdout and stderr to /dev/null, lines to the log file or syslog alone,
 * and the parent told that the daemon is ready; no-op in the foreground. */
void detach_ready(void);
/* path made absolute against the current directory (malloc'd; NULL without memory). */
char *detach_abspath(const char *path);
/* Writes this process's pid into path (absolute; atomically, by rename), to be removed by
 * pidfile_remove; 0 or -1 with err. */
int pidfile_write(const char *path, char *err, size_t errlen);
/* Removes the pid file if it still names this process (exit). */
void pidfile_remove(void);

/* config.c (the option table), config_load.c (reading, validating) */
/* A validated configuration; replaced whole on reload, never edited in place, and kept alive
 * by references (config_ref) for work that runs past a reload, such as a commit. */
struct config {
	unsigned refs;             /* loop thread only; 1 from config_load */
	char *socket;              /* path of the Unix socket */
	char *host;                /* this node's name; "" for the hostname (store_host) */
	unsigned socket_mode;      /* from an octal string, e.g. "0660" */
	char *socket_group;        /* the socket's group by name; "": the daemon's own */
	gid_t socket_gid;          /* its gid; (gid_t)-1 for "" */
	char **allowed_roots;      /* absolute, canonical (realpath) directories */
	size_t n_roots;
	double host_cache_gib;     /* as written */
	uint64_t host_cache_bytes; /* rounded down to whole chunks */
	uint64_t chunk_bytes;      /* cache chunk (copy/flush unit), multiple of 4096 */
	unsigned flush_threads;
	unsigned copy_threads;
	unsigned restore_threads;  /* 0: chosen at start */
	int keep_resident;         /* keep files just saved in the cache (resident.c) */
	int gpu_checksums;         /* loads into GPU memory are checked there (restore.c) */
	unsigned keep_last;        /* 0 = keep all */
	int log_level;             /* enum log_level */
	int o_direct;              /* write files with O_DIRECT where the filesystem allows */
	unsigned file_mode;        /* of the files dsckptd writes */
	unsigned dir_mode;         /* of the directories it creates */
	/* Per-user limits (quota.c); a user is a uid, over all of its connections. */
	unsigned max_conns_per_user;
	unsigned max_saves_per_user;
	unsigned max_loads_per_user;
	unsigned max_plans_per_user;
	unsigned max_regions_per_user;
	double max_region_gib;     /* as written; 0 = the machine's RAM */
	uint64_t max_region_bytes; /* host memory mapped for one user */
	uint64_t max_unread_bytes; /* buffered input and output of one user's connections */
	uint64_t max_blob_bytes;   /* blobs of one user's saves in flight */
	uint64_t max_held_bytes;   /* what the daemon decoded and keeps for one user */
	unsigned max_tensors_per_save;
	unsigned max_seals_per_user;
	unsigned max_recovery_entries; /* start-up recovery's budget of one user (recover.c) */
	uint64_t max_recovery_bytes;
	/* The remote tier (config_remote.c reads these; remote.c uses them). */
	char **root_remotes;       /* per allowed root: "s3://bucket/prefix", "file:///dir" or NULL */
	char *s3_endpoint;         /* "http(s)://host[:port]"; "" for AWS's of s3_region */
	char *s3_region;
	int s3_virtual;            /* addressing: 1 virtual-hosted (bucket.host), 0 path */
	char *s3_credentials_file; /* "" for none */
	char *s3_key_id, *s3_secret, *s3_token; /* read from it; never logged (token may be NULL) */
	unsigned upload_concurrency;   /* requests in flight per transfer */
	uint64_t upload_part_bytes;    /* multipart part size */
	double upload_max_mib_per_s;   /* shared by all uploads of the daemon; 0: no cap */
	unsigned keep_last_remote;     /* committed tags kept per job in the remote tier; 0: all */
	/* Peer copies (config_peer.c reads these; peer*.c and replica_store.c use them). */
	unsigned replicas;         /* other nodes holding each node's committed files; 0: none */
	unsigned peer_port;        /* UCX listener's TCP port */
	char *peer_secret_file;    /* "": peer copies off */
	char *peer_secret;         /* its bytes, trailing white space cut; never logged */
	size_t peer_secret_len;
	double replica_cache_gib;  /* as written */
	uint64_t replica_cache_bytes;
	char *replica_root;        /* canonical; "": copies held in memory only */
	double peer_max_mib_per_s; /* what sending copies may take of the network; 0: no cap */
	char *peer_hosts;          /* the cluster's daemons a restore asks for copies; "": none */
};
/* Reads, parses and validates path into a fresh config; -1 with every problem in err. */
int config_load(const char *path, struct config **out, char *err, size_t errlen);
/* The same from len bytes of JSON text. */
int config_load_text(const char *text, size_t len, struct config **out, char *err,
		     size_t errlen);
/* Takes a reference to cfg (loop thread); returns cfg. */
struct config *config_ref(struct config *cfg);
/* Drops a reference (loop thread); the last one frees it. NULL is fine. */
void config_unref(struct config *cfg);
/* Frees a config whatever its references (start-up errors, tools). */
void config_free(struct config *cfg);
/* Prints every option (name, type, range, default, help) for --help. */
void config_print_help(FILE *f);
/* config_remote.c: the index of the allowed root of cfg that path (absolute) lies in or
 * below, or -1; its remote tier's URL (NULL: none) into *remote when remote is not NULL. */
int config_root_of(const struct config *cfg, const char *path, const char **remote);
/* Whether cfg turns peer copies on: a peer_secret_file read and replicas not 0
 * (config_peer.c). */
int config_peer_on(const struct config *cfg);

/* remote.c — a root's remote tier (DESIGN.md §9): an S3-compatible store (remote_s3.c, over
 * libcurl: SigV4 signing, parallel requests on a multi handle) or a shared directory
 * (remote_file.c: temporary file, fsync, rename), behind one set of blocking calls that
 * several threads may make at once. A key is a relative path of names of [A-Za-z0-9._-]
 * ("job/tag/rank0.safetensors"), under the remote's prefix. Errors are negative codes with
 * one line in err: EACCES (refused: credentials, policy, permissions), ENOENT (no bucket,
 * object or directory), EEXIST (a conditional write lost), ENOSPC (a full filesystem), EIO
 * or ETIMEDOUT (the endpoint unreachable, a server error), EINVAL. Credentials never reach a
 * message or a log line. */
struct remote;
#define REMOTE_ETAG_MAX 128
/* Conditions of remote_put. */
enum remote_cond {
	REMOTE_ANY,     /* create or replace */
	REMOTE_CREATE,  /* only if no object has the key (If-None-Match: *, O_EXCL/link) */
	REMOTE_REPLACE  /* only if the object is still the one of etag (If-Match) */
};
/* Where an upload's bytes come from (the cache's resident copy, a file): read fills buf with
 * the len bytes at off of size; 0 or a negative code. Called from the calling thread only. */
struct remote_src {
	int (*read)(void *arg, uint64_t off, void *buf, size_t len);
	void *arg;
	uint64_t size;
};
/* An upload left open (a multipart upload, a temporary file), as remote_list_uploads finds
 * it; nonzero from the callback stops the listing with that value. */
typedef int (*remote_upload_cb)(void *arg, const char *key, const char *id);
/* Opens the remote tier url ("s3://bucket/prefix", "file:///dir") with cfg's s3 and upload
 * keys; nothing is contacted yet. 0 or a negative code with err. */
int remote_open(const struct config *cfg, const char *url, struct remote **out, char *err,
		size_t errlen);
/* Closes r (no call in flight). NULL is fine. */
void remote_close(struct remote *r);
/* The URL r was opened with. */
const char *remote_url(const struct remote *r);
/* Whether r answers: the bucket exists and the credentials work, or the directory exists
 * and is writable; 0 or a negative code with one line in err. */
int remote_check(struct remote *r, char *err, size_t errlen);
/* Writes len bytes as key under cond (etag: REMOTE_REPLACE's expected version); the new
 * version's etag into etag_out (REMOTE_ETAG_MAX bytes) when not NULL. 0 or a code. */
int remote_put(struct remote *r, const char *key, const void *buf, size_t len, int cond,
	       const char *etag, char *etag_out, char *err, size_t errlen);
/* Writes src as key: S3 multipart in parallel parts past one part (aborted on failure), the
 * file tier through a temporary file; held to upload_max_mib_per_s. 0 or a code. */
int remote_upload(struct remote *r, const char *key, const struct remote_src *src, char *err,
		  size_t errlen);
/* Reads len bytes at off of key into buf, in parallel ranges; 0 or a code (ENOENT: no such
 * key; EIO: shorter than off + len). */
int remote_get(struct remote *r, const char *key, uint64_t off, void *buf, size_t len,
	       char *err, size_t errlen);
/* The size and etag (REMOTE_ETAG_MAX bytes; NULL is fine) of key; 0 or a code. */
int remote_head(struct remote *r, const char *key, uint64_t *size, char *etag, char *err,
		size_t errlen);
/* Key read whole, at most max bytes (EMSGSIZE past it), malloc'd with a NUL after it, its
 * length into len and etag (NULL is fine) as remote_head's; NULL with *rc (ENOENT: not
 * there). */
char *remote_read_whole(struct remote *r, const char *key, size_t max, size_t *len,
			char *etag, int *rc, char *err, size_t errlen);
/* Deletes key; 0 (also when it was not there) or a code. */
int remote_delete(struct remote *r, const char *key, char *err, size_t errlen);
/* Calls cb for each upload left open under prefix ("" for all); 0, cb's nonzero, or a
 * code. */
int remote_list_uploads(struct remote *r, const char *prefix, remote_upload_cb cb, void *arg,
			char *err, size_t errlen);
/* A name directly below a listed prefix (remote_list). */
typedef int (*remote_name_cb)(void *arg, const char *name);
/* Calls cb with each name directly below prefix (the "directories" and the keys), only names
 * a key may hold (no '/', ".", ".." or temporary file), page by page; cb's nonzero return
 * stops it and is returned. 0 or a code. */
int remote_list(struct remote *r, const char *prefix, remote_name_cb cb, void *arg, char *err,
		size_t errlen);
/* Aborts the upload id of key (from remote_list_uploads); 0 or a code. */
int remote_abort(struct remote *r, const char *key, const char *id, char *err,
		 size_t errlen);
/* Whether a failure with code may pass if tried again later (unreachable, server error,
 * full filesystem), as opposed to one that needs a person (credentials, missing bucket). */
int remote_retryable(int code);
/* Whether name is the directory of a later version of a tag saved again ("v<created_ns>"),
 * below the tag in a remote tier: its files and node records (its manifest's "remote_dir"). */
int remote_version_name(const char *name);
/* Checks the remote tier of every root of cfg (dsckptd -n): 0, or -1 with one line per
 * remote that does not answer in err. */
int remote_check_roots(const struct config *cfg, char *err, size_t errlen);

/* pull.c — a committed tag of a root's remote tier brought into the local tier for a user
 * (loads of a tag the node lacks, PREFETCH): only a tag whose remote manifest names that uid
 * (any for root); files checked against the manifest's checksums before they are renamed into
 * place, owned by the manifest's user, the manifest written last, `latest` moved forward.
 * Blocking (libuv's threadpool); pulls of one directory run one at a time. */
#define PULL_DIR_MAX 4096
/* Where a pull's files came from (pull_info.pulled). */
enum { PULL_REMOTE = 1, PULL_PEER = 2 };
/* What a pull did. */
struct pull_info {
	char tag[256];
	int pulled;              /* PULL_REMOTE, PULL_PEER: the files were written here from
				  * there; 0: here already */
	uint64_t files, bytes;   /* pulled */
	uint64_t created_ns;     /* the tag's commit time (its manifest's) */
	double seconds;
};
/* Whether the tag dir is committed here: its MANIFEST.json there, the directory owner's (any
 * for owner 0). */
int pull_committed_here(const struct config *cfg, const char *dir, uid_t owner, gid_t gid);
/* Whether dir (<root>/<job>/<tag>) lies below a root that has a remote tier. */
int pull_has_remote(const struct config *cfg, const char *dir);
/* Whether a tag dir missing here could be pulled: peer copies on, or a remote tier. */
int pull_has_source(const struct config *cfg, const char *dir);
/* Whether the peers' copies (asked first) or the remote tier hold tag dir committed for uid:
 * 0, or a code (ENOENT: not committed there; EACCES: another user's) with err. */
int pull_check(const struct config *cfg, const char *dir, uid_t uid, char *err, size_t errlen);
/* A load's pull (load.c): as pull_tag, but from the remote tier only the files of the stem
 * file (its .safetensors and .meta); the manifest and `latest` are written once every file
 * of the tag is here (the other ranks' loads, or a whole pull), the tag uncommitted here
 * until then. From peers' copies the tag comes whole. */
int pull_tag_file(const struct config *cfg, const char *dir, const char *file, uid_t uid,
		  gid_t gid, struct pull_info *info, char *err, size_t errlen);
/* Brings the tag dir into the local tier for uid/gid from peers' copies (pull_peer_tag) when
 * peer copies are on, else (or when no peer holds it) from the remote tier; nothing when it is
 * committed here already; 0 or a code with err (ENOENT: not committed remotely, EACCES: another user's,
 * ECHECKSUM: an object differs from its manifest; nothing is committed here then). */
int pull_tag(const struct config *cfg, const char *dir, uid_t uid, gid_t gid,
	     struct pull_info *info, char *err, size_t errlen);
/* pull_file.c — one file of a pulled tag written into the local tier, for pull.c and
 * pull_peer.c. Reads len bytes at off of the file being pulled into buf; 0 or a code with
 * err. */
typedef int (*pull_read_fn)(void *arg, uint64_t off, void *buf, size_t len, char *err,
			    size_t errlen);
/* Writes file f into dfd as <name>.partial owned by uid/gid (replacing one a dead pull
 * left), read through read in pieces of cap bytes into buf, hashed on the way and checked
 * against the manifest's checksum before it is renamed into place; 0 or a code with err
 * naming what (ECHECKSUM: it differs), nothing of the file left then. */
int pull_file_write(const struct config *cfg, int dfd, const struct manifest_file *f,
		    uid_t uid, gid_t gid, pull_read_fn read, void *arg, uint8_t *buf, size_t cap,
		    const char *what, char *err, size_t errlen);
/* pull_peer.c — the same from other nodes' copies (peer_restore.c), asked before the remote
 * tier: a tag dir brought into the local tier for uid, as pull_tag (ENOENT: no peer holds
 * it); and the newest tag of jobdir the peers hold, into tag and created_ns. */
int pull_peer_tag(const struct config *cfg, const char *dir, uid_t uid, gid_t gid,
		  struct pull_info *info, char *err, size_t errlen);
int pull_peer_latest(const struct config *cfg, const char *jobdir, uid_t uid, char *tag,
		     size_t taglen, uint64_t *created_ns, char *err, size_t errlen);
/* Whether a peer holds a copy of tag dir (for uid: the job's nodes it told count): 0,
 * ENOENT, or a code with err. */
int pull_peer_check(const struct config *cfg, const char *dir, uid_t uid, char *err,
		    size_t errlen);
/* The tag the remote `latest` of jobdir names, when its remote manifest is there and names uid
 * (any for root): into tag, its commit time into created_ns; 0 or a code with err. */
int pull_latest(const struct config *cfg, const char *jobdir, uid_t uid, char *tag,
		size_t taglen, uint64_t *created_ns, char *err, size_t errlen);

/* peer_place.c — where a node's committed files get their peer copies (issue 35): the job's
 * host names (from its seal records, in any order) sorted, each once, read as a ring. The
 * pointers written into out are hosts' own. */
/* The peers that keep self's copies: the `replicas` hosts after self on the ring (fewer when
 * the job has fewer other nodes), at most cap; how many, -ENOENT when self is not among
 * hosts, or -ENOMEM. */
int peer_place(const char *const *hosts, size_t n, const char *self, unsigned replicas,
	       const char **out, size_t cap);
/* The nodes whose copies self keeps: the `replicas` hosts before self on the ring; as
 * peer_place. */
int peer_place_owners(const char *const *hosts, size_t n, const char *self, unsigned replicas,
		      const char **out, size_t cap);

/* peer_member.c — whether a peer daemon is a node of a copy's job (issue 35 item 3): told
 * apart by its link's address (peer_link_who's "address:port"), to which a node's host name
 * resolves; a copy's nodes are its owner and the hosts of the seal records in its tag
 * directory here. Blocking (name resolution); any thread. */
struct replica_id;
/* Calls fn(arg, host) for each seal record's host in dir (SEAL.<host>.json) until fn returns
 * non-zero; that value, or 0 (also when dir is not here). */
int peer_member_hosts(const char *dir, int (*fn)(void *arg, const char *host), void *arg);
/* Whether name (a host name or address) resolves to the address of who. */
int peer_member_is(const char *name, const char *who);
/* Whether a host of a seal record in dir is the daemon at who. */
int peer_member_dir(const char *dir, const char *who);
/* Whether the daemon at who is a node of copy id (owner, or seal records of id->dir here). */
int peer_member_of(const struct replica_id *id, const char *who);
/* Whether name is this node: its `host`, or a name of one of its interfaces' addresses
 * (loopback's aside). */
int peer_member_self(const char *name);

/* peer_nodes.c — a job's nodes as its trainers told them (NODES, from the process group):
 * for a replacement node of a new name and address, whom to ask and which ranks to fetch;
 * on the nodes holding copies, which daemons are nodes of the job for the copies of the
 * user who told. In memory, each user's last PEER_NODES_PER_USER jobs told (charged to its
 * max_held_mib_per_user); no user's telling replaces another's. Any thread. */
#define PEER_NODES_MAX 4096        /* nodes of one job told */
#define PEER_NODES_PER_USER 16     /* jobs one user's tellings are kept of */
#define PEER_NODES_MAX_RANKS 256   /* this node's ranks told (a FETCH's most) */
#define PEER_NODES_JOB_MAX 256     /* a job's name (its directory's) */
/* Records that uid's job runs on the n hosts and this node's ranks are ranks; 0, or
 * ERR_EINVAL, ERR_ELIMIT (max_held_mib_per_user), ERR_ENOMEM with err. */
int peer_nodes_tell(const char *job, uid_t uid, const char *const *hosts, unsigned n,
		    const unsigned *ranks, unsigned nranks, char *err, size_t errlen);
/* Whether uid told that the daemon at who is a node of job. Blocking (names resolved). */
int peer_nodes_member(const char *job, uid_t uid, const char *who);
/* Calls fn(arg, host) for each node uid told of job (root's own too) until fn returns
 * non-zero; this node's ranks told into ranks (room for PEER_NODES_MAX_RANKS):
 * how many. */
unsigned peer_nodes_each(const char *job, uid_t uid, int (*fn)(void *arg, const char *host),
			 void *arg, unsigned *ranks);

/* peer_auth.c — daemons prove to each other that they hold the cluster's secret
 * (peer_secret_file): HMAC-SHA256 (OpenSSL's libcrypto) of the secret over a label naming the
 * side and both sides' fresh nonces, compared in constant time. Pure; any thread. */
#define PEER_NONCE_LEN 32
#define PEER_MAC_LEN 32
enum { PEER_SERVER, PEER_CLIENT };
/* Fills a nonce from getrandom(2); 0 or -errno. */
int peer_auth_nonce(uint8_t nonce[PEER_NONCE_LEN]);
/* side's proof over the nonces into mac; 0 or -EIO. */
int peer_auth_mac(const void *secret, size_t len, int side,
		  const uint8_t client_nonce[PEER_NONCE_LEN],
		  const uint8_t server_nonce[PEER_NONCE_LEN], uint8_t mac[PEER_MAC_LEN]);
/* 0 when mac is side's proof over the nonces, -EACCES when not, -EIO. */
int peer_auth_check(const void *secret, size_t len, int side,
		    const uint8_t client_nonce[PEER_NONCE_LEN],
		    const uint8_t server_nonce[PEER_NONCE_LEN], const uint8_t mac[PEER_MAC_LEN]);

/* peer_ucx.c — links between daemons over UCX's ucp API (tagged messages; RDMA, TCP or shared
 * memory as UCX picks): a listener thread (peer_listen.c) hands each connection to a thread
 * of its own, with a worker of its own; every call blocks its thread at most the link's
 * timeout and returns 0 or a negative errno (ECONNRESET: the other side went away;
 * ETIMEDOUT). Never the loop thread's. */
struct peer_net;
struct peer_link;
/* Serves one accepted link on its own thread; the link is closed when it returns. */
typedef void (*peer_serve_fn)(void *arg, struct peer_link *l);
/* Opens the daemon's UCX context; links it accepts wait timeout_s per call. */
int peer_net_open(double timeout_s, struct peer_net **out, char *err, size_t errlen);
/* peer_listen.c: listens on port, serving each connection with serve(arg, link), max_conns
 * at once. */
int peer_listen(struct peer_net *n, unsigned port, unsigned max_conns, peer_serve_fn serve,
		void *arg, char *err, size_t errlen);
/* Makes every call on the net's links fail from now on (any thread). */
void peer_net_stop(struct peer_net *n);
/* Stops listening, ends every connection's calls, waits for their threads, closes. */
void peer_net_close(struct peer_net *n);
/* Connects to host:port (resolved as the system does); a peer that is down is found by the
 * first call. */
int peer_connect(struct peer_net *n, const char *host, unsigned port, double timeout_s,
		 struct peer_link **out, char *err, size_t errlen);
/* Sends a message of type tag. */
int peer_send(struct peer_link *l, uint64_t tag, const void *buf, size_t len);
/* Receives the next message of any type into buf (cap bytes; -EMSGSIZE past it). */
int peer_recv(struct peer_link *l, uint64_t *tag, void *buf, size_t cap, size_t *len);
/* The other side's address, for messages. */
const char *peer_link_who(const struct peer_link *l);
/* Sets how long each call of l may wait. */
void peer_link_set_timeout(struct peer_link *l, double seconds);
/* Closes a link (what was sent is flushed first while the peer answers). NULL is fine. */
void peer_link_close(struct peer_link *l);
/* Several operations in flight on a link (peer_window.c's), each waited for once: */
struct peer_op;
/* Posts a send (buf untouched until it completes) or a receive of the next message (posted
 * receives take messages in order), buf malloc'd; 0 with *op, or a negative errno. */
int peer_post_send(struct peer_link *l, uint64_t tag, const void *buf, size_t len,
		   struct peer_op **op);
int peer_post_recv(struct peer_link *l, void *buf, size_t cap, struct peer_op **op);
/* Waits for op as peer_send/peer_recv wait, its type and length into tag and len (NULL:
 * not wanted) and frees it; 0 or a negative errno (-ECANCELED: it never ended after the link
 * broke: its buffer is left to the link, freed at peer_link_close). */
int peer_op_wait(struct peer_link *l, struct peer_op *op, uint64_t *tag, size_t *len);
/* Cancels a receive that took no message yet (its wait then fails). */
void peer_op_cancel(struct peer_link *l, struct peer_op *op);
/* Breaks l at once: what is in flight fails, and every later call. */
void peer_link_abort(struct peer_link *l);

/* peer_window.c — a file's chunks pipelined on a link: a window of buffers (8 MiB, 2 to 8
 * of them) whose sends, or receives posted ahead, are in flight at once, taken back oldest
 * first, so messages keep their order. One thread, the link's; the first error sticks. */
struct peer_window;
/* Opens a sending (recv 0) or receiving window of buffers of cap bytes on l. */
int peer_window_open(struct peer_link *l, int recv, size_t cap, struct peer_window **out);
/* Sending: the next free buffer (waiting for its last send), then posts it as tag, len. */
int peer_window_next(struct peer_window *w, void **buf);
int peer_window_send(struct peer_window *w, uint64_t tag, size_t len);
/* Sending: both at once for a message of len bytes copied from msg (NULL when len is 0). */
int peer_window_post(struct peer_window *w, uint64_t tag, const void *msg, size_t len);
/* Sending: waits for every send posted. */
int peer_window_flush(struct peer_window *w);
/* Makes rc, the caller's failure, the window's error (unless it has one); that error. */
int peer_window_fail(struct peer_window *w, int rc);
/* Receiving: the next message, its bytes in the window's buffer until the next call. */
int peer_window_recv(struct peer_window *w, uint64_t *tag, void **buf, size_t *len);
/* Ends w (sends waited for, receives posted ahead cancelled: -EPROTO when one took a
 * message; broken first after an error) and frees it; 0 or its error. */
int peer_window_end(struct peer_window *w);

/* replica_store.c — other nodes' copies of their committed files (one owner's files of one
 * tag, with the tag's manifest), in replica_cache_size of host memory, spilling to
 * replica_root; a copy is visible only once every file arrived whole and checked against the
 * manifest's checksums and the sender's; the oldest go first for room, never an owner's
 * newest of a job nor one being read. Thread-safe. */
struct replica_store;
struct replica;
/* A copy's identity: whose (owner host), which job, run and tag, the tag's directory there
 * and its manifest's created_ns. */
struct replica_id {
	const char *owner, *job, *run, *tag, *dir;
	uint64_t created_ns;
};
/* Opens a store of mem bytes spilling to root ("" or NULL: none). */
int replica_store_open(uint64_t mem, const char *root, struct replica_store **out, char *err,
		       size_t errlen);
/* Frees every copy (none referenced) and the store; copies wholly on the root stay there for
 * replica_recover. NULL is fine. */
void replica_store_close(struct replica_store *rs);
/* replica_recover.c: takes back the copies a daemon left wholly on rs's root (their identity
 * and manifest there, every byte checked again against the manifest's checksums), oldest
 * first, and removes the rest of the root (.partial-*, copies that held files in memory).
 * Copies wholly on the root get their identity written as they arrive. */
void replica_recover(struct replica_store *rs);
/* Begins an incoming copy of the files of the n ranks in manifest text (len bytes). */
int replica_in_begin(struct replica_store *rs, const struct replica_id *id, const char *text,
		     size_t len, const unsigned *ranks, unsigned n, struct replica **out,
		     char *err, size_t errlen);
/* Begins its file name of size bytes (one of those files, that size); its index into *index. */
int replica_in_file(struct replica *r, const char *name, uint64_t size, unsigned *index,
		    char *err, size_t errlen);
/* Appends bytes to file index, in order. */
int replica_in_write(struct replica *r, unsigned index, const void *buf, size_t len, char *err,
		     size_t errlen);
/* Ends file index: whole, and matching sent_xxh3 and the manifest (else -EBADMSG). */
int replica_in_file_end(struct replica *r, unsigned index, uint64_t sent_xxh3, char *err,
			size_t errlen);
/* Makes the copy visible once every file of it ended checked. */
int replica_in_commit(struct replica *r, char *err, size_t errlen);
/* Drops an incoming copy, never seen. NULL is fine. */
void replica_in_abort(struct replica *r);
/* The newest visible copy of job with a file of each of the n ranks, referenced; or NULL. */
struct replica *replica_find(struct replica_store *rs, const char *job, const unsigned *ranks,
			     unsigned n);
/* The newest visible copy owner sent of job's tag of run and commit time created_ns,
 * referenced; or NULL. A copy is of job when its seal records name job or its directory is
 * <root>/<job>/<tag>. */
struct replica *replica_find_copy(struct replica_store *rs, const char *job, const char *tag,
				  const char *owner, const char *run, uint64_t created_ns);
/* What replica_list calls for each copy: its identity, how many ranks its files are of and
 * the uid its manifest names (whose files; MANIFEST_BAD: none). */
typedef void (*replica_each_fn)(void *arg, const struct replica_id *id, unsigned nranks,
				uint64_t uid);
/* Calls fn (under the store's lock: it may not call the store) for each visible copy of job
 * (of tag; "" or NULL: any). */
void replica_list(struct replica_store *rs, const char *job, const char *tag,
		  replica_each_fn fn, void *arg);
/* Takes a reference to a visible copy. */
void replica_hold(struct replica *r);
/* Drops a reference (an evicted copy goes with its last). */
void replica_put(struct replica *r);
/* A copy's identity, manifest text and number of files (the copy's own). */
const struct replica_id *replica_id(const struct replica *r, const char **manifest,
				    size_t *len, unsigned *nfiles);
/* File i's manifest entry. */
const struct manifest_file *replica_file(const struct replica *r, unsigned i);
/* Reads len bytes at off of file i. */
int replica_read(const struct replica *r, unsigned i, uint64_t off, void *buf, size_t len);
/* replica_list.c: the uid a copy's manifest names (MANIFEST_BAD: none). */
uint64_t replica_uid(const struct replica *r);
/* Copies held, bytes of memory held, evictions so far. */
void replica_stats(struct replica_store *rs, unsigned *copies, uint64_t *mem,
		   uint64_t *evictions);

/* peer_serve.c — the listening side: a peer proves it holds the secret (and is shown that we
 * do) before it may place copies in the store; it lists and fetches only copies of jobs it
 * is a node of (peer_member_of). */
struct peer_service {
	const void *secret;
	size_t secret_len;
	struct replica_store *rs;
	_Atomic unsigned long copies_in, refused, fetches;
};
/* peer_serve_fn over a struct peer_service. */
void peer_serve(void *arg, struct peer_link *l);

/* peer_send.c — the connecting side: open (prove membership both ways), put a copy, fetch
 * one. Blocking, on the caller's thread. */
/* Reads len bytes at off of file i of a copy being sent into buf; 0 or a negative errno. */
typedef int (*peer_read_fn)(void *arg, unsigned i, uint64_t off, void *buf, size_t len);
/* Connects and authenticates both ways (EACCES: the secrets differ). */
int peer_open(struct peer_net *n, const char *host, unsigned port, const void *secret,
	      size_t slen, double timeout_s, struct peer_link **out, char *err, size_t errlen);
/* Sends a copy (identity, ranks, manifest, the files of those ranks read through read, under
 * cap); 0 once the peer checked and kept it. */
int peer_put(struct peer_link *l, const struct replica_id *id, const unsigned *ranks,
	     unsigned nranks, const char *manifest, size_t mlen,
	     const struct manifest_file *const *files, unsigned nfiles, peer_read_fn read,
	     void *arg, struct rate_cap *cap, char *err, size_t errlen);
/* Fetches the peer's newest copy of job holding the n ranks into the store into, checked;
 * the copy referenced into *out, or -ENOENT when the peer holds none. */
int peer_fetch(struct peer_link *l, const char *job, const unsigned *ranks, unsigned n,
	       struct replica_store *into, struct replica **out, char *err, size_t errlen);
/* Fetches owner's copy of job's tag of run and commit time created_ns (the files of the n
 * ranks; n 0: every rank it holds) into the store into, as peer_fetch (-ENOENT also when the
 * copy holds none of those ranks). */
int peer_fetch_copy(struct peer_link *l, const char *job, const char *tag, const char *owner,
		    const char *run, uint64_t created_ns, const unsigned *ranks, unsigned n,
		    struct replica_store *into, struct replica **out, char *err, size_t errlen);
struct peer_copies;
/* Asks which copies of job (of tag; "": any) of uid's files (UINT32_MAX: any user's) the
 * peer holds (owner, run, tag, commit time, ranks, uid: peer_int.h's COPIES), into *c. */
int peer_list(struct peer_link *l, const char *job, const char *tag, uint32_t uid,
	      struct peer_copies *c, char *err, size_t errlen);

/* peer_tag.c — a committed tag's files of this node, opened for peer.c's sender: manifest,
 * seal records (the job's hosts, this node's ranks) and files, resident copies pinned. */
#define PEER_MAX_HOSTS 4096    /* seal records read from one tag */
#define PEER_MAX_MINE 512      /* this node's ranks and files of one tag (the protocol takes
				* 256 ranks a copy: peer_int.h) */
struct peer_tag {
	uint64_t chunk;               /* the cache's chunk: a resident copy's piece */
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
/* Reads the committed tag dir (open as dirfd; chunk: the cache's) into t, zeroed: 0, or a
 * negative errno with err (-ENOENT: this node sealed nothing there). */
int peer_tag_read(int dirfd, const char *dir, uint64_t chunk, struct peer_tag *t, char *err,
		  size_t errlen);
/* Frees what peer_tag_read read (unpins, closes). */
void peer_tag_free(struct peer_tag *t);
/* peer_read_fn over a struct peer_tag: the data from the resident copy where it is held. */
int peer_read_file(void *arg, unsigned i, uint64_t off, void *buf, size_t len);

/* peer.c — peer copies in the daemon, on with a peer_secret_file: the service on peer_port
 * and, for each COMMITTED save of a tag this node sealed, its files sent on a thread of its
 * own (from their resident copies where the cache keeps them) to the first `replicas` peers
 * of the ring (peer_place) that take them. */
/* Starts them when cfg turns them on; 0 (also when off) or -1 with err. */
int peer_start(const struct config *cfg, char *err, size_t errlen);
/* Stops them (shutdown); no-op when off. */
void peer_stop(void);
/* save_change_cb: queues a COMMITTED save's tag for sending (loop thread). */
void peer_on_save(struct save *s);
/* dsckptd -n: UCX opens with a transport when cfg turns peer copies on; 0 or -1 with err. */
int peer_check(const struct config *cfg, char *err, size_t errlen);
/* Whether peer copies run (restores may ask peers). */
int peer_on(void);
/* Opens the queue that brings sent tags back to loop's thread to settle their saves'
 * REPLICATED (save_mark_replicated); at start-up once the loop exists; 0 or a negative ERR_E*. */
int peer_wire(struct uv_loop_s *loop, char *err, size_t errlen);
/* A tag of this node whose copies are not all held yet (PENDING). */
struct peer_view {
	const char *dir;
	uid_t uid;               /* the owner of the save that queued it */
	const char *state;       /* "queued", "sending", or "short" (sent to fewer peers) */
	unsigned copies, replicas;
	uint64_t bytes;          /* of one copy (0 while queued) */
	const char *holders;     /* the peers that kept one, ", " between */
	const char *error;       /* "short": why no more; else NULL */
	double age_s;            /* since it was COMMITTED */
};
/* Calls fn for each tag queued, being sent or left short (loop thread; fn must not call into
 * peer.c). */
void peer_each(void (*fn)(void *arg, const struct peer_view *v), void *arg);
/* Calls fn with each tag of the last 64 sent that peers hold: its directory, owner and the
 * peers that acknowledged a copy, ", " between (loop thread; fn must not call into peer.c). */
void peer_each_held(void (*fn)(void *arg, const char *dir, uid_t uid, const char *peers),
		    void *arg);
/* Opens an authenticated link to the daemon on host (the peer service's net, secret and
 * port), for restores; 0 or a negative errno with err (-ENOTCONN: peer copies are off). */
int peer_restore_open(const char *host, struct peer_link **out, char *err, size_t errlen);

/* peer_restore.c — a tag this node lacks found in other nodes' daemons: the hosts of the
 * job's seal records here (the tag's, else the job directory's other tags') and of
 * peer_hosts asked which copies of the job they hold, then the owners of the copies listed,
 * in turn; of this node's own copies (owner: its host or a name of its address) the tag
 * picked (asked, or the newest commit listed) with its run and commit time, fetched in
 * parallel and checked into a store of their own. Blocking; never the loop thread. */
#define PEER_RESTORE_MAX 64
struct peer_restore {
	char tag[256];                   /* the tag picked */
	uint64_t created_ns;             /* its commit time */
	struct replica_store *rs;        /* the copies' store */
	struct replica *copies[PEER_RESTORE_MAX]; /* referenced */
	unsigned n;
};
/* Finds job's tag ("": its newest) on the peers for dir (<root>/<job>/<tag>, or with tag ""
 * the job's directory), for uid (the job's nodes it told: peer_nodes_each), and with fetch
 * set fetches this node's copies of it (or its ranks told) into pr (peer_restore_free); 0,
 * ENOENT (no peer holds one), or a code with err. */
int peer_restore(const struct config *cfg, const char *dir, const char *job, const char *tag,
		 uid_t uid, int fetch, struct peer_restore *pr, char *err, size_t errlen);
/* Drops what peer_restore fetched. */
void peer_restore_free(struct peer_restore *pr);

/* quota.c — per-user limits (thread-safe); a user is a uid over all its connections. */
enum quota_kind {
	QUOTA_CONNS,        /* open connections */
	QUOTA_SAVES,        /* saves begun, not yet durable or failed */
	QUOTA_REGIONS,      /* sources held open (regions, and those saves still read) */
	QUOTA_REGION_BYTES, /* host memory those sources map */
	QUOTA_UNREAD,       /* bytes buffered for unfinished frames and unread replies */
	QUOTA_BLOB,         /* blob bytes of saves not yet durable */
	QUOTA_SEALS,        /* sealed tags the daemon follows (not yet committed or given up) */
	QUOTA_LOADS,        /* loads begun, not yet finished */
	QUOTA_PLANS,        /* save plans of open connections */
	QUOTA_HELD,         /* bytes of what the daemon decoded and keeps for the user: tensor
			     * lists (tensors.c), load headers and destinations (load.c) */
	QUOTA_N
};
/* Sets the limits from a config (start, reload); none are enforced before the first call. */
void quota_set_limits(const struct config *cfg);
/* Charges n of kind to uid within its limit; 0, or ERR_ELIMIT naming the key in err. */
int quota_take(uid_t uid, int kind, uint64_t n, char *err, size_t errlen);
/* Gives back n of kind that quota_take charged to uid. */
void quota_give(uid_t uid, int kind, uint64_t n);
/* What uid holds of kind now. */
uint64_t quota_used(uid_t uid, int kind);

/* cache.c */
/* Told how far the cache's start-up got: bytes of total done in step ("touched", "locked");
 * called on cache_create's thread at each step's start and end, about once a second between. */
typedef void (*cache_progress_fn)(const char *step, uint64_t done, uint64_t total);
/* Maps bytes of host memory (split into one pool per NUMA node with CPUs, each bound to its
 * node), touches it with several threads (on each node's CPUs) and locks it (best effort),
 * telling progress (NULL: nobody) how far it got. */
int cache_create(uint64_t bytes, uint64_t chunk_bytes, cache_progress_fn progress,
		 struct cache **out, char *err, size_t errlen);
/* Unmaps the cache; every chunk must be back. */
void cache_destroy(struct cache *c);
/* Takes a free chunk, from node's pool first (-1: any node), else from any pool, else one the
 * evict hook gives back; waits only while no chunk is free or evictable; NULL once
 * cache_shutdown was called. */
void *cache_get(struct cache *c, int node);
/* Takes a free chunk (node's first, as cache_get; evicting as it does) if one is free now,
 * else NULL. */
void *cache_tryget(struct cache *c, int node);
/* Returns a chunk. */
void cache_put(struct cache *c, void *chunk);
/* Gives one held chunk back with cache_put; 1 if it did, 0 if nothing can be given. Called
 * without the cache's lock, by whichever thread wants a chunk. */
typedef int (*cache_evict_fn)(struct cache *c);
/* Sets the eviction hook (resident.c's), before the cache is shared. */
void cache_set_evict(struct cache *c, cache_evict_fn fn);
/* Tells waiters of cache_get that the hook may now find a chunk to give back. */
void cache_evictable(struct cache *c);
/* Wakes every waiter of cache_get; they get NULL from now on. */
void cache_shutdown(struct cache *c);
/* Base address and length of the whole mapping, every pool (for pinning with CUDA). */
void *cache_base(struct cache *c);
uint64_t cache_total(struct cache *c);
/* Bytes currently handed out. */
uint64_t cache_used(struct cache *c);
uint64_t cache_chunk(struct cache *c);
/* Milliseconds the start-up touch took. */
double cache_touch_ms(struct cache *c);
/* Bytes of it locked in memory at start (less than the total when RLIMIT_MEMLOCK is lower). */
uint64_t cache_locked(struct cache *c);
/* Number of pools: one per NUMA node the cache is split over, or 1. */
unsigned cache_pools(struct cache *c);
/* Pool i's NUMA node (-1: not split), size and bytes handed out (any may be NULL). */
void cache_pool_info(struct cache *c, unsigned i, int *node, uint64_t *total, uint64_t *used);
/* cache_numa.c — the NUMA topology the cache's pools follow, from sysfs. */
#define CACHE_MAX_NODES 64    /* node ids the one-word mbind mask holds */
/* The online nodes that have CPUs: ids ascending into nodes, their CPUs into cpus; how many
 * (0 or 1: the cache is not split). */
unsigned cache_nodes(int nodes[CACHE_MAX_NODES], cpu_set_t cpus[CACHE_MAX_NODES]);
/* NUMA node of a PCI device ("0000:3b:00.0", any case), from sysfs; -1 if unknown. */
int cache_pci_node(const char *busid);
/* Test hook: reads the NUMA topology under root instead of /sys (NULL restores /sys). */
void cache_set_sysfs(const char *root);

/* source.c — transports: a client's memory (a region), which a save reads from and a load
 * writes into (there a source is the load's destination, `dst`), and the copiers that move
 * the bytes (one per copy or restore thread). */
struct copier;
struct cuda_copier;
struct cuda_fence;
/* Takes a client's host memory fd (ownership too) of at least size bytes: only a memfd that
 * is sealed (here, if not yet) against shrinking; read with pread, never mapped. */
int source_host_open(int fd, uint64_t size, struct source **out, char *err, size_t errlen);
/* Makes a copy thread's copier (its device part when there are GPUs); negative ERR_E*. */
int copier_new(struct copier **out, char *err, size_t errlen);
/* Frees a copier whose reads were synced; NULL is fine. */
void copier_free(struct copier *cp);
/* Orders the copier's next reads (until copier_sync), on whichever devices they touch, after
 * a client's fence (NULL: none). */
void copier_fence(struct copier *cp, struct cuda_fence *f);
/* Frees a client's fence (a job's, once no copier waits for it). */
void copier_fence_free(struct cuda_fence *f);
/* Reads len bytes at off of s into dst (a cache chunk), or queues the read (device kinds)
 * until copier_sync; 0 or a negative ERR_E* with err (ERR_ERANGE past the source's end). */
int copier_read(struct copier *cp, struct source *s, uint64_t off, void *dst, uint64_t len,
		char *err, size_t errlen);
/* Waits for every read the copier queued, on every device, even after an error, and ends its
 * fence; 0 or the first failure's ERR_E* with err. */
int copier_sync(struct copier *cp, char *err, size_t errlen);
/* Writes len bytes of src (a cache chunk) to s at off (loads), or queues the write (device
 * kinds) until copier_sync, as copier_read; 0 or a negative ERR_E* with err. */
int copier_write(struct copier *cp, struct source *s, uint64_t off, const void *src,
		 uint64_t len, char *err, size_t errlen);
/* A checksum of bytes where they lie: source s's [off, off + len), len > 240 (source_digest
 * fills xxh3). */
struct digest {
	struct source *s;
	uint64_t off, len;
	uint64_t xxh3;
	void *priv;              /* s's kind's state (source_digest fills it) */
	size_t tag;              /* the caller's */
};
/* Whether s's kind computes checksums of its own memory (device memory, on its device, once
 * a self-test there passed), so that a load need not hash those bytes on the host. */
int source_can_digest(struct source *s);
/* Fills d[i].xxh3 with the XXH3-64 of each range (sources source_can_digest accepted, every
 * write to them synced), one call per digest function (d reordered); 0 or a negative ERR_E*
 * with err. */
int source_digest(struct digest *d, size_t n, char *err, size_t errlen);
/* Whether a load may write s now (a writable kind; host memory open for writing and not
 * sealed against it); 0 or a negative ERR_E* with err. */
int source_writable(const struct source *s, char *err, size_t errlen);
/* Size of the source in bytes. */
uint64_t source_size(const struct source *s);
/* Kind name ("host", "cuda_ipc", "cuda_vmm"). */
const char *source_kind(const struct source *s);
/* NUMA node the source's memory is near (a GPU's), or -1 for any (host memory, unknown). */
int source_node(const struct source *s);
/* Charges the source to uid (a region; host bytes too) until its last reference goes. */
int source_charge(struct source *s, uid_t uid, char *err, size_t errlen);
/* Takes a reference (thread-safe). */
void source_ref(struct source *s);
/* Takes n references at once. */
void source_ref_n(struct source *s, unsigned n);
/* Drops a reference; the last one unmaps and closes. */
void source_unref(struct source *s);
/* Drops n references at once. */
void source_unref_n(struct source *s, unsigned n);
/* Gives emit each of n sources at first, stride bytes apart (NULL ones skipped), with how
 * often it came (counted 16 sources at a time). */
void source_tally(struct source *const *first, size_t n, size_t stride,
		  void (*emit)(void *arg, struct source *src, unsigned count), void *arg);
/* Takes (take 1) or drops a reference to each of n sources at first, stride bytes apart
 * (NULL ones skipped), counted per source first. */
void source_refs(struct source *const *first, size_t n, size_t stride, int take);
/* What a kind of source does: source.c dispatches through it, cuda_source.c adds the CUDA
 * kinds, tests add fakes. */
struct source_ops {
	const char *name;
	/* Copies [off, off+len), already within the source's size, into dst, or queues the
	 * copy on the reading copier's device part cc (device kinds; NULL without GPUs), which
	 * its copier_sync waits for; a negative ERR_E* with err. */
	int (*read)(void *priv, struct cuda_copier *cc, uint64_t off, void *dst, uint64_t len,
		    char *err, size_t errlen);
	/* Copies len bytes from src (a cache chunk) to [off, off+len), already within the
	 * source's size, or queues the copy on cc like read (loads); NULL: not writable. */
	int (*write)(void *priv, struct cuda_copier *cc, uint64_t off, const void *src,
		     uint64_t len, char *err, size_t errlen);
	/* Whether every byte can be read; NULL means always. */
	int (*complete)(const void *priv);
	/* Whether the kind computes checksums of this source now; NULL: never. */
	int (*can_digest)(void *priv);
	/* Fills each d[i].xxh3 (n ranges of sources whose kinds share this function, each
	 * accepted by can_digest; d[i].priv their state); 0 or a negative ERR_E* with err. */
	int (*digest)(struct digest *d, size_t n, char *err, size_t errlen);
	/* NUMA node near the memory; NULL means -1 (any). */
	int (*node)(const void *priv);
	/* Releases the kind's state of a size-byte source. */
	void (*close)(void *priv, uint64_t size);
};
/* Makes a source (one reference) of size bytes of a kind; NULL without memory. */
struct source *source_new(const struct source_ops *ops, void *priv, uint64_t size);
/* Returns the kind's state when s is of kind ops, else NULL. */
void *source_priv(struct source *s, const struct source_ops *ops);
/* Whether every byte of the source can be read (a VMM range may still be mapping). */
int source_complete(const struct source *s);

/* store_path.c, store_file.c, store_list.c, store_host.c, store_commit.c, store_describe.c,
 * store_latest.c, store_tag.c, retention.c — the checkpoint directories on disk (their format
 * is format/'s). */
#define STORE_DIR_FLAGS (O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
#define STORE_HOST_MAX 256 /* "dsckpt.host": at most 255 bytes */
#define STORE_XATTR_HOST "user.dsckpt.host" /* on a partial from its creation: its node */
#define STORE_HEADER_PREFIX 4096 /* bytes of a header start-up recovery reads (store_host.c) */
#define STORE_LOCK_WAIT_MS 10000 /* the longest a commit waits for its job directory's lock */
/* What start-up recovery may still spend on one user's tree (recover.c): directory entries
 * listed and bytes of manifests and headers read; spent once something did not fit. Where a
 * store_* call takes one, NULL means no bound but the call's own. */
struct store_budget {
	uint64_t entries;
	uint64_t bytes;
	int spent;
};
/* store_path.c — opening a client's directory below an allowed root. */
/* The identity of an allowed root a directory was opened under. */
struct store_root {
	dev_t dev;
	ino_t ino;
};
/*
 * Opens (creating what is missing) the absolute directory dir for a client uid/gid: dir must
 * be <root>/<job>/<tag> or deeper under one of cfg's allowed roots, contain no "." or ".."
 * component and no symbolic link below the root; created directories are made private, then
 * chowned to uid/gid and given cfg->dir_mode through their descriptor; existing ones below the
 * root must be owned by uid unless uid is 0. Returns an O_DIRECTORY fd (and the root's
 * identity in root when not NULL), or a negative ERR_E* with err.
 */
int store_open_dir(const struct config *cfg, const char *dir, uid_t uid, gid_t gid,
		   struct store_root *root, char *err, size_t errlen);
/* store_open_dir, and dir's parent (the job directory) opened on the way into *jobfd. */
int store_open_dir_job(const struct config *cfg, const char *dir, uid_t uid, gid_t gid,
		       struct store_root *root, int *jobfd, char *err, size_t errlen);
/* Opens the existing directory dir (checked as store_open_dir does, nothing created) and its
 * parent, the job directory, into *jobfd; an O_DIRECTORY fd or a negative ERR_E* with err. */
int store_open_tag(const struct config *cfg, const char *dir, uid_t uid, gid_t gid, int *jobfd,
		   char *err, size_t errlen);
/* The owner of dir, a directory strictly below an allowed root, walked as store_open_dir walks
 * (no symbolic link followed, nothing created) as far as it exists: 0 with *owner the uid of
 * dir itself (*missing 0) or of its deepest existing directory, the root included (*missing:
 * how many of dir's components below it do not exist); or a negative ERR_E* with err. */
int store_owner_below(const struct config *cfg, const char *dir, uid_t *owner, unsigned *missing,
		      char *err, size_t errlen);
/* The identity of a directory a request opened: what the daemon's state of a tag (its saves,
 * its seals) is keyed by, so that a directory removed and made again is a new tag. */
struct store_dirid {
	dev_t dev;
	ino_t ino;
};
/* The identity of the open directory dirfd; 0 or ERR_EIO with err. */
int store_dir_id(int dirfd, struct store_dirid *id, char *err, size_t errlen);
/* Whether jobfd/name is (still) the open directory dfd: not exchanged or moved since. */
int store_dir_at(int jobfd, const char *name, int dfd);
/* Whether two identities are the same directory. */
int store_dirid_eq(const struct store_dirid *a, const struct store_dirid *b);
/* Whether dirfd still lies below root (a client may have moved it); 0 or ERR_EACCES. */
int store_dir_within(int dirfd, const struct store_root *root, char *err, size_t errlen);
/* Whether f is a file name a client may choose: 1-128 of [A-Za-z0-9._-], no leading '.'. */
int store_valid_file(const char *f);
/* Copies dir without trailing slashes (so "a/b/" and "a/b" name one checkpoint). */
void store_norm_dir(char *out, size_t len, const char *dir);
/* store_file.c — files written as <name>.partial, renamed into place once whole. */
/* Creates dirfd/name.partial (exclusive, O_DIRECT when asked and possible), owned by uid/gid
 * with mode (owner read/write always), both set on the descriptor. */
int store_file_create(int dirfd, const char *name, uid_t uid, gid_t gid, unsigned mode,
		      int o_direct, struct store_file **out, char *err, size_t errlen);
/* Whether the file was opened with O_DIRECT (writes must then be 4096-aligned). */
int store_file_direct(const struct store_file *f);
/* The file's identity (st_dev, st_ino), which stays the same once renamed; 0, or -1. */
int store_file_identity(const struct store_file *f, dev_t *dev, ino_t *ino);
/* Writes len bytes at off (retrying short writes); negative ERR_E* with err. */
int store_file_pwrite(struct store_file *f, const void *buf, size_t len, uint64_t off,
		      char *err, size_t errlen);
/* Truncates to size, fsyncs, renames name.partial → name, fsyncs the directory; frees f. */
int store_file_finish(struct store_file *f, uint64_t size, char *err, size_t errlen);
/* Unlinks name.partial and frees f. */
void store_file_abort(struct store_file *f);
/* Writes dirfd/name atomically (partial, fsync, rename, dir fsync), owned by uid/gid. */
int store_write_atomic(int dirfd, const char *name, const void *buf, size_t len, uid_t uid,
		       gid_t gid, unsigned mode, char *err, size_t errlen);
/* store_commit.c — MANIFEST.json and latest. */
/* Result of a commit. */
struct store_commit_info {
	char tag[256];
	unsigned files;        /* the tag's files and their bytes: when records > 0, those of */
	uint64_t bytes;        /* this node only (the others' are in their records, not read) */
	unsigned records;      /* other nodes' seal records the manifest names (version 2) */
};
/*
 * Commits checkpoint directory dir (already durable) for run ("" the unknown run): reads every
 * *.safetensors header there, checks ranks 0..world-1 are present among the files of run and
 * no *.partial is left, removes the files and seal records of other runs, writes
 * MANIFEST.json atomically, then <dir>/../latest (atomically), then applies keep_last in the
 * job directory (deleting only older committed tags, never the newest). With id, dir must
 * still be that directory (ERR_ENOENT otherwise).
 */
int store_commit(const struct config *cfg, const char *dir, unsigned world, const char *run,
		 const struct store_dirid *id, uid_t uid, gid_t gid,
		 struct store_commit_info *info, char *err, size_t errlen);
/* store_commit as of created_ns (0: now): the daemons' commit of a sealed tag dates it by its
 * newest seal, so that a job's tags order by step however late each commit lands, and takes
 * the descriptions of its files from the run's seal records seen (NULL: from the headers). */
/* Whether dir is a staging directory (<job>/.<tag>.dsckpt-next); its tag's path into tagdir. */
int store_staged_tag(const char *dir, char *tagdir, size_t len);
int store_commit_at(const struct config *cfg, const char *dir, unsigned world, const char *run,
		    const struct store_dirid *id, uid_t uid, gid_t gid, uint64_t created_ns,
		    const struct seal_seen *seen, struct store_commit_info *info, char *err,
		    size_t errlen);
/* store_commit_at of the tag dir by the daemons that sealed it, from the directory dfd and
 * its job directory jobfd that its SEAL opened and validated, whose lock the caller holds:
 * no path walked again and no name looked up (a manifest in dfd says it was committed; in
 * a staging directory, the tag's name is looked up to see it exchanged), the tag's names (n,
 * sorted) as the look just listed them (NULL: listed here). */
int store_commit_held(const struct config *cfg, const char *dir, int jobfd, int dfd,
		      unsigned world, const char *run, uid_t uid, gid_t gid, uint64_t created_ns,
		      const struct seal_seen *seen, char *const *names, size_t n,
		      struct store_commit_info *info, char *err, size_t errlen);
/* store_describe.c — a tag's files described for its manifest: from their headers, or from
 * the seal records of the nodes that wrote them. */
/* One file of a checkpoint as its manifest will describe it. */
struct store_entry {
	const char *name;
	uint64_t size;
	long rank;
	int other;                       /* of another run than the commit's */
	/* safetensors */
	struct st_header *h;             /* its parsed header */
	struct manifest_tensor *t;       /* its tensors, as the manifest lists them */
	const char *data_xxh3;           /* borrowed from h */
	char meta_xxh3[CHECKSUM_HEX + 1]; /* its .meta's checksum as recorded, or "" */
	uint64_t meta_size;              /* and size */
	/* meta */
	char xxh3[CHECKSUM_HEX + 1];
	const struct manifest_file *d;   /* its seal record's description, or NULL */
};
struct store_seal_desc;
/* Describes every *.safetensors and *.meta file of the tag dfd (at path) among names (n,
 * sorted) into ents (n entries; *nents used), marking those of another run than run: as desc
 * describes them (NULL: none), else from their headers. 0 or a negative ERR_E* with err. */
int store_describe_all(int dfd, const char *path, const char *run, char **names, size_t n,
		       struct store_seal_desc *desc, struct store_entry *ents, size_t *nents,
		       char *err, size_t errlen);
/* Whether e is a safetensors file. */
int store_entry_st(const struct store_entry *e);
/* The manifest's entry of e (its strings and tensors borrowed from e). */
struct manifest_file store_entry_file(const struct store_entry *e);
/* A node's files of a tag as its seal record describes them. */
struct store_files {
	struct manifest_file *files;
	size_t n;
	void *own;            /* what files point into */
};
/* A file's header as this daemon wrote it (its first len bytes) and the file's size, kept
 * since; hdr NULL: not kept. */
struct store_known {
	const uint8_t *hdr;
	size_t len;
	uint64_t size;
};
/* Describes <base>.safetensors of each of bases (n) in the tag dfd, files of run, and the
 * .meta siblings their headers record, into out (store_files_free): from known[i] where it
 * holds a header (known NULL: none does), else from the file's; 0 or a negative ERR_E*. */
int store_describe_files(int dfd, char *const *bases, const struct store_known *known,
			 size_t n, const char *run, struct store_files *out, char *err,
			 size_t errlen);
/* Frees what store_describe_files made. */
void store_files_free(struct store_files *f);
/* store_latest.c — the job directory: its commit lock, `latest` (forward only), repair. */
/* Takes the job directory's commit lock (waiting); 0 or a negative ERR_E* with err. */
int store_job_lock(int jobfd, char *err, size_t errlen);
/* Takes it only if it is free now; 0 or ERR_EBUSY with err. */
int store_job_trylock(int jobfd, char *err, size_t errlen);
/* Lets it go. */
void store_job_unlock(int jobfd);
/* Points `latest` at tag (committed at ns) unless it names a later commit; the lock is held. */
int store_latest_advance(const struct config *cfg, int jobfd, const char *tag, uint64_t ns,
			 uid_t uid, gid_t gid, char *err, size_t errlen);
/* The same, the tag latest names then (NAME_MAX + 1 bytes: "" for none) into named. */
int store_latest_advance_to(const struct config *cfg, int jobfd, const char *tag, uint64_t ns,
			    uid_t uid, gid_t gid, char *named, size_t len, char *err,
			    size_t errlen);
/* Renames a whole MANIFEST.json.partial (every file there, sizes right; read within b) into
 * place in the tag dirfd; 1 when the tag is committed now, else 0. */
int store_finish_manifest(int dirfd, const char *path, struct store_budget *b);
/* Under the job lock (not waited for): `latest` to the newest committed tag of the job
 * directory's owner, written as that owner, and keep_last applied again; reads within b
 * (nothing is changed once b is spent). */
void store_job_repair(const struct config *cfg, int jobfd, const char *path,
		      struct store_budget *b);
/* store_tag.c — a job directory's tags, read only (below store_latest.c and retention.c). */
/* The manifest dirfd/name, read within b when there is one (a file of one link, charged to
 * it); NULL when missing, unsound or over budget. */
struct manifest *store_manifest_read(int dirfd, const char *name, struct store_budget *b);
/* When jobfd/tag was committed (manifest's created_ns); 0 when it is not committed. */
uint64_t store_tag_committed(int jobfd, const char *tag);
/* The same with its manifest read within b: a file of one link, charged to b. */
uint64_t store_tag_committed_within(int jobfd, const char *tag, struct store_budget *b);
/* The tag `latest` names (into tag) and when it was committed; 0 if none committed. */
uint64_t store_latest_get(int jobfd, char *tag, size_t len);
/* The same with the manifests read within b. */
uint64_t store_latest_within(int jobfd, char *tag, size_t len, struct store_budget *b);
#define STORE_TAG_NEXT ".dsckpt-next" /* .<tag>.dsckpt-next: a tag's next version, staged */
#define STORE_TAG_OLD ".dsckpt-old"   /* .<tag>.dsckpt-old: its old one, being removed */
/* Whether name is ".<tag>.dsckpt-next" (1) or ".<tag>.dsckpt-old" (2), its tag into tag; or 0. */
int store_tag_version(const char *name, char *tag, size_t len);
/* store_swap.c — a committed tag saved again: its staging directory .<tag>.dsckpt-next, the
 * exchange that replaces the tag in one step, and their recovery. */
/* The staging path of the tag directory dir into out; 0, or ERR_ENAMETOOLONG with err. */
int swap_staging_path(const char *dir, char *out, size_t len, char *err, size_t errlen);
/* Opens (creating) the staging directory stage for uid/gid as store_open_dir does, after
 * clearing its name of anything that is not uid's directory; fd, or a negative ERR_E*. */
int swap_open_staging(const struct config *cfg, const char *stage, uid_t uid, gid_t gid,
		      struct store_root *root, char *err, size_t errlen);
/* Exchanges jobfd/stage with jobfd/tag (renames it when the tag is gone), durably. */
int swap_exchange(int jobfd, const char *stage, const char *tag, char *err, size_t errlen);
/* Removes the staging directory stage if it is still dfd (in jobfd) and empty. */
void swap_remove_empty(int jobfd, const char *stage, int dfd);
/* Removes the old version left at the staging name of tag after swap_exchange (b: NULL). */
void swap_remove_old(int jobfd, const char *path, const char *tag, struct store_budget *b);
/* Start-up recovery of the staging or old directory jobfd/name: 1 when rolled forward or
 * removed, 0 when it is to be recovered as an uncommitted tag (or was left). */
int swap_recover(int jobfd, const char *path, const char *name, struct store_budget *b);
/* store_seal.c — the tag's seal records (format/seal_name.c's names): one per node, and one
 * more for its late seals. */
/* Writes this node's record r into the tag dirfd atomically, owned by uid/gid. */
int store_seal_write(const struct config *cfg, int dirfd, const struct seal_record *r,
		     uid_t uid, gid_t gid, char *err, size_t errlen);
/* Reads the record dirfd/name into r (seal_record_free); 0, or -1 when unsound. */
int store_seal_read(int dirfd, const char *name, struct seal_record *r);
/* Marks in have (world bytes) every rank of job's run the tag's records name, *newest the
 * newest seal time they record; how many ranks, or -1. */
int store_seal_scan(int dirfd, const char *job, const char *run, unsigned world,
		    uint8_t *have, uint64_t *newest);
/* The records a collecting node has read already: each name with the inode it had (a record
 * rewritten is renamed into place, so a new inode), and the record as read when it is of the
 * job's run (its files' descriptions make the commit's manifest). */
struct seal_seen {
	char **names;
	ino_t *inos;
	struct seal_record *recs;   /* host NULL: not of the run (or unreadable) */
	size_t n, cap;
};
/* store_seal_desc.c — what a commit takes from the records a collecting node took in. */
/* The files the run's records describe, by name, for one commit, and the records it names. */
struct store_seal_desc {
	const struct manifest_file **files;  /* sorted by name */
	uint8_t *listed;                     /* each found in the directory's listing */
	size_t n;
	const struct seal_seen *seen;
	uint8_t *named;        /* per record of seen: taken in by its name, the manifest names it */
	size_t nnamed;
	struct seal_record *loaded;          /* records taken in by name but read after all */
	size_t nloaded;
};
/* Collects the files the records of seen describe into d (store_seal_desc_free), and which
 * records taken in by name (telling names) the manifest is to name: those the listing names
 * (nnames, sorted) holds, but where another record of their node names their ranks, or where
 * a record of the run describes no files (an older daemon's: then they are read from the tag
 * dirfd, and their files described here). 0, or a negative ERR_E* with err. A file two records
 * describe is the first's. */
int store_seal_desc_build(int dirfd, const struct seal_seen *seen, char *const *names,
			  size_t nnames, struct store_seal_desc *d, char *err, size_t errlen);
/* The records d names for the manifest (d->nnamed, pointing into d's records; free'd by the
 * caller; NULL without memory), their ranks marked in ranks (world bytes). */
struct manifest_record *store_seal_desc_records(const struct store_seal_desc *d,
						uint8_t *ranks, unsigned world);
/* The description of the file name (NULL d: none), marked as listed; NULL if none. */
const struct manifest_file *store_seal_desc_find(struct store_seal_desc *d, const char *name);
/* ERR_EINCOMPLETE with err when a record describes a file the listing did not hold; else 0. */
int store_seal_desc_missing(const struct store_seal_desc *d, char *err, size_t errlen);
/* Whether name is a record of the run seen read (NULL d: no). */
int store_seal_desc_ours(const struct store_seal_desc *d, const char *name);
/* Frees what store_seal_desc_build made. */
void store_seal_desc_free(struct store_seal_desc *d);
/* store_seal_scan reading only the records not in seen (which it adds), adding their ranks
 * to have and *newest as they stand (a run's records only ever grow): each record is read
 * about once however often the node looks. */
int store_seal_scan_new(int dirfd, const char *job, const char *run, unsigned world,
			uint8_t *have, uint64_t *newest, struct seal_seen *seen);
/* The same for the records names (n) only, which the directory's watch saw come: no listing
 * (a round trip to a shared filesystem's server); -1 without memory. */
int store_seal_scan_names(int dirfd, char *const *names, size_t n, const char *job,
			  const char *run, unsigned world, uint8_t *have, uint64_t *newest,
			  struct seal_seen *seen);
/* A collecting node's listing of the tag for a look: the records not in seen (indexes into
 * it, added there), whether the manifest is there (no other name looked up for it), and every
 * name listed, sorted (NULL without memory), for the commit that follows to take. */
struct seal_listing {
	size_t *at;
	size_t n;
	int manifest;
	char **names;
	size_t nnames;
};
/* Lists the tag dirfd into l (store_seal_read_listed or store_seal_listing_free); 0, or -1
 * (cannot list). */
int store_seal_list(int dirfd, struct seal_seen *seen, struct seal_listing *l);
/* Reads the records l listed (but this node's when skip_own: store_seal_write_seen kept it),
 * as store_seal_scan_new does; how many ranks have holds then. Empties l. */
int store_seal_read_listed(int dirfd, struct seal_listing *l, int skip_own, const char *job,
			   const char *run, unsigned world, uint8_t *have, uint64_t *newest,
			   struct seal_seen *seen);
/* Frees what l holds; the records it listed unread are read at the next look. Its names go
 * to kept where not NULL (kept's freed first). */
void store_seal_listing_free(struct seal_listing *l, struct seal_seen *seen,
			     struct seal_listing *kept);
/* Adds names (n, the records a watch saw come) to l's names, each once, sorted: the listing
 * as it stands now when nothing else changed; -1 without memory (l's names freed). */
int store_seal_listing_add(struct seal_listing *l, char *const *names, size_t n);
/* Frees l's names alone. */
void store_seal_listing_names_free(struct seal_listing *l);
/* store_seal_write, the record written kept in seen as if read (its inode the one written),
 * its ranks added to have and its seal to *newest: the collecting node never reads its own. */
int store_seal_write_seen(const struct config *cfg, int dirfd, const struct seal_record *r,
			  uid_t uid, gid_t gid, uint8_t *have, uint64_t *newest,
			  struct seal_seen *seen, char *err, size_t errlen);
/* Frees what seen holds. */
void store_seal_seen_free(struct seal_seen *seen);
/* retention.c — keep_last. */
/* Deletes the committed tags of the job directory jobfd (at jobpath) beyond the newest keep,
 * current (committed at current_ns) too when keep tags dated later are kept; never latest
 * (the tag `latest` names), nor a directory (or a file in one) that the job directory's
 * owner does not own, nor one uid does not own (uid 0: any), nor (remote: its root has a
 * remote tier) one without REMOTE.json; manifests read and entries listed are charged to b
 * (NULL: no bound), and nothing is deleted once b is spent. With run (the committing run's;
 * NULL: none), the tags other runs left uncommitted before the newest commit go too. The
 * job lock is held. */
void retention_keep(int jobfd, const char *jobpath, const char *current, uint64_t current_ns,
		    const char *latest, uid_t uid, unsigned keep, struct store_budget *b,
		    int remote, const char *run);
/* store_host.c — which machine wrote a file. */
/*
 * This machine's name (gethostname(), read once, at most 255 bytes of printable ASCII); every
 * safetensors file dsckptd writes records it as "dsckpt.host".
 */
const char *store_host(void);
/* Test hook: makes store_host() answer host from now on. */
void store_set_host(const char *host);
/* Who wrote the safetensors file (or partial) dirfd/name: -1 not a readable dsckpt file,
 * 0 dsckpt before hosts were recorded, 1 with its "dsckpt.host" (printable) in host. */
int store_st_host(int dirfd, const char *name, char *host, size_t hostlen);
/* Its "dsckpt.rank" likewise, and any other key of its __metadata__. */
int store_st_rank(int dirfd, const char *name, char *rank, size_t ranklen);
int store_st_key(int dirfd, const char *name, const char *key, char *out, size_t outlen);
/* The node that created the partial dirfd/name (its STORE_XATTR_HOST): 1, or -1 if unknown. */
int store_xattr_host(int dirfd, const char *name, char *host, size_t hostlen);
/* store_list.c — names of our files, directory listings. */
/* Whether s ends with suffix (and has something before it). */
int store_has_suffix(const char *s, const char *suffix);
/* Whether name is one of the *.partial files dsckptd writes. */
int store_is_our_partial(const char *name);
/* Whether name is a kind of file dsckptd writes into a tag directory. */
int store_is_ours(const char *name);
/* Whether dirfd/name is a regular file (not following a link). */
int store_is_regular(int dirfd, const char *name);
/* Lists the entries of a directory but . and .., sorted by name; 0, or -1 with errno set. */
int store_list(int dirfd, char ***out, size_t *count);
/* The same, its entries charged to b (NULL: no bound); -1 with E2BIG (b spent) when the
 * directory has more than b has left. */
int store_list_within(int dirfd, struct store_budget *b, char ***out, size_t *count);
/* Frees a list from store_list. */
void store_list_free(char **names, size_t n);
/* Appends a copy of name to names (*n, room for *cap); 0, or -1 without memory. */
int store_list_push(char ***names, size_t *n, size_t *cap, const char *name);
/* Sorts names (n) as store_list does. */
void store_list_sort(char **names, size_t n);
/* Adds each of add (k) not in the sorted names (*n), kept sorted; 0, or -1 without memory. */
int store_list_merge(char ***names, size_t *n, char *const *add, size_t k);

/* lock.c — one daemon per socket and per root on this host (flock'ed files in a directory
 * only the daemon's user can write). */
/* Takes the socket's lock; 0, or -1 with err naming the daemon that holds it. */
int lock_socket(const struct config *cfg, char *err, size_t errlen);
/* Holds the lock of every root of cfg (taking new ones, letting dropped ones go); 0, or -1
 * with err naming the root another daemon of this host holds (nothing changed then). */
int lock_roots(const struct config *cfg, char *err, size_t errlen);
/* Lets go of every lock. */
void lock_release(void);

/* recover.c — start-up recovery of what an interrupted daemon left. */
/*
 * At start-up: reports and removes what this host left under the roots: *.partial files and
 * the files of manifest-less tags whose "dsckpt.host" is ours (or absent, from older versions);
 * a partial naming no host only once unchanged for 15 minutes. Other hosts' files are left.
 */
/* Told of each tag this node had sealed but not committed (its record, the record's owner),
 * once the pass is over. */
typedef void (*recover_sealed_cb)(const char *dir, const struct seal_record *r, uid_t uid,
				  gid_t gid);
void recover_run(const struct config *cfg, recover_sealed_cb on_sealed);

/* cuda_source.c — the CUDA transports (static runtime; driver calls via
 * cudaGetDriverEntryPoint, probed by cuda.c). */
/* Opens a legacy IPC handle of a whole size-byte allocation on the GPU with this UUID. */
int source_cuda_ipc_open(const uint8_t uuid[16], const uint8_t handle[64], uint64_t size,
			 struct source **out, char *err, size_t errlen);
/* Creates a VMM source: reserves size bytes of address space on the GPU with this UUID. */
int source_cuda_vmm_open(const uint8_t uuid[16], uint64_t size, struct source **out,
			 char *err, size_t errlen);
/* Imports n exported allocations (fds, always taken) of the given sizes, maps them one after
 * another from byte at, and enables read access; negative ERR_E* with err. */
int source_cuda_vmm_map(struct source *s, const uint8_t uuid[16], uint64_t size, uint64_t at,
			const int *fds, const uint64_t *sizes, unsigned n, char *err,
			size_t errlen);

/* cuda_copier.c — a copier's device part (streams per device) and fences. */
/* Makes a copier's device part (*out NULL without GPUs: there is nothing to hold). */
int cuda_copier_new(struct cuda_copier **out, char *err, size_t errlen);
/* Destroys its streams and frees it; NULL is fine. */
void cuda_copier_free(struct cuda_copier *cc);
/* Orders the next device reads through cc, on every device they touch, after f. */
void cuda_copier_fence(struct cuda_copier *cc, struct cuda_fence *f);
/* Waits for every copy queued through cc, on every device, even after an error, and ends its
 * fence; 0 or ERR_EIO with err. */
int cuda_copier_sync(struct cuda_copier *cc, char *err, size_t errlen);
/* Orders a daemon-owned fence after the latest record, as of now, of a client's
 * interprocess event (opened once per owner, a connection); later re-records do not matter. */
int cuda_fence_import(uint64_t owner, const uint8_t uuid[16], const uint8_t handle[64],
		      struct cuda_fence **out, char *err, size_t errlen);
/* Closes the events imported for owner (a connection id; the connection is gone). */
void cuda_fence_forget(uint64_t owner);
/* Frees a fence. */
void cuda_fence_free(struct cuda_fence *f);

/* cuda.c — optional CUDA (runtime linked statically; no -lcuda): probe, devices, pinning. */
/* Probes for a driver and devices; returns a line for status ("none: <reason>" or names). */
const char *gpu_init(void);
/* Number of usable GPUs (0 without CUDA); gpu_init must have run. */
int gpu_count(void);
/* Runs each GPU's checksum self-test (cuda_source.c), which a first load would otherwise
 * wait for; no-op without CUDA. */
void gpu_digest_prepare(void);
/* Pins [base, base+len) for fast device copies when CUDA is usable; no-op otherwise. */
void gpu_register_host(void *base, uint64_t len);
/* Undoes gpu_register_host. */
void gpu_unregister_host(void *base);

/* notify.c — the sd_notify and socket-activation protocols, by hand (no libsystemd). */
/* Sends one datagram of newline-separated assignments (READY=1, STATUS=...), formatted, to
 * $NOTIFY_SOCKET ("/path", or "@name" in the abstract namespace); no-op without it. */
void notify_sendf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Whether $NOTIFY_SOCKET names somewhere to send to. */
int notify_wanted(void);
/* Returns the listening fd handed over by systemd socket activation (LISTEN_PID == getpid(),
 * LISTEN_FDS == 1 → fd 3, set CLOEXEC, unsetenv the vars), or -1. */
int notify_listen_fd(void);

/* service.c — what the daemon tells systemd it is doing (STATUS=, EXTEND_TIMEOUT_USEC=,
 * READY=1, RELOADING=1, STOPPING=1); loop thread only; no-ops without $NOTIFY_SOCKET. */
/* STATUS= of a start-up step. */
void service_status(const char *what);
/* cache_progress_fn: the cache's start-up progress, each report extending the start timeout. */
void service_cache_progress(const char *step, uint64_t done, uint64_t total);
/* The cache of bytes is being pinned for CUDA: status and time for it. */
void service_cuda_pin(uint64_t bytes);
/* READY=1 and the running status of d, refreshed from now on (once a second at most). */
void service_ready(const struct daemon *d);
/* RELOADING=1 (with MONOTONIC_USEC=), then READY=1 when the reload is over. */
void service_reloading(void);
void service_reloaded(void);
/* STOPPING=1 and the draining status, refreshed (and the stop timeout extended) as the drain
 * progresses. */
void service_stopping(void);
/* The drain is over; closes the refresh timer (shutdown). */
void service_close(void);

/* main.c — the daemon's context: main.c makes the one there is and hands it to the modules
 * that need it when they start (server, service, request, query, save, load, commit, seal,
 * tensors), which keep the pointer; those below them get the values they need as arguments.
 * Owned by the loop thread. */
struct daemon {
	struct uv_loop_s *loop;
	struct config *config;   /* the current one: replaced whole on SIGHUP, so read it here
				  * each time (config_ref for work that outlives a reload) */
	struct cache *cache;
	const char *gpu_line;    /* gpu_init()'s answer, for status */
	double start_time;       /* CLOCK_REALTIME seconds at start */
};

/* server.c — the listening socket. */
/* Before anything is touched: takes systemd's socket, or refuses (-1 with err) a socket path
 * another user could take, another user's entry at it, or a socket someone listens on. */
int server_prepare(const struct daemon *d, char *err, size_t errlen);
/* Binds the socket of server_prepare's daemon (unless systemd's was taken) and starts
 * accepting; -1 with err. */
int server_start(char *err, size_t errlen);
/* Stops accepting and removes the socket path (when we created it). */
void server_stop(void);

/* conn.c — the connection layer: frame I/O, descriptors, credentials; knows no handler. */
struct proto_hdr;
/* Gets each complete frame of c; the descriptors (nfds) are the callee's. */
typedef void (*conn_dispatch_cb)(struct conn *c, const struct proto_hdr *h,
				 const uint8_t *body, int *fds, unsigned nfds);
/* Told that c is closing; whatever refers to it must be let go (conn_data too). */
typedef void (*conn_gone_cb)(struct conn *c);
/* Sets the loop and the two callbacks, once, before the first accept. */
void conn_init(struct uv_loop_s *loop, conn_dispatch_cb on_frame, conn_gone_cb on_gone);
/* Takes an accepted, non-blocking socket; reads peer credentials. */
void conn_accept(int fd);
/* Number of open connections. */
unsigned conn_count(void);
/* The open connection with this id, or NULL once it is gone. */
struct conn *conn_find(uint64_t id);
/* Closes every connection (shutdown). */
void conn_close_all(void);
/* Queues a finished frame for the client (and frees it). */
void conn_send(struct conn *c, struct proto_out *o);
/* Closes c once its queued replies are written; reads nothing more from it. */
void conn_close_after(struct conn *c);
/* Accessors: the id (never reused), the peer's kernel credentials, the layer above's data. */
uint64_t conn_id(const struct conn *c);
pid_t conn_pid(const struct conn *c);
uid_t conn_uid(const struct conn *c);
gid_t conn_gid(const struct conn *c);
void *conn_data(const struct conn *c);
void conn_set_data(struct conn *c, void *data);

/* request.c — the request layer: decodes frames, checks them, acts, answers via reply.c. */
/* conn_dispatch_cb: handles one complete frame (a client's state is made at its first). */
void request_dispatch(struct conn *c, const struct proto_hdr *h, const uint8_t *body,
		      int *fds, unsigned nfds);
/* conn_gone_cb: forgets a departed client's waits, open saves, events and regions. */
void request_conn_gone(struct conn *c);
/* Hands the layer the daemon it serves (start-up, before the first frame). */
void request_init(const struct daemon *d);

/* session.c — a connected client above the connection (its session): identity and regions. */
struct session;
enum session_role { SESSION_NONE, SESSION_TRAINER, SESSION_CTL };
/* A newly connected client (no role yet) of connection id; NULL without memory. */
struct session *session_new(uint64_t id, pid_t pid, uid_t uid, gid_t gid);
/* Frees a client and drops its regions (NULL: nothing). */
void session_free(struct session *cl);
/* Accessors; the id is the connection's. */
uint64_t session_id(const struct session *cl);
pid_t session_pid(const struct session *cl);
uid_t session_uid(const struct session *cl);
gid_t session_gid(const struct session *cl);
int session_role(const struct session *cl);
const char *session_job(const struct session *cl);
unsigned session_rank(const struct session *cl);
unsigned session_world(const struct session *cl);
/* The run of the job the client belongs to ("" when it named none: an unknown run). */
const char *session_run(const struct session *cl);
/* Records HELLO's identity. */
void session_set_identity(struct session *cl, int role, const char *job, unsigned rank,
			 unsigned world, const char *run);
/* Registers a source under a client-chosen id (takes the reference on success), charged to
 * the client's user; negative ERR_E* (EEXIST, ELIMIT, ENOMEM) with err. */
int session_region_add(struct session *cl, uint64_t id, struct source *s, char *err,
		      size_t errlen);
/* Forgets a region; -1 if unknown. */
int session_region_del(struct session *cl, uint64_t id);
/* Looks a region up (borrowed reference); NULL if unknown. */
struct source *session_region(const struct session *cl, uint64_t id);

/* auth.c — who may do what: the one home of the permission checks. */
enum auth_action {
	AUTH_REQUEST,  /* any message but HELLO: HELLO must have come first */
	AUTH_HELLO,    /* HELLO: only once */
	AUTH_SAVE,     /* SAVE_BEGIN: an identified trainer */
	AUTH_COMMIT,   /* COMMIT: an identified trainer */
	AUTH_SEAL,     /* SEAL: an identified trainer */
	AUTH_LOAD      /* LOAD_BEGIN: any client past HELLO (the file is checked by load.c) */
};
/* Whether client cl may perform action a; 0, or a negative ERR_E* with err. */
int auth_check(const struct session *cl, enum auth_action a, char *err, size_t errlen);
/* Whether a client of uid viewer may see a save of uid owner (PENDING). */
int auth_sees(uid_t viewer, uid_t owner);

/* workq.c — worker → loop completions (engine.c's and restore.c's): workers push items,
 * the loop thread runs them in push order through one async handle. */
struct workq;
/* A completion's link, embedded (zeroed) in what a worker hands back to the loop. */
struct workq_item {
	unsigned posted;               /* (queue lock) events pushed, not yet taken */
	unsigned taken;                /* (loop) events taken, callback not yet run */
	struct workq_item *next;       /* (queue lock) link in the queue while posted != 0 */
	struct workq_item *run_next;   /* (loop) link in the run list while taken != 0 */
};
/* Runs on the loop thread with the events pushed to it since its last run, OR'd; it may free
 * the item. */
typedef void (*workq_fn)(struct workq_item *it, unsigned events);
/* Makes a queue whose items run fn on loop's thread; 0 or a negative ERR_E* with err. */
int workq_open(struct workq **out, struct uv_loop_s *loop, workq_fn fn, char *err,
	       size_t errlen);
/* Any thread: ORs events (non-zero) into it, queues it unless queued, and wakes the loop. */
void workq_push(struct workq *q, struct workq_item *it, unsigned events);
/* Loop thread: runs every item pushed so far (again from within fn: the rest of the list). */
void workq_run(struct workq *q);
/* Loop thread, no worker left to push: runs what is pending and closes the handle; the queue
 * is freed by the loop's next turn. NULL is fine. */
void workq_close(struct workq *q);

/* engine.c — copy threads (source → cache chunk) and flush threads (chunk → file). */
struct job;
/* One tensor of a job, in file order. */
struct engine_tensor {
	uint64_t off;        /* offset in the data region */
	uint64_t nbytes;
	struct source *src;  /* a reference the job owns */
	uint64_t src_off;
};
/* What a save hands to the engine; the engine owns every pointer in it from submit on. */
struct engine_req {
	struct engine_tensor *t;
	size_t n;
	/* When set, t is this list's description (tensors_lend), read only: the job holds a
	 * reference to the list and one per entry to the sources, which lent_drop drops
	 * (sources 1: the sources', per allocation; 0: the list's). The engine calls it
	 * through the pointer and knows nothing of lists. */
	struct tensors *lent;
	void (*lent_drop)(struct tensors *lent, size_t n, int sources);
	/* The header's description, borrowed from the save (which outlives its job); the
	 * header itself is built by a flush thread, off the request path. */
	const struct st_tensor *st;
	const char *const *meta;
	size_t nmeta;
	struct store_file *file;
	int dirfd;           /* for the .meta file */
	char *meta_name;     /* "<file>.meta" or NULL when there are no blobs */
	uint8_t *meta_bytes;  /* the .meta file's contents */
	size_t meta_len;
	uid_t uid;
	gid_t gid;
	unsigned mode;       /* of the .meta file */
	char *meta_xxh3;     /* 17 bytes of the save's, where the .meta's checksum goes (the
			      * flush thread fills it before laying out the header), or NULL */
	struct store_root root;    /* the files are renamed into place only below it */
	struct cuda_fence *fence;  /* copies wait for it (GPU saves), or NULL */
	struct resident *res;      /* keeps the written pieces (resident.c), or NULL; the
				    * flush thread ends it (durable or dropped) */
	void *owner;         /* the save, passed back in events */
};
enum engine_event { ENGINE_SNAPSHOT, ENGINE_DURABLE, ENGINE_FAILED };
/* Event callback on the loop thread; after DURABLE or FAILED the job is the loop's to free.
 * FAILED comes with a negative ERR_E* code and its message (valid for the whole call, even
 * once the job is freed); other events with 0 and NULL. */
typedef void (*engine_cb)(void *owner, struct job *j, int event, int code, const char *error);
/* Starts the worker threads, their events to loop. */
int engine_start(struct uv_loop_s *loop, struct cache *c, unsigned copy_threads,
		 unsigned flush_threads, engine_cb cb, char *err, size_t errlen);
/* Queues a job (a zero-byte job completes at once): 0 and the engine owns r's pointers, or a
 * negative ERR_E* with err and r still the caller's. */
int engine_submit(struct engine_req *r, struct job **out, char *err, size_t errlen);
/* Fails a job that has not finished (loop thread): no new piece is claimed, its partial file
 * is removed, and its FAILED event carries code and why. */
void engine_cancel(struct job *j, int code, const char *why);
/* Bytes copied into the cache and written to the file so far. */
void engine_progress(struct job *j, uint64_t *snapshot, uint64_t *flushed);
/* Per-tensor checksums once DURABLE (n entries). */
const uint64_t *engine_checksums(struct job *j);
/* The durable file's header (*len bytes, as written) and size; NULL when none was laid out. */
const uint8_t *engine_header(struct job *j, size_t *len, uint64_t *size);
/* Frees a finished job. */
void engine_job_free(struct job *j);
/* Drops the job's references to its sources once it reached SNAPSHOT (nothing reads them any
 * more), so that memory its client unregistered is let go now rather than at DURABLE. */
void engine_release_sources(struct job *j);
/* Stops and joins every thread (jobs must be finished). */
void engine_stop(void);

/* flush_file.c — one save's file as the flush threads write it (header, pieces, finish). */
struct flush_file;
/* The state for writing a file of n tensors; NULL without memory. */
struct flush_file *flush_file_new(size_t n);
/* Frees it (NULL is fine). */
void flush_file_free(struct flush_file *f);
/* Whether the header has been laid out and written. */
int flush_file_started(const struct flush_file *f);
/* Lays out and writes r's header (checksum slots zero; the .meta checksum filled in first). */
int flush_file_begin(struct flush_file *f, const struct engine_req *r, char *err,
		     size_t errlen);
/* Hashes and writes len data bytes at data offset start from chunk (pieces in file order). */
int flush_file_piece(struct flush_file *f, const struct engine_req *r, uint64_t start,
		     uint8_t *chunk, uint64_t len, char *err, size_t errlen);
/* The filled header, the .meta file, then the file durable under its name (r->file freed). */
int flush_file_finish(struct flush_file *f, struct engine_req *r, uint64_t data_len, char *err,
		      size_t errlen);
/* The per-tensor checksums, once finished. */
const uint64_t *flush_file_checksums(const struct flush_file *f);
/* The finished file's identity (for its resident copy); 0, or -1 when unknown. */
int flush_file_identity(const struct flush_file *f, dev_t *dev, ino_t *ino);
/* The header bytes as written (checksums filled once finished): the file's first *len. */
const uint8_t *flush_file_header(const struct flush_file *f, size_t *len);

/* blob.c — a save's named blobs, charged to its user, packed as the .meta file. */
struct blobs;
/* An empty set charged to uid; NULL without memory. */
struct blobs *blobs_new(uid_t uid);
/* Appends len bytes to blob name (made when new); negative ERR_E* (EINVAL, ERANGE, ELIMIT,
 * ENOMEM) with err. */
int blobs_add(struct blobs *bs, const char *name, const void *data, size_t len, char *err,
	      size_t errlen);
/* Number of blobs. */
size_t blobs_count(const struct blobs *bs);
/* The .meta file's bytes (*out, the caller frees); 0, or -1 without memory. */
int blobs_pack(const struct blobs *bs, uint8_t **out, size_t *len);
/* Frees the bytes (once packed); the charge stays until blobs_uncharge. */
void blobs_clear(struct blobs *bs);
/* Gives the charge back (the packed bytes are written or dropped). */
void blobs_uncharge(struct blobs *bs);
/* Frees the set and gives its charge back (NULL: nothing). */
void blobs_free(struct blobs *bs);

/* tensors.c — a tensor list as a client described it, checked, names unique; shared
 * copy-on-write between a plan and the saves made from it. Loop thread only. */
struct tensors;
/* An empty list with one reference; NULL without memory. */
struct tensors *tensors_new(uid_t uid);
/* Hands the module the daemon whose max_tensors_per_save it applies (start-up). */
void tensors_init(const struct daemon *d);
/* Another reference / drops one (the last frees it). */
struct tensors *tensors_ref(struct tensors *tl);
void tensors_unref(struct tensors *tl);
/* Counts. */
size_t tensors_count(const struct tensors *tl);
uint64_t tensors_bytes(const struct tensors *tl);
/* Checks a tensor and appends it to *tlp (copied first when shared); negative ERR_E* with
 * err. */
int tensors_add(struct tensors **tlp, const char *name, const char *dtype,
		const uint64_t *shape, unsigned ndim, struct source *src, uint64_t off,
		uint64_t nbytes, char *err, size_t errlen);
/* Makes room for more entries at once; -1 without memory (adding still works). */
int tensors_reserve(struct tensors **tlp, size_t more);
/* Appends from's entries to *tlp: an empty *tlp becomes a reference to from (*shared set:
 * the caller holds references of its own to from's sources, see tensors_sources_ref). */
int tensors_append(struct tensors **tlp, struct tensors *from, int *shared, char *err,
		   size_t errlen);
/* Takes (take 1) or drops one reference to the source of each of the first n entries. */
void tensors_sources_ref(struct tensors *tl, size_t n, int take);
/* The header's description of tl, made once and kept with it; NULL without memory. */
const struct st_tensor *tensors_header(struct tensors *tl);
/* Fills the engine's et (data offsets, new source references), in order. */
void tensors_give(struct tensors *tl, struct engine_tensor *et);
/* Lends tl's kept description to the engine with references to tl and its sources (see
 * engine_req.lent); NULL without memory. */
struct engine_tensor *tensors_lend(struct tensors *tl);
/* Drops what tensors_lend gave for n entries: the sources' references (sources 1) or the
 * list's (0). */
void tensors_lent_drop(struct tensors *tl, size_t n, int sources);
/* Drops the sources' references of a list nobody shares (the engine took its own). */
void tensors_release(struct tensors *tl);
/* Drops a plan's reference to its list and, when saves still share it, the list's
 * references to its sources. */
void tensors_forsake(struct tensors *tl);
/* Whether any entry reads from src. */
int tensors_use(const struct tensors *tl, const struct source *src);

/* plan.c — save plans: tensor lists a connection describes once and names in later saves;
 * loop thread only. */
struct plan;
/* The plan id of client; NULL when none. */
struct plan *plan_find(uint64_t client, uint64_t id);
/* The plan id of client, made and charged to uid when new; NULL with *code and err. */
struct plan *plan_open(uint64_t client, uid_t uid, uint64_t id, int *code, char *err,
		       size_t errlen);
/* Makes room for n more tensors at once (best effort). */
void plan_reserve(struct plan *p, size_t n);
/* Adds a tensor to a plan (checked as a save's are); negative ERR_E* with err. */
int plan_add_tensor(struct plan *p, const char *name, const char *dtype,
		    const uint64_t *shape, unsigned ndim, struct source *src, uint64_t off,
		    uint64_t nbytes, char *err, size_t errlen);
/* The plan's list, for save_add_plan. */
struct tensors *plan_tensors(const struct plan *p);
/* Forgets a plan; -1 when unknown. */
int plan_del(uint64_t client, uint64_t id);
/* Forgets client's plans reading src (a deleted region), or all of them for NULL. */
void plan_forget(uint64_t client, const struct source *src);

/* Who a request comes from, as the layers below the request layer know a client (they never
 * see its struct session): its connection's id and kernel credentials, and what HELLO said (a
 * trainer's job, run, rank and world; the strings are borrowed for the call). */
struct owner {
	uint64_t conn;
	pid_t pid;
	uid_t uid;
	gid_t gid;
	const char *job, *run;
	unsigned rank, world;
};

/* save.c — the registry of saves and their levels; loop thread only. */
/* What a reply or a listing shows of a save (strings borrowed from it). */
struct save_view {
	uint64_t id, client;
	pid_t pid;
	uid_t uid;
	const char *job, *run, *dir, *file;
	struct store_dirid dirid;  /* dir as SAVE_BEGIN opened it */
	const uint8_t *hdr;        /* DURABLE: the file's header as written (hdr_len bytes), or */
	size_t hdr_len;            /* NULL; and the file's size */
	uint64_t size;
	unsigned rank;
	int level;
	int code;                /* FAILED: its ERR_E*; else 0 */
	const char *error;       /* FAILED: the reason; else NULL */
	uint64_t bytes_total, bytes_snapshot, bytes_flushed;
	double age_s, busy_s;    /* since ACCEPTED; busy stops at the final level */
	int settled;             /* peer copies of the node's files sent: copies of replicas */
	unsigned copies, replicas;
	const char *copies_why;  /* settled with copies < replicas: why no more; else NULL */
	const char *remote_why;  /* never REMOTE (another version replaced it first): why; NULL */
	int kept;                /* finished long ago, kept only for its client's WAITs */
};
/* Told of every change of a save's level. */
typedef void (*save_change_cb)(struct save *s);
/* Starts the engine of d with save.c's event handler, and the timer that forgets old saves. */
int save_engine_start(const struct daemon *d, char *err, size_t errlen);
/* Registers an observer of level changes (at start-up; a few at most). */
void save_observe(save_change_cb cb);
/* Opens the directory a SAVE_BEGIN of o into dir (normalised, of size len) goes into, below
 * c's roots, which may be another version's (its path then replaces dir): fd with *root and
 * *id, or a negative ERR_E* with err. */
typedef int (*save_dir_cb)(const struct config *c, char *dir, size_t len,
			   const struct owner *o, struct store_root *root,
			   struct store_dirid *id, char *err, size_t errlen);
/* Told of a save of uid into the directory id dropped before its SAVE_END (loop thread). */
typedef void (*save_drop_cb)(uid_t uid, const struct store_dirid *id);
/* Registers that opener and drop's callback (at start-up; overwrite.c's and seal_dirs.c's,
 * wired in main.c; none: the tag itself, nobody told). */
void save_open_with(save_dir_cb cb, save_drop_cb drop);
/* Opens a save for o; returns its id or a negative ERR_E* with err. */
int64_t save_begin(const struct owner *o, const char *dir, const char *file, char *err,
		   size_t errlen);
/* Finds a save of client (a connection id) that is still open for adding; NULL otherwise. */
struct save *save_find_open(uint64_t client, uint64_t id);
/* Finds any save of client by id; NULL otherwise. */
struct save *save_find(uint64_t client, uint64_t id);
/* Adds a tensor (name, dtype, shape) from a region; negative ERR_E* with err. */
int save_add_tensor(struct save *s, const char *name, const char *dtype,
		    const uint64_t *shape, unsigned ndim, struct source *src, uint64_t off,
		    uint64_t nbytes, char *err, size_t errlen);
/* Adds a plan's tensors (see tensors_append); negative ERR_E* with err. */
int save_add_plan(struct save *s, struct tensors *plan, char *err, size_t errlen);
/* Makes room for n more tensors at once (best effort: a frame's batch). */
void save_reserve(struct save *s, size_t n);
/* Appends to a named blob. */
int save_add_blob(struct save *s, const char *name, const void *data, size_t len, char *err,
		  size_t errlen);
/* Abandons a save still open for adding (a bad SAVE_ADD). */
void save_drop(struct save *s);
/* Totals so far. */
void save_totals(struct save *s, uint64_t *tensors, uint64_t *bytes);
/* Plans the file and submits it to the engine (ACCEPTED), its copies ordered after fence
 * (taken, may be NULL); negative ERR_E* with err. */
int save_end(struct save *s, struct cuda_fence *fence, char *err, size_t errlen);
/* A save's id, level, directory and client. */
uint64_t save_id(const struct save *s);
int save_level(const struct save *s);
const char *save_dir(const struct save *s);
uint64_t save_client(const struct save *s);
/* Fills v with what a reply shows of s, progress as of now. */
void save_view(const struct save *s, struct save_view *v);
/* The save after s (the first for NULL); NULL at the end. */
struct save *save_next(const struct save *s);
/* Keeps s from being forgotten until the matching save_release. */
void save_hold(struct save *s);
void save_release(struct save *s);
/* Saves in flight (accepted, not yet durable or failed). */
unsigned save_inflight(void);
/* Moves s to level, one it reaches (save_marks.c); a FAILED save stays FAILED. */
void save_set_level(struct save *s, int level);
/* Records on s that copies of replicas peers hold its node's files (why: why no more). */
void save_set_copies(struct save *s, unsigned copies, unsigned replicas, const char *why);
/* Records on s that it will never be REMOTE, and why. */
void save_set_remote_why(struct save *s, const char *why);

/* save_marks.c — the levels a tag directory's saves reach together (through save.c), and the
 * state a commit checks. Loop thread only. */
/* Hands the module the daemon (start-up). */
void save_marks_init(const struct daemon *d);
/* The first failed save of uid's run into the directory id (or NULL); *pending: whether any
 * of them is short of DURABLE. */
struct save *save_dir_state(const struct store_dirid *id, uid_t uid, const char *run,
			    int *pending);
/* Marks uid's DURABLE saves of run into the directory id COMMITTED. */
void save_mark_committed(const struct store_dirid *id, uid_t uid, const char *run);
/* Marks the COMMITTED saves into the directory id REMOTE (then REPLICATED, where settled
 * with every copy). */
void save_mark_remote(const struct store_dirid *id);
/* The COMMITTED saves into the directory id will never be REMOTE (upload.c: a newer version
 * of the tag replaced theirs before its upload ended; why says so): every wait on them ends. */
void save_mark_replaced(const struct store_dirid *id, const char *why);
/* Settles the peer copies of the COMMITTED or REMOTE saves into the directory id: copies of
 * replicas peers hold them (why: why no more); REPLICATED when all are (after REMOTE where the
 * root has a remote tier), and a wait for REPLICATED on one left short ends now. */
void save_mark_replicated(const struct store_dirid *id, unsigned copies, unsigned replicas,
			  const char *why);
/* Frees every save (shutdown, once nothing is in flight and no wait holds one). */
void save_free_all(void);

/* save_gc.c — finished saves forgotten a minute after their last change, but a connected
 * client's newest that finished well, slimmed and kept for its WAITs. */
/* Starts the timer that forgets them (start-up); 0, or -1 with err. */
int save_gc_start(const struct daemon *d, char *err, size_t errlen);
/* Stops it (shutdown). */
void save_gc_stop(void);
/* Drops a departed client's saves that were never ended; its ended ones are not kept. */
void save_client_gone(uint64_t client);

/* waiter.c — requests parked until something happens (a WAIT's level, a COMMIT's durability,
 * a LOAD_WAIT's end): each by connection id, what it waits for and its deadline; registries
 * publish their levels to it, and each end goes to its tag's handler. Loop thread only. */
enum waiter_tag { WAITER_SAVE, WAITER_LOAD, WAITER_COMMIT, WAITER_TAGS };
/* What a wait is for: the save, load or commit key (its id) reaching level; a negative level
 * published (failed) ends it too. */
struct waiter_on {
	enum waiter_tag tag;
	uint64_t key;
	int level;
};
/* How a wait ended: its level was published, its deadline passed, or it was dropped (its
 * connection left, or shutdown). */
enum waiter_how { WAITER_REACHED, WAITER_TIMEOUT, WAITER_DROPPED };
/* A wait that ended (given to its tag's handler, gone once the handler returns). */
struct waiter_end {
	uint64_t conn, req;      /* the request parked */
	struct waiter_on on;
	enum waiter_how how;
	int level;               /* REACHED: the level published */
};
/* A tag's handler: answers (through reply.c) or moves its state machine on. */
typedef void (*waiter_fn)(const struct waiter_end *e);
/* Makes the layer's one timer on loop l (start-up); 0, or ERR_ENOMEM. */
int waiter_init(struct uv_loop_s *l);
/* Sets tag's handler (start-up), and whether its waits outlive their connection (a COMMIT
 * goes on without its client; reply.c drops the answer). */
void waiter_handle(enum waiter_tag tag, waiter_fn fn, int outlive);
/* Parks request req of connection conn until on is reached, or for timeout_ms (< 0: no
 * deadline; 0: until the loop's next turn); 0, or ERR_ENOMEM. */
int waiter_add(uint64_t conn, uint64_t req, const struct waiter_on *on, int64_t timeout_ms);
/* A registry's news: key of tag is at level now; ends the waits it satisfies, in the order
 * they were parked. */
void waiter_publish(enum waiter_tag tag, uint64_t key, int level);
/* A registry's news: key of tag, at level, will go no higher; every wait on it ends now. */
void waiter_settle(enum waiter_tag tag, uint64_t key, int level);
/* Whether a wait on key of tag is parked. */
int waiter_parked(enum waiter_tag tag, uint64_t key);
/* Drops a departed connection's waits (those of tags that outlive it go on). */
void waiter_conn_gone(uint64_t conn);
/* Waits parked now. */
unsigned waiter_count(void);
/* Drops every wait and closes the timer (shutdown). */
void waiter_close(void);

/* wait.c — WAITs: parked in waiter.c by save id, each holding its save; loop thread only. */
/* Answers a WAIT for s now or when the level is reached, it fails or timeout_ms passes. */
void wait_add(uint64_t conn, uint64_t req, struct save *s, int level, int64_t timeout_ms);
/* waiter_fn of WAITER_SAVE: answers a WAIT that ended (not one dropped) and lets its save go. */
void wait_end(const struct waiter_end *e);

/* upload.c, upload_tag.c — the remote tier's uploads (level REMOTE): a save's files from
 * DURABLE, its tag's node record, remote manifest and latest after COMMITTED, on worker
 * threads of their own; start-up resumes committed tags without REMOTE.json. */
/* What PENDING shows of a tag not yet REMOTE (strings valid during the callback). */
struct upload_view {
	const char *dir, *remote, *key;
	uid_t uid;               /* the tag's owner */
	int committed;           /* the tag is committed here (else its files go up early) */
	int code;                /* the last failure's ERR_E*, or 0 */
	const char *error;       /* its message, or what the tag waits for; NULL: nothing */
	uint64_t files, files_done, bytes_total, bytes_done;
	double age_s;            /* since it was queued (or committed) */
};
/* Opens the remote of every root of d's config that has one (the remote settings of the
 * start hold until a restart) and starts the upload threads; 0 or a negative ERR_E*. */
int upload_start(const struct daemon *d, char *err, size_t errlen);
/* save_change_cb: files go up from DURABLE; a tag is finished from COMMITTED. */
void upload_on_save(struct save *s);
/* Calls fn for each tag not yet REMOTE (loop thread; fn must not call into upload.c). */
void upload_each(void (*fn)(void *arg, const struct upload_view *v), void *arg);
/* Tags not yet REMOTE and their bytes still to upload. */
void upload_backlog(uint64_t *tags, uint64_t *bytes);
/* Stops the threads (an upload in flight is aborted) and frees every tag (shutdown). */
void upload_stop(void);

/* commit.c — COMMITs: wait for durability, write manifest/latest/retention off the loop. */
/* Handles COMMIT of dir for o, answered when done, failed or timed out; of the directory
 * want (a version's, as its saves opened it) when given, else of the one dir names now. */
void commit_request(const struct owner *o, uint64_t req, const char *dir, unsigned world,
		    int64_t timeout_ms, const struct store_dirid *want);
/* save_change_cb: a save becoming DURABLE or FAILED may let a commit go on. */
void commit_on_save(struct save *s);
/* waiter_fn of WAITER_COMMIT: a commit's wait for durability ended (its saves durable and
 * its user's previous commit done; a save failed; time up; shutdown). */
void commit_wait_end(const struct waiter_end *e);
/* Commits in the threadpool now. */
unsigned commit_running(void);
/* Hands the module the daemon it commits for (start-up). */
void commit_init(const struct daemon *d);

/* seal.c — SEAL, and the commits the daemons make once every rank has sealed. */
struct seal_record;
/* Handles SEAL of dir by o (an identified trainer): answered at once; the commit follows on
 * its own. */
void seal_request(const struct owner *o, uint64_t req, const char *dir);
/* Hands the module the daemon it seals for (start-up, before recovery resumes seals). */
void seal_init(const struct daemon *d);
/* Whether rank of uid's job and run sealed the directory id through this daemon (its next
 * save of the tag begins a new version, overwrite.c). */
int seal_holds(const struct store_dirid *id, uid_t uid, const char *job, const char *run,
	       unsigned rank);
/* save_change_cb: a save becoming DURABLE or FAILED may let its tag go on. */
void seal_on_save(struct save *s);
/* Takes up a tag this node sealed before a restart (its record r, the files' uid/gid). */
void seal_resume(const char *dir, const struct seal_record *r, uid_t uid, gid_t gid);
/* Seals at work in the threadpool now. */
unsigned seal_running(void);
/* Forgets every tag (shutdown, nothing running). */
void seal_free_all(void);

/* seal_watch.c — a sealed tag's directory watched for the manifest another node writes. */
struct seal_watch;
typedef void (*seal_watch_cb)(void *arg);
/* Watches dir (open as dfd, kept open by the caller) for a manifest (and seal records, if
 * records): inotify, and a poll (100 ms doubling to 2 s) for other hosts' writes; cb(arg) on
 * loop whenever one is seen. NULL without memory. */
struct seal_watch *seal_watch_start(struct uv_loop_s *loop, const char *dir, int dfd,
				    int records, seal_watch_cb cb, void *arg);
/* Stops and frees a watch (NULL is fine). */
void seal_watch_stop(struct seal_watch *w);
/* Threadpool: whether the manifest in the tag dfd commits run by world ranks; *present:
 * whether there is one (one open either way). */
int seal_watch_mine(int dfd, const char *run, unsigned world, int *present);
/* Threadpool: whether the tag dfd (tag in jobfd) is committed already, from the listing l when
 * there is one, else from its manifest and name; *mine as seal_watch_mine. */
int seal_watch_committed(int dfd, int jobfd, const char *tag, const char *run, unsigned world,
			 const struct seal_listing *l, int *mine);
/* w, or (NULL, or of other records) a new watch as seal_watch_start makes. */
struct seal_watch *seal_watch_keep(struct seal_watch *w, struct uv_loop_s *loop,
				   const char *dir, int dfd, int records, seal_watch_cb cb,
				   void *arg);
/* Names of seal records (malloc'd). */
struct seal_names {
	char **v;
	size_t n;
};
/* Frees the names s holds (s itself is the caller's). */
void seal_names_free(struct seal_names *s);
/* The seal records inotify saw come since the last call, handed over into *out (freed first),
 * the directory listed since the watch started (listed); -1 when the watch cannot say (NULL,
 * polled, an event missed, not listed): the directory is listed, changes noted from now; 1
 * when no other name changed since: that listing and these records are the directory now. */
int seal_watch_names(struct seal_watch *w, struct seal_names *out, int listed);

/* seal_dirs.c — the tag directories SAVE_BEGINs opened, kept for their ranks' SEALs. */
/* Whether the directory dfd was removed (or can no longer be looked at). */
int seal_dirs_gone(int dfd);
/* SAVE_BEGIN: keeps dir of uid (dfd duplicated, jobfd taken) with its identity id. */
void seal_dirs_keep(uid_t uid, const char *dir, int dfd, int jobfd,
		    const struct store_dirid *id);
/* Opens the existing tag dir of uid/gid by its path, with its job directory and identity. */
int seal_dirs_walk(const struct config *cfg, const char *dir, uid_t uid, gid_t gid, int *jobfd,
		   struct store_dirid *id, char *err, size_t errlen);
/* SEAL of dir by o: the directory kept, else walked; 1 when o's rank's save of its run there
 * is not committed yet, else 0, or a negative ERR_E* with err. */
int seal_dirs_open(const struct config *cfg, const struct owner *o, const char *dir, int *dfd,
		   int *jobfd, struct store_dirid *id, char *err, size_t errlen);
/* Closes every directory kept (shutdown). */
void seal_dirs_free_all(void);
/* A save of uid into the directory id ended: its kept directory goes once none is in flight;
 * a staging directory, when failed (no save of it committed) and empty, is removed. */
void seal_dirs_release(uid_t uid, const struct store_dirid *id, int failed);
/* save_drop_cb: a save of uid into the directory id was dropped before its SAVE_END
 * (abandoned, aborted, its client gone): seal_dirs_release as failed. */
void seal_dirs_dropped(uid_t uid, const struct store_dirid *id);

/* seal_files.c — what this node's seal record of a tag speaks for: its ranks' files. */
/* The ranks of uid's job and run (world) sealed through this daemon into the directory. */
struct seal_scope {
	uid_t uid;
	struct store_dirid dirid;
	const char *job, *run;
	unsigned world;
	const uint8_t *sealed;    /* world entries */
};
/* The names (without .safetensors) of the files those ranks saved there, and the headers
 * their saves kept (malloc'd copies). */
struct seal_files {
	char **bases;
	struct store_known *known;
	size_t n;
};
/* Whether the save (viewed) is of a rank the scope holds sealed. */
int seal_files_sealed(const struct seal_scope *sc, const struct save_view *v);
/* The time now (CLOCK_REALTIME, ns), as records date their seals. */
uint64_t seal_files_now_ns(void);
/* Collects them into f (replacing what it held). */
void seal_files_gather(struct seal_files *f, const struct seal_scope *sc);
/* Whether a rank of the scope's job and run saved there through this daemon, unsealed. */
int seal_files_unsealed(const struct seal_scope *sc);
/* Threadpool: writes record r into the tag dfd (at dir), f's files described; with seen
 * (not NULL), keeps it there as read (store_seal_write_seen: have, newest). */
int seal_files_write(const struct config *cfg, int dfd, const struct seal_record *r,
		     const struct seal_files *f, uid_t uid, gid_t gid, const char *dir,
		     uint8_t *have, uint64_t *newest, struct seal_seen *seen, char *err,
		     size_t errlen);
/* Frees what f holds. */
void seal_files_free(struct seal_files *f);

/* overwrite.c — which version of a tag a save, a seal, a commit names (loop thread). */
/* save_dir_cb: opens the directory a save of dir by o's rank goes into: the tag, or its
 * staging directory (its path then replaces dir) when the tag is committed or the rank
 * sealed it; fd with *root and *id, or a negative ERR_E* with err. */
int overwrite_save_dir(const struct config *c, char *dir, size_t len, const struct owner *o,
		       struct store_root *root, struct store_dirid *id, char *err,
		       size_t errlen);
/* Rewrites a SEAL's dir to the staging path when rank's newest save of run into the tag went
 * there (or none did, and the tag is committed with a staging beside it). */
void overwrite_seal_dir(char *dir, size_t len, uid_t uid, const char *run, unsigned rank);
/* Rewrites a COMMIT's dir to the staging path when uid's run saved there last, uncommitted;
 * 1 then, with that version's directory identity in *id (the name may hold another soon). */
int overwrite_commit_dir(char *dir, size_t len, uid_t uid, const char *run,
			 struct store_dirid *id);

/* load.c — the registry of loads (restores) and their levels; loop thread only, but for the
 * header's parse (threadpool), which load_file.c does (load.h: what the two share). */
struct load;
enum load_level { LOAD_FAILED = -1, LOAD_OPEN = 0, LOAD_ACCEPTED = 1, LOAD_LOADED = 2 };
/* What a reply shows of a load. */
struct load_view {
	uint64_t id;
	int level;
	int code;                /* FAILED: its ERR_E*; else 0 */
	const char *error;       /* FAILED: the reason; else NULL */
	const char *read_from;   /* "cache" or "file": where its bytes come from (wire: source) */
	uint64_t tensors, bytes, bytes_cached; /* of the file */
	uint64_t bytes_total, bytes_done;      /* of the destinations named */
};
/* Starts the restore threads (restore.c) of d with load.c's event handler. */
int load_start(const struct daemon *d, unsigned threads, char *err, size_t errlen);
/* Opens dir/file.safetensors for o's LOAD_BEGIN req: checks the file here, then its header
 * and resident copy in the threadpool, and answers req once they are (a load of o's
 * connection found by no request until then). 0, or a negative ERR_E* with err to answer now. */
int load_begin(const struct owner *o, uint64_t req, const char *dir, const char *file,
	       char *err, size_t errlen);
/* Finds a load of client still open for adding; NULL otherwise. */
struct load *load_find_open(uint64_t client, uint64_t id);
/* Finds any load of client; NULL otherwise. */
struct load *load_find(uint64_t client, uint64_t id);
/* Names a destination; mismatches with the file are collected for load_end, other errors
 * (region range, size) returned as a negative ERR_E* with err. */
int load_add_tensor(struct load *l, const char *name, const char *dtype,
		    const uint64_t *shape, unsigned ndim, struct source *dst, uint64_t off,
		    uint64_t nbytes, char *err, size_t errlen);
/* Totals of the destinations so far. */
void load_totals(const struct load *l, uint64_t *tensors, uint64_t *bytes);
/* Abandons a load still open (a bad LOAD_ADD, LOAD_ABORT). */
void load_drop(struct load *l);
/* Starts filling the destinations after fence (taken, may be NULL): ERR_EINVAL naming every
 * mismatch (the load abandoned), or 0 (ACCEPTED). */
int load_end(struct load *l, struct cuda_fence *fence, char *err, size_t errlen);
/* Fills v with what a reply shows of l. */
void load_view(const struct load *l, struct load_view *v);
/* Answers a LOAD_WAIT of request req now or once l is done, failed or timeout_ms passed
 * (parked in waiter.c); forgets l after answering a final level. */
void load_wait(struct load *l, uint64_t req, int64_t timeout_ms);
/* waiter_fn of WAITER_LOAD: answers a LOAD_WAIT that ended (not one dropped). */
void load_wait_end(const struct waiter_end *e);
/* Cancels and forgets a departed client's loads. */
void load_client_gone(uint64_t client);
/* Loads in progress. */
unsigned load_count(void);
/* Loads whose header is parsed or queued to be (the drain waits for them). */
unsigned load_parsing(void);
/* Cancels every running load (shutdown). */
void load_cancel_all(void);
/* Frees every load (shutdown, once the restore threads are stopped). */
void load_free_all(void);

/* prefetch.c — PREFETCH: a tag (or a job's latest, here or in the remote tier) pulled into
 * the local tier when only the remote holds it, then read into the cache as resident copies
 * (only chunks free or evictable now, at most 7/8 of the cache); loop thread, the work in
 * libuv's threadpool. */
/* Keeps d (the cache, the config) for the prefetches to come. */
void prefetch_start(const struct daemon *d);
/* Starts a prefetch of dir (a tag or job directory; tag: one of that job, or NULL) for o;
 * answers req once the tag is known (wait: once it is in the cache), or returns a code. */
int prefetch_begin(const struct owner *o, uint64_t req, const char *dir, const char *tag,
		   int wait, char *err, size_t errlen);
/* Prefetches still running (a drain waits for them). */
unsigned prefetch_running(void);

/* restore.c — the restore threads: file or resident pieces → checked → destinations (the
 * filling in restore_fill.c, through restore_int.h). */
struct restore_job;
/* One destination of a restore job, in file order. */
struct restore_dst {
	uint64_t begin, end;     /* the tensor's data range in the file (data_offsets) */
	struct source *dst;      /* a reference the job owns */
	uint64_t dst_off;
	const char *name;        /* borrowed from the load */
	int has_xxh3;
	uint64_t xxh3;           /* the header's checksum, when has_xxh3 */
};
/* What a load hands to the restore threads; the job owns d, the descriptors, the pin, the
 * fence and every reference from submit on. */
struct restore_req {
	struct restore_dst *d;   /* sorted by begin */
	size_t n;
	int fd;                  /* the file, buffered: pieces already in the page cache */
	int dfd;                 /* the same file with O_DIRECT (cold pieces), or -1 */
	uint64_t data_start;     /* file offset of the data region (4096-aligned for dfd) */
	uint64_t data_len;       /* bytes of the data region */
	const char *path;        /* for messages (borrowed from the load) */
	struct resident *res;    /* pinned resident copy, or NULL */
	struct cuda_fence *fence;
	int ondev;               /* destinations that checksum themselves may (gpu_checksums) */
	void *owner;             /* the load, passed back in the event */
};
/* Final event on the loop thread: code 0 (every byte in place) or a negative ERR_E* and its
 * message; the job is the loop's to free. */
typedef void (*restore_cb)(void *owner, struct restore_job *j, int code, const char *error);
/* Starts n restore threads over the cache, their ends to loop. */
int restore_start(struct uv_loop_s *loop, struct cache *c, unsigned n, restore_cb cb,
		  char *err, size_t errlen);
/* Queues a job: 0 and the job owns r's references, or a negative ERR_E* with err. */
int restore_submit(struct restore_req *r, struct restore_job **out, char *err, size_t errlen);
/* Bytes in place so far. */
uint64_t restore_progress(struct restore_job *j);
/* Stops a job early (loop thread); its final event follows with code. */
void restore_cancel(struct restore_job *j, int code, const char *why);
/* Frees a finished job (its references, fd, pin). */
void restore_job_free(struct restore_job *j);
/* Stops and joins the threads (jobs must be finished). */
void restore_stop(void);

/* resident.c — the hot set: the cache chunks of files just saved, kept after the flush so
 * that a restore needs no disk; given up piece by piece whenever the cache needs room (the
 * cache's evict hook: oldest file first, lowest piece first, never a pinned file's). Thread-
 * safe (its own lock, taken before the cache's); the lock order is written in resident.c. */
struct resident;
/* Starts keeping (when enabled) and hooks eviction into cache c; called again (a reload) it
 * changes only whether new files are kept. */
void resident_init(struct cache *c, int enabled);
/* A save's file about to be written into dir/file (data_len bytes in cache-chunk pieces),
 * of uid; NULL when nothing is kept (disabled, no memory). Its writer (the engine, through
 * engine_req.res) must end it with resident_durable or resident_drop. */
struct resident *resident_begin(const char *dir, const char *file, uid_t uid,
				uint64_t data_len);
/* Keeps the flushed chunk of piece i (a flush thread): 1 kept, 0 the caller puts it back.
 * NULL r keeps nothing. */
int resident_keep(struct resident *r, uint64_t piece, void *chunk);
/* The file is durable as dev/ino, its header the hdr_len bytes at hdr (copied): from now on a
 * load may find it, and an older copy of the same dir/file is let go. Ends the writer's hold. */
void resident_durable(struct resident *r, dev_t dev, ino_t ino, const void *hdr,
		      size_t hdr_len);
/* The save failed or was abandoned: every kept chunk goes back (r is freed unless pinned,
 * which it cannot be before DURABLE). NULL is fine. */
void resident_drop(struct resident *r);
/* dir was committed (loop thread; a tag's staging directory: its files are moved to the tag
 * first, resident_moved): its files are marked committed; of its job (dir's parent)
 * the other committed tags' files go, and uncommitted ones begun before dir's (tags are
 * ordered by when their files began here; a dir with none here counts as the newest
 * committed tag and leaves uncommitted files be). */
void resident_committed(const char *dir);
/* The files of dir now lie in to (a staging directory exchanged with its tag): to's older
 * copies go, dir's become to's (loop thread). */
void resident_moved(const char *dir, const char *to);
/* Finds the durable copy of dir/file still identical to the file dev/ino and pins it (no
 * piece of it is given up until resident_unpin); NULL if none. A partial copy is trimmed
 * first so that partial pinned copies leave at least an eighth of the cache (one chunk at
 * least) to the chunks a reader of the rest of the file needs; a complete copy stays whole.
 * A copy let go while pinned (a commit) stays readable until its last unpin. */
struct resident *resident_pin(const char *dir, const char *file, dev_t dev, ino_t ino);
/* A pinned copy's header bytes (the file's first *len bytes: the data starts at *len). */
const void *resident_header(const struct resident *r, size_t *len);
/* Piece i of a pinned copy (the data bytes [i * chunk, min(i * chunk + chunk, data_len))),
 * or NULL when not held; held pieces stay put while pinned. */
const void *resident_piece(const struct resident *r, uint64_t i);
/* Bytes of a pinned copy's data still held (== the file's data length: every piece held). */
uint64_t resident_held(const struct resident *r);
/* Ends a pin; the last one makes its pieces evictable again (or frees a copy let go). */
void resident_unpin(struct resident *r);
/* Cache bytes held by resident files now (whole chunks). */
uint64_t resident_bytes(void);
/* Data bytes of the files those chunks hold (a file's last chunk is partly filled). */
uint64_t resident_data_bytes(void);
/* Calls fn for each durable resident file, oldest first, with resident.c's lock held (fn
 * must not call into resident.c or the cache); bytes are the data bytes held. */
void resident_each(void (*fn)(void *arg, const char *dir, const char *file, uid_t uid,
			      uint64_t bytes, int committed), void *arg);
/* Gives every chunk back and frees every resident (shutdown, after engine_stop and once no
 * restore runs). */
void resident_free_all(void);

/* metrics.c — node-wide counters and latency histograms since start, for METRICS; they name
 * no path, job or user. Counters and histograms: any thread (relaxed atomics). It
 * calls nothing of the daemon's; metrics_save.c feeds it save levels. */
enum metric {
	METRIC_SAVES_STARTED,      /* accepted (SAVE_END handed them to the engine) */
	METRIC_SAVES_SNAPSHOTTED,
	METRIC_SAVES_DURABLE,
	METRIC_SAVES_COMMITTED,
	METRIC_COPIED_BYTES,       /* copied into the cache by the copy threads */
	METRIC_FLUSHED_BYTES,      /* written into files by the flush threads */
	METRIC_LOADS_STARTED,      /* accepted (LOAD_END) */
	METRIC_LOADS_DONE,
	METRIC_RESTORED_BYTES,     /* put in place in loads' destinations */
	METRIC_UPLOADED_BYTES,     /* files uploaded to remote tiers (upload.c) */
	METRIC_UPLOADS_DONE,       /* tags that reached REMOTE */
	METRIC_RETENTION_HELD,     /* keep_last passes that kept a tag not yet REMOTE */
	METRIC_PULLED_BYTES,       /* files read from remote tiers into the local tier (pull.c) */
	METRIC_N
};
/* Counters by reason, an ERR_E* code. */
enum metric_reasoned {
	METRIC_SAVES_FAILED,       /* accepted saves that reached FAILED */
	METRIC_SAVES_REFUSED,      /* SAVE_BEGIN/ADD/END answered with an error: never started */
	METRIC_LOADS_FAILED,
	METRIC_UPLOADS_FAILED,     /* failed steps of uploads (each tried again) */
	METRIC_PULLS_FAILED,       /* pulls from a remote tier that failed */
	METRIC_REASONED_N
};
/* What start-up recovery did (recover.c). */
enum metric_recovery {
	RECOVERY_PARTIAL_REMOVED,  /* *.partial files of this host removed */
	RECOVERY_FILE_REMOVED,     /* files of uncommitted tags removed */
	RECOVERY_COMMIT_FINISHED,  /* interrupted commits finished (a whole manifest) */
	RECOVERY_SEAL_RESUMED,     /* sealed, uncommitted tags taken up again */
	RECOVERY_FILE_LEFT,        /* files left to other hosts (or too recent to judge) */
	RECOVERY_N
};
/* Latencies of saves from ACCEPTED to SNAPSHOT, DURABLE and COMMITTED; of tags from
 * COMMITTED (or start-up) to REMOTE; of pulls of a tag from a remote tier, whole. */
enum metric_hist { METRIC_SNAPSHOT_S, METRIC_FLUSH_S, METRIC_COMMIT_S, METRIC_UPLOAD_S,
		   METRIC_PULL_S, METRIC_HIST_N };
#define METRIC_BUCKETS 18          /* bounds of every histogram: 1 ms … 10 min */
#define METRIC_CODE_XX_(name, value, msg) +1
#define METRIC_CODES (0 ERR_TABLE(METRIC_CODE_XX_))
/* One histogram: counts per bucket (not cumulative; the last is above every bound). */
struct metrics_hist {
	uint64_t bucket[METRIC_BUCKETS + 1];
	uint64_t sum_us;
};
/* A reason's count. */
struct metrics_reason {
	int code;
	uint64_t n;
};
/* Everything METRICS shows, as of one moment. */
struct metrics_view {
	uint64_t counter[METRIC_N];
	struct metrics_reason reasons[METRIC_REASONED_N][METRIC_CODES];  /* non-zero ones */
	unsigned nreasons[METRIC_REASONED_N];
	uint64_t recovery[RECOVERY_N];
	uint64_t le_us[METRIC_BUCKETS];
	struct metrics_hist hist[METRIC_HIST_N];
};
/* Adds n to counter m (any thread). */
void metrics_add(enum metric m, uint64_t n);
/* Counts one of m with reason code, a negative ERR_E* (any thread). */
void metrics_fail(enum metric_reasoned m, int code);
/* Counts n recovery actions of kind a. */
void metrics_recovered(enum metric_recovery a, uint64_t n);
/* Puts one observation of seconds into histogram h (any thread). */
void metrics_observe(enum metric_hist h, double seconds);
/* Fills v with every counter and histogram as of now (loop thread). */
void metrics_view(struct metrics_view *v);
/* Peer copies' block (issue 35), apart from the above: counters and gauges any thread sets,
 * and the replication histogram (seconds from COMMITTED to a peer keeping the copy),
 * observed by the sender thread. */
enum metric_peer {
	METRIC_PEER_BYTES_SENT,       /* bytes of copies peers kept */
	METRIC_PEER_BYTES_RECEIVED,   /* bytes of other nodes' copies kept here */
	METRIC_PEER_COPIES_SENT,      /* copies peers kept */
	METRIC_PEER_COPIES_RECEIVED,  /* copies kept here (taken back at start too) */
	METRIC_PEER_RESTORED_BYTES,   /* bytes written into the local tier from peers' copies */
	METRIC_PEER_COPIES_HELD,      /* gauge: copies the replica store holds */
	METRIC_PEER_MEMORY_BYTES,     /* gauge: of replica_cache_size in use */
	METRIC_PEER_EVICTIONS,        /* copies dropped for room */
	METRIC_PEER_N
};
struct metrics_peer_view {
	uint64_t v[METRIC_PEER_N];
	struct metrics_hist replication;
};
/* Adds n to peer counter m (any thread). */
void metrics_peer_add(enum metric_peer m, uint64_t n);
/* Sets peer gauge (or store-kept count) m to n (any thread). */
void metrics_peer_set(enum metric_peer m, uint64_t n);
/* One replication of seconds into the histogram (any thread). */
void metrics_peer_replicated(double seconds);
/* Fills v as of now (any thread; a reader may see one value a piece ahead of another). */
void metrics_peer_view(struct metrics_peer_view *v);
/* The wire key of peer value m; the replication histogram's is METRIC_PEER_HIST_KEY. */
const char *metrics_peer_key(enum metric_peer m);
#define METRIC_PEER_HIST_KEY "peer_replication_seconds"
/* Wire keys (PROTOCOL.md's METRICS) of a counter, a reasoned one, an action, a histogram. */
const char *metrics_counter_key(enum metric m);
const char *metrics_reasoned_key(enum metric_reasoned m);
const char *metrics_recovery_key(enum metric_recovery a);
const char *metrics_hist_key(enum metric_hist h);
/* metrics_save.c — save_change_cb: counts SNAPSHOT, DURABLE, COMMITTED and FAILED, and
 * observes each one's time from ACCEPTED. */
void metrics_on_save(struct save *s);

/* query.c — the control queries' answers, built from the registries' read-only views (and
 * filtered for the viewer) into values reply.c encodes; loop thread only. */
/* A resident file STATUS lists (copied). */
struct query_resident {
	char *dir, *file;
	uint64_t bytes;
	int committed;
};
/* A cache pool STATUS lists. */
struct query_pool {
	int node;
	uint64_t total, used;
};
/* STATUS's answer (the version and protocol are reply.c's constants). */
struct query_status {
	uid_t viewer;            /* the resident files are those it may see (auth_sees) */
	uint64_t pid, uptime_s;
	uint64_t cache_total, cache_used, chunk, cache_resident, resident_data, cache_locked;
	uint64_t clients;        /* connections but the asker's */
	uint64_t saves;          /* in flight, committing or sealing */
	uint64_t loads;
	unsigned flush_threads, copy_threads;
	const char *cuda;        /* gpu_init's line */
	struct query_pool *pools;
	unsigned npools;
	const char *const *roots; /* the config's allowed roots (borrowed) */
	size_t nroots;
	struct query_resident *resident;
	size_t nresident, resident_cap;
	int resident_oom;        /* the list stopped short of memory (either list) */
	struct query_held *held; /* tags whose files peers hold (peer_each_held) */
	size_t nheld, held_cap;
};
/* A tag of this node whose files peers hold (STATUS's peer_copies). */
struct query_held {
	char *dir, *peers;
};
/* Fills q for a client of uid viewer (short of memory, lists are cut short); free it with
 * query_status_free. */
void query_status(struct query_status *q, uid_t viewer);
void query_status_free(struct query_status *q);
/* One save PENDING lists (strings borrowed from the save). */
struct query_save {
	struct save_view v;
	uint64_t rate;           /* bytes flushed per busy second */
	uint64_t age_ms;         /* since ACCEPTED */
	int client_alive;        /* its connection is still open */
};
/* One tag PENDING lists as not yet REMOTE (copied). */
struct query_upload {
	struct upload_view v;    /* its strings point into the copies below (key: NULL) */
	char *dir, *remote, *error;
};
/* One tag PENDING lists as not yet REPLICATED (copied). */
struct query_repl {
	struct peer_view v;      /* its strings point into the copies below */
	char *dir, *holders, *error;
};
/* PENDING's answer: the ended saves a viewer may see, in the registry's order, its tags not
 * yet in their remote tier, and those whose peer copies are not all held. */
struct query_pending {
	uid_t viewer;
	struct query_save *saves;
	size_t n;
	struct query_upload *uploads;
	size_t nuploads, uploads_cap;
	struct query_repl *repls;
	size_t nrepls, repls_cap;
};
/* Fills q for a client of uid viewer (all saves for root); 0, or -1 without memory. Free it
 * with query_pending_free. */
int query_pending(struct query_pending *q, uid_t viewer);
void query_pending_free(struct query_pending *q);
/* METRICS's answer: metrics.c's view and the gauges of the moment. */
struct query_metrics {
	struct metrics_view v;
	struct metrics_peer_view peer;
	uint64_t start_time_ms, uptime_ms;
	uint64_t cache_total, cache_used, cache_resident;
	uint64_t clients, saves_in_flight, loads_in_flight;
	uint64_t upload_backlog_tags, upload_backlog_bytes;
};
void query_metrics(struct query_metrics *q);
/* Hands the module the daemon it answers for (start-up). */
void query_init(const struct daemon *d);

/* reply.c — the one place that encodes replies (ERROR frames through proto_pack_error), from
 * values it is handed: it reads no registry. Each names its client by connection id and is
 * dropped when that connection is gone. */
struct store_commit_info;
/* ERROR {code, message} to request req; the connection goes on. */
void reply_error(uint64_t conn, uint64_t req, int code, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
/* ERROR for a frame that breaks the protocol; the connection closes after it. */
void reply_fatal(uint64_t conn, uint64_t req, int code, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
/* The replies of PROTOCOL.md, one per message. */
void reply_empty(uint64_t conn, uint64_t req);
void reply_hello(uint64_t conn, uint64_t req, unsigned max_tensors);
void reply_save_begun(uint64_t conn, uint64_t req, uint64_t save);
void reply_save_totals(uint64_t conn, uint64_t req, uint64_t tensors, uint64_t bytes);
void reply_save_accepted(uint64_t conn, uint64_t req);
/* Answers a SAVE_BEGIN with end: the save id, ACCEPTED. */
void reply_save_ended(uint64_t conn, uint64_t req, uint64_t save);
void reply_save_state(uint64_t conn, uint64_t req, const struct save_view *v);
void reply_committed(uint64_t conn, uint64_t req, const struct store_commit_info *info);
void reply_sealed(uint64_t conn, uint64_t req, int committed);
/* The control queries' answers, as query.c built them. */
void reply_status(uint64_t conn, uint64_t req, const struct query_status *q);
void reply_pending(uint64_t conn, uint64_t req, const struct query_pending *q);
void reply_metrics(uint64_t conn, uint64_t req, const struct query_metrics *q);
void reply_load_begun(uint64_t conn, uint64_t req, const struct load_view *v);
void reply_load_state(uint64_t conn, uint64_t req, const struct load_view *v);
/* Answers PREFETCH: the tag directory and tag, bytes pulled from the remote tier and put in
 * the cache, and the milliseconds it took (0s when answered at its start). */
void reply_prefetch(uint64_t conn, uint64_t req, const char *dir, const char *tag,
		    uint64_t pulled, uint64_t cached, uint64_t ms);

#endif /* DSCKPTD_H */
