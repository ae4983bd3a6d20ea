/* fuzz_proto.c — libFuzzer target for the frame decoder: header, msgpack pre-scan, getters. */
#include <stdint.h>
#include <stdlib.h>

#include "../proto/proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Decodes one frame the way the daemon does and reads a SAVE_ADD-shaped body from it. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct proto_hdr h;
	struct proto_in in;
	struct proto_map m;
	struct proto_tensor t;
	char why[160], name[PROTO_MAX_NAME + 1];
	const msgpack_object_array *arr = NULL;
	uint64_t u;

	if (size < PROTO_HDR_SIZE || proto_hdr_unpack(data, &h, why, sizeof(why)) < 0)
		return 0;
	size_t len = size - PROTO_HDR_SIZE < h.length ? size - PROTO_HDR_SIZE : h.length;
	if (proto_in_parse(&in, data + PROTO_HDR_SIZE, len, why, sizeof(why)) == 0) {
		proto_map_init(&m, in.root);
		proto_get_u64(&m, "save", UINT64_MAX, &u, 0);
		proto_get_str(&m, "dir", name, PROTO_MAX_NAME, 0);
		if (proto_get_array(&m, "tensors", &arr, 65536, 0) == 1) {
			for (uint32_t i = 0; i < arr->size && !m.err; i++)
				proto_get_tensor(&m, &arr->ptr[i], &t);
		}
		proto_map_end(&m);
	}
	proto_in_free(&in);
	return 0;
}
