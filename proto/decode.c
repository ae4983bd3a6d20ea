/*
 * decode.c — decoding a frame's body: a pre-scan that bounds every length and count before
 * msgpack-c allocates, then typed getters over one map whose first error sticks until the
 * final proto_map_end (which also rejects keys nobody asked for).
 */
#include "proto.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* Big-endian integer of n bytes. */
static uint64_t get_be(const uint8_t *p, int n)
{
	uint64_t v = 0;
	for (int i = 0; i < n; i++)
		v = (v << 8) | p[i];
	return v;
}

/*
 * Walks the msgpack encoding without allocating, checking that every length fits in what is
 * left and that every array or map count is plausible (each element takes at least a byte).
 * msgpack-c allocates an array's objects before reading them, so a 10-byte frame declaring
 * 2^32 elements must be stopped here. Extension types are refused: the protocol has none.
 */
static int prescan(const uint8_t *p, size_t len, char *why, size_t whylen)
{
	size_t pos = 0;
	uint64_t need = 1;	/* objects still to read */

	while (need > 0) {
		uint64_t count = 0, skip = 0;
		int lenbytes = 0;
		if (pos >= len)
			goto truncated;
		uint8_t b = p[pos++];
		need--;
		if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3)
			continue;
		if ((b & 0xf0) == 0x80) {
			count = 2ull * (b & 0x0f);
		} else if ((b & 0xf0) == 0x90) {
			count = b & 0x0f;
		} else if ((b & 0xe0) == 0xa0) {
			skip = b & 0x1f;
		} else {
			switch (b) {
			case 0xc4: case 0xd9: lenbytes = 1; break;
			case 0xc5: case 0xda: lenbytes = 2; break;
			case 0xc6: case 0xdb: lenbytes = 4; break;
			case 0xca: skip = 4; break;
			case 0xcb: skip = 8; break;
			case 0xcc: case 0xd0: skip = 1; break;
			case 0xcd: case 0xd1: skip = 2; break;
			case 0xce: case 0xd2: skip = 4; break;
			case 0xcf: case 0xd3: skip = 8; break;
			case 0xdc: case 0xde: lenbytes = -2; break;
			case 0xdd: case 0xdf: lenbytes = -4; break;
			default:
				snprintf(why, whylen, "unsupported msgpack type 0x%02x at byte %zu",
					 b, pos - 1);
				return -1;
			}
			if (lenbytes) {
				int n = lenbytes < 0 ? -lenbytes : lenbytes;
				if (len - pos < (size_t)n)
					goto truncated;
				uint64_t v = get_be(p + pos, n);
				pos += (size_t)n;
				if (lenbytes > 0)
					skip = v;
				else
					count = (b == 0xde || b == 0xdf) ? 2 * v : v;
			}
		}
		if (skip > len - pos)
			goto truncated;
		pos += skip;
		if (count > len - pos) {
			snprintf(why, whylen, "container of %llu elements in %zu remaining bytes",
				 (unsigned long long)count, len - pos);
			return -1;
		}
		need += count;
	}
	if (pos != len) {
		snprintf(why, whylen, "%zu trailing bytes after the body", len - pos);
		return -1;
	}
	return 0;
truncated:
	snprintf(why, whylen, "body is truncated msgpack");
	return -1;
}

/* Parses exactly one msgpack map. */
int proto_in_parse(struct proto_in *in, const void *body, size_t len, char *why,
		   size_t whylen)
{
	size_t off = 0;

	msgpack_unpacked_init(&in->up);
	in->root = NULL;
	if (prescan(body, len, why, whylen) < 0)
		return -1;
	msgpack_unpack_return r = msgpack_unpack_next(&in->up, body, len, &off);
	if (r != MSGPACK_UNPACK_SUCCESS) {
		snprintf(why, whylen, "body is not valid msgpack");
		return -1;
	}
	if (off != len) {
		snprintf(why, whylen, "%zu trailing bytes after the body", len - off);
		return -1;
	}
	if (in->up.data.type != MSGPACK_OBJECT_MAP) {
		snprintf(why, whylen, "body is not a map");
		return -1;
	}
	in->root = &in->up.data;
	return 0;
}

/* Frees a decoded body. */
void proto_in_free(struct proto_in *in)
{
	msgpack_unpacked_destroy(&in->up);
}

/* Marks an error by hand; keeps the first. */
void proto_map_fail(struct proto_map *pm, const char *fmt, ...)
{
	va_list ap;

	if (pm->err)
		return;
	pm->err = 1;
	va_start(ap, fmt);
	vsnprintf(pm->why, sizeof(pm->why), fmt, ap);
	va_end(ap);
}

/* Whether a msgpack string object equals key. */
static int key_is(const msgpack_object *k, const char *key)
{
	size_t n = strlen(key);
	return k->type == MSGPACK_OBJECT_STR && k->via.str.size == n &&
	       memcmp(k->via.str.ptr, key, n) == 0;
}

/* Starts reading obj as a map; rejects non-maps, non-string and duplicate keys. */
void proto_map_init(struct proto_map *pm, const msgpack_object *obj)
{
	memset(pm, 0, sizeof(*pm));
	if (!obj || obj->type != MSGPACK_OBJECT_MAP) {
		proto_map_fail(pm, "expected a map");
		return;
	}
	pm->m = &obj->via.map;
	if (pm->m->size > PROTO_MAX_KEYS) {
		proto_map_fail(pm, "map of %u keys (limit %d)", pm->m->size, PROTO_MAX_KEYS);
		return;
	}
	for (uint32_t i = 0; i < pm->m->size; i++) {
		const msgpack_object *k = &pm->m->ptr[i].key;
		if (k->type != MSGPACK_OBJECT_STR) {
			proto_map_fail(pm, "map key %u is not a string", i);
			return;
		}
		for (uint32_t j = 0; j < i; j++) {
			const msgpack_object *o = &pm->m->ptr[j].key;
			if (o->via.str.size == k->via.str.size &&
			    memcmp(o->via.str.ptr, k->via.str.ptr, k->via.str.size) == 0) {
				proto_map_fail(pm, "duplicate key '%.*s'",
					       (int)(k->via.str.size > 64 ? 64 : k->via.str.size),
					       k->via.str.ptr);
				return;
			}
		}
	}
}

/* Finds key, marks it used; NULL (and an error if required) when absent. */
static const msgpack_object *lookup(struct proto_map *pm, const char *key, int required)
{
	if (pm->err)
		return NULL;
	for (uint32_t i = 0; i < pm->m->size; i++) {
		if (key_is(&pm->m->ptr[i].key, key)) {
			pm->used |= 1ull << i;
			return &pm->m->ptr[i].val;
		}
	}
	if (required)
		proto_map_fail(pm, "missing key '%s'", key);
	return NULL;
}

/* Reads an unsigned integer in [0, max]. */
int proto_get_u64(struct proto_map *pm, const char *key, uint64_t max, uint64_t *out,
		  int required)
{
	const msgpack_object *v = lookup(pm, key, required);
	if (!v)
		return pm->err ? -1 : 0;
	if (v->type != MSGPACK_OBJECT_POSITIVE_INTEGER) {
		proto_map_fail(pm, "'%s' must be an unsigned integer", key);
		return -1;
	}
	if (v->via.u64 > max) {
		proto_map_fail(pm, "'%s' = %llu exceeds %llu", key,
			       (unsigned long long)v->via.u64, (unsigned long long)max);
		return -1;
	}
	*out = v->via.u64;
	return 1;
}

/* Reads a signed integer in [min, max]. */
int proto_get_i64(struct proto_map *pm, const char *key, int64_t min, int64_t max,
		  int64_t *out, int required)
{
	const msgpack_object *v = lookup(pm, key, required);
	int64_t x;

	if (!v)
		return pm->err ? -1 : 0;
	if (v->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
		x = v->via.i64;
	else if (v->type == MSGPACK_OBJECT_POSITIVE_INTEGER && v->via.u64 <= INT64_MAX)
		x = (int64_t)v->via.u64;
	else {
		proto_map_fail(pm, "'%s' must be an integer", key);
		return -1;
	}
	if (x < min || x > max) {
		proto_map_fail(pm, "'%s' = %lld out of range [%lld, %lld]", key, (long long)x,
			       (long long)min, (long long)max);
		return -1;
	}
	*out = x;
	return 1;
}

/* Reads a boolean. */
int proto_get_bool(struct proto_map *pm, const char *key, int *out, int required)
{
	const msgpack_object *v = lookup(pm, key, required);
	if (!v)
		return pm->err ? -1 : 0;
	if (v->type != MSGPACK_OBJECT_BOOLEAN) {
		proto_map_fail(pm, "'%s' must be a boolean", key);
		return -1;
	}
	*out = v->via.boolean;
	return 1;
}

/* Copies string value v (named what in errors) of at most maxlen bytes, NUL-free, into out. */
static int str_value(struct proto_map *pm, const char *what, const msgpack_object *v,
		     char *out, size_t maxlen)
{
	if (v->type != MSGPACK_OBJECT_STR) {
		proto_map_fail(pm, "'%s' must be a string", what);
		return -1;
	}
	if (v->via.str.size > maxlen) {
		proto_map_fail(pm, "'%s' is %u bytes long (limit %zu)", what, v->via.str.size,
			       maxlen);
		return -1;
	}
	if (memchr(v->via.str.ptr, 0, v->via.str.size)) {
		proto_map_fail(pm, "'%s' contains a NUL byte", what);
		return -1;
	}
	memcpy(out, v->via.str.ptr, v->via.str.size);
	out[v->via.str.size] = 0;
	return 1;
}

/* Reads a NUL-free string of at most maxlen bytes into out. */
int proto_get_str(struct proto_map *pm, const char *key, char *out, size_t maxlen,
		  int required)
{
	const msgpack_object *v = lookup(pm, key, required);
	if (!v)
		return pm->err ? -1 : 0;
	return str_value(pm, key, v, out, maxlen);
}

/* Decodes a tensor entry [name, dtype, [shape…], region, offset, nbytes] into t. */
int proto_get_tensor(struct proto_map *pm, const msgpack_object *obj, struct proto_tensor *t)
{
	const msgpack_object *f = obj->via.array.ptr;

	if (pm->err)
		return -1;
	if (obj->type != MSGPACK_OBJECT_ARRAY || obj->via.array.size != 6) {
		proto_map_fail(pm, "a tensor must be an array [name, dtype, shape, region, "
			       "offset, nbytes]");
		return -1;
	}
	if (str_value(pm, "tensor name", &f[0], t->name, PROTO_MAX_NAME) < 0 ||
	    str_value(pm, "tensor dtype", &f[1], t->dtype, sizeof(t->dtype) - 1) < 0)
		return -1;
	if (f[2].type != MSGPACK_OBJECT_ARRAY || f[2].via.array.size > PROTO_MAX_DIMS) {
		proto_map_fail(pm, "tensor '%s': shape must be an array of at most %d "
			       "dimensions", t->name, PROTO_MAX_DIMS);
		return -1;
	}
	t->ndim = f[2].via.array.size;
	for (unsigned i = 0; i < t->ndim; i++) {
		if (f[2].via.array.ptr[i].type != MSGPACK_OBJECT_POSITIVE_INTEGER) {
			proto_map_fail(pm, "tensor '%s': shape entries must be unsigned integers",
				       t->name);
			return -1;
		}
		t->shape[i] = f[2].via.array.ptr[i].via.u64;
	}
	for (int i = 3; i < 6; i++) {
		if (f[i].type != MSGPACK_OBJECT_POSITIVE_INTEGER) {
			proto_map_fail(pm, "tensor '%s': region, offset and nbytes must be unsigned "
				       "integers", t->name);
			return -1;
		}
	}
	t->region = f[3].via.u64;
	t->offset = f[4].via.u64;
	t->nbytes = f[5].via.u64;
	return 0;
}

/* Reads binary data of at most maxlen bytes. */
int proto_get_bin(struct proto_map *pm, const char *key, const void **p, size_t *len,
		  size_t maxlen, int required)
{
	const msgpack_object *v = lookup(pm, key, required);
	if (!v)
		return pm->err ? -1 : 0;
	if (v->type != MSGPACK_OBJECT_BIN) {
		proto_map_fail(pm, "'%s' must be binary", key);
		return -1;
	}
	if (v->via.bin.size > maxlen) {
		proto_map_fail(pm, "'%s' is %u bytes long (limit %zu)", key, v->via.bin.size,
			       maxlen);
		return -1;
	}
	*p = v->via.bin.ptr;
	*len = v->via.bin.size;
	return 1;
}

/* Reads an array of at most maxn elements. */
int proto_get_array(struct proto_map *pm, const char *key,
		    const msgpack_object_array **out, size_t maxn, int required)
{
	const msgpack_object *v = lookup(pm, key, required);
	if (!v)
		return pm->err ? -1 : 0;
	if (v->type != MSGPACK_OBJECT_ARRAY) {
		proto_map_fail(pm, "'%s' must be an array", key);
		return -1;
	}
	if (v->via.array.size > maxn) {
		proto_map_fail(pm, "'%s' has %u elements (limit %zu)", key, v->via.array.size,
			       maxn);
		return -1;
	}
	*out = &v->via.array;
	return 1;
}

/* Reads a nested map into sub. */
int proto_get_map(struct proto_map *pm, const char *key, struct proto_map *sub,
		  int required)
{
	const msgpack_object *v = lookup(pm, key, required);
	if (!v)
		return pm->err ? -1 : 0;
	proto_map_init(sub, v);
	if (sub->err) {
		proto_map_fail(pm, "'%s': %s", key, sub->why);
		return -1;
	}
	return 1;
}

/* Final check: no error and no unread key. */
int proto_map_end(struct proto_map *pm)
{
	if (pm->err)
		return -1;
	for (uint32_t i = 0; i < pm->m->size; i++) {
		if (!(pm->used & (1ull << i))) {
			const msgpack_object *k = &pm->m->ptr[i].key;
			proto_map_fail(pm, "unknown key '%.*s'",
				       (int)(k->via.str.size > 64 ? 64 : k->via.str.size),
				       k->via.str.ptr);
			return -1;
		}
	}
	return 0;
}
