/*
 * meta.c — the <file>.meta format: a save's named blobs as one msgpack map, name → bin, in
 * the order they were first added.
 */
#include "format.h"

#include <msgpack.h>
#include <string.h>

/* Packs n blobs into a fresh buffer (*out, freed by the caller); 0, or -1 without memory. */
int meta_pack(const struct meta_blob *b, size_t n, uint8_t **out, size_t *len)
{
	msgpack_sbuffer sb;
	msgpack_packer pk;
	int rc;

	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	rc = msgpack_pack_map(&pk, n);
	for (size_t i = 0; i < n && rc == 0; i++) {
		size_t nlen = strlen(b[i].name);
		rc = msgpack_pack_str(&pk, nlen) || msgpack_pack_str_body(&pk, b[i].name, nlen) ||
		     msgpack_pack_bin(&pk, b[i].len) ||
		     msgpack_pack_bin_body(&pk, b[i].data, b[i].len);
	}
	if (rc != 0 || !sb.data) {
		msgpack_sbuffer_destroy(&sb);
		return -1;
	}
	*out = (uint8_t *)sb.data;
	*len = sb.size;
	return 0;
}
