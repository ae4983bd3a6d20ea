/*
 * check_tensors.c — a save's list of tensors (daemon/tensors.c) fed directly, no daemon:
 * every check on an entry with its code and text (and the list unchanged after a refusal),
 * the per-save and header limits, what the list costs charged to its user and given back,
 * names unique across growth, a plan's list shared and copied on write, and when the sources'
 * references go (release, forsake, give, lend): sources are a test kind that counts closes.
 */
#include "../daemon/dsckptd.h"
#include "harness.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define UID 1234

/* The daemon's context tensors.c reads max_tensors_per_save from (main.c's in the daemon). */
static struct config cfg;
static struct daemon dsckptd = {.config = &cfg};

/* A test source: whether it may be read whole yet, and how often it was closed. */
struct fake {
	int complete;
	int closed;
};

/* ops.complete: whether every byte can be read. */
static int fake_complete(const void *priv)
{
	return ((const struct fake *)priv)->complete;
}

/* ops.close: counts the close. */
static void fake_close(void *priv, uint64_t size)
{
	(void)size;
	((struct fake *)priv)->closed++;
}

static const struct source_ops fake_ops = {
	.name = "fake", .complete = fake_complete, .close = fake_close,
};

/* A test source of size bytes (one reference, the caller's) with its state in f. */
static struct source *fake_source(struct fake *f, uint64_t size)
{
	f->complete = 1;
	f->closed = 0;
	struct source *s = source_new(&fake_ops, f, size);
	ck_assert_ptr_nonnull(s);
	return s;
}

/* Before each test: limits that do not get in the way, and nothing charged. */
static void setup(void)
{
	memset(&cfg, 0, sizeof(cfg));
	cfg.max_tensors_per_save = 1000000;
	cfg.max_held_bytes = UINT64_MAX;
	tensors_init(&dsckptd);
	quota_set_limits(&cfg);
}

/* After each test: everything the lists charged went back. */
static void teardown(void)
{
	ck_assert_uint_eq(quota_used(UID, QUOTA_HELD), 0);
}

/* Adds an F32 tensor of n elements at off in src, asserting success. */
static void add_ok(struct tensors **tl, const char *name, struct source *src, uint64_t off,
		   uint64_t n)
{
	char err[ERRLEN];
	uint64_t shape[1] = {n};
	int rc = tensors_add(tl, name, "F32", shape, 1, src, off, 4 * n, err, sizeof(err));
	ck_assert_msg(rc == 0, "add %s: %d %s", name, rc, err);
}

/* Each refusal of tensor_check, with its code and text; the list unchanged after each. */
START_TEST(test_refusals)
{
	struct fake f;
	struct source *src = fake_source(&f, 1024);
	struct tensors *tl = tensors_new(UID);
	char err[ERRLEN];
	uint64_t s23[2] = {2, 3}, big[3] = {1ull << 32, 1ull << 32, 2}, huge[1] = {1ull << 62};
	uint64_t zero[2] = {0, UINT64_MAX}, six[1] = {6};
	const struct {
		const char *name, *dtype;
		const uint64_t *shape;
		unsigned ndim;
		uint64_t off, nbytes;
		int rc;
		const char *text;
	} bad[] = {
		{"", "F32", s23, 2, 0, 24, ERR_EINVAL, "tensor with an empty name"},
		{"w", "F33", s23, 2, 0, 24, ERR_EINVAL, "tensor 'w': unknown dtype 'F33'"},
		{"w", "", s23, 2, 0, 24, ERR_EINVAL, "tensor 'w': unknown dtype ''"},
		{"w", "F32", big, 3, 0, 0, ERR_ERANGE, "tensor 'w': shape overflows"},
		{"w", "F32", s23, 2, 0, 20, ERR_EINVAL,
		 "tensor 'w': nbytes 20 does not match its shape and dtype"},
		{"w", "F32", huge, 1, 0, 0, ERR_EINVAL,	/* 2^62 * 4 wraps to 0 */
		 "tensor 'w': nbytes 0 does not match its shape and dtype"},
		{"w", "F32", s23, 2, 1001, 24, ERR_ERANGE,
		 "tensor 'w': bytes [1001, +24) lie outside its 1024-byte region"},
		{"w", "F32", s23, 2, 1025, 24, ERR_ERANGE,
		 "tensor 'w': bytes [1025, +24) lie outside its 1024-byte region"},
		{"w", "F32", s23, 2, UINT64_MAX - 4, 24, ERR_ERANGE,
		 "tensor 'w': bytes [18446744073709551611, +24) lie outside its 1024-byte region"},
	};

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		int rc = tensors_add(&tl, bad[i].name, bad[i].dtype, bad[i].shape, bad[i].ndim, src,
				     bad[i].off, bad[i].nbytes, err, sizeof(err));
		ck_assert_msg(rc == bad[i].rc, "case %zu: %d, not %d (%s)", i, rc, bad[i].rc, err);
		ck_assert_str_eq(err, bad[i].text);
		ck_assert_uint_eq(tensors_count(tl), 0);
		ck_assert_uint_eq(quota_used(UID, QUOTA_HELD), 0);
	}

	/* The edges that are fine: the last bytes of the region, a scalar, an empty tensor
	 * whose other dimension is huge, a one-byte dtype. */
	ck_assert_int_eq(tensors_add(&tl, "end", "F32", s23, 2, src, 1000, 24, err, ERRLEN), 0);
	ck_assert_int_eq(tensors_add(&tl, "scalar", "I64", s23, 0, src, 0, 8, err, ERRLEN), 0);
	ck_assert_int_eq(tensors_add(&tl, "empty", "BF16", zero, 2, src, 1024, 0, err, ERRLEN), 0);
	ck_assert_int_eq(tensors_add(&tl, "bytes", "U8", six, 1, src, 1018, 6, err, ERRLEN), 0);
	ck_assert_uint_eq(tensors_count(tl), 4);
	ck_assert_uint_eq(tensors_bytes(tl), 38);
	uint64_t held = quota_used(UID, QUOTA_HELD);
	ck_assert_uint_gt(held, 0);

	/* A name twice; a region still mapping. */
	ck_assert_int_eq(tensors_add(&tl, "end", "F32", s23, 2, src, 0, 24, err, sizeof(err)),
			 ERR_EINVAL);
	ck_assert_str_eq(err, "tensor 'end' is named twice");
	f.complete = 0;
	ck_assert_int_eq(tensors_add(&tl, "late", "F32", s23, 2, src, 0, 24, err, sizeof(err)),
			 ERR_ESTATE);
	ck_assert_str_eq(err, "tensor 'late': its region is not fully mapped yet");
	ck_assert_uint_eq(tensors_count(tl), 4);
	ck_assert_uint_eq(tensors_bytes(tl), 38);
	ck_assert_uint_eq(quota_used(UID, QUOTA_HELD), held);

	/* The header's description: the entries in order, as added. */
	const struct st_tensor *st = tensors_header(tl);
	ck_assert_ptr_nonnull(st);
	ck_assert_str_eq(st[0].name, "end");
	ck_assert_str_eq(st[0].dtype, "F32");
	ck_assert_uint_eq(st[0].ndim, 2);
	ck_assert_uint_eq(st[0].shape[1], 3);
	ck_assert_str_eq(st[1].name, "scalar");
	ck_assert_uint_eq(st[1].ndim, 0);
	ck_assert_str_eq(st[3].dtype, "U8");

	source_unref(src);
	ck_assert_int_eq(f.closed, 0);	/* the list holds it */
	tensors_unref(tl);
	ck_assert_int_eq(f.closed, 1);
}
END_TEST

/* max_tensors_per_save and max_held_mib_per_user refuse an entry (ELIMIT, list unchanged);
 * tensors_reserve refuses more than a save may hold. */
START_TEST(test_limits)
{
	struct fake f;
	struct source *src = fake_source(&f, 1 << 20);
	struct tensors *tl = tensors_new(UID);
	char err[ERRLEN];
	uint64_t shape[1] = {1};

	cfg.max_tensors_per_save = 3;
	ck_assert_int_eq(tensors_reserve(&tl, 4), -1);
	ck_assert_int_eq(tensors_reserve(&tl, 3), 0);
	add_ok(&tl, "a", src, 0, 1);
	add_ok(&tl, "b", src, 4, 1);
	add_ok(&tl, "c", src, 8, 1);
	ck_assert_int_eq(tensors_add(&tl, "d", "F32", shape, 1, src, 12, 4, err, sizeof(err)),
			 ERR_ELIMIT);
	ck_assert_str_eq(err, "tensor 'd': a save holds at most max_tensors_per_save (3) tensors");
	ck_assert_uint_eq(tensors_count(tl), 3);

	/* What three entries cost is charged; the fourth's would pass a limit just above it. */
	cfg.max_tensors_per_save = 100;
	uint64_t held = quota_used(UID, QUOTA_HELD);
	cfg.max_held_bytes = held + 10;
	quota_set_limits(&cfg);
	ck_assert_int_eq(tensors_add(&tl, "d", "F32", shape, 1, src, 12, 4, err, sizeof(err)),
			 ERR_ELIMIT);
	ck_assert_msg(strstr(err, "per-user limit max_held_mib_per_user reached: uid 1234 holds")
		      == err, "%s", err);
	ck_assert_uint_eq(tensors_count(tl), 3);
	ck_assert_uint_eq(quota_used(UID, QUOTA_HELD), held);
	tensors_unref(tl);
	ck_assert_uint_eq(quota_used(UID, QUOTA_HELD), 0);
	source_unref(src);
	ck_assert_int_eq(f.closed, 1);
}
END_TEST

/* The file's header stays within safetensors' limit: entries are accepted while the sum of
 * their header bytes fits, and the first that would not is refused. */
START_TEST(test_header_limit)
{
	struct fake f;
	struct source *src = fake_source(&f, 1 << 20);
	struct tensors *tl = tensors_new(UID);
	char err[ERRLEN];
	size_t len = 800;	/* the refusal's text names the entry: it must fit in err */
	char *name = malloc(len + 16);
	uint64_t shape[1] = {1}, sum = 0;
	unsigned i;

	ck_assert_ptr_nonnull(name);
	memset(name + 8, '\x01', len);	/* escaped as \u0001: 12 header bytes a character */
	name[len + 8] = '\0';
	for (i = 0;; i++) {
		snprintf(name, 9, "%07u", i);
		name[7] = '.';
		uint64_t hdr = st_tensor_header_bytes(name, "F32", 1);
		int rc = tensors_add(&tl, name, "F32", shape, 1, src, 0, 4, err, sizeof(err));
		if (sum + hdr > ST_MAX_HEADER - ST_HEADER_FIXED) {
			ck_assert_int_eq(rc, ERR_ELIMIT);
			break;
		}
		ck_assert_msg(rc == 0, "entry %u: %s", i, err);
		sum += hdr;
	}
	printf("header limit: %u entries of %zu-byte names fit\n", i, len + 8);
	ck_assert_uint_ge(i, 2);
	char want[160];
	snprintf(want, sizeof(want), "the file's header would exceed safetensors' %u-byte limit "
		 "(%u tensors so far)", ST_MAX_HEADER, i);
	ck_assert_msg(strstr(err, want) != NULL, "%s", err);
	ck_assert_uint_eq(tensors_count(tl), i);
	tensors_unref(tl);
	source_unref(src);
	free(name);
}
END_TEST

/* Names stay unique while the name set grows and is rehashed: every name is found again. */
START_TEST(test_many_names)
{
	enum { N = 5000 };
	struct fake f;
	struct source *src = fake_source(&f, 4 * N);
	struct tensors *tl = tensors_new(UID);
	char err[ERRLEN], name[32];
	uint64_t shape[1] = {1};

	ck_assert_int_eq(tensors_reserve(&tl, 100), 0);
	for (unsigned i = 0; i < N; i++) {
		snprintf(name, sizeof(name), "layer.%u.weight", i);
		add_ok(&tl, name, src, 4 * i, 1);
	}
	for (unsigned i = 0; i < N; i += 7) {
		snprintf(name, sizeof(name), "layer.%u.weight", i);
		ck_assert_int_eq(tensors_add(&tl, name, "F32", shape, 1, src, 0, 4, err,
					     sizeof(err)), ERR_EINVAL);
	}
	ck_assert_uint_eq(tensors_count(tl), N);
	ck_assert_uint_eq(tensors_bytes(tl), 4 * N);
	const struct st_tensor *st = tensors_header(tl);
	snprintf(name, sizeof(name), "layer.%u.weight", N - 1);
	ck_assert_str_eq(st[N - 1].name, name);
	tensors_unref(tl);
	source_unref(src);
	ck_assert_int_eq(f.closed, 1);
}
END_TEST

/* A plan's list appended to an empty save is shared (no copy, the save's references to the
 * sources its own); the save's next entry copies the list first, charged whole again, and
 * the plan's list is unchanged. A non-empty save gets the plan's entries added one by one. */
START_TEST(test_shared)
{
	struct fake fa, fb;
	struct source *a = fake_source(&fa, 4096), *b = fake_source(&fb, 4096);
	struct tensors *plan = tensors_new(UID), *save = tensors_new(UID);
	char err[ERRLEN];
	int shared;

	add_ok(&plan, "x", a, 0, 10);
	add_ok(&plan, "y", b, 0, 10);
	uint64_t one = quota_used(UID, QUOTA_HELD);
	ck_assert_int_eq(tensors_append(&save, plan, &shared, err, sizeof(err)), 0);
	ck_assert_int_eq(shared, 1);
	ck_assert_ptr_eq(save, plan);
	ck_assert_uint_eq(quota_used(UID, QUOTA_HELD), one);

	add_ok(&save, "z", a, 40, 10);	/* copied on write */
	ck_assert_ptr_ne(save, plan);
	ck_assert_uint_eq(tensors_count(plan), 2);
	ck_assert_uint_eq(tensors_count(save), 3);
	ck_assert_uint_gt(quota_used(UID, QUOTA_HELD), 2 * one);
	/* The copy knows the names. */
	ck_assert_int_eq(tensors_add(&save, "x", "F32", (uint64_t[]){1}, 1, a, 0, 4, err,
				     sizeof(err)), ERR_EINVAL);

	/* The plan goes: its sources' references with it, the save's copy keeps its own, and
	 * the references the shared save took are dropped as SAVE_END would. */
	tensors_sources_ref(plan, tensors_count(plan), 0);
	tensors_forsake(plan);
	source_unref(a);
	source_unref(b);
	ck_assert_int_eq(fa.closed + fb.closed, 0);
	ck_assert(tensors_use(save, b));
	tensors_unref(save);
	ck_assert_int_eq(fa.closed, 1);
	ck_assert_int_eq(fb.closed, 1);

	/* A save that has an entry gets a plan's added one by one, refusals included. */
	a = fake_source(&fa, 4096);
	plan = tensors_new(UID);
	save = tensors_new(UID);
	add_ok(&plan, "p", a, 0, 1);
	add_ok(&plan, "q", a, 4, 1);
	add_ok(&save, "s", a, 8, 1);
	ck_assert_int_eq(tensors_append(&save, plan, &shared, err, sizeof(err)), 0);
	ck_assert_int_eq(shared, 0);
	ck_assert_uint_eq(tensors_count(save), 3);
	ck_assert_int_eq(tensors_append(&save, plan, &shared, err, sizeof(err)), ERR_EINVAL);
	ck_assert_str_eq(err, "tensor 'p' is named twice");
	tensors_unref(plan);
	tensors_unref(save);
	source_unref(a);
	ck_assert_int_eq(fa.closed, 1);
}
END_TEST

/* tensors_give describes the data in order with a reference per entry; tensors_release then
 * lets the list's own references go (the names stay); tensors_lend lends the kept
 * description with references that tensors_lent_drop gives back. */
START_TEST(test_give_release_lend)
{
	struct fake fa, fb;
	struct source *a = fake_source(&fa, 4096), *b = fake_source(&fb, 4096);
	struct tensors *tl = tensors_new(UID);
	struct engine_tensor et[3];

	add_ok(&tl, "x", a, 100, 10);
	add_ok(&tl, "y", b, 200, 5);
	add_ok(&tl, "z", a, 0, 1);
	tensors_give(tl, et);
	ck_assert_uint_eq(et[0].off, 0);
	ck_assert_uint_eq(et[1].off, 40);
	ck_assert_uint_eq(et[2].off, 60);
	ck_assert_uint_eq(et[1].nbytes, 20);
	ck_assert_uint_eq(et[0].src_off, 100);
	ck_assert_ptr_eq(et[1].src, b);

	tensors_release(tl);
	ck_assert(!tensors_use(tl, a));
	source_unref(a);
	source_unref(b);
	ck_assert_int_eq(fa.closed + fb.closed, 0);	/* the engine's references */
	for (int i = 0; i < 3; i++)
		source_unref(et[i].src);
	ck_assert_int_eq(fa.closed, 1);
	ck_assert_int_eq(fb.closed, 1);
	ck_assert_str_eq(tensors_header(tl)[2].name, "z");
	tensors_unref(tl);

	a = fake_source(&fa, 4096);
	tl = tensors_new(UID);
	add_ok(&tl, "x", a, 0, 1);
	add_ok(&tl, "y", a, 4, 1);
	struct engine_tensor *lent = tensors_lend(tl);
	ck_assert_ptr_nonnull(lent);
	ck_assert_ptr_eq(tensors_lend(tl), lent);	/* the same kept description */
	ck_assert_uint_eq(lent[1].off, 4);
	tensors_unref(tl);	/* the borrowers' references keep the list */
	source_unref(a);
	ck_assert_uint_eq(lent[1].src_off, 4);
	for (int i = 0; i < 2; i++) {
		tensors_lent_drop(tl, 2, 1);
		ck_assert_int_eq(fa.closed, 0);	/* the list still holds its own */
		tensors_lent_drop(tl, 2, 0);
	}
	ck_assert_int_eq(fa.closed, 1);	/* the last borrower's drop freed the list */
}
END_TEST

/* The suite. */
static Suite *tensors_suite(void)
{
	Suite *s = suite_create("tensors");
	TCase *tc = tcase_create("tensors");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_refusals);
	tcase_add_test(tc, test_limits);
	tcase_add_test(tc, test_header_limit);
	tcase_add_test(tc, test_many_names);
	tcase_add_test(tc, test_shared);
	tcase_add_test(tc, test_give_release_lend);
	suite_add_tcase(s, tc);
	return s;
}

CHECK_MAIN(tensors_suite)
