/*
 * flush_file.c — one save's file as the flush threads write it: the header laid out and written
 * first (checksum slots still zero, so that even a partial file names its host), then the data
 * pieces in file order, hashed as they go (one streaming checksum per tensor and one over the
 * data region), then the filled header, the .meta file and the rename into place.
 *
 * A flush_file belongs to its job; only the flush thread that holds the job (engine.c's
 * "flushing") touches it, so it needs no lock of its own.
 */
#include "dsckptd.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxh_x86dispatch.h>  /* XXH3 with the CPU's widest vectors (AVX2, AVX-512) */

struct flush_file {
	size_t n;                  /* tensors */
	uint8_t *hdr;              /* header region with xxh3 slots, once laid out */
	size_t hdr_len;            /* where the data starts in the file */
	size_t *slots;             /* n + 1 slot positions in hdr */
	uint64_t *xxh3;            /* per tensor */
	XXH3_state_t *tstate;      /* the current tensor's streaming hash */
	XXH3_state_t *dstate;      /* the whole data region's hash */
	size_t hash_tensor;        /* the tensor being hashed */
	int have_id;               /* dev and ino are the finished file's */
	dev_t dev;
	ino_t ino;
};

/* Frees a file's state (NULL is fine); the file itself is the request's. */
void flush_file_free(struct flush_file *f)
{
	if (!f)
		return;
	free(f->hdr);
	free(f->slots);
	free(f->xxh3);
	XXH3_freeState(f->tstate);
	XXH3_freeState(f->dstate);
	free(f);
}

/* The state for writing a file of n tensors; NULL without memory. */
struct flush_file *flush_file_new(size_t n)
{
	struct flush_file *f = calloc(1, sizeof(*f));

	if (!f)
		return NULL;
	f->n = n;
	f->xxh3 = calloc(n ? n : 1, sizeof(uint64_t));
	f->slots = calloc(n + 1, sizeof(size_t));
	f->tstate = XXH3_createState();
	f->dstate = XXH3_createState();
	if (!f->xxh3 || !f->slots || !f->tstate || !f->dstate) {
		flush_file_free(f);
		return NULL;
	}
	XXH3_64bits_reset(f->dstate);
	return f;
}

/* Whether the header has been laid out and written. */
int flush_file_started(const struct flush_file *f)
{
	return f->hdr != NULL;
}

/* Lays the header out (where the data starts) and writes it with zero checksum slots; the
 * .meta file's checksum goes into the header first. 0 or a negative ERR_E* with err. */
int flush_file_begin(struct flush_file *f, const struct engine_req *r, char *err,
		     size_t errlen)
{
	if (r->meta_xxh3)
		checksum_hex(XXH3_64bits(r->meta_bytes, r->meta_len), r->meta_xxh3);
	int rc = st_header_build(r->st, r->n, r->meta, r->nmeta, &f->hdr, &f->hdr_len, f->slots,
				 err, errlen);
	if (rc == 0)
		rc = store_file_pwrite(r->file, f->hdr, f->hdr_len, 0, err, errlen);
	return rc;
}

/* Feeds a piece to the per-tensor and whole-data checksums (data in file order). */
static void flush_hash(struct flush_file *f, const struct engine_req *r, uint64_t start,
		       const uint8_t *p, uint64_t len)
{
	uint64_t end = start + len;

	XXH3_64bits_update(f->dstate, p, len);
	while (f->hash_tensor < f->n) {
		const struct engine_tensor *t = &r->t[f->hash_tensor];
		if (t->off >= end)
			break;
		uint64_t a = t->off > start ? t->off : start;
		uint64_t b = t->off + t->nbytes < end ? t->off + t->nbytes : end;
		if (a == t->off)
			XXH3_64bits_reset(f->tstate);
		if (b > a)
			XXH3_64bits_update(f->tstate, p + (a - start), b - a);
		if (b < t->off + t->nbytes)
			break;	/* the tensor goes on in the next piece */
		f->xxh3[f->hash_tensor++] = XXH3_64bits_digest(f->tstate);
	}
}

/* Hashes and writes the len data bytes at data offset start from chunk (padded with zeros to
 * 4096 for O_DIRECT; the padding is truncated at the end); 0 or a negative ERR_E*. */
int flush_file_piece(struct flush_file *f, const struct engine_req *r, uint64_t start,
		     uint8_t *chunk, uint64_t len, char *err, size_t errlen)
{
	uint64_t wlen = len;

	flush_hash(f, r, start, chunk, len);
	if (store_file_direct(r->file) && (wlen & 4095)) {
		wlen = (len + 4095) & ~(uint64_t)4095;
		memset(chunk + len, 0, wlen - len);
	}
	return store_file_pwrite(r->file, chunk, wlen, f->hdr_len + start, err, errlen);
}

/* Writes the filled header and the .meta file, then makes the file of data_len data bytes
 * durable under its name; r->file is freed either way (and set to NULL). */
int flush_file_finish(struct flush_file *f, struct engine_req *r, uint64_t data_len, char *err,
		      size_t errlen)
{
	/* Tensors of zero bytes never reach flush_hash: give them the empty hash. */
	for (; f->hash_tensor < f->n; f->hash_tensor++)
		f->xxh3[f->hash_tensor] = XXH3_64bits(NULL, 0);
	for (size_t i = 0; i < f->n; i++)
		st_header_set_xxh3(f->hdr, f->slots[i], f->xxh3[i]);
	st_header_set_xxh3(f->hdr, f->slots[f->n], XXH3_64bits_digest(f->dstate));

	/* The header buffer is 4096-aligned and padded: fit for O_DIRECT as it is. */
	int rc = store_file_pwrite(r->file, f->hdr, f->hdr_len, 0, err, errlen);
	/* Nothing is renamed into a directory its client moved out of the allowed root. */
	if (rc == 0)
		rc = store_dir_within(r->dirfd, &r->root, err, errlen);
	if (rc == 0 && r->meta_name)
		rc = store_write_atomic(r->dirfd, r->meta_name, r->meta_bytes, r->meta_len, r->uid,
					r->gid, r->mode, err, errlen);
	if (rc < 0)
		return rc;
	/* The identity a load of its resident copy checks, while the descriptor is open. */
	f->have_id = store_file_identity(r->file, &f->dev, &f->ino) == 0;
	rc = store_file_finish(r->file, f->hdr_len + data_len, err, errlen);
	r->file = NULL;	/* finish frees it, success or not */
	return rc;
}

/* The finished file's identity; 0, or -1 when it could not be read. */
int flush_file_identity(const struct flush_file *f, dev_t *dev, ino_t *ino)
{
	if (!f->have_id)
		return -1;
	*dev = f->dev;
	*ino = f->ino;
	return 0;
}

/* The header as written, checksums filled once finished: the file's first *len bytes. */
const uint8_t *flush_file_header(const struct flush_file *f, size_t *len)
{
	*len = f->hdr_len;
	return f->hdr;
}

/* The per-tensor checksums (once finished). */
const uint64_t *flush_file_checksums(const struct flush_file *f)
{
	return f->xxh3;
}
