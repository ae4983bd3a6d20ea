/*
 * st_build.c — the header region of a safetensors file dsckptd writes, built by hand.
 *
 * Layout: 8-byte little-endian length N, then N bytes of JSON padded with spaces so that the
 * tensor data starts at a multiple of 4096 (what O_DIRECT wants). "__metadata__" comes first
 * and holds fixed-width checksum slots that the flush path fills in once the bytes are known.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "format.h"

#define ST_SLOT "0000000000000000"

/* A growing byte buffer; ok drops to 0 once an allocation failed. */
struct st_buf {
	char *p;
	size_t len;
	size_t cap;
	int ok;
};

/* Makes room for n more bytes. */
static int st_buf_grow(struct st_buf *b, size_t n)
{
	if (!b->ok)
		return -1;
	if (b->len + n <= b->cap)
		return 0;
	size_t cap = b->cap ? b->cap : 4096;
	while (cap < b->len + n)
		cap *= 2;
	char *p = realloc(b->p, cap);
	if (!p) {
		b->ok = 0;
		return -1;
	}
	b->p = p;
	b->cap = cap;
	return 0;
}

/* Appends n bytes. */
static void st_buf_add(struct st_buf *b, const void *s, size_t n)
{
	if (st_buf_grow(b, n) == 0) {
		memcpy(b->p + b->len, s, n);
		b->len += n;
	}
}

/* Appends a C string. */
static void st_buf_str(struct st_buf *b, const char *s)
{
	st_buf_add(b, s, strlen(s));
}

/* Appends an unsigned decimal number. */
static void st_buf_u64(struct st_buf *b, uint64_t v)
{
	char tmp[24];
	int n = snprintf(tmp, sizeof(tmp), "%" PRIu64, v);
	st_buf_add(b, tmp, (size_t)n);
}

/* Appends s as the inside of a JSON string (quotes, backslashes, control characters escaped). */
static void st_buf_escape(struct st_buf *b, const char *s)
{
	static const char hex[] = "0123456789abcdef";
	const char *run = s;
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;
		if (c >= 0x20 && c != '"' && c != '\\')
			continue;
		st_buf_add(b, run, (size_t)(s - run));
		if (c == '"' || c == '\\') {
			char e[2] = {'\\', (char)c};
			st_buf_add(b, e, 2);
		} else {
			char e[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};
			st_buf_add(b, e, 6);
		}
		run = s + 1;
	}
	st_buf_add(b, run, (size_t)(s - run));
}

/* Length of s once escaped as the inside of a JSON string (st_buf_escape). */
static size_t st_escaped_len(const char *s)
{
	size_t n = 0;
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;
		n += c == '"' || c == '\\' ? 2 : c < 0x20 ? 6 : 1;
	}
	return n;
}

/* At most how many header bytes tensor t adds (its checksum slot and its entry). */
size_t st_tensor_header_bytes(const char *name, const char *dtype, unsigned ndim)
{
	/* slot: "dsckpt.xxh3.<name>":"<16>",  entry: ,"<name>":{"dtype":"<dtype>",
	 * "shape":[<ndim numbers>],"data_offsets":[<20>,<20>]} — numbers at most 20 digits. */
	return 2 * st_escaped_len(name) + strlen(dtype) + 21 * (size_t)ndim + 140;
}

/* Appends "s" (quoted and escaped). */
static void st_buf_qstr(struct st_buf *b, const char *s)
{
	st_buf_add(b, "\"", 1);
	st_buf_escape(b, s);
	st_buf_add(b, "\"", 1);
}

/* Whether s is valid UTF-8 (the JSON header must be; safetensors refuses anything else). */
static int st_utf8_valid(const char *s)
{
	const unsigned char *p = (const unsigned char *)s;
	while (*p) {
		unsigned c = *p, n;
		uint32_t cp;
		if (c < 0x80) {
			p++;
			continue;
		} else if ((c & 0xe0) == 0xc0) {
			n = 1, cp = c & 0x1f;
		} else if ((c & 0xf0) == 0xe0) {
			n = 2, cp = c & 0x0f;
		} else if ((c & 0xf8) == 0xf0) {
			n = 3, cp = c & 0x07;
		} else {
			return 0;
		}
		for (unsigned i = 1; i <= n; i++) {
			if ((p[i] & 0xc0) != 0x80)
				return 0;
			cp = (cp << 6) | (p[i] & 0x3f);
		}
		if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) ||
		    cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
			return 0;
		p += n + 1;
	}
	return 1;
}

/* Checks names are unique with an open-addressing hash set; the index of a duplicate or -1. */
static long st_find_duplicate(const struct st_tensor *t, size_t n, int *nomem)
{
	size_t cap = 16;
	while (cap < 2 * n)
		cap *= 2;
	const char **set = calloc(cap, sizeof(*set));
	long dup = -1;
	*nomem = set == NULL;
	for (size_t i = 0; set && i < n && dup < 0; i++) {
		size_t len = strlen(t[i].name);
		size_t h = (size_t)XXH3_64bits(t[i].name, len) & (cap - 1);
		while (set[h] && strcmp(set[h], t[i].name) != 0)
			h = (h + 1) & (cap - 1);
		if (set[h])
			dup = (long)i;
		set[h] = t[i].name;
	}
	free(set);
	return dup;
}

/* Validates one tensor: name, dtype, rank and that nbytes matches the shape. */
static int st_check_tensor(const struct st_tensor *t, char *err, size_t errlen)
{
	if (!t->name || !*t->name)
		return err_set(err, errlen, ERR_EINVAL, "tensor with an empty name");
	if (!st_utf8_valid(t->name))
		return err_set(err, errlen, ERR_EINVAL, "tensor name is not valid UTF-8");
	if (strcmp(t->name, "__metadata__") == 0)
		return err_set(err, errlen, ERR_EINVAL, "tensor name __metadata__ is reserved");
	unsigned size = dtype_size(t->dtype);
	if (size == 0)
		return err_set(err, errlen, ERR_EINVAL, "tensor %s: unknown dtype %s", t->name,
			        t->dtype ? t->dtype : "(null)");
	if (t->ndim > ST_MAX_NDIM)
		return err_set(err, errlen, ERR_EINVAL, "tensor %s: %u dimensions (at most %d)",
			        t->name, t->ndim, ST_MAX_NDIM);
	uint64_t bytes = size;
	for (unsigned d = 0; d < t->ndim; d++) {
		if (__builtin_mul_overflow(bytes, t->shape[d], &bytes))
			return err_set(err, errlen, ERR_EINVAL, "tensor %s: shape overflows",
				        t->name);
	}
	if (bytes != t->nbytes)
		return err_set(err, errlen, ERR_EINVAL,
			        "tensor %s: %" PRIu64 " bytes given, shape and %s make %" PRIu64,
			        t->name, t->nbytes, t->dtype, bytes);
	return 0;
}

/* Validates the metadata pairs: valid strings, unique keys, none in our reserved names. */
static int st_check_meta(const char *const *meta, size_t nmeta, char *err, size_t errlen)
{
	for (size_t i = 0; i < nmeta; i++) {
		const char *k = meta[2 * i], *v = meta[2 * i + 1];
		if (!k || !v || !st_utf8_valid(k) || !st_utf8_valid(v))
			return err_set(err, errlen, ERR_EINVAL, "metadata entry %zu is not a "
				        "UTF-8 string pair", i);
		if (checksum_key_reserved(k))
			return err_set(err, errlen, ERR_EINVAL, "metadata key %s is reserved", k);
		for (size_t j = 0; j < i; j++) {
			if (strcmp(meta[2 * j], k) == 0)
				return err_set(err, errlen, ERR_EINVAL,
					        "duplicate metadata key %s", k);
		}
	}
	return 0;
}

/* Builds the header region (see format.h). */
int st_header_build(const struct st_tensor *t, size_t n, const char *const *meta,
		    size_t nmeta, uint8_t **hdr, size_t *hdr_len, size_t *slot_pos,
		    char *err, size_t errlen)
{
	struct st_buf b = {.ok = 1};
	uint64_t off = 0;
	int rc, nomem;

	for (size_t i = 0; i < n; i++) {
		if ((rc = st_check_tensor(&t[i], err, errlen)) < 0)
			return rc;
		if (__builtin_add_overflow(off, t[i].nbytes, &off))
			return err_set(err, errlen, ERR_EINVAL, "tensors add up to over 2^64 "
				        "bytes");
	}
	long dup = st_find_duplicate(t, n, &nomem);
	if (nomem)
		return err_set(err, errlen, ERR_ENOMEM, "out of memory checking names");
	if (dup >= 0)
		return err_set(err, errlen, ERR_EINVAL, "duplicate tensor name %s",
			        t[dup].name);
	if ((rc = st_check_meta(meta, nmeta, err, errlen)) < 0)
		return rc;

	st_buf_add(&b, "\0\0\0\0\0\0\0\0{\"__metadata__\":{", 25);
	for (size_t i = 0; i < nmeta; i++) {
		st_buf_qstr(&b, meta[2 * i]);
		st_buf_add(&b, ":", 1);
		st_buf_qstr(&b, meta[2 * i + 1]);
		st_buf_add(&b, ",", 1);
	}
	for (size_t i = 0; i <= n; i++) {
		if (i < n) {
			st_buf_str(&b, "\"" CHECKSUM_KEY_TENSOR);
			st_buf_escape(&b, t[i].name);
			st_buf_str(&b, "\":\"");
		} else {
			st_buf_str(&b, "\"" CHECKSUM_KEY_DATA "\":\"");
		}
		slot_pos[i] = b.len;
		st_buf_str(&b, ST_SLOT "\"");
		st_buf_add(&b, i < n ? "," : "}", 1);
	}
	off = 0;
	for (size_t i = 0; i < n; i++) {
		st_buf_add(&b, ",", 1);
		st_buf_qstr(&b, t[i].name);
		st_buf_str(&b, ":{\"dtype\":\"");
		st_buf_str(&b, t[i].dtype);
		st_buf_str(&b, "\",\"shape\":[");
		for (unsigned d = 0; d < t[i].ndim; d++) {
			if (d)
				st_buf_add(&b, ",", 1);
			st_buf_u64(&b, t[i].shape[d]);
		}
		st_buf_str(&b, "],\"data_offsets\":[");
		st_buf_u64(&b, off);
		st_buf_add(&b, ",", 1);
		off += t[i].nbytes;
		st_buf_u64(&b, off);
		st_buf_str(&b, "]}");
	}
	st_buf_add(&b, "}", 1);
	if (!b.ok)
		return err_set(err, errlen, ERR_ENOMEM, "out of memory building the header");

	size_t total = (b.len + ST_ALIGN - 1) / ST_ALIGN * ST_ALIGN;
	void *out;
	if (posix_memalign(&out, ST_ALIGN, total) != 0) {
		free(b.p);
		return err_set(err, errlen, ERR_ENOMEM, "out of memory building the header");
	}
	memcpy(out, b.p, b.len);
	memset((char *)out + b.len, ' ', total - b.len);
	uint64_t json_len = total - 8;
	for (int i = 0; i < 8; i++)
		((uint8_t *)out)[i] = (uint8_t)(json_len >> (8 * i));
	free(b.p);
	*hdr = out;
	*hdr_len = total;
	return 0;
}

/* Writes h as 16 lowercase hex digits at hdr + pos. */
void st_header_set_xxh3(uint8_t *hdr, size_t pos, uint64_t h)
{
	char hex[CHECKSUM_HEX + 1];
	checksum_hex(h, hex);
	memcpy(hdr + pos, hex, CHECKSUM_HEX);
}
