/* checksum.c — how checksums and a file's origin are written and named in __metadata__. */
#include <stdio.h>
#include <string.h>

#include "format.h"

/* Writes h as 16 lowercase hex digits and a NUL. */
void checksum_hex(uint64_t h, char out[CHECKSUM_HEX + 1])
{
	static const char hex[] = "0123456789abcdef";
	for (int i = CHECKSUM_HEX - 1; i >= 0; i--, h >>= 4)
		out[i] = hex[h & 15];
	out[CHECKSUM_HEX] = '\0';
}

/* Parses exactly 16 lowercase hex digits. */
int checksum_parse(const char *s, uint64_t *out)
{
	uint64_t v = 0;
	if (!s || strlen(s) != CHECKSUM_HEX)
		return -1;
	for (int i = 0; i < CHECKSUM_HEX; i++) {
		char c = s[i];
		if (c >= '0' && c <= '9')
			v = v << 4 | (uint64_t)(c - '0');
		else if (c >= 'a' && c <= 'f')
			v = v << 4 | (uint64_t)(c - 'a' + 10);
		else
			return -1;
	}
	*out = v;
	return 0;
}

/* The tensor name of a per-tensor checksum key, or NULL. */
const char *checksum_key_tensor(const char *key)
{
	size_t n = strlen(CHECKSUM_KEY_TENSOR);
	return strncmp(key, CHECKSUM_KEY_TENSOR, n) == 0 ? key + n : NULL;
}

/* Whether the header builder adds key itself. */
int checksum_key_reserved(const char *key)
{
	return checksum_key_tensor(key) != NULL || strcmp(key, CHECKSUM_KEY_DATA) == 0;
}

/* Lays out the origin pairs of a header's __metadata__: the run only when known; the .meta
 * file's size and checksum come last, and only when there is one (a commit checks the file
 * against them instead of hashing whatever a client left in its place). */
size_t st_origin_pairs(struct st_origin *o, unsigned rank, unsigned world, int64_t meta_size)
{
	size_t n = 0;

	snprintf(o->rank, sizeof(o->rank), "%u", rank);
	snprintf(o->world, sizeof(o->world), "%u", world);
	o->meta_size[0] = '\0';
	if (meta_size >= 0)
		snprintf(o->meta_size, sizeof(o->meta_size), "%lld", (long long)meta_size);
	const char *pairs[] = {"format", "pt", KEY_VERSION, o->version, KEY_JOB, o->job,
			       KEY_RANK, o->rank, KEY_WORLD, o->world, KEY_HOST, o->host,
			       KEY_RUN, o->run, KEY_META_SIZE, o->meta_size,
			       CHECKSUM_KEY_META, o->meta_xxh3};
	_Static_assert(sizeof(pairs) == sizeof(o->pairs), "st_origin holds these pairs");
	for (size_t i = 0; i < ST_ORIGIN_PAIRS; i++) {
		if ((i == 6 && (!o->run || !*o->run)) || (i >= 7 && meta_size < 0))
			continue;	/* pair 6: the run; 7 and 8: the .meta file's */
		o->pairs[2 * n] = pairs[2 * i];
		o->pairs[2 * n + 1] = pairs[2 * i + 1];
		n++;
	}
	return n;
}
