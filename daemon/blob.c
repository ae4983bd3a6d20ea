/*
 * blob.c — a save's named blobs (opaque bytes the client attaches, e.g. a pickled skeleton),
 * appended piecewise, charged to the user's blob limit while they are held, and packed into
 * the <file>.meta file's bytes at SAVE_END. Loop thread only; owned by one save.
 */
#include "dsckptd.h"

#include <stdlib.h>
#include <string.h>

#define MAX_BLOB_BYTES (1ull << 30) /* of one save */

struct blobs {
	uid_t uid;                /* charged QUOTA_BLOB for bytes */
	struct meta_blob *b;
	size_t n;
	uint64_t bytes;
};

/* An empty set of blobs charged to uid; NULL without memory. */
struct blobs *blobs_new(uid_t uid)
{
	struct blobs *bs = calloc(1, sizeof(*bs));

	if (bs)
		bs->uid = uid;
	return bs;
}

/* Frees the blobs' bytes (packed for the engine); their charge stays until blobs_uncharge. */
void blobs_clear(struct blobs *bs)
{
	for (size_t i = 0; i < bs->n; i++) {
		free(bs->b[i].name);
		free(bs->b[i].data);
	}
	free(bs->b);
	bs->b = NULL;
	bs->n = 0;
}

/* Gives back what the blobs were charged (their bytes are written or dropped). */
void blobs_uncharge(struct blobs *bs)
{
	quota_give(bs->uid, QUOTA_BLOB, bs->bytes);
	bs->bytes = 0;
}

/* Frees a set of blobs (NULL: nothing). */
void blobs_free(struct blobs *bs)
{
	if (!bs)
		return;
	blobs_clear(bs);
	blobs_uncharge(bs);
	free(bs);
}

/* Number of blobs. */
size_t blobs_count(const struct blobs *bs)
{
	return bs->n;
}

/* Appends len bytes to blob name (made when new); negative ERR_E* with err. */
int blobs_add(struct blobs *bs, const char *name, const void *data, size_t len, char *err,
	      size_t errlen)
{
	struct meta_blob *b = NULL;
	uint64_t total = len;

	for (size_t i = 0; i < bs->n; i++) {
		total += bs->b[i].len;
		if (strcmp(bs->b[i].name, name) == 0)
			b = &bs->b[i];
	}
	if (!*name)
		return err_set(err, errlen, ERR_EINVAL, "blob with an empty name");
	if (total > MAX_BLOB_BYTES)
		return err_set(err, errlen, ERR_ERANGE, "blobs of one save exceed %llu bytes",
			       (unsigned long long)MAX_BLOB_BYTES);
	int rc = quota_take(bs->uid, QUOTA_BLOB, len, err, errlen);
	if (rc < 0)
		return rc;
	bs->bytes += len;
	if (!b) {
		struct meta_blob *nb = realloc(bs->b, (bs->n + 1) * sizeof(*nb));
		if (!nb)
			return err_set(err, errlen, ERR_ENOMEM, "out of memory");
		bs->b = nb;
		b = &bs->b[bs->n];
		memset(b, 0, sizeof(*b));
		if (!(b->name = strdup(name)))
			return err_set(err, errlen, ERR_ENOMEM, "out of memory");
		bs->n++;
	}
	uint8_t *d = realloc(b->data, b->len + len + 1);
	if (!d)
		return err_set(err, errlen, ERR_ENOMEM, "out of memory");
	memcpy(d + b->len, data, len);
	b->data = d;
	b->len += len;
	return 0;
}

/* The .meta file's bytes for the blobs (*out, the caller frees); 0, or -1 without memory. */
int blobs_pack(const struct blobs *bs, uint8_t **out, size_t *len)
{
	return meta_pack(bs->b, bs->n, out, len);
}
