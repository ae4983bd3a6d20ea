/*
 * check_cuda.c — the CUDA transports where no GPU can be used: every entry point fails
 * cleanly with ERR_ENOCUDA, takes the descriptors it was given, and gpu_init says why.
 * On a machine with a GPU the same calls name an unknown UUID (ERR_ENOENT) instead.
 */
#include "../daemon/dsckptd.h"
#include "harness.h"
#include "harness_unit.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static char err[ERRLEN];
/* The UUID of no GPU; 00 01 02 … 0f, printed GPU-00010203-0405-0607-0809-0a0b0c0d0e0f. */
static const uint8_t uuid[16] = { 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15 };
static uint8_t handle[64];

/* Quiet logs in every forked test. */
static void setup(void)
{
	log_init("check_cuda", LOG_LVL_ERROR);
	memset(err, 0, sizeof(err));
	memset(handle, 0xab, sizeof(handle));
}

/* Whether this machine has a usable GPU (then unknown UUIDs are what fails). */
static int have_gpu(void)
{
	return strncmp(gpu_init(), "none: ", 6) != 0;
}

/* Checks rc and err for a call on the UUID of no GPU. */
static void expect_unavailable(int rc)
{
	if (have_gpu()) {
		ck_assert_int_eq(rc, ERR_ENOENT);
		ck_assert_msg(strstr(err, "no GPU with UUID "
				     "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f") != NULL,
			      "err: %s", err);
	} else {
		ck_assert_int_eq(rc, ERR_ENOCUDA);
		ck_assert_msg(strncmp(err, "CUDA not available: ", 20) == 0, "err: %s", err);
		ck_assert_uint_gt(strlen(err), 20);
	}
}

/* Makes a host source of one page. */
static struct source *host_source(void)
{
	struct source *s;
	int fd = memfd_create("check_cuda", MFD_CLOEXEC | MFD_ALLOW_SEALING);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(ftruncate(fd, 4096), 0);
	ck_assert_int_eq(source_host_open(fd, 4096, &s, err, sizeof(err)), 0);
	return s;
}

/* Whether fd is closed. */
static int is_closed(int fd)
{
	return fcntl(fd, F_GETFD) == -1 && errno == EBADF;
}

START_TEST(test_gpu_init_line)
{
	const char *line = gpu_init();

	ck_assert_ptr_nonnull(line);
	ck_assert_ptr_eq(gpu_init(), line); /* probed once, same answer */
	if (have_gpu()) {
		printf("SKIP: a GPU is present: %s\n", line);
		return;
	}
	ck_assert_msg(strncmp(line, "none: ", 6) == 0 && strlen(line) > 6, "line: %s", line);
}
END_TEST

START_TEST(test_ipc_open)
{
	struct source *s = (struct source *)&s;

	expect_unavailable(source_cuda_ipc_open(uuid, handle, 1 << 20, &s, err, sizeof(err)));
	ck_assert_ptr_null(s);
	/* Malformed too: a zero size fails the same way before anything is opened. */
	s = (struct source *)&s;
	expect_unavailable(source_cuda_ipc_open(uuid, handle, 0, &s, err, sizeof(err)));
	ck_assert_ptr_null(s);
}
END_TEST

START_TEST(test_vmm_open)
{
	struct source *s = (struct source *)&s;

	expect_unavailable(source_cuda_vmm_open(uuid, 2 << 20, &s, err, sizeof(err)));
	ck_assert_ptr_null(s);
	s = (struct source *)&s;
	expect_unavailable(source_cuda_vmm_open(uuid, 12345, &s, err, sizeof(err)));
	ck_assert_ptr_null(s);
}
END_TEST

/* Mapping into a region that is not a VMM range fails and still closes every fd. */
START_TEST(test_vmm_map_takes_fds)
{
	struct source *s = host_source();
	int p[2], fds[3];
	uint64_t sizes[3] = { 2 << 20, 2 << 20, 0 };

	ck_assert_int_eq(pipe(p), 0);
	fds[0] = p[0];
	fds[1] = p[1];
	fds[2] = memfd_create("check_cuda_vmm", MFD_CLOEXEC);
	ck_assert_int_ge(fds[2], 0);
	int rc = source_cuda_vmm_map(s, uuid, 6 << 20, 0, fds, sizes, 3, err, sizeof(err));
	ck_assert_int_lt(rc, 0);
	if (!have_gpu())
		expect_unavailable(rc);
	for (int i = 0; i < 3; i++)
		ck_assert_msg(is_closed(fds[i]), "fd %d left open", fds[i]);
	/* The host source is untouched by the failed map. */
	ck_assert(source_complete(s));
	ck_assert_str_eq(source_kind(s), "host");
	source_unref(s);
}
END_TEST

START_TEST(test_fence_import)
{
	struct cuda_fence *f = (struct cuda_fence *)&f;

	expect_unavailable(cuda_fence_import(1, uuid, handle, &f, err, sizeof(err)));
	ck_assert_ptr_null(f);
	cuda_fence_free(NULL);
}
END_TEST

/* Before gpu_init (as in a fresh process) the entry points probe by themselves. */
START_TEST(test_no_init_needed)
{
	struct source *s = NULL;
	int rc = source_cuda_vmm_open(uuid, 2 << 20, &s, err, sizeof(err));

	ck_assert_ptr_null(s);
	expect_unavailable(rc);
}
END_TEST

/* Pinning is a no-op without a GPU and the host path keeps working on pinned memory. */
START_TEST(test_register_host)
{
	size_t len = 1 << 20;
	unsigned char *buf = mmap(NULL, len, PROT_READ | PROT_WRITE,
				  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	struct source *s = host_source();

	ck_assert_ptr_ne(buf, MAP_FAILED);
	memset(buf, 1, len);
	gpu_register_host(buf, len);
	ck_assert_int_eq(h_read_src(s, 0, buf, 4096, err, sizeof(err)), 0);
	ck_assert_int_eq(buf[0], 0); /* the memfd is zeros */
	ck_assert_int_eq(buf[4096], 1);
	ck_assert_int_lt(h_read_src(s, 1, buf, 4096, err, sizeof(err)), 0);
	ck_assert_msg(strstr(err, "past its 4096 bytes") != NULL, "err: %s", err);
	gpu_unregister_host(buf);
	gpu_unregister_host(NULL);
	source_unref(s);
	munmap(buf, len);
}
END_TEST

/* Builds the suite. */
static Suite *cuda_suite(void)
{
	Suite *s = suite_create("cuda");
	TCase *tc = tcase_create("nodriver");

	tcase_add_checked_fixture(tc, setup, NULL);
	tcase_add_test(tc, test_gpu_init_line);
	tcase_add_test(tc, test_ipc_open);
	tcase_add_test(tc, test_vmm_open);
	tcase_add_test(tc, test_vmm_map_takes_fds);
	tcase_add_test(tc, test_fence_import);
	tcase_add_test(tc, test_no_init_needed);
	tcase_add_test(tc, test_register_host);
	suite_add_tcase(s, tc);
	return s;
}

CHECK_MAIN(cuda_suite)
