/*
 * format.h — the on-disk format of a checkpoint, one section per file of format/: the
 * safetensors dtypes, the checksums and other dsckpt keys of a header's __metadata__, the
 * safetensors header (built by the daemon, parsed by the daemon and dsckptctl) and
 * MANIFEST.json (written by the daemon, read by the daemon and dsckptctl).
 *
 * format/ depends on libc, cJSON and xxhash only, never on daemon/ or client/. libdsckpt
 * links only errors.c and dtype.c (it links neither cJSON nor xxhash; see the Makefile's
 * FORMAT_LIB_SRC). Bump the manifest's version, and keep reading the old one, if you change
 * what a file holds.
 *
 * Layout of a checkpoint directory <root>/<job>/<tag>/:
 *   <file>.safetensors   8-byte little-endian length N, N bytes of JSON padded with spaces
 *                        (data starts at a multiple of 4096), then the tensors packed in order
 *   <file>.meta          the save's blobs (msgpack), checksummed in the header beside it
 *   <name>.partial       a file still being written; never part of a checkpoint
 *   SEAL+w..+<host>.json the ranks this node's daemon saw seal the tag and their files
 *                        (seal.c, its name seal_name.c's; SEAL.<host>.json: older, or long)
 *   MANIFEST.json        written last, deleted first: a tag is committed exactly when it exists
 *   REMOTE.json          written once the tag is in its root's remote tier (daemon/upload.c)
 *   ../latest            the name of the job's newest committed tag
 */
#ifndef DSCKPT_FORMAT_H
#define DSCKPT_FORMAT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "errors.h"

struct stat;

/* File names of a checkpoint directory (see the layout above). */
#define FMT_SAFETENSORS ".safetensors"
#define FMT_META ".meta"
#define FMT_PARTIAL ".partial"
#define FMT_MANIFEST "MANIFEST.json"
#define FMT_LATEST "latest"
#define FMT_SEAL_PREFIX "SEAL."
#define FMT_SEAL_SUFFIX ".json"
#define FMT_REMOTE "REMOTE.json"  /* in a committed tag: it is in its root's remote tier */

/* dtype.c — the safetensors dtypes. */
/* XX(name, size in bytes): every dtype a tensor may have. */
#define DTYPE_TABLE(XX)                                                        \
	XX(BOOL, 1) XX(U8, 1) XX(I8, 1) XX(F8_E4M3, 1) XX(F8_E5M2, 1)          \
	XX(U16, 2) XX(I16, 2) XX(F16, 2) XX(BF16, 2)                           \
	XX(U32, 4) XX(I32, 4) XX(F32, 4)                                       \
	XX(U64, 8) XX(I64, 8) XX(F64, 8)
/* Size in bytes of a dtype by its exact name ("F32" → 4); 0 for unknown names and NULL. */
unsigned dtype_size(const char *name);

/* seal.c — a node's seal record (named as seal_name.c says): the ranks it saw seal the tag. */
#define SEAL_MAX_WORLD 65536
#define SEAL_MAX_BYTES (64u << 20) /* larger records are refused (their files described) */
struct seal_record {
	const char *host;
	const char *job;
	unsigned world;
	unsigned *ranks;
	unsigned nranks;
	const char *run;          /* the run that sealed; "" (or NULL, writing) for none */
	uint64_t sealed_ns;       /* when the newest of ranks sealed (this node's clock); 0:
				   * not recorded (to within 256 ns: a double) */
	/* The files of these ranks, each described as the manifest will describe it (its
	 * layout is the manifest's), so that the committing node reads records, not files;
	 * NULL: not described (a record of an older version, or the node could not). */
	const struct manifest_file *files;
	size_t nfiles;
	struct manifest *desc;    /* reading: what files points into (seal_record_free) */
};
/* The text of a record (malloc'd), or NULL without memory. */
char *seal_record_write(const struct seal_record *r);
/* Parses a record into r (seal_record_free frees it); 0, or -1 with why. */
int seal_record_parse(const char *text, size_t len, struct seal_record *r, char *why,
		      size_t whylen);
/* Reads and parses the record dirfd/name; 0, or -1 with why. */
int seal_record_load(int dirfd, const char *name, struct seal_record *r, char *why,
		     size_t whylen);
/* seal_record_load of a record of at most max bytes (and SEAL_MAX_BYTES), its size in *len:
 * what reads many records bounds their sum so. */
int seal_record_load_max(int dirfd, const char *name, uint64_t max, size_t *len,
			 struct seal_record *r, char *why, size_t whylen);
/* Frees what seal_record_parse allocated. */
void seal_record_free(struct seal_record *r);

/* seal_name.c — a seal record's file name: SEAL+w<world>+r<ranks>+t<sealed_ns>+<runlen>:<run>+
 * <host>.json (telling: what the collecting node needs, so that it opens no record), or
 * SEAL.<host>.json (plain: older daemons, or a telling name too long). */
/* Whether name is a seal record's file name, plain or telling. */
int seal_record_name(const char *name);
/* The file name of r into out: 1 the telling one, 0 the plain one (too long, a run holding
 * '/', or not a safetensors file of each rank described: a telling name says the record
 * describes them), -1 when neither fits len. */
int seal_record_fname(const struct seal_record *r, char *out, size_t len);
/* Whether r describes a safetensors file of each of its ranks. */
int seal_record_covers(const struct seal_record *r);
/* Parses a telling name into r (host, run, world, ranks, sealed_ns; job NULL, no files): 1;
 * 0 for a plain name; -1 for an unsound telling name (or without memory). */
int seal_name_parse(const char *name, struct seal_record *r);
/* The host a record's name names into host; 0, or -1. */
int seal_record_host(const char *name, char *host, size_t len);
/* The rank set ranks (n, distinct) as ascending ranges ("0-3,8-11") into out; its length, or
 * -1 when it does not fit. */
int seal_ranks_text(const unsigned *ranks, unsigned n, char *out, size_t len);

/* leftover.c — an uncommitted tag another run of its job left (keep_last and prune remove it). */
/* Whether the uncommitted tag tagfd, holding the n entries names, is what a run other than
 * run ("" the unknown one) left: something in it is of a run (a seal record, a safetensors
 * file's KEY_RUN), nothing of run, and no save is in flight there (no *.partial, whichever
 * node's) nor a manifest. Records and files are read until one of run is found; a safetensors file
 * whose header does not read keeps the tag, and so does a seal record that does not parse (one
 * being written: a node seals it now). A tag holding only seal records is judged by them. */
int leftover_of_other_run(int tagfd, char *const *names, size_t n, const char *run);

/* meta.c — the <file>.meta file: a save's named blobs. */
/* One blob: a name and its bytes. */
struct meta_blob {
	char *name;
	uint8_t *data;
	size_t len;
};
/* Packs n blobs as a msgpack map name → bin into a fresh buffer (*out, the caller frees);
 * 0, or -1 without memory. */
int meta_pack(const struct meta_blob *b, size_t n, uint8_t **out, size_t *len);

/* checksum.c — checksums (XXH3-64) and the other dsckpt keys of __metadata__. */
#define CHECKSUM_ALGO "xxh3-64"          /* the manifest's "checksum" */
#define CHECKSUM_HEX 16                  /* a checksum is written as 16 lowercase hex digits */
#define CHECKSUM_KEY_TENSOR "dsckpt.xxh3." /* + tensor name: that tensor's bytes */
#define CHECKSUM_KEY_DATA "dsckpt.data_xxh3" /* the whole data region */
#define CHECKSUM_KEY_META "dsckpt.meta_xxh3" /* the .meta file beside it ("" if none) */
#define KEY_META_SIZE "dsckpt.meta_size" /* and its size in bytes, in decimal */
#define KEY_VERSION "dsckpt.version"     /* the dsckptd version that wrote the file */
#define KEY_JOB "dsckpt.job"
#define KEY_RANK "dsckpt.rank"           /* decimal */
#define KEY_WORLD "dsckpt.world"         /* decimal */
#define KEY_HOST "dsckpt.host"           /* the machine that wrote it (start-up recovery) */
#define KEY_RUN "dsckpt.run"             /* the run of the job that saved it; absent: unknown */
/* What dsckptd records of a file's origin in its header's __metadata__ ("format": "pt" and the
 * KEY_* and CHECKSUM_KEY_META pairs above); the strings are borrowed but for the numbers'. */
#define ST_ORIGIN_PAIRS 9
struct st_origin {
	const char *version, *job, *host;
	const char *run;                   /* "" (unknown run): no KEY_RUN pair */
	char rank[16], world[16];
	char meta_size[24];                /* "" when the file has no .meta beside it */
	char meta_xxh3[CHECKSUM_HEX + 1];  /* filled in before the header is built */
	const char *pairs[2 * ST_ORIGIN_PAIRS];
};
/* Lays o's key/value pairs out in o->pairs (meta_size < 0: no .meta); returns how many. */
size_t st_origin_pairs(struct st_origin *o, unsigned rank, unsigned world, int64_t meta_size);
/* Writes h as CHECKSUM_HEX lowercase hex digits and a NUL into out. */
void checksum_hex(uint64_t h, char out[CHECKSUM_HEX + 1]);
/* Parses exactly CHECKSUM_HEX lowercase hex digits; 0, or -1 if s (maybe NULL) is not that. */
int checksum_parse(const char *s, uint64_t *out);
/* The tensor name a "dsckpt.xxh3.<name>" key is the checksum of; NULL for any other key. */
const char *checksum_key_tensor(const char *key);
/* Whether key is one that the header builder adds itself (so that a caller may not). */
int checksum_key_reserved(const char *key);

/* st_build.c — building the header of a safetensors file dsckptd writes. */
struct st_tensor {
	const char *name;
	const char *dtype;
	const uint64_t *shape;
	unsigned ndim;
	uint64_t nbytes;
};
#define ST_ALIGN 4096       /* the data region starts at a multiple of this */
#define ST_MAX_NDIM 16
/* safetensors' own limit on the JSON header (readers refuse a longer one). */
#define ST_MAX_HEADER 100000000u
/* Room for the header's fixed part (__metadata__ pairs, braces, alignment padding). */
#define ST_HEADER_FIXED (64u << 10)
/* At most how many header bytes one tensor adds; a save keeps the sum below the limit, so
 * that every save accepted can also be read back (and committed). */
size_t st_tensor_header_bytes(const char *name, const char *dtype, unsigned ndim);
/*
 * Builds the header region: 8-byte length + JSON + spaces so that data starts at a multiple
 * of ST_ALIGN. Tensors are packed in the given order. __metadata__ holds meta (key/value
 * pairs, nmeta of them), plus CHECKSUM_KEY_TENSOR<name> for every tensor and
 * CHECKSUM_KEY_DATA, each a 16-hex-digit slot filled later by st_header_set_xxh3. *hdr is
 * ST_ALIGN-aligned and malloc'd; *hdr_len is the data start; slot_pos[i] (n + 1 entries, the
 * last for the data region) locates each slot in *hdr. 0, or ERR_EINVAL / ERR_ENOMEM with err.
 */
int st_header_build(const struct st_tensor *t, size_t n, const char *const *meta,
		    size_t nmeta, uint8_t **hdr, size_t *hdr_len, size_t *slot_pos,
		    char *err, size_t errlen);
/* Writes h as 16 lowercase hex digits at hdr + pos. */
void st_header_set_xxh3(uint8_t *hdr, size_t pos, uint64_t h);

/* st_parse.c — reading the header of any safetensors file (needs cJSON). */
/* One tensor of a parsed header; strings point into the header. */
struct st_entry {
	const char *name;
	const char *dtype;        /* a known dtype */
	const uint64_t *shape;
	unsigned ndim;
	uint64_t begin, end;      /* data_offsets, relative to the data start; end - begin is
				   * the size that shape and dtype make */
	const char *xxh3;         /* its CHECKSUM_KEY_TENSOR entry in __metadata__, or NULL */
};
/* A parsed header. */
struct st_header {
	uint64_t data_start;      /* 8 + the JSON's length */
	struct st_entry *t;       /* in the header's order */
	size_t n;
	const char *const *meta;  /* __metadata__ as key/value pairs, nmeta of them, in order */
	size_t nmeta;
	int checksummed;          /* it has dsckpt checksums: then every tensor has its own */
	uint64_t held;            /* bytes it holds, about (what st_header_free gives back) */
};
/* Called once per problem found; msg is only valid during the call. */
typedef void st_problem_fn(void *arg, const char *msg);
/*
 * Parses the JSON of a header (json, len bytes, spaces allowed after it). Every problem is
 * reported through problem (parsing goes on past a bad tensor so that all are named):
 * invalid JSON, not an object, a tensor without dtype/shape/data_offsets, an unknown dtype,
 * a shape that is not non-negative integers or overflows, offsets that are not [begin, end]
 * or do not match the shape, a non-string __metadata__ entry, a duplicate tensor name, a
 * checksum that is not 16 lowercase hex digits or names no tensor, a tensor without a
 * checksum in a file that has them.
 * Returns the header, or NULL once there was a problem or no memory (reported too).
 */
struct st_header *st_header_parse(const char *json, size_t len, st_problem_fn *problem,
				  void *arg);
/*
 * Reads and parses the header of the safetensors file open as fd, size bytes long (see
 * st_header_parse). *data_start is set once the length is sane (even if the JSON is not),
 * else left alone.
 */
struct st_header *st_header_read(int fd, uint64_t size, uint64_t *data_start,
				 st_problem_fn *problem, void *arg);
/*
 * The first part of st_header_read: reads the length and the JSON (malloc'd, *data_start - 8
 * bytes, not NUL-terminated); NULL after reporting a problem (a short file, an absurd length,
 * a read error). *data_start as st_header_read's.
 */
char *st_header_text(int fd, uint64_t size, uint64_t *data_start, st_problem_fn *problem,
		     void *arg);
/* At most how many bytes st_header_parse takes, at its peak, to parse json (len bytes), and
 * at most how many members (tensors and __metadata__) its object has, in *members. */
uint64_t st_parse_cost(const char *json, size_t len, uint64_t *members);
/* The string value of __metadata__ key, or NULL. */
const char *st_header_meta(const struct st_header *h, const char *key);
/* Index in h->t of the tensor called name, or -1. */
long st_header_find(const struct st_header *h, const char *name);
/* Frees a parsed header (NULL is fine). */
void st_header_free(struct st_header *h);

/* manifest.c — MANIFEST.json (needs cJSON). */
#define MANIFEST_FORMAT "dsckpt-manifest"
#define MANIFEST_VERSION 1
#define MANIFEST_VERSION_RECORDS 2      /* a multi-node commit naming its nodes' seal records */
#define MANIFEST_MAX_BYTES (1u << 30)   /* larger manifests are refused */
#define MANIFEST_KIND_ST "safetensors"
#define MANIFEST_KIND_META "meta"
/* Reading: a number that is absent or not an exact non-negative integer (at most 2^53). */
#define MANIFEST_BAD UINT64_MAX
/* One tensor of a safetensors file's entry. Reading: NULL strings were absent or not
 * strings; has_shape is 0 when shape was not an array of integers. */
struct manifest_tensor {
	const char *name;
	const char *dtype;
	const uint64_t *shape;
	unsigned ndim;
	int has_shape;
	uint64_t begin, end;      /* data_offsets */
	const char *xxh3;
};
/* One file of the checkpoint (kind MANIFEST_KIND_ST or MANIFEST_KIND_META). */
struct manifest_file {
	const char *name;
	const char *kind;
	uint64_t size;
	uint64_t rank;
	/* safetensors: where data starts, its data region's checksum and its tensors */
	uint64_t header_len;
	const char *data_xxh3;
	const struct manifest_tensor *t;
	size_t nt;
	int has_tensors;          /* reading: 0 when there was no tensors array */
	/* meta: the whole file's checksum */
	const char *xxh3;
};
/* A seal record a manifest of version 2 names: its file name in the tag, its host and ranks;
 * its "files" are the tag's files of those ranks. */
struct manifest_record {
	const char *name;
	const char *host;
	const unsigned *ranks;
	unsigned nranks;
};
/* A checkpoint's manifest. */
struct manifest {
	const char *tag;
	const char *dsckptd_version;
	const char *created;      /* reading: the UTC time written ("2026-01-31T12:00:00Z") */
	uint64_t created_ns;      /* reading: to within 256 ns (a double), 0 if absent */
	uint64_t world_size;
	const char *run;          /* the run committed; "" or NULL: unknown (not written) */
	uint64_t uid;             /* the owner's uid (whose restores a remote tier serves);
				   * reading: MANIFEST_BAD when absent (written before it was) */
	const char *remote_dir;   /* reading: a remote copy's directory of its files, or NULL */
	const char *checksum;     /* reading: the algorithm named (CHECKSUM_ALGO is written) */
	uint64_t total_bytes;
	const struct manifest_file *files;
	size_t nfiles;
	/* Version 2 (written when nrecords > 0): files are the collecting node's, and the other
	 * nodes' are in the records named here (manifest_expand reads them). */
	const struct manifest_record *records;
	size_t nrecords;
};
/* The text of m (created from created_ns; format, version and checksum are the current
 * ones); malloc'd, NULL without memory. Sizes and offsets are written exactly (not doubles). */
char *manifest_write(const struct manifest *m);
/*
 * Parses a manifest's text if it is a dsckpt manifest of the version this tree reads: a JSON
 * object with format MANIFEST_FORMAT, version MANIFEST_VERSION and a files array. Else NULL
 * with why. Fields of the wrong type read as MANIFEST_BAD or NULL (see the structs).
 */
struct manifest *manifest_parse(const char *text, size_t len, char *why, size_t whylen);
/* Reads dirfd's MANIFEST.json (see manifest_parse), expanded (manifest_expand: every record
 * read); NULL with why, and *present saying whether the file is there at all. Every reader of
 * a tag's files reads it so. */
struct manifest *manifest_load(int dirfd, int *present, char *why, size_t whylen);
/*
 * Makes m (a manifest of the tag dirfd) list every file of the tag as version 1 does: the
 * records a version-2 manifest names are read (only those naming one of the nwant ranks want,
 * when want is not NULL: a rank's load opens its own record), and their files added to m's,
 * total_bytes made theirs; records then 0. 0, or -1 with why when a record is missing,
 * unreadable, or names another run, world size, host or rank set than m, or when the records
 * read are more than max bytes in all (MANIFEST_MAX_BYTES for every reader: a user's tag must
 * not make the root daemon hold a world of 64 MiB records): never a partial list. A manifest
 * of version 1 is left as it is.
 */
int manifest_expand(int dirfd, struct manifest *m, const unsigned *want, size_t nwant,
		    uint64_t max, char *why, size_t whylen);
/*
 * Rewrites *text (*len bytes, malloc'd: a manifest of the tag dirfd) as manifest_write writes
 * it expanded (version 1, every file listed, created_ns to within 256 ns), when it is of
 * version 2; left as it is otherwise. What copies a tag elsewhere (a remote tier, a peer)
 * copies this: the copy needs no record. 0, or -1 with why (unparsable, a record unsound).
 */
int manifest_text_expand(int dirfd, char **text, size_t *len, char *why, size_t whylen);
/* The same for the file dirfd/name, not expanded (e.g. an interrupted commit's
 * MANIFEST.json.partial, or a daemon's own look at what it committed). */
struct manifest *manifest_load_at(int dirfd, const char *name, int *present, char *why,
				  size_t whylen);
/* Frees a parsed manifest (NULL is fine). */
void manifest_free(struct manifest *m);

/* userfile.c — opening a file in a tree users can write, for reading. */
#define USERFILE_ONE_LINK 1 /* refuse a file with more than one hard link */
/*
 * Opens dirfd/name for reading without blocking (a FIFO, a lease), following a link or taking
 * a terminal (O_RDONLY|O_NONBLOCK|O_NOFOLLOW|O_NOCTTY|O_CLOEXEC), then keeps it only if
 * fstat shows a regular file of at most max bytes (and, with USERFILE_ONE_LINK, one link);
 * O_NONBLOCK is cleared again. The fd (its stat in *st when st is not NULL), or a negative
 * errno (ELOOP: a link, EINVAL: not a regular file, EMLINK, EFBIG: over max) with why.
 */
int userfile_open(int dirfd, const char *name, uint64_t max, int flags, struct stat *st,
		  char *why, size_t whylen);
/* Reads up to len bytes at off of fd (short only at the end of the file); how many, or -1
 * with errno. */
ssize_t userfile_pread(int fd, void *buf, size_t len, uint64_t off);
/* Reads the whole of dirfd/name opened as userfile_open does (max, flags) into a malloc'd
 * buffer with a NUL after its *len bytes; NULL with *err (an errno: ENOENT when it is not
 * there) and why. */
char *userfile_read(int dirfd, const char *name, uint64_t max, int flags, size_t *len,
		    int *err, char *why, size_t whylen);

#endif /* DSCKPT_FORMAT_H */
