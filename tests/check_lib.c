/*
 * check_lib.c — libdsckpt alone: error and level names, the host allocator, connecting
 * where there is no daemon, argument validation and NULL handles. The library's requests
 * against a scripted fake daemon are check_lib_save.c's and check_lib_fail.c's.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../client/lib/internal.h"
#include "harness.h"

/* Every code has its own message and name. */
START_TEST(test_errors)
{
#define XX(name, value, msg)                                                   \
	ck_assert_str_eq(dsckpt_strerror(DSCKPT_##name), msg);                 \
	ck_assert_str_eq(dsckpt_err_name(value), #name);
	DSCKPT_ERRNO_MAP(XX)
#undef XX
	ck_assert_str_eq(dsckpt_strerror(0), "success");
	ck_assert_str_eq(dsckpt_err_name(0), "OK");
	ck_assert_str_eq(dsckpt_strerror(-9999), "unknown error");
	ck_assert_str_eq(dsckpt_err_name(-9999), "UNKNOWN");
	ck_assert_str_eq(dsckpt_err_name(5), "UNKNOWN");
	ck_assert_str_eq(dsckpt_version(), DSCKPT_VERSION_STRING);
	ck_assert_int_eq(lib_errno(ENOSPC), DSCKPT_ENOSPC);
	ck_assert_int_eq(lib_errno(ECONNRESET), DSCKPT_EPIPE);
	ck_assert_int_eq(lib_errno(ELOOP), DSCKPT_EIO);
}
END_TEST

/* Level names, and unknown levels. */
START_TEST(test_levels)
{
	ck_assert_str_eq(dsckpt_level_name(DSCKPT_FAILED), "FAILED");
	ck_assert_str_eq(dsckpt_level_name(DSCKPT_NONE), "NONE");
	ck_assert_str_eq(dsckpt_level_name(DSCKPT_ACCEPTED), "ACCEPTED");
	ck_assert_str_eq(dsckpt_level_name(DSCKPT_SNAPSHOT), "SNAPSHOT");
	ck_assert_str_eq(dsckpt_level_name(DSCKPT_DURABLE), "DURABLE");
	ck_assert_str_eq(dsckpt_level_name(DSCKPT_COMMITTED), "COMMITTED");
	ck_assert_str_eq(dsckpt_level_name(DSCKPT_REMOTE), "REMOTE");
	ck_assert_str_eq(dsckpt_level_name(DSCKPT_REPLICATED), "REPLICATED");
	ck_assert_str_eq(dsckpt_level_name(7), "UNKNOWN");
	ck_assert_str_eq(dsckpt_level_name(-2), "UNKNOWN");
}
END_TEST

/* Many blocks: lookups inside, across the end, outside; frees, reuse, unique ids. */
START_TEST(test_host_alloc)
{
	enum { N = 300 };
	uint8_t *p[N];
	struct lib_hostref h, seen[N];
	uint64_t gen = lib_host_generation();

	for (int i = 0; i < N; i++) {
		size_t size = 1 + (size_t)i * 1237;
		p[i] = dsckpt_host_alloc(size);
		ck_assert_ptr_nonnull(p[i]);
		memset(p[i], i & 0xff, size);
		ck_assert_int_eq(lib_host_find(p[i], size, &seen[i]), 1);
		ck_assert(seen[i].base == (uintptr_t)p[i]);
		ck_assert_uint_ge(seen[i].size, size);
		ck_assert_uint_eq(seen[i].size % 4096, 0);
		for (int j = 0; j < i; j++)
			ck_assert(seen[j].region != seen[i].region);
	}
	for (int i = 0; i < N; i++) {
		size_t size = 1 + (size_t)i * 1237;
		ck_assert_int_eq(lib_host_find(p[i] + size / 2, size - size / 2, &h), 1);
		ck_assert(h.region == seen[i].region);
		ck_assert_int_eq(lib_host_find(p[i] + 1, seen[i].size, &h), DSCKPT_EINVAL);
		ck_assert_int_eq(p[i][size - 1], i & 0xff);
	}
	int on_stack = 0;
	ck_assert_int_eq(lib_host_find(&on_stack, sizeof(on_stack), &h), 0);
	ck_assert_int_eq(lib_host_find(NULL, 0, &h), 0);

	for (int i = 0; i < N; i += 2) {
		dsckpt_host_free(p[i]);
		ck_assert_int_eq(lib_host_find(p[i], 1, &h), 0);
		ck_assert(!lib_host_alive(&seen[i]));
		ck_assert_int_eq(lib_host_dup(&seen[i]), DSCKPT_ENOENT);
	}
	ck_assert_uint_eq(lib_host_generation(), gen + N / 2);
	for (int i = 1; i < N; i += 2) {
		ck_assert(lib_host_alive(&seen[i]));
		int fd = lib_host_dup(&seen[i]);
		ck_assert_int_ge(fd, 0);
		struct stat st;
		ck_assert_int_eq(fstat(fd, &st), 0);
		ck_assert_uint_eq((uint64_t)st.st_size, seen[i].size);
		close(fd);
	}
	/* Reuse: a new block gets a fresh region id even at a recycled address. */
	for (int i = 0; i < N; i += 2) {
		p[i] = dsckpt_host_alloc(4096);
		ck_assert_ptr_nonnull(p[i]);
		ck_assert_int_eq(lib_host_find(p[i], 4096, &h), 1);
		for (int j = 0; j < N; j++)
			ck_assert(h.region != seen[j].region);
	}
	dsckpt_host_free(NULL);
	dsckpt_host_free(&on_stack);           /* not ours: ignored */
	dsckpt_host_free(p[1] + 1);            /* not a base: ignored */
	ck_assert_int_eq(lib_host_find(p[1], 1, &h), 1);
	for (int i = 0; i < N; i++)
		dsckpt_host_free(p[i]);
	ck_assert_ptr_null(dsckpt_host_alloc(0));
	ck_assert_ptr_null(dsckpt_host_alloc(SIZE_MAX));
}
END_TEST

/* A missing socket (said so, not "No such file or directory"), a path that is not a socket,
 * an over-long path, $DSCKPT_SOCKET. */
START_TEST(test_connect_errors)
{
	char dir[256], path[400], big[200];
	dsckpt_conn_t *c = (dsckpt_conn_t *)&c;

	h_tmpdir(dir, sizeof(dir));
	snprintf(path, sizeof(path), "%s/none.sock", dir);
	ck_assert_int_eq(dsckpt_connect(path, &c), DSCKPT_ECONNREFUSED);
	ck_assert_ptr_null(c);
	char want[512];
	snprintf(want, sizeof(want), "no dsckptd at %s (no such socket)", path);
	ck_assert_str_eq(dsckpt_last_error(NULL), want);

	setenv("DSCKPT_SOCKET", path, 1);
	ck_assert_int_eq(dsckpt_connect(NULL, &c), DSCKPT_ECONNREFUSED);
	ck_assert_ptr_nonnull(strstr(dsckpt_last_error(NULL), path));
	ck_assert_int_eq(dsckpt_connect("", &c), DSCKPT_ECONNREFUSED);
	ck_assert_ptr_nonnull(strstr(dsckpt_last_error(NULL), path));
	unsetenv("DSCKPT_SOCKET");

	ck_assert_int_eq(h_system("touch '%s'", path), 0);
	ck_assert_int_eq(dsckpt_connect(path, &c), DSCKPT_ECONNREFUSED);
	ck_assert_ptr_nonnull(strstr(dsckpt_last_error(NULL), "not a socket (a regular file)"));

	memset(big, 'a', sizeof(big) - 1);
	big[0] = '/';
	big[sizeof(big) - 1] = 0;
	ck_assert_int_eq(dsckpt_connect(big, &c), DSCKPT_ENAMETOOLONG);
	ck_assert_int_eq(dsckpt_connect(path, NULL), DSCKPT_EINVAL);
	h_rm_rf(dir);
}
END_TEST

/* Tensor and blob validation before anything goes to the daemon. */
START_TEST(test_tensor_check)
{
	char why[LIB_ERRLEN], name[600];
	int64_t s2[2] = {3, 5}, neg[2] = {3, -1}, huge[2] = {INT64_MAX, 4};
	int64_t big[17];
	uint8_t buf[64];

	ck_assert_uint_eq(lib_check_dtype("F64"), 8);
	ck_assert_uint_eq(lib_check_dtype("F32"), 4);
	ck_assert_uint_eq(lib_check_dtype("BF16"), 2);
	ck_assert_uint_eq(lib_check_dtype("F16"), 2);
	ck_assert_uint_eq(lib_check_dtype("I64"), 8);
	ck_assert_uint_eq(lib_check_dtype("U32"), 4);
	ck_assert_uint_eq(lib_check_dtype("I16"), 2);
	ck_assert_uint_eq(lib_check_dtype("U8"), 1);
	ck_assert_uint_eq(lib_check_dtype("BOOL"), 1);
	ck_assert_uint_eq(lib_check_dtype("F8_E4M3"), 1);
	ck_assert_uint_eq(lib_check_dtype("F8_E5M2"), 1);
	ck_assert_uint_eq(lib_check_dtype("f32"), 0);
	ck_assert_uint_eq(lib_check_dtype(""), 0);
	ck_assert_uint_eq(lib_check_dtype("F32 "), 0);

	ck_assert_int_eq(lib_check_tensor("w", "F32", s2, 2, buf, 60, why, sizeof(why)), 0);
	ck_assert_int_eq(lib_check_tensor("w", "U8", NULL, 0, buf, 1, why, sizeof(why)), 0);
	ck_assert_int_eq(lib_check_tensor("w", "U8", s2, 0, buf, 1, why, sizeof(why)), 0);
	int64_t zero[1] = {0};
	ck_assert_int_eq(lib_check_tensor("w", "F32", zero, 1, NULL, 0, why, sizeof(why)), 0);

	ck_assert_int_eq(lib_check_tensor(NULL, "F32", s2, 2, buf, 60, why, sizeof(why)),
			 DSCKPT_EINVAL);
	ck_assert_int_eq(lib_check_tensor("", "F32", s2, 2, buf, 60, why, sizeof(why)),
			 DSCKPT_EINVAL);
	memset(name, 'n', sizeof(name));
	name[PROTO_MAX_NAME] = 0;
	ck_assert_int_eq(lib_check_tensor(name, "F32", s2, 2, buf, 60, why, sizeof(why)), 0);
	name[PROTO_MAX_NAME] = 'n';
	name[PROTO_MAX_NAME + 1] = 0;
	ck_assert_int_eq(lib_check_tensor(name, "F32", s2, 2, buf, 60, why, sizeof(why)),
			 DSCKPT_ENAMETOOLONG);
	ck_assert_int_eq(lib_check_tensor("__metadata__", "F32", s2, 2, buf, 60, why,
					  sizeof(why)), DSCKPT_EINVAL);
	ck_assert_int_eq(lib_check_tensor("w", "F31", s2, 2, buf, 60, why, sizeof(why)),
			 DSCKPT_EINVAL);
	ck_assert_ptr_nonnull(strstr(why, "F31"));
	ck_assert_int_eq(lib_check_tensor("w", NULL, s2, 2, buf, 60, why, sizeof(why)),
			 DSCKPT_EINVAL);
	ck_assert_int_eq(lib_check_tensor("w", "F32", s2, -1, buf, 60, why, sizeof(why)),
			 DSCKPT_EINVAL);
	for (int i = 0; i < 17; i++)
		big[i] = 1;
	ck_assert_int_eq(lib_check_tensor("w", "U8", big, 16, buf, 1, why, sizeof(why)), 0);
	ck_assert_int_eq(lib_check_tensor("w", "U8", big, 17, buf, 1, why, sizeof(why)),
			 DSCKPT_EINVAL);
	ck_assert_int_eq(lib_check_tensor("w", "F32", NULL, 2, buf, 60, why, sizeof(why)),
			 DSCKPT_EINVAL);
	ck_assert_int_eq(lib_check_tensor("w", "F32", neg, 2, buf, 60, why, sizeof(why)),
			 DSCKPT_EINVAL);
	ck_assert_int_eq(lib_check_tensor("w", "U8", huge, 2, buf, 60, why, sizeof(why)),
			 DSCKPT_ERANGE);
	int64_t h1[1] = {INT64_MAX / 2 + 1};   /* 2^62 elements of 4 bytes */
	ck_assert_int_eq(lib_check_tensor("w", "F32", h1, 1, buf, 60, why, sizeof(why)),
			 DSCKPT_ERANGE);
	ck_assert_int_eq(lib_check_tensor("w", "F32", s2, 2, buf, 59, why, sizeof(why)),
			 DSCKPT_EINVAL);
	ck_assert_ptr_nonnull(strstr(why, "60"));
	ck_assert_int_eq(lib_check_tensor("w", "BF16", s2, 2, buf, 60, why, sizeof(why)),
			 DSCKPT_EINVAL);
	ck_assert_int_eq(lib_check_tensor("w", "F32", s2, 2, NULL, 60, why, sizeof(why)),
			 DSCKPT_EINVAL);

	ck_assert_int_eq(lib_check_blob("meta", buf, 3, why, sizeof(why)), 0);
	ck_assert_int_eq(lib_check_blob("meta", NULL, 0, why, sizeof(why)), 0);
	ck_assert_int_eq(lib_check_blob("meta", NULL, 3, why, sizeof(why)), DSCKPT_EINVAL);
	ck_assert_int_eq(lib_check_blob("", buf, 3, why, sizeof(why)), DSCKPT_EINVAL);
	ck_assert_int_eq(lib_check_blob(name, buf, 3, why, sizeof(why)), DSCKPT_ENAMETOOLONG);
}
END_TEST

/* NULL handles are refused, not dereferenced. */
START_TEST(test_null_handles)
{
	dsckpt_save_t *s = (dsckpt_save_t *)&s;
	dsckpt_progress_t p;
	int64_t shape[1] = {1};

	ck_assert_int_eq(dsckpt_identify(NULL, "j", 0, 1), DSCKPT_EINVAL);
	ck_assert_int_eq(dsckpt_save_begin(NULL, "/x", "f", &s), DSCKPT_EINVAL);
	ck_assert_int_eq(dsckpt_add_tensor(NULL, "t", "U8", shape, 1, "", 1), DSCKPT_EINVAL);
	ck_assert_int_eq(dsckpt_add_blob(NULL, "b", "", 0), DSCKPT_EINVAL);
	ck_assert_int_eq(dsckpt_save_end(NULL), DSCKPT_EINVAL);
	ck_assert_int_eq(dsckpt_save_set_stream(NULL, NULL), DSCKPT_EINVAL);
	ck_assert_int_eq(dsckpt_wait(NULL, DSCKPT_SNAPSHOT, 0), DSCKPT_EINVAL);
	ck_assert_int_eq(dsckpt_save_progress(NULL, &p), DSCKPT_EINVAL);
	ck_assert_int_eq(dsckpt_commit(NULL, "/x", 0), DSCKPT_EINVAL);
	dsckpt_save_free(NULL);
	dsckpt_close(NULL);
}
END_TEST

/* The suite. */
static Suite *lib_suite(void)
{
	Suite *s = suite_create("lib");
	TCase *tc = tcase_create("local");
	tcase_add_test(tc, test_errors);
	tcase_add_test(tc, test_levels);
	tcase_add_test(tc, test_host_alloc);
	tcase_add_test(tc, test_connect_errors);
	tcase_add_test(tc, test_tensor_check);
	tcase_add_test(tc, test_null_handles);
	suite_add_tcase(s, tc);
	return s;
}

CHECK_MAIN(lib_suite)
