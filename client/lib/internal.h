/*
 * internal.h — libdsckpt's internal API, one section per file. Nothing here is exported: the
 * library is built with -fvisibility=hidden and only DSCKPT_EXTERN functions are public.
 * Internal names are prefixed lib_ so that they never clash with the daemon's modules, which
 * unit tests link beside the static library.
 *
 * Lock order: a connection's lock (conn.c) before the host-memory registry lock (hostmem.c).
 * hostmem.c never takes a connection lock, and nothing waits on the socket while holding the
 * registry lock.
 */
#ifndef DSCKPT_INTERNAL_H
#define DSCKPT_INTERNAL_H

#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdint.h>

#include "../dsckpt.h"
#include "../../proto/proto.h"

/* Room for a message: the daemon's are up to PROTO_MAX_STR bytes (LOAD_END's names up to 16
 * mismatched tensors). */
#define LIB_ERRLEN (PROTO_MAX_STR + 1)

/* errors.c */
/* Maps an errno value to the closest DSCKPT_E* code. */
int lib_errno(int e);

/* grow.c */
/* Room for element n (at most *cap) of size bytes in v, of capacity *cap (doubled when n
 * reaches it): v itself, or its elements moved to a larger block; NULL when out of memory
 * (v and *cap are then as they were). */
void *lib_grow(void *v, size_t *cap, size_t n, size_t size);

/* conn.c — the socket, last error, HELLO and registered regions of a connection; conn_wire.c
 * — its requests and replies (lib_conn_frame, _call, _post, _settle, _call_empty, _query,
 * _query_end, _refused, lib_reply_end, lib_wait_*). */
/* A decoded REPLY; the caller reads m with proto_get_* and then calls lib_reply_end. */
struct lib_reply {
	uint8_t *body;       /* the frame body; msgpack strings point into it */
	struct proto_in in;
	struct proto_map m;
};
/* Takes and releases the connection's lock. */
void lib_conn_lock(dsckpt_conn_t *c);
void lib_conn_unlock(dsckpt_conn_t *c);
/* Takes a reference for a save or a load; lib_conn_unref drops it (the last one frees c). */
void lib_conn_ref(dsckpt_conn_t *c);
void lib_conn_unref(dsckpt_conn_t *c);
/* Records the code behind the DSCKPT_EFAILED just stored (lock held). */
void lib_conn_set_cause(dsckpt_conn_t *c, int cause);
/* Stores a message for dsckpt_last_error and returns err (lock held); clears the cause. */
int lib_conn_fail(dsckpt_conn_t *c, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* The message stored by the last failure (lock held). */
const char *lib_conn_error(dsckpt_conn_t *c);
struct lib_cuda;
/* The connection's CUDA state (cuda.c creates it on first need; freed with the connection). */
struct lib_cuda **lib_conn_cuda(dsckpt_conn_t *c);
/* Fails with DSCKPT_ELIMIT, naming the daemon's max_tensors_per_save, when what would hold
 * n tensors, more than a save may (lock held). */
int lib_conn_check_tensors(dsckpt_conn_t *c, const char *what, size_t n);
/* World size given to dsckpt_identify, 0 before it (lock held). */
int lib_conn_world(dsckpt_conn_t *c);
/* Whether the connection can still carry requests (lock held). */
int lib_conn_alive(dsckpt_conn_t *c);
/* Sets the longest wait for a reply (-1: none) and returns the one before (lock held). */
int lib_conn_timeout(dsckpt_conn_t *c, int timeout_ms);
/* Starts a request frame of type with the connection's next request id (lock held). */
void lib_conn_frame(dsckpt_conn_t *c, struct proto_out *o, unsigned type);
/*
 * Sends frame o (freed here) with fds and reads the reply (lock held). REPLY: 0 with the map
 * in *r; ERROR: the daemon's code, its message kept for dsckpt_last_error. A broken stream
 * gives DSCKPT_EPIPE now and for every later request.
 */
int lib_conn_call(dsckpt_conn_t *c, struct proto_out *o, const int *fds, unsigned nfds,
		  struct lib_reply *r);
/*
 * A posted request's reply goes to its owner's take (lock held): e is 0 with the map in *r
 * (take calls lib_reply_end), or the failure (its message stored, *r empty). lib_conn_post
 * sends frame o; its reply is read before the connection's next request goes out, or by
 * lib_conn_settle, which reads every posted reply in order and which the owner calls before
 * it needs the reply (and before freeing arg). Up to LIB_POST_MAX requests are posted at once.
 */
typedef void (*lib_take_fn)(dsckpt_conn_t *c, int e, struct lib_reply *r, void *arg);
int lib_conn_post(dsckpt_conn_t *c, struct proto_out *o, lib_take_fn take, void *arg);
/* lib_conn_post with descriptors sent beside the frame (a REGION_ADD's). */
int lib_conn_post_fds(dsckpt_conn_t *c, struct proto_out *o, const int *fds, unsigned nfds,
		      lib_take_fn take, void *arg);
void lib_conn_settle(dsckpt_conn_t *c);
/* Checks that every key of the reply was read well and frees it; 0 or DSCKPT_EPROTO. */
int lib_reply_end(dsckpt_conn_t *c, struct lib_reply *r, const char *what);
/* Sends a request whose reply is {} (lock held). */
int lib_conn_call_empty(dsckpt_conn_t *c, struct proto_out *o, const int *fds,
			unsigned nfds, const char *what);
/*
 * conn_batch.c — REGION_ADDs posted together. While a batch is open on a connection, the
 * REGION_ADDs of lib_conn_use_host and lib_cuda_place are posted, not awaited: the caches
 * take the region at once, and lib_conn_batch_close reads every reply, drops the regions the
 * daemon refused from the caches (so that the daemon holds no region the connection does not
 * know of, and the connection none the daemon lacks) and returns the first refusal. tag is
 * the owner's, set before each placement (a tensor's index): the first refusal's is kept.
 */
struct lib_batch_sent {
	uint64_t region, tag;
	int failed;
};
struct lib_batch {
	struct lib_batch_sent *v;  /* posted, in order */
	size_t n, cap, next;       /* next: the request whose reply comes next */
	uint64_t tag;              /* the owner's, for the REGION_ADDs posted from now */
	size_t failed;             /* REGION_ADDs refused */
	int err;                   /* the first refusal's code */
	uint64_t err_tag;          /* its tag */
	char why[LIB_ERRLEN];      /* its message */
};
/* Opens batch b (zeroed here) on c: REGION_ADDs of placements are posted into it (lock held). */
void lib_conn_batch_open(dsckpt_conn_t *c, struct lib_batch *b);
/* Reads b's replies, forgets the refused regions and closes it: 0, or the first refusal (its
 * message stored, b->err_tag its tag) (lock held). */
int lib_conn_batch_close(dsckpt_conn_t *c, struct lib_batch *b);
/* The batch open on c, or NULL (lock held). */
struct lib_batch *lib_conn_batch(dsckpt_conn_t *c);
/*
 * Sends REGION_ADD frame o with fds for region: posted into b when b is not NULL (0: sent,
 * the reply read at b's close), else awaited (0: registered). A failure to send is returned
 * at once either way (lock held).
 */
int lib_conn_region_send(dsckpt_conn_t *c, struct lib_batch *b, struct proto_out *o,
			 const int *fds, unsigned nfds, uint64_t region);
/* Registers a host memfd of size bytes as region on the connection (lock held). */
int lib_conn_region_add(dsckpt_conn_t *c, uint64_t region, int fd, uint64_t size);
/* Unregisters a region (lock held). */
int lib_conn_region_del(dsckpt_conn_t *c, uint64_t region);
struct lib_hostref;
/* Registers a dsckpt_host_alloc block on the connection unless it already is (lock held). */
int lib_conn_use_host(dsckpt_conn_t *c, const struct lib_hostref *h);
/* Unregisters blocks freed since the last sweep, before a SAVE_ADD (lock held). */
int lib_conn_sweep(dsckpt_conn_t *c);
/*
 * For dsckptctl, which links the static library; each takes the connection's lock. A failure
 * leaves its message for dsckpt_last_error(c), in the words a trainer gets.
 */
/* Introduces c as dsckptctl (HELLO as "ctl"); every reply is awaited at most timeout_ms. */
int lib_conn_ctl_hello(dsckpt_conn_t *c, int timeout_ms);
/* Sends a query of type without arguments ({}: STATUS, PENDING) and reads its reply. */
int lib_conn_query(dsckpt_conn_t *c, unsigned type, struct lib_reply *r);
/* Frees a query's reply; DSCKPT_EPROTO if a key read from it was malformed. Keys nobody read
 * are allowed: a later daemon may add some. */
int lib_conn_query_end(dsckpt_conn_t *c, struct lib_reply *r);
/*
 * Long waits hold the connection's lock one slice at a time, so that other threads' calls on
 * the connection (the next save while an upload thread waits for DURABLE) wait at most a
 * slice: lib_wait_start notes the deadline of a wait of timeout_ms (< 0: none) and
 * lib_wait_slice gives the daemon-side timeout of the next query, at most LIB_WAIT_SLICE_MS.
 * The daemon answers a WAIT as soon as the level is reached, so slicing delays nobody.
 */
#define LIB_WAIT_SLICE_MS 20
struct lib_wait {
	int timeout_ms;
	double deadline;     /* CLOCK_MONOTONIC seconds, when timeout_ms > 0 */
};
void lib_wait_start(struct lib_wait *w, int timeout_ms);
/* The next query's timeout in ms; *last set when it is the final query of the wait. */
int lib_wait_slice(struct lib_wait *w, int *last);
/* Whether the last failure was the daemon's ERROR reply (its message is the daemon's). */
int lib_conn_refused(dsckpt_conn_t *c);

/* hostmem.c — dsckpt_host_alloc blocks and the process-wide registry of them. */
/* One block as found in the registry. */
struct lib_hostref {
	uint64_t region;   /* region id, unique in the process */
	uintptr_t base;
	uint64_t size;     /* mapped bytes (the memfd's size) */
};
/* A fresh region id, unique in the process (host blocks and staging arenas share them). */
uint64_t lib_region_id(void);
/* Creates a memfd of size bytes (CLOEXEC) mapped shared read-write; 0 or DSCKPT_E*. */
int lib_memfd_map(const char *name, size_t size, int *fd, void **base);
/* Finds the block holding [p, p + n): 1 found, 0 none, DSCKPT_EINVAL if the range leaves it. */
int lib_host_find(const void *p, size_t n, struct lib_hostref *out);
/* A duplicate (CLOEXEC) of the block's memfd; DSCKPT_ENOENT if it was freed meanwhile. */
int lib_host_dup(const struct lib_hostref *h);
/* Whether the block is still allocated. */
int lib_host_alive(const struct lib_hostref *h);
/* A counter bumped by every dsckpt_host_free (lets connections skip needless sweeps). */
uint64_t lib_host_generation(void);

/* cuda.c — GPU memory as regions (legacy IPC handles, VMM file descriptors) and the
 * interprocess event of save_end, through the driver that cudrv.c loads at run time (its
 * API in cudrv.h, which only cuda.c and cudrv.c include). */
/* Where a tensor in GPU memory lies. */
struct lib_gpu_ref {
	uint64_t region, offset;
	int device;    /* the GPU's ordinal */
	void *ctx;     /* the CUcontext the save's event is recorded in */
};
/* The driver's answers about a list of pointers, asked on the library's look thread
 * (cudalook.c). */
struct lib_cuda_look;
/* Queues a look at the n pointers of ptrs (malloc'd; taken over, freed with the look or at
 * once) in context ctx (NULL: none pushed); NULL when the driver is absent or memory or the
 * thread is short. */
struct lib_cuda_look *lib_cuda_look_start(uintptr_t *ptrs, size_t n, void *ctx);
/* Takes the look off the queue, or waits until the thread is done with it, and frees it
 * (NULL: nothing). */
void lib_cuda_look_free(struct lib_cuda_look *l);
/* What a plan knows of memory it places again (plan.c): where it lay, and the driver's
 * answers prepared for it. */
struct lib_place_hint {
	struct lib_cuda_look *look;  /* NULL: the driver is asked now */
	size_t at;                   /* the answer about this pointer */
	uint64_t region, offset;     /* where it lay; a cached region still covering it there is
					taken before any other (VMM regions overlap) */
};
/*
 * Places [ptr, ptr + n) if it is GPU memory: 1 with *out set (the allocation registered on c
 * unless it already was), 0 if it is not GPU memory or CUDA is absent (the host paths apply),
 * or DSCKPT_E*: DSCKPT_ENOTSUP for managed memory and for memory on another GPU than gpu
 * (-1: any), as SAVE_END carries one event (lock held). hint: NULL, or what a plan knows.
 */
int lib_cuda_place(dsckpt_conn_t *c, const void *ptr, size_t n, int gpu,
		   const struct lib_place_hint *hint, struct lib_gpu_ref *out);
/* Records the connection's interprocess event of ctx on stream (NULL: the legacy default
 * stream) and gives the event's handle and the GPU's UUID (lock held). */
int lib_cuda_record(dsckpt_conn_t *c, int device, void *ctx, void *stream,
		    uint8_t event[64], uint8_t uuid[16]);
/* Drops region from c's cache of GPU regions, if there (the daemon refused it; lock held). */
void lib_cuda_forget(dsckpt_conn_t *c, uint64_t region);
/* Unregisters every GPU region cached on c (lock held); a later save registers them anew. */
int lib_cuda_release(dsckpt_conn_t *c);
/* Frees a connection's CUDA state: its events and the contexts it retained. */
void lib_cuda_free(struct lib_cuda *st);

/* check.c — arguments checked before anything is sent. */
/* Size in bytes of a safetensors dtype name; 0 if unknown. */
unsigned lib_check_dtype(const char *dtype);
/* Checks a tensor's name, dtype, shape and size; 0 or DSCKPT_E* with why. */
int lib_check_tensor(const char *name, const char *dtype, const int64_t *shape, int ndim,
		     const void *ptr, size_t nbytes, char *why, size_t whylen);
/* Checks a blob's name and data; 0 or DSCKPT_E* with why. */
int lib_check_blob(const char *name, const void *data, size_t len, char *why, size_t whylen);
/* Checks a file name, [A-Za-z0-9._-]{1,128} not starting with a dot (lock held). */
int lib_check_file(dsckpt_conn_t *c, const char *file);
/* Checks a checkpoint directory: absolute, at most PROTO_MAX_STR bytes (lock held). */
int lib_check_dir(dsckpt_conn_t *c, const char *dir);

/* names.c — a set of names owning copies of them; zero-initialised it is empty. */
struct lib_names {
	char **slot;
	size_t cap, n;
};
/* Whether name is in the set. */
int lib_names_has(const struct lib_names *ns, const char *name);
/* Adds a copy of a name not yet in the set; returns the copy, NULL when out of memory. */
const char *lib_names_add(struct lib_names *ns, const char *name);
/* Frees the set and its names. */
void lib_names_free(struct lib_names *ns);

/* entries.c — the tensor entries of a save or a load: placed, encoded, sent in frames. */
struct lib_entries {
	msgpack_sbuffer enc;   /* the entries, encoded as SAVE_ADD/LOAD_ADD carry them */
	msgpack_packer pk;
	size_t *ends;          /* ends[i]: end of entry i in enc */
	size_t n, cap;
	int gpu;               /* ordinal of the GPU of the tensors; -1: none */
	void *gpu_ctx;         /* the CUcontext their event is recorded in */
};
/* Empties es for a new save or load. */
void lib_entries_init(struct lib_entries *es);
/* Frees the encoded entries. */
void lib_entries_free(struct lib_entries *es);
/*
 * Places [ptr, ptr + nbytes): 1 with *region and *offset set for a dsckpt_host_alloc block
 * or GPU memory (registered on c unless it already is; GPU memory on es's one GPU), 0 for
 * other host memory, which the caller stages, or DSCKPT_E* (lock held). hint: NULL, or what
 * a plan knows of the memory (lib_cuda_place).
 */
int lib_entries_place(dsckpt_conn_t *c, struct lib_entries *es, const void *ptr,
		      size_t nbytes, const struct lib_place_hint *hint, uint64_t *region,
		      uint64_t *offset);
/* Encodes the entry of tensor t, whose bytes lie at region + offset (lock held). */
int lib_entries_add(dsckpt_conn_t *c, struct lib_entries *es, const dsckpt_tensor_t *t,
		    uint64_t region, uint64_t offset);
/* Sends a SAVE_ADD or LOAD_ADD frame o and reads its reply's totals (lock held). */
int lib_entries_call(dsckpt_conn_t *c, struct proto_out *o, const char *what);
/*
 * Sends the entries in frames of type ({key: id, tensors}) under the frame limit, all but
 * the last batch, whose first index goes to *last for the END request (lock held).
 */
int lib_entries_send(dsckpt_conn_t *c, struct lib_entries *es, unsigned type,
		     const char *key, uint64_t id, size_t *last);
/* Keeps the first n entries only (those after them are undone). */
void lib_entries_truncate(struct lib_entries *es, size_t n);
/* Whether every entry fits the END request's frame (lib_entries_send would send none). */
int lib_entries_fit(const struct lib_entries *es);
/* Packs the key "tensors" and the entries from index last on into o, if there are any. */
void lib_entries_pack_rest(const struct lib_entries *es, struct proto_out *o, size_t last);

/* plan.c — save plans. */
/* Makes p usable by the save of serial whose entries are es: 0 when the daemon's copy holds,
 * 1 when it was sent anew, or DSCKPT_E*; *id names it in the save's request (lock held). */
int lib_plan_use(dsckpt_plan_t *p, struct lib_entries *es, uint64_t serial, uint64_t *id);
/* Starts the driver queries of p's use by the save of serial on a thread (lock held). */
void lib_plan_prepare(dsckpt_plan_t *p, uint64_t serial);
/* The connection a plan was made on. */
dsckpt_conn_t *lib_plan_conn(const dsckpt_plan_t *p);

/* stage.c — the staging arenas of a save or a load; zero-initialised there are none. */
struct lib_stage;
struct lib_stages {
	struct lib_stage *v;
	size_t n;
};
/* Reserves nbytes in an arena (created and registered when none has room) and gives where
 * they are, for the daemon (region, offset) and for this process (*at) (lock held). */
int lib_stage_alloc(dsckpt_conn_t *c, struct lib_stages *ss, size_t nbytes, uint64_t *region,
		    uint64_t *offset, void **at);
/* Copies nbytes at ptr into an arena as lib_stage_alloc places them (lock held). */
int lib_stage_copy(dsckpt_conn_t *c, struct lib_stages *ss, const void *ptr, size_t nbytes,
		   uint64_t *region, uint64_t *offset);
/* Unregisters (while the connection is alive) and frees every arena (lock held). */
void lib_stage_free(dsckpt_conn_t *c, struct lib_stages *ss);
/* Gives the arenas of ss, which the daemon reads no more, to the connection's pool for later
 * saves, keeping at most a few (lock held). */
void lib_stage_keep(dsckpt_conn_t *c, struct lib_stages *ss);
/* The connection's pool of kept arenas (conn.c; lock held). */
struct lib_stages *lib_conn_stage_pool(dsckpt_conn_t *c);

#endif /* DSCKPT_INTERNAL_H */
