/* checksum.c — how checksums are written and named in a header's __metadata__. */
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
