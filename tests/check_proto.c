/* check_proto.c — frame header, strict decoding and descriptor passing. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../proto/proto.h"
#include "harness.h"

/* Builds a body from a packing callback and parses it into in. */
static int parse_body(struct proto_in *in, struct proto_out *o, char *why)
{
	size_t len = proto_out_finish(o, 0);
	return proto_in_parse(in, o->sb.data + PROTO_HDR_SIZE, len - PROTO_HDR_SIZE, why, 160);
}

START_TEST(hdr_round_trip)
{
	struct proto_hdr h = {PROTO_MAGIC, PROTO_VERSION, PROTO_SAVE_END, 1234, 2, 0,
			      0x1122334455667788ull}, g;
	uint8_t buf[PROTO_HDR_SIZE];
	char why[160];

	proto_hdr_pack(&h, buf);
	ck_assert_int_eq(buf[0], 'D');
	ck_assert_int_eq(buf[3], 'K');
	ck_assert_int_eq(proto_hdr_unpack(buf, &g, why, sizeof(why)), 0);
	ck_assert_int_eq(g.type, PROTO_SAVE_END);
	ck_assert_uint_eq(g.length, 1234);
	ck_assert_uint_eq(g.nfds, 2);
	ck_assert(g.id == h.id);
}
END_TEST

START_TEST(hdr_rejects)
{
	struct proto_hdr h = {PROTO_MAGIC, PROTO_VERSION, PROTO_HELLO, 0, 0, 0, 1}, g;
	uint8_t buf[PROTO_HDR_SIZE];
	char why[160];

	h.magic = 0xdeadbeef;
	proto_hdr_pack(&h, buf);
	ck_assert_int_eq(proto_hdr_unpack(buf, &g, why, sizeof(why)), -1);
	ck_assert_ptr_nonnull(strstr(why, "magic"));
	h.magic = PROTO_MAGIC;
	h.length = PROTO_MAX_BODY + 1;
	proto_hdr_pack(&h, buf);
	ck_assert_int_eq(proto_hdr_unpack(buf, &g, why, sizeof(why)), -1);
	ck_assert_ptr_nonnull(strstr(why, "limit"));
	h.length = 0;
	h.nfds = PROTO_MAX_FDS + 1;
	proto_hdr_pack(&h, buf);
	ck_assert_int_eq(proto_hdr_unpack(buf, &g, why, sizeof(why)), -1);
	h.nfds = 0;
	h.flags = 1;
	proto_hdr_pack(&h, buf);
	ck_assert_int_eq(proto_hdr_unpack(buf, &g, why, sizeof(why)), -1);
}
END_TEST

START_TEST(typed_getters)
{
	struct proto_out o;
	struct proto_in in;
	struct proto_map m, sub;
	char why[160], s[16];
	uint64_t u = 0;
	int64_t i = 0;
	int b = 0;
	const void *bin;
	size_t binlen;
	const msgpack_object_array *arr;

	proto_out_init(&o, PROTO_HELLO, 1);
	msgpack_pack_map(&o.pk, 7);
	proto_kv_u64(&o.pk, "u", 42);
	proto_kv_i64(&o.pk, "i", -5);
	proto_kv_bool(&o.pk, "b", 1);
	proto_kv_str(&o.pk, "s", "hello");
	proto_kv_bin(&o.pk, "bin", "\0\1\2", 3);
	proto_key(&o.pk, "a");
	msgpack_pack_array(&o.pk, 2);
	msgpack_pack_uint8(&o.pk, 1);
	msgpack_pack_uint8(&o.pk, 2);
	proto_key(&o.pk, "m");
	msgpack_pack_map(&o.pk, 1);
	proto_kv_u64(&o.pk, "x", 7);
	ck_assert_int_eq(parse_body(&in, &o, why), 0);
	proto_map_init(&m, in.root);
	ck_assert_int_eq(proto_get_u64(&m, "u", 100, &u, 1), 1);
	ck_assert_int_eq(proto_get_i64(&m, "i", -10, 10, &i, 1), 1);
	ck_assert_int_eq(proto_get_bool(&m, "b", &b, 1), 1);
	ck_assert_int_eq(proto_get_str(&m, "s", s, 15, 1), 1);
	ck_assert_int_eq(proto_get_bin(&m, "bin", &bin, &binlen, 10, 1), 1);
	ck_assert_int_eq(proto_get_array(&m, "a", &arr, 2, 1), 1);
	ck_assert_int_eq(proto_get_map(&m, "m", &sub, 1), 1);
	ck_assert_int_eq(proto_get_u64(&sub, "x", 10, &u, 1), 1);
	ck_assert_int_eq(proto_map_end(&sub), 0);
	ck_assert_int_eq(proto_get_u64(&m, "absent", 10, &u, 0), 0);
	ck_assert_int_eq(proto_map_end(&m), 0);
	ck_assert_uint_eq(u, 7);
	ck_assert_int_eq(i, -5);
	ck_assert_str_eq(s, "hello");
	ck_assert_uint_eq(binlen, 3);
	ck_assert_uint_eq(arr->size, 2);
	proto_in_free(&in);
	proto_out_free(&o);
}
END_TEST

/* Decodes a one-key map {k: <packed by fn>} and returns the getter's why. */
#define BAD_CASE(pack_value, getter_call, expect)                                       \
	do {                                                                            \
		struct proto_out o;                                                     \
		struct proto_in in;                                                     \
		struct proto_map m;                                                     \
		char why[160];                                                          \
		proto_out_init(&o, PROTO_HELLO, 1);                                     \
		msgpack_pack_map(&o.pk, 1);                                             \
		proto_key(&o.pk, "k");                                                  \
		pack_value;                                                             \
		ck_assert_int_eq(parse_body(&in, &o, why), 0);                          \
		proto_map_init(&m, in.root);                                            \
		getter_call;                                                            \
		ck_assert_int_eq(proto_map_end(&m), -1);                                \
		ck_assert_msg(strstr(m.why, expect), "why '%s' lacks '%s'", m.why, expect); \
		proto_in_free(&in);                                                     \
		proto_out_free(&o);                                                     \
	} while (0)

START_TEST(getters_reject)
{
	uint64_t u;
	int64_t i;
	char s[8];
	const msgpack_object_array *a;

	BAD_CASE(msgpack_pack_int8(&o.pk, -1), proto_get_u64(&m, "k", 9, &u, 1), "unsigned");
	BAD_CASE(msgpack_pack_uint8(&o.pk, 10), proto_get_u64(&m, "k", 9, &u, 1), "exceeds");
	BAD_CASE(msgpack_pack_int8(&o.pk, -11), proto_get_i64(&m, "k", -10, 10, &i, 1), "range");
	BAD_CASE(proto_str(&o.pk, "x"), proto_get_u64(&m, "k", 9, &u, 1), "unsigned");
	BAD_CASE(proto_str(&o.pk, "too long!"), proto_get_str(&m, "k", s, 7, 1), "limit");
	BAD_CASE((msgpack_pack_str(&o.pk, 3), msgpack_pack_str_body(&o.pk, "a\0b", 3)),
		 proto_get_str(&m, "k", s, 7, 1), "NUL");
	BAD_CASE(msgpack_pack_uint8(&o.pk, 1), proto_get_str(&m, "k", s, 7, 1), "string");
	BAD_CASE((msgpack_pack_array(&o.pk, 3), msgpack_pack_nil(&o.pk), msgpack_pack_nil(&o.pk),
		  msgpack_pack_nil(&o.pk)),
		 proto_get_array(&m, "k", &a, 2, 1), "elements");
	BAD_CASE(msgpack_pack_uint8(&o.pk, 1), proto_get_u64(&m, "other", 9, &u, 1), "missing");
	BAD_CASE(msgpack_pack_uint8(&o.pk, 1), (void)0, "unknown key 'k'");
}
END_TEST

START_TEST(body_rejects)
{
	struct proto_in in;
	char why[160];
	struct proto_map m;
	const uint8_t not_map[] = {0x01};
	const uint8_t trailing[] = {0x80, 0x01};
	const uint8_t truncated[] = {0x81, 0xa1};
	/* {"a":1,"a":2} */
	const uint8_t dup[] = {0x82, 0xa1, 'a', 0x01, 0xa1, 'a', 0x02};
	/* {1: 1} */
	const uint8_t intkey[] = {0x81, 0x01, 0x01};
	/* {"a": array32 of 2^32-1 elements}: must be refused before anything is allocated */
	const uint8_t huge[] = {0x81, 0xa1, 'a', 0xdd, 0xff, 0xff, 0xff, 0xff, 0x01};
	/* an extension type */
	const uint8_t ext[] = {0x81, 0xa1, 'a', 0xd4, 0x01, 0x01};

	ck_assert_int_eq(proto_in_parse(&in, not_map, sizeof(not_map), why, sizeof(why)), -1);
	proto_in_free(&in);
	ck_assert_int_eq(proto_in_parse(&in, trailing, sizeof(trailing), why, sizeof(why)), -1);
	ck_assert_ptr_nonnull(strstr(why, "trailing"));
	proto_in_free(&in);
	ck_assert_int_eq(proto_in_parse(&in, truncated, sizeof(truncated), why, sizeof(why)), -1);
	proto_in_free(&in);
	ck_assert_int_eq(proto_in_parse(&in, dup, sizeof(dup), why, sizeof(why)), 0);
	proto_map_init(&m, in.root);
	ck_assert_int_eq(proto_map_end(&m), -1);
	ck_assert_ptr_nonnull(strstr(m.why, "duplicate"));
	proto_in_free(&in);
	ck_assert_int_eq(proto_in_parse(&in, huge, sizeof(huge), why, sizeof(why)), -1);
	ck_assert_ptr_nonnull(strstr(why, "elements"));
	proto_in_free(&in);
	ck_assert_int_eq(proto_in_parse(&in, ext, sizeof(ext), why, sizeof(why)), -1);
	ck_assert_ptr_nonnull(strstr(why, "unsupported"));
	proto_in_free(&in);
	ck_assert_int_eq(proto_in_parse(&in, intkey, sizeof(intkey), why, sizeof(why)), 0);
	proto_map_init(&m, in.root);
	ck_assert_int_eq(proto_map_end(&m), -1);
	proto_in_free(&in);
}
END_TEST

START_TEST(send_recv_fds)
{
	int sv[2], fds[PROTO_MAX_FDS];
	unsigned nfds = 0;
	struct proto_out o;
	struct proto_hdr h;
	uint8_t *body;
	char why[160];
	int p[2];

	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	ck_assert_int_eq(pipe(p), 0);
	proto_out_init(&o, PROTO_REGION_ADD, 9);
	msgpack_pack_map(&o.pk, 1);
	proto_kv_u64(&o.pk, "region", 3);
	size_t len = proto_out_finish(&o, 1);
	ck_assert_int_eq(proto_send(sv[0], o.sb.data, len, &p[1], 1), 0);
	ck_assert_int_eq(proto_recv(sv[1], &h, &body, fds, &nfds, 1000, why, sizeof(why)), 0);
	ck_assert_uint_eq(h.id, 9);
	ck_assert_uint_eq(h.nfds, 1);
	ck_assert_uint_eq(nfds, 1);
	ck_assert_int_eq(write(fds[0], "x", 1), 1);	/* the descriptor works */
	char ch;
	ck_assert_int_eq(read(p[0], &ch, 1), 1);
	ck_assert_int_eq(ch, 'x');
	free(body);
	/* Nothing more: the receive times out. */
	ck_assert_int_eq(proto_recv(sv[1], &h, &body, fds, &nfds, 50, why, sizeof(why)),
			 -ETIMEDOUT);
	close(sv[0]);
	ck_assert_int_eq(proto_recv(sv[1], &h, &body, fds, &nfds, 1000, why, sizeof(why)), -EPIPE);
	proto_out_free(&o);
}
END_TEST

/* Random bytes never crash the decoder. */
START_TEST(random_bodies)
{
	uint8_t buf[256];
	char why[160];
	srand(1234);
	for (int n = 0; n < 20000; n++) {
		size_t len = (size_t)(rand() % (int)sizeof(buf));
		for (size_t i = 0; i < len; i++)
			buf[i] = (uint8_t)rand();
		struct proto_in in;
		if (proto_in_parse(&in, buf, len, why, sizeof(why)) == 0) {
			struct proto_map m;
			uint64_t u;
			proto_map_init(&m, in.root);
			proto_get_u64(&m, "save", UINT64_MAX, &u, 0);
			proto_map_end(&m);
		}
		proto_in_free(&in);
	}
}
END_TEST

/* The suite. */
static Suite *proto_suite(void)
{
	Suite *s = suite_create("proto");
	TCase *tc = tcase_create("proto");
	tcase_add_test(tc, hdr_round_trip);
	tcase_add_test(tc, hdr_rejects);
	tcase_add_test(tc, typed_getters);
	tcase_add_test(tc, getters_reject);
	tcase_add_test(tc, body_rejects);
	tcase_add_test(tc, send_recv_fds);
	tcase_add_test(tc, random_bodies);
	suite_add_tcase(s, tc);
	return s;
}

CHECK_MAIN(proto_suite)
