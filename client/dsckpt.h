/*
 * dsckpt.h — the client library trainer ranks link to hand tensors to dsckptd.
 *
 * A rank connects to the node's daemon, identifies itself (job, rank, world size), and for
 * each checkpoint file opens a save, adds tensors and blobs by reference, and ends the save.
 * save_end returns as soon as the daemon has validated the request (ACCEPTED); the daemon then
 * pulls the bytes into its host cache (SNAPSHOT) and writes them to disk (DURABLE). One rank
 * commits the checkpoint directory (COMMITTED) once every rank's files are durable.
 *
 * Every function returns 0 (or a non-negative count) on success and a negative DSCKPT_E* code
 * on failure; none of them exits or prints. dsckpt_last_error() gives the daemon's message.
 *
 * Thread safety: a connection may be shared by threads; calls on it are serialised by an
 * internal lock (one request on the wire at a time). A save belongs to one thread between
 * dsckpt_save_begin and dsckpt_save_end; after that, dsckpt_wait/dsckpt_save_progress may be
 * called from any thread. dsckpt_host_alloc/free are thread-safe.
 */
#ifndef DSCKPT_H
#define DSCKPT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define DSCKPT_EXTERN __attribute__((visibility("default")))
#else
#define DSCKPT_EXTERN
#endif

/* Library version; dsckpt_version() gives the one actually loaded. */
#define DSCKPT_VERSION_MAJOR 0
#define DSCKPT_VERSION_MINOR 1
#define DSCKPT_VERSION_PATCH 0
#define DSCKPT_VERSION_STRING "0.1.0"

/* Socket used when neither an argument nor DSCKPT_SOCKET names one (the system daemon's). */
#define DSCKPT_DEFAULT_SOCKET "/run/dsckptd/dsckptd.sock"
/* A per-user daemon's socket, below $XDG_RUNTIME_DIR: used when the system one is absent. */
#define DSCKPT_USER_SOCKET "dsckptd/dsckptd.sock"

/*
 * Error codes: XX(name, value, message). Values follow errno where one fits; the wire
 * carries the same numbers. Never renumber an existing code.
 */
#define DSCKPT_ERRNO_MAP(XX)                                                   \
	XX(EPERM, -1, "operation not permitted")                               \
	XX(ENOENT, -2, "no such file or directory")                            \
	XX(EIO, -5, "input/output error")                                      \
	XX(EBADF, -9, "bad file descriptor")                                   \
	XX(ENOMEM, -12, "out of memory")                                       \
	XX(EACCES, -13, "permission denied")                                   \
	XX(EBUSY, -16, "resource busy")                                        \
	XX(EEXIST, -17, "already exists")                                      \
	XX(EINVAL, -22, "invalid argument")                                    \
	XX(ENOSPC, -28, "no space left on device")                             \
	XX(EPIPE, -32, "connection to the daemon broken")                      \
	XX(ERANGE, -34, "value out of range")                                  \
	XX(ENAMETOOLONG, -36, "name too long")                                 \
	XX(EPROTO, -71, "malformed message")                                   \
	XX(EMSGSIZE, -90, "message too long")                                  \
	XX(ENOTSUP, -95, "not supported")                                      \
	XX(ETIMEDOUT, -110, "timed out")                                       \
	XX(ECONNREFUSED, -111, "daemon not reachable")                         \
	XX(EFAILED, -1000, "save failed")                                      \
	XX(EVERSION, -1001, "protocol version mismatch")                       \
	XX(ESTATE, -1002, "call out of order")                                 \
	XX(ENOCUDA, -1003, "CUDA not available")                               \
	XX(ECHECKSUM, -1004, "checksum mismatch")                              \
	XX(EINCOMPLETE, -1005, "checkpoint incomplete")                        \
	XX(ESHUTDOWN, -1006, "daemon shutting down")                           \
	XX(ELIMIT, -1007, "per-user limit of the daemon reached")

/* The error codes as an enum: DSCKPT_EINVAL, DSCKPT_EFAILED, ... */
typedef enum {
#define DSCKPT_XX_(name, value, msg) DSCKPT_##name = (value),
	DSCKPT_ERRNO_MAP(DSCKPT_XX_)
#undef DSCKPT_XX_
	DSCKPT_OK = 0
} dsckpt_errno_t;

/* Levels of a save, in order. FAILED is terminal and carries a reason. */
typedef enum {
	DSCKPT_FAILED = -1,    /* any error; dsckpt_last_error() says which */
	DSCKPT_NONE = 0,       /* not yet ended */
	DSCKPT_ACCEPTED = 1,   /* validated, sources open; the daemon owns it now */
	DSCKPT_SNAPSHOT = 2,   /* every byte is in the daemon: tensors may change */
	DSCKPT_DURABLE = 3,    /* files written, fsynced and renamed into place */
	DSCKPT_COMMITTED = 4,  /* the checkpoint directory is committed (manifest, latest) */
	DSCKPT_REMOTE = 5,     /* the committed tag, its manifest and the job's latest are in the
				* root's remote tier (allowed_roots' "remote"); waiting for it on
				* a root without one fails at once with DSCKPT_ENOTSUP, and with
				* DSCKPT_EINCOMPLETE, its message naming the newer version, on a
				* save of a version skipped: its tag committed again before its
				* upload started (one in flight goes on) */
	DSCKPT_REPLICATED = 6  /* this node's files of the committed tag are held by `replicas`
				* other nodes' daemons, each having checked them (and the tag is
				* REMOTE first where its root has a remote tier). Waiting for it
				* fails at once with DSCKPT_ENOTSUP when the node's daemon has peer
				* copies off, and with DSCKPT_EINCOMPLETE, its message naming how
				* many peers hold a copy, once every node of the job was tried and
				* fewer took one */
} dsckpt_level_t;

/* A connection to the daemon (opaque). */
typedef struct dsckpt_conn dsckpt_conn_t;
/* One file being saved (opaque). */
typedef struct dsckpt_save dsckpt_save_t;

/* Progress of one save as last reported by the daemon. */
typedef struct {
	int level;                 /* a dsckpt_level_t */
	uint64_t bytes_total;      /* tensor bytes in the save */
	uint64_t bytes_snapshot;   /* bytes already in the host cache or on disk */
	uint64_t bytes_flushed;    /* bytes already written to the file */
} dsckpt_progress_t;

/* Version of the loaded library, e.g. "0.1.0". */
DSCKPT_EXTERN const char *dsckpt_version(void);
/* Message for an error code (never NULL). */
DSCKPT_EXTERN const char *dsckpt_strerror(int err);
/* Name of an error code, e.g. "EINVAL" (never NULL). */
DSCKPT_EXTERN const char *dsckpt_err_name(int err);
/* Name of a level, e.g. "SNAPSHOT" (never NULL). */
DSCKPT_EXTERN const char *dsckpt_level_name(int level);

/* The socket a connection goes to without a path, written into buf (len bytes, cut to fit)
 * and returned: $DSCKPT_SOCKET; else DSCKPT_DEFAULT_SOCKET when it exists; else
 * $XDG_RUNTIME_DIR/DSCKPT_USER_SOCKET (a per-user daemon's) when that exists; else
 * DSCKPT_DEFAULT_SOCKET. */
DSCKPT_EXTERN const char *dsckpt_default_socket(char *buf, size_t len);
/* Connects to the daemon at path (NULL or "": dsckpt_default_socket's). A missing socket is
 * DSCKPT_ECONNREFUSED with "no dsckptd at PATH (no such socket)". */
DSCKPT_EXTERN int dsckpt_connect(const char *path, dsckpt_conn_t **out);
/* Identifies this process as rank of a job of world_size ranks; required before saving or
 * loading. The run is the environment's (see dsckpt_identify_run with run NULL). */
DSCKPT_EXTERN int dsckpt_identify(dsckpt_conn_t *c, const char *job, int rank,
				  int world_size);
/*
 * Identifies this process as dsckpt_identify does, as a rank of one run of the job: every
 * rank of a run gives the same run id, and a new run (a restart) another. A tag's commit
 * combines only the files and seals of one run, so that a tag an earlier run left incomplete
 * is taken over by the new run's saves, never mixed with them. run: at most
 * DSCKPT_RUN_MAX bytes of printable ASCII; "" for an unknown run; NULL for the environment's:
 * the first of $DSCKPT_RUN_ID, $TORCHELASTIC_RUN_ID (not "none"), SLURM's
 * "$SLURM_JOB_ID.$SLURM_STEP_ID.$SLURM_RESTART_COUNT" (a missing step "batch", a missing
 * count 0), $PMIX_NAMESPACE, $OMPI_MCA_ess_base_jobid that is set, non-empty and fits,
 * else "". Files and seals of the unknown run combine only with each other, as before run
 * ids existed: two unknown runs of one job may still mix in a tag the first left incomplete.
 */
#define DSCKPT_RUN_MAX 128
DSCKPT_EXTERN int dsckpt_identify_run(dsckpt_conn_t *c, const char *job, int rank,
				      int world_size, const char *run);
/* The run this connection identified with ("" for the unknown run, or before identifying);
 * valid until dsckpt_close. */
DSCKPT_EXTERN const char *dsckpt_run(dsckpt_conn_t *c);
/* The most tensors one save (or plan) may hold on this daemon (its max_tensors_per_save, as
 * it said when connected); a larger one is refused with DSCKPT_ELIMIT before anything is sent. */
DSCKPT_EXTERN int64_t dsckpt_max_tensors(dsckpt_conn_t *c);
/* Closes the connection; saves already ACCEPTED still complete in the daemon. */
DSCKPT_EXTERN void dsckpt_close(dsckpt_conn_t *c);
/* Detailed message of the last failed call on this connection (never NULL); with c NULL,
 * the message of this thread's last failed dsckpt_connect. */
DSCKPT_EXTERN const char *dsckpt_last_error(dsckpt_conn_t *c);
/* The code behind the last DSCKPT_EFAILED on this connection: why the save failed
 * (DSCKPT_ENOSPC for a full disk, DSCKPT_EACCES, DSCKPT_EIO, ...), or 0 when unknown. */
DSCKPT_EXTERN int dsckpt_last_cause(dsckpt_conn_t *c);

/*
 * Opens a save of dir/file.safetensors (+ dir/file.meta when blobs are added). dir is the
 * absolute checkpoint directory (<root>/<job path>/<tag>) under one of the daemon's allowed
 * roots; file is a plain name ([A-Za-z0-9._-], no extension), e.g. "rank0" or "mp_rank_00".
 */
DSCKPT_EXTERN int dsckpt_save_begin(dsckpt_conn_t *c, const char *dir, const char *file,
				    dsckpt_save_t **out);
/* dsckpt_save_begin_flags: the daemon hears of the save with its first request, in the best
 * case a single one at dsckpt_save_end (one round trip for a whole save); what the daemon
 * refuses at begin (the directory, the user's limits, a file being saved) is then returned by
 * that call instead (dsckpt_add_blob of a large blob, or dsckpt_save_end). */
#define DSCKPT_SAVE_DEFER 1u
/* dsckpt_save_begin_flags: SAVE_BEGIN goes out at once, but its reply is read only by
 * dsckpt_save_end (or by the connection's next request), so the daemon makes the directory
 * and the file while the caller prepares the save (a trainer proving its tensors unchanged,
 * walking a state dict); dsckpt_save_end then costs one round trip. What the daemon refuses
 * at begin is returned by dsckpt_save_end (and any later call on the save). Not with
 * DSCKPT_SAVE_DEFER. */
#define DSCKPT_SAVE_EARLY 2u
/* dsckpt_save_begin with flags (0, DSCKPT_SAVE_DEFER or DSCKPT_SAVE_EARLY). */
DSCKPT_EXTERN int dsckpt_save_begin_flags(dsckpt_conn_t *c, const char *dir, const char *file,
					  unsigned flags, dsckpt_save_t **out);
/*
 * Adds a tensor by reference. dtype is a safetensors dtype name ("F32", "BF16", ...);
 * shape has ndim entries and nbytes must equal their product times the dtype size.
 * GPU memory (cudaMalloc or PyTorch's caching allocator: a legacy IPC handle; cuMemCreate or
 * PyTorch's expandable segments: VMM file descriptors) and memory from dsckpt_host_alloc are
 * handed over without a copy and must stay unchanged until the save reaches SNAPSHOT; each
 * allocation's handle is sent once per connection. Managed memory is refused (ENOTSUP).
 * Any other host memory is copied (staged) before this returns.
 */
DSCKPT_EXTERN int dsckpt_add_tensor(dsckpt_save_t *s, const char *name, const char *dtype,
				    const int64_t *shape, int ndim, const void *ptr,
				    size_t nbytes);
/* One tensor of dsckpt_add_tensors: the arguments of dsckpt_add_tensor. */
typedef struct dsckpt_tensor {
	const char *name;
	const char *dtype;
	const int64_t *shape;
	int ndim;
	const void *ptr;
	size_t nbytes;
} dsckpt_tensor_t;
/*
 * Adds n tensors as n dsckpt_add_tensor calls would, in one call (for bindings whose calls
 * are dear, such as Python's ctypes). Stops at the first tensor that fails and returns its
 * error; *added (when not NULL) is the number added before it. 0 when all were added.
 */
DSCKPT_EXTERN int dsckpt_add_tensors(dsckpt_save_t *s, const dsckpt_tensor_t *tensors,
				     size_t n, size_t *added);
/*
 * Save plans: a training run saves the same tensors at every checkpoint, so describe them
 * once. dsckpt_plan_create sends the tensors' names, dtypes, shapes and places to the daemon,
 * which keeps them decoded; dsckpt_add_plan then adds them all to a save by the plan's id
 * alone. Before each use the library checks (one driver query per allocation, not per tensor)
 * that every allocation the plan points into is still the one it was made from; when one
 * was freed or replaced, it resolves the plan's pointers anew and sends it whole again, so a
 * stale plan never saves a wrong byte. The caller must pass the same pointers: a tensor
 * that moved (another pointer, dtype or shape) needs a new plan. Plans take GPU memory and
 * dsckpt_host_alloc memory only (any other pointer: DSCKPT_ENOTSUP, nothing created) and
 * die with their connection.
 */
typedef struct dsckpt_plan dsckpt_plan_t;
/* Creates a plan of n tensors (as dsckpt_add_tensors takes them) on connection c. */
DSCKPT_EXTERN int dsckpt_plan_create(dsckpt_conn_t *c, const dsckpt_tensor_t *tensors,
				     size_t n, dsckpt_plan_t **out);
/* Adds the plan's tensors to an open save of the plan's connection, in the plan's order:
 * 0 when only its id was sent, 1 when it had to be sent whole (an allocation changed), or an
 * error. Names must not clash with the save's other tensors. */
DSCKPT_EXTERN int dsckpt_add_plan(dsckpt_save_t *s, dsckpt_plan_t *p);
/* Starts the check of dsckpt_add_plan(s, p) on a thread of the library, so that its driver
 * queries run while the caller prepares the save; that call waits for them (or asks itself
 * when that thread has not begun) and uses their answers (any other save's use of p asks
 * anew). The answers are as of this call: no
 * allocation under the plan may be freed between the two calls. Host memory and a process
 * without the driver need no queries (nothing is started). 0, or an error as
 * dsckpt_add_plan's (a save not open, a plan of another connection). */
DSCKPT_EXTERN int dsckpt_plan_prepare(dsckpt_save_t *s, dsckpt_plan_t *p);
/* Forgets the plan here and in the daemon (saves already ended are not affected). */
DSCKPT_EXTERN void dsckpt_plan_free(dsckpt_plan_t *p);
/* Attaches an opaque named blob (copied now), stored in file.meta. Blobs of up to 1 MiB in all
 * go with dsckpt_save_end's request; larger ones are sent at once. */
DSCKPT_EXTERN int dsckpt_add_blob(dsckpt_save_t *s, const char *name, const void *data,
				  size_t len);
/*
 * Names the CUDA stream (a cudaStream_t or CUstream) whose queued work writes this save's GPU
 * tensors; at dsckpt_save_end an interprocess event is recorded on it and the daemon's copies
 * wait for that event, so nobody synchronizes the device. Default: the legacy default stream.
 */
DSCKPT_EXTERN int dsckpt_save_set_stream(dsckpt_save_t *s, void *stream);
/* Hands the save to the daemon; returns once it is ACCEPTED (about a millisecond). */
DSCKPT_EXTERN int dsckpt_save_end(dsckpt_save_t *s);
/*
 * Waits until the save reaches level (timeout_ms < 0: forever). Returns the level reached
 * (>= level), DSCKPT_ETIMEDOUT, or DSCKPT_EFAILED with the reason in dsckpt_last_error().
 * Call dsckpt_wait(s, DSCKPT_SNAPSHOT, -1) right before the optimizer step.
 */
DSCKPT_EXTERN int dsckpt_wait(dsckpt_save_t *s, int level, int timeout_ms);
/* Asks the daemon for the save's progress without waiting; a failed save reports level
 * DSCKPT_FAILED with the reason in dsckpt_last_error(). */
DSCKPT_EXTERN int dsckpt_save_progress(dsckpt_save_t *s, dsckpt_progress_t *out);
/* Frees the client-side handle (and any staging memory); the daemon keeps going. */
DSCKPT_EXTERN void dsckpt_save_free(dsckpt_save_t *s);

/*
 * Commits the checkpoint directory dir: waits (up to timeout_ms, < 0 forever) until every
 * save into dir that this daemon holds is DURABLE, checks that ranks 0..world_size-1 all
 * have files there, then writes MANIFEST.json atomically and points <dir>/../latest at it.
 * Multi-node: call it on one rank after a barrier that follows every rank's DURABLE wait.
 */
DSCKPT_EXTERN int dsckpt_commit(dsckpt_conn_t *c, const char *dir, int timeout_ms);

/*
 * Seals dir for this rank: it will save nothing more there (a later save into dir is
 * refused). Once every rank of the job has sealed and every sealed file is DURABLE, the
 * daemons commit dir themselves (MANIFEST.json, then latest), even if every trainer has died
 * by then; dsckpt_commit may still be called to wait for it. Returns 0 (1 when dir is already
 * committed) right away, or an error.
 */
DSCKPT_EXTERN int dsckpt_seal(dsckpt_conn_t *c, const char *dir);

/*
 * Lets the daemon let go of the GPU memory this connection handed it: every allocation's
 * handle is unregistered, and the daemon closes each as soon as no save in flight reads it
 * (saves past SNAPSHOT read nothing); a later save sends the handles again (about a
 * millisecond each on the daemon's side). Call it before freeing GPU memory that saves used
 * (torch.cuda.empty_cache(), cudaFree): CUDA calls freeing memory that another process still
 * has open undefined behaviour. Host memory needs no such call.
 */
DSCKPT_EXTERN int dsckpt_release_gpu(dsckpt_conn_t *c);

/*
 * Loads (restores): the daemon fills the caller's tensors from a checkpoint file, taking the
 * bytes from its host cache when it still holds the file (a restart on the same node) or
 * reading them from disk, checking each tensor's checksum on the way. GPU destinations are
 * filled by the daemon's host-to-device copies (the same handles as saves), memory from
 * dsckpt_host_alloc directly, any other host memory through a staging area copied out in
 * dsckpt_load_wait. Typical use:
 *   dsckpt_load_begin(c, dir, "rank0", &l); dsckpt_load_add_tensors(l, t, n, NULL);
 *   dsckpt_load_end(l); dsckpt_load_wait(l, -1); dsckpt_load_free(l);
 */
typedef struct dsckpt_load dsckpt_load_t;
/* Levels of a load: DSCKPT_FAILED, DSCKPT_ACCEPTED, then this one. */
#define DSCKPT_LOADED 2
/* Opens a load of dir/file.safetensors (a file of the caller's user). Like a save it needs
 * dsckpt_identify first (DSCKPT_ESTATE otherwise): the daemon serves identified clients. */
DSCKPT_EXTERN int dsckpt_load_begin(dsckpt_conn_t *c, const char *dir, const char *file,
				    dsckpt_load_t **out);
/* Where the daemon takes the bytes from: "cache" (its host cache holds the whole file),
 * "file", "remote" (the tag was pulled from its root's remote tier first) or "peer" (from
 * other nodes' peer copies first); never NULL. */
DSCKPT_EXTERN const char *dsckpt_load_source(const dsckpt_load_t *l);
/*
 * Names where n tensors of the file go (name, dtype, shape as in the file; ptr the
 * destination, nbytes its size). Tensors of the file not named are not read. A name the file
 * lacks or a dtype/shape other than the file's is reported by dsckpt_load_end, together with
 * every other mismatch, before any byte is written. *added as for dsckpt_add_tensors.
 * The GPU destinations of one load lie on one GPU (DSCKPT_ENOTSUP otherwise). The daemon is
 * asked to open the call's new destination allocations all at once, in one round trip; one
 * it refuses fails the call with its code, the message naming the first tensor in it, and
 * that tensor and those after it are not added.
 */
DSCKPT_EXTERN int dsckpt_load_add_tensors(dsckpt_load_t *l, const dsckpt_tensor_t *tensors,
					  size_t n, size_t *added);
/* Names the CUDA stream whose queued work still uses the GPU destinations: the daemon's
 * writes wait for it (an interprocess event; no device synchronisation). Default: none. */
DSCKPT_EXTERN int dsckpt_load_set_stream(dsckpt_load_t *l, void *stream);
/* Starts the load; DSCKPT_EINVAL with every mismatch named in dsckpt_last_error() when the
 * destinations do not match the file (nothing was written). */
DSCKPT_EXTERN int dsckpt_load_end(dsckpt_load_t *l);
/*
 * Waits until every byte is in place and checked (timeout_ms < 0: forever): DSCKPT_LOADED,
 * DSCKPT_ETIMEDOUT, or DSCKPT_EFAILED with the reason in dsckpt_last_error() and its code in
 * dsckpt_last_cause() (DSCKPT_ECHECKSUM for a corrupted tensor, naming it). GPU destinations
 * are complete when it returns: any stream may use them at once; staged host destinations
 * are copied out before it returns DSCKPT_LOADED. Later calls repeat the outcome.
 */
DSCKPT_EXTERN int dsckpt_load_wait(dsckpt_load_t *l, int timeout_ms);
/* Bytes the load fills and how many are in place, as the daemon last reported them (either
 * may be NULL; before any report, the bytes named so far and 0); dsckpt_load_wait(l, 0)
 * asks it anew without waiting. */
DSCKPT_EXTERN void dsckpt_load_progress(const dsckpt_load_t *l, uint64_t *total,
					uint64_t *done);
/* Frees the handle (a load not yet ended is abandoned; one running goes on in the daemon
 * until its connection closes, so its GPU and dsckpt_host_alloc destinations must stay
 * allocated until then, and staged ones are never filled). */
DSCKPT_EXTERN void dsckpt_load_free(dsckpt_load_t *l);

/*
 * Prefetch: the daemon reads a checkpoint ahead of its load, so that the load is served from
 * its host cache. dir is a tag directory, or a job directory whose tag is tag (NULL: the job's
 * latest, on this node or else in its root's remote tier). A tag only the remote tier holds is
 * first pulled into the local tier (checksums checked; only the caller's own tags); then its
 * files are read into the cache as far as room allows (evictable like any cached file). With
 * wait 0 it returns once the daemon knows the tag and has started; with wait 1 once it is
 * done (no reply timeout then). info (NULL is fine) gets the tag directory, the tag, and with
 * wait the bytes pulled and cached and the seconds it took. Any connection past its HELLO
 * (dsckpt_identify, or dsckptctl's) may ask. DSCKPT_ENOENT: no such tag here or remotely;
 * DSCKPT_EACCES: another user's; DSCKPT_ECHECKSUM: a remote object is corrupt.
 */
typedef struct dsckpt_prefetch_info {
	char dir[4097];
	char tag[257];
	uint64_t bytes_pulled;   /* from the remote tier into the local tier */
	uint64_t bytes_cached;   /* data bytes now in the daemon's cache */
	double seconds;
} dsckpt_prefetch_info_t;
DSCKPT_EXTERN int dsckpt_prefetch(dsckpt_conn_t *c, const char *dir, const char *tag, int wait,
				  dsckpt_prefetch_info_t *info);
/*
 * The job's nodes (peer copies, issue 35): tells the daemon that the job of job directory
 * dir runs on the n daemons named by hosts (each daemon's `host`, as the others reach it) and
 * that this node's ranks of it are ranks (nranks, at most 256). Every rank calls it with what
 * the process group gathered (dsckpt.torch.tell_nodes), before any rank loads: a replacement
 * node of a new name at a new address then restores its ranks' files from the peers' copies,
 * which serve them to it because their own trainers told them it is a node of the job (only
 * copies of the caller's own files). DSCKPT_ENOTSUP: peer copies are off on this node.
 */
DSCKPT_EXTERN int dsckpt_job_nodes(dsckpt_conn_t *c, const char *dir, const char *const *hosts,
				   unsigned n, const unsigned *ranks, unsigned nranks);

/* Allocates host memory the daemon can read without a copy (memfd-backed); NULL on failure. */
DSCKPT_EXTERN void *dsckpt_host_alloc(size_t size);
/* Frees memory from dsckpt_host_alloc. */
DSCKPT_EXTERN void dsckpt_host_free(void *ptr);

#ifdef __cplusplus
}
#endif
#endif /* DSCKPT_H */
