/* dtype.c — the safetensors dtypes: one table (format.h's DTYPE_TABLE) for the whole tree. */
#include <stdint.h>
#include <string.h>

#include "format.h"

/* A name of at most 7 characters as one integer (its bytes, zero-padded); 0 if longer. */
static uint64_t dtype_key(const char *name)
{
	uint64_t key = 0;
	size_t len = strnlen(name, 8);

	if (len == 8)
		return 0;
	memcpy(&key, name, len);
	return key;
}

/* Size in bytes of a dtype by its exact name; 0 if unknown. Each tensor of every save asks:
 * names are compared as integers, not strings. */
unsigned dtype_size(const char *name)
{
	static const struct {
		const char *name;
		unsigned size;
	} dtypes[] = {
#define XX(dname, dsize) {#dname, dsize},
		DTYPE_TABLE(XX)
#undef XX
	};
	enum { N = sizeof(dtypes) / sizeof(dtypes[0]) };
	static uint64_t keys[N];	/* made on first use; every thread makes the same */

	if (!name)
		return 0;
	uint64_t key = dtype_key(name);
	for (size_t i = 0; key && i < N; i++) {
		if (__atomic_load_n(&keys[i], __ATOMIC_RELAXED) == 0)
			__atomic_store_n(&keys[i], dtype_key(dtypes[i].name), __ATOMIC_RELAXED);
		if (__atomic_load_n(&keys[i], __ATOMIC_RELAXED) == key)
			return dtypes[i].size;
	}
	return 0;
}
