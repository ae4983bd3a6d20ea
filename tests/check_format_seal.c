/* check_format_seal.c — a node's seal record (format/seal.c): written and read back (its run
 * too; a record without one reads as the unknown run ""), and every malformed record (not
 * JSON, another format, world or ranks out of range, a run that is not a string) refused
 * with why. */
#include "../format/format.h"
#include "harness.h"

#include <check.h>
#include <stdlib.h>
#include <string.h>

/* A record reads back as written. */
START_TEST(test_round_trip)
{
	unsigned ranks[] = {0, 3, 7};
	struct seal_record r = {"node-7", "gpt", 8, ranks, 3, NULL, 0}, back;
	char why[200];
	char *text = seal_record_write(&r);
	ck_assert_ptr_nonnull(text);
	ck_assert_ptr_null(strstr(text, "\"run\""));	/* the unknown run: no key */
	ck_assert_ptr_null(strstr(text, "\"sealed_ns\""));	/* not recorded: no key */
	ck_assert_int_eq(seal_record_parse(text, strlen(text), &back, why, sizeof(why)), 0);
	ck_assert_str_eq(back.run, "");
	ck_assert_uint_eq(back.sealed_ns, 0);
	seal_record_free(&back);
	free(text);
	r.run = "8812.0.1";
	r.sealed_ns = 1796400000123456768ull;	/* a multiple of 256: exact as a double */
	text = seal_record_write(&r);
	ck_assert_ptr_nonnull(text);
	ck_assert_int_eq(seal_record_parse(text, strlen(text), &back, why, sizeof(why)), 0);
	ck_assert_str_eq(back.run, "8812.0.1");
	ck_assert_str_eq(back.host, "node-7");
	ck_assert_str_eq(back.job, "gpt");
	ck_assert_uint_eq(back.world, 8);
	ck_assert_uint_eq(back.nranks, 3);
	ck_assert_uint_eq(back.ranks[2], 7);
	ck_assert_uint_eq(back.sealed_ns, 1796400000123456768ull);
	seal_record_free(&back);
	free(text);
	ck_assert(seal_record_name("SEAL.node-7.json"));
	ck_assert(!seal_record_name("SEAL..json") && !seal_record_name("SEAL.x.json.partial"));
}
END_TEST

/* Malformed records are refused, saying why. */
START_TEST(test_malformed)
{
	static const char *const bad[] = {
		"", "[]", "{", "{\"format\": \"dsckpt-seal\"}",
		"{\"format\": \"other\", \"version\": 1, \"host\": \"h\", \"job\": \"j\", "
		"\"world\": 2, \"ranks\": [0]}",
		"{\"format\": \"dsckpt-seal\", \"version\": 2, \"host\": \"h\", \"job\": \"j\", "
		"\"world\": 2, \"ranks\": [0]}",
		"{\"format\": \"dsckpt-seal\", \"version\": 1, \"host\": \"h\", \"job\": \"j\", "
		"\"world\": 0, \"ranks\": []}",
		"{\"format\": \"dsckpt-seal\", \"version\": 1, \"host\": \"h\", \"job\": \"j\", "
		"\"world\": 70000, \"ranks\": [0]}",
		"{\"format\": \"dsckpt-seal\", \"version\": 1, \"host\": \"h\", \"job\": \"j\", "
		"\"world\": 2, \"ranks\": [2]}",
		"{\"format\": \"dsckpt-seal\", \"version\": 1, \"host\": \"h\", \"job\": \"j\", "
		"\"world\": 2, \"ranks\": [0.5]}",
		"{\"format\": \"dsckpt-seal\", \"version\": 1, \"host\": \"h\", \"job\": \"j\", "
		"\"world\": 2, \"ranks\": [\"0\"]}",
		"{\"format\": \"dsckpt-seal\", \"version\": 1, \"host\": 5, \"job\": \"j\", "
		"\"world\": 2, \"ranks\": [0]}",
		"{\"format\": \"dsckpt-seal\", \"version\": 1, \"host\": \"h\", \"job\": \"j\", "
		"\"run\": 7, \"world\": 2, \"ranks\": [0]}",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct seal_record r;
		char why[200] = "";
		ck_assert_msg(seal_record_parse(bad[i], strlen(bad[i]), &r, why, sizeof(why)) < 0,
			      "accepted: %s", bad[i]);
		ck_assert_msg(why[0], "no reason for: %s", bad[i]);
	}
}
END_TEST

/* The suite. */
static Suite *format_seal_suite(void)
{
	Suite *s = suite_create("format seal");
	TCase *tc = tcase_create("seal");
	tcase_add_test(tc, test_round_trip);
	tcase_add_test(tc, test_malformed);
	suite_add_tcase(s, tc);
	return s;
}

CHECK_MAIN(format_seal_suite)
