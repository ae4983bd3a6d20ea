/*
 * dsckptd.h — the daemon's internal API, one section per subsystem (file named for it).
 *
 * Threads: the libuv loop thread owns connections, saves and their levels. Copy threads pull
 * bytes from sources into cache chunks; flush threads write chunks to files. Workers hand
 * completions back to the loop through engine.c's locked queue + uv_async_send.
 */
#ifndef DSCKPTD_H
#define DSCKPTD_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "../client/dsckpt.h"

#define DSCKPTD_VERSION DSCKPT_VERSION_STRING
#define DSCKPTD_DEFAULT_CONFIG "/etc/dsckptd/dsckptd.json"
#define ERRLEN 256

struct config;
struct cache;
struct source;
struct save;
struct conn;
struct store_file;

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

/* config.c */
/* A validated configuration; replaced whole on reload, never edited in place. */
struct config {
	char *socket;              /* path of the Unix socket */
	unsigned socket_mode;      /* from an octal string, e.g. "0660" */
	char **allowed_roots;      /* absolute, canonical (realpath) directories */
	size_t n_roots;
	double host_cache_gib;     /* as written */
	uint64_t host_cache_bytes; /* rounded down to whole chunks */
	uint64_t chunk_bytes;      /* cache chunk (copy/flush unit), multiple of 4096 */
	unsigned flush_threads;
	unsigned copy_threads;
	unsigned keep_last;        /* 0 = keep all */
	int log_level;             /* enum log_level */
	int o_direct;              /* write files with O_DIRECT where the filesystem allows */
};
/* Reads, parses and validates path into a fresh config; -1 with every problem in err. */
int config_load(const char *path, struct config **out, char *err, size_t errlen);
/* Frees a config. */
void config_free(struct config *cfg);
/* Prints every option (name, type, range, default, help) for --help. */
void config_print_help(FILE *f);

/* cache.c */
/* Maps bytes of host memory, touches it with several threads and locks it (best effort). */
int cache_create(uint64_t bytes, uint64_t chunk_bytes, struct cache **out, char *err,
		 size_t errlen);
/* Unmaps the cache; every chunk must be back. */
void cache_destroy(struct cache *c);
/* Takes a free chunk, waiting while none is free; NULL once cache_shutdown was called. */
void *cache_get(struct cache *c);
/* Takes a free chunk if one is free now, else NULL. */
void *cache_tryget(struct cache *c);
/* Returns a chunk. */
void cache_put(struct cache *c, void *chunk);
/* Wakes every waiter of cache_get; they get NULL from now on. */
void cache_shutdown(struct cache *c);
/* Base address and length of the whole mapping (for pinning with CUDA). */
void *cache_base(struct cache *c);
uint64_t cache_total(struct cache *c);
/* Bytes currently handed out. */
uint64_t cache_used(struct cache *c);
uint64_t cache_chunk(struct cache *c);
/* Milliseconds the start-up touch took. */
double cache_touch_ms(struct cache *c);

/* source.c — transports: a source of bytes the daemon pulls from (host memfd now). */
/* Maps a client's host memory fd (takes ownership of fd) of at least size bytes. */
int source_host_open(int fd, uint64_t size, struct source **out, char *err, size_t errlen);
/* Copies len bytes at off of the source into dst (a cache chunk); 0 or -1 with err. */
int source_read(struct source *s, uint64_t off, void *dst, uint64_t len, char *err,
		size_t errlen);
/* Size of the source in bytes. */
uint64_t source_size(const struct source *s);
/* Kind name ("host"). */
const char *source_kind(const struct source *s);
/* Takes a reference (thread-safe). */
void source_ref(struct source *s);
/* Drops a reference; the last one unmaps and closes. */
void source_unref(struct source *s);

/* safetensors.c — the file image of one save. */
struct st_tensor {
	const char *name;
	const char *dtype;
	const uint64_t *shape;
	unsigned ndim;
	uint64_t nbytes;
};
/* Size in bytes of a safetensors dtype ("F32" → 4); 0 if unknown. */
unsigned st_dtype_size(const char *dtype);
/*
 * Builds the header region: 8-byte length + JSON + spaces so that data starts at a multiple
 * of 4096. Tensors are packed in the given order. __metadata__ holds meta (key/value pairs,
 * nmeta of them), plus "dsckpt.xxh3.<name>" for every tensor and "dsckpt.data_xxh3", each a
 * 16-hex-digit slot filled later by st_header_set_xxh3. *hdr is malloc'd; *hdr_len is the data
 * start; slot_pos[i] (n + 1 entries, the last for data_xxh3) locates each slot in *hdr.
 */
int st_header_build(const struct st_tensor *t, size_t n, const char *const *meta,
		    size_t nmeta, uint8_t **hdr, size_t *hdr_len, size_t *slot_pos,
		    char *err, size_t errlen);
/* Writes h as 16 lowercase hex digits at hdr + pos. */
void st_header_set_xxh3(uint8_t *hdr, size_t pos, uint64_t h);

/* store.c — directories, files, commits, retention and start-up recovery on disk. */
/*
 * Opens (creating what is missing) the absolute directory dir for a client uid/gid: dir must
 * lie under one of cfg's allowed roots, contain no "." or ".." component and no symbolic link
 * below the root; created directories are owned by uid/gid; existing ones below the root must
 * be owned by uid unless uid is 0. Returns an O_DIRECTORY fd, or a negative DSCKPT_E* with err.
 */
int store_open_dir(const struct config *cfg, const char *dir, uid_t uid, gid_t gid,
		   char *err, size_t errlen);
/* Creates dirfd/name.partial (exclusive, O_DIRECT when asked and possible), owned by uid/gid. */
int store_file_create(int dirfd, const char *name, uid_t uid, gid_t gid, int o_direct,
		      struct store_file **out, char *err, size_t errlen);
/* Whether the file was opened with O_DIRECT (writes must then be 4096-aligned). */
int store_file_direct(const struct store_file *f);
/* Writes len bytes at off (retrying short writes); negative DSCKPT_E* with err. */
int store_file_pwrite(struct store_file *f, const void *buf, size_t len, uint64_t off,
		      char *err, size_t errlen);
/* Truncates to size, fsyncs, renames name.partial → name, fsyncs the directory; frees f. */
int store_file_finish(struct store_file *f, uint64_t size, char *err, size_t errlen);
/* Unlinks name.partial and frees f. */
void store_file_abort(struct store_file *f);
/* Writes dirfd/name atomically (partial, fsync, rename, dir fsync), owned by uid/gid. */
int store_write_atomic(int dirfd, const char *name, const void *buf, size_t len, uid_t uid,
		       gid_t gid, char *err, size_t errlen);
/* Result of a commit. */
struct store_commit_info {
	char tag[256];
	unsigned files;
	uint64_t bytes;
};
/*
 * Commits checkpoint directory dir (already durable): reads every *.safetensors header there,
 * checks ranks 0..world-1 are present and no *.partial is left, writes MANIFEST.json
 * atomically, then <dir>/../latest (atomically), then applies keep_last in the job directory
 * (deleting only older committed tags, never the newest).
 */
int store_commit(const struct config *cfg, const char *dir, unsigned world, uid_t uid,
		 gid_t gid, struct store_commit_info *info, char *err, size_t errlen);
/* At start-up: reports and removes *.partial files and manifest-less tags under the roots. */
void store_recover(const struct config *cfg);

/* gpu.c — optional CUDA (runtime linked statically; no -lcuda). */
/* Probes for a driver and devices; returns a line for status ("none: <reason>" or names). */
const char *gpu_init(void);
/* Pins [base, base+len) for fast device copies when CUDA is usable; no-op otherwise. */
void gpu_register_host(void *base, uint64_t len);
/* Undoes gpu_register_host. */
void gpu_unregister_host(void *base);

#endif /* DSCKPTD_H */
