/* check_store_files.c — checked directories below an allowed root, files written as *.partial. */
#include "harness_store.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

/* Nested tag directories are made with the client's owner and dir_mode; reopening is fine. */
START_TEST(test_open_dir_nested)
{
	char err[ERRLEN];
	struct stat st;
	int fd = store_open_dir(&cfg, rpath("%s", "job/a/b/step10"), 1234, 4321, NULL, err,
				sizeof(err));
	ck_assert_msg(fd >= 0, "%s", err);
	ck_assert_int_eq(fstat(fd, &st), 0);
	ck_assert(S_ISDIR(st.st_mode));
	ck_assert_uint_eq(st.st_mode & 07777, 0750);	/* cfg.dir_mode, whatever the umask */
	if (geteuid() == 0) {
		ck_assert_uint_eq(st.st_uid, 1234);
		ck_assert_uint_eq(st.st_gid, 4321);
		ck_assert_int_eq(stat(rpath("%s", "job"), &st), 0);
		ck_assert_uint_eq(st.st_uid, 1234);
	}
	close(fd);
	/* Existing directories owned by the client, a trailing slash: fine. */
	fd = store_open_dir(&cfg, rpath("%s", "job/a/b/step10/"), 1234, 4321, NULL, err,
			    sizeof(err));
	ck_assert_msg(fd >= 0, "%s", err);
	close(fd);
	/* ... but not for another user, unless root. */
	if (geteuid() == 0) {
		ck_assert_int_eq(store_open_dir(&cfg, rpath("%s", "job/a"), 999, 999, NULL, err,
						sizeof(err)), ERR_EACCES);
		ck_assert_ptr_nonnull(strstr(err, "not owned by uid 999"));
	}
	fd = store_open_dir(&cfg, rpath("%s", "job/a"), 0, 0, NULL, err, sizeof(err));
	ck_assert_msg(fd >= 0, "%s", err);
	close(fd);
}
END_TEST

/* Empty, relative, "..", outside or equal to a root, through links, too long: refused. */
START_TEST(test_open_dir_rejects)
{
	char err[ERRLEN], outside[PATH_MAX + 16], longname[NAME_MAX + 2];
	snprintf(outside, sizeof(outside), "%s/outside", scratch);
	ck_assert_int_eq(mkdir(outside, 0755), 0);
	ck_assert_int_eq(mkdir(rpath("%s", "in"), 0755), 0);
	ck_assert_int_eq(symlink(outside, rpath("%s", "out_link")), 0);
	ck_assert_int_eq(symlink(rpath("%s", "in"), rpath("%s", "in_link")), 0);
	write_text(rpath("%s", "file"), "x");
	memset(longname, 'x', NAME_MAX + 1);
	longname[NAME_MAX + 1] = 0;
	char rootslash[sizeof(root) + 2];
	snprintf(rootslash, sizeof(rootslash), "%s/", root);
	char sibling[sizeof(root) + 8];
	snprintf(sibling, sizeof(sibling), "%s2/job", root); /* shares the root's prefix */

	struct {
		const char *dir;
		int rc;
		const char *want;
	} cases[] = {
		{"", ERR_EINVAL, "empty"},
		{NULL, ERR_EINVAL, "empty"},
		{"job/step", ERR_EINVAL, "absolute"},
		{rpath("%s", "job/../../etc"), ERR_EINVAL, "\"..\""},
		{rpath("%s", "./job"), ERR_EINVAL, "\"..\""},
		{rpath("%s", "job//step"), ERR_EINVAL, "empty component"},
		{"/etc/dsckpt", ERR_EACCES, "allowed root"},
		{outside, ERR_EACCES, "allowed root"},
		{root, ERR_EACCES, "allowed root"},
		{rootslash, ERR_EACCES, "allowed root"},
		{sibling, ERR_EACCES, "allowed root"},
		{rpath("%s", "out_link/step"), ERR_EACCES, "symbolic link in path"},
		{rpath("%s", "in"), ERR_EINVAL, "<root>/<job>/<tag>"},
		{rpath("%s", "in_link/step"), ERR_EACCES, "symbolic link in path"},
		{rpath("%s", "file/step"), ERR_EINVAL, "not a directory"},
		{rpath("job/%s", longname), ERR_ENAMETOOLONG, "longer than"},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		err[0] = 0;
		int rc = store_open_dir(&cfg, cases[i].dir, 0, 0, NULL, err, sizeof(err));
		ck_assert_msg(rc == cases[i].rc, "case %zu (%s): rc %d %s", i, cases[i].dir, rc,
			      err);
		ck_assert_msg(strstr(err, cases[i].want), "case %zu: %s", i, err);
	}
	/* Nothing was created through the links or beside the root. */
	ck_assert(!h_exists(rpath("%s", "in/step")));
	char p[sizeof(outside) + 8];
	snprintf(p, sizeof(p), "%s/step", outside);
	ck_assert(!h_exists(p));
	ck_assert(!h_exists(rpath("%s", "job")));
}
END_TEST

/* A file's mode is set on its descriptor; a directory moved out of its root is noticed. */
START_TEST(test_modes_and_moved_dir)
{
	char err[ERRLEN], away[PATH_MAX + 16];
	struct store_root rid;
	struct store_file *f;
	struct stat st;
	int dfd = store_open_dir(&cfg, rpath("%s", "job/t"), 0, 0, &rid, err, sizeof(err));

	ck_assert_msg(dfd >= 0, "%s", err);
	ck_assert_int_eq(stat(root, &st), 0);
	ck_assert(st.st_dev == rid.dev && st.st_ino == rid.ino);
	ck_assert_int_eq(store_dir_within(dfd, &rid, err, sizeof(err)), 0);
	umask(0);
	ck_assert_int_eq(store_file_create(dfd, "m.safetensors", 0, 0, 0640, 0, &f, err,
					   sizeof(err)), 0);
	ck_assert_int_eq(store_file_finish(f, 0, err, sizeof(err)), 0);
	ck_assert_int_eq(stat(rpath("%s", "job/t/m.safetensors"), &st), 0);
	ck_assert_uint_eq(st.st_mode & 07777, 0640);
	ck_assert_int_eq(store_write_atomic(dfd, "latest", "t", 1, 0, 0, 0, err, sizeof(err)), 0);
	ck_assert_int_eq(stat(rpath("%s", "job/t/latest"), &st), 0);
	ck_assert_uint_eq(st.st_mode & 07777, 0600);	/* the owner always reads and writes */

	snprintf(away, sizeof(away), "%s/away", scratch);
	ck_assert_int_eq(rename(rpath("%s", "job/t"), away), 0);
	ck_assert_int_eq(store_dir_within(dfd, &rid, err, sizeof(err)), ERR_EACCES);
	ck_assert_msg(strstr(err, "moved out of its allowed root") != NULL, "%s", err);
	ck_assert_int_eq(rename(away, rpath("%s", "job/deeper")), 0);
	ck_assert_int_eq(store_dir_within(dfd, &rid, err, sizeof(err)), 0);
	close(dfd);
}
END_TEST

/* A file is written as *.partial and renamed when finished; O_DIRECT; atomic small files. */
START_TEST(test_file_write)
{
	char err[ERRLEN], *buf;
	size_t len;
	struct store_file *f;
	int dfd = store_open_dir(&cfg, rpath("%s", "job/t"), 0, 0, NULL, err, sizeof(err));
	ck_assert_int_ge(dfd, 0);

	/* A partial left by a crash is replaced. */
	write_text(rpath("%s", "job/t/x.safetensors.partial"), "stale");
	ck_assert_int_eq(store_file_create(dfd, "x.safetensors", 0, 0, 0644, 0, &f, err,
					   sizeof(err)), 0);
	ck_assert_int_eq(store_file_direct(f), 0);
	ck_assert_int_eq(store_file_pwrite(f, "world", 5, 6, err, sizeof(err)), 0);
	ck_assert_int_eq(store_file_pwrite(f, "hello ", 6, 0, err, sizeof(err)), 0);
	ck_assert(h_exists(rpath("%s", "job/t/x.safetensors.partial")));
	ck_assert(!h_exists(rpath("%s", "job/t/x.safetensors")));
	ck_assert_int_eq(store_file_finish(f, 11, err, sizeof(err)), 0);
	ck_assert(!h_exists(rpath("%s", "job/t/x.safetensors.partial")));
	buf = h_read_file(rpath("%s", "job/t/x.safetensors"), &len);
	ck_assert_uint_eq(len, 11);
	ck_assert_str_eq(buf, "hello world");
	free(buf);

	/* O_DIRECT where the filesystem has it; aligned writes, then truncated to size. */
	void *page;
	ck_assert_int_eq(posix_memalign(&page, 4096, 8192), 0);
	memset(page, 'z', 8192);
	ck_assert_int_eq(store_file_create(dfd, "y.safetensors", 0, 0, 0644, 1, &f, err,
					   sizeof(err)), 0);
	ck_assert_int_eq(store_file_pwrite(f, page, 8192, 0, err, sizeof(err)), 0);
	ck_assert_int_eq(store_file_finish(f, 5000, err, sizeof(err)), 0);
	buf = h_read_file(rpath("%s", "job/t/y.safetensors"), &len);
	ck_assert_uint_eq(len, 5000);
	ck_assert_int_eq(buf[4999], 'z');
	free(buf);
	free(page);

	/* Atomic small files replace what was there. */
	ck_assert_int_eq(store_write_atomic(dfd, "latest", "one", 3, 0, 0, 0644, err, sizeof(err)),
			 0);
	ck_assert_int_eq(store_write_atomic(dfd, "latest", "two!", 4, 0, 0, 0644, err, sizeof(err)),
			 0);
	buf = h_read_file(rpath("%s", "job/t/latest"), &len);
	ck_assert_str_eq(buf, "two!");
	free(buf);
	ck_assert(!h_exists(rpath("%s", "job/t/latest.partial")));

	/* Bad names. */
	ck_assert_int_eq(store_file_create(dfd, "a/b", 0, 0, 0644, 0, &f, err, sizeof(err)),
			 ERR_EINVAL);
	ck_assert_int_eq(store_file_create(dfd, "", 0, 0, 0644, 0, &f, err, sizeof(err)),
			 ERR_EINVAL);
	ck_assert_int_eq(store_file_create(dfd, "..", 0, 0, 0644, 0, &f, err, sizeof(err)),
			 ERR_EINVAL);
	char longname[NAME_MAX];
	memset(longname, 'n', sizeof(longname) - 1);
	longname[sizeof(longname) - 1] = 0;
	ck_assert_int_eq(store_file_create(dfd, longname, 0, 0, 0644, 0, &f, err, sizeof(err)),
			 ERR_ENAMETOOLONG);
	close(dfd);
}
END_TEST

/* An aborted file leaves neither the file nor its *.partial. */
START_TEST(test_file_abort)
{
	char err[ERRLEN];
	struct store_file *f;
	int dfd = store_open_dir(&cfg, rpath("%s", "job/t"), 0, 0, NULL, err, sizeof(err));
	ck_assert_int_ge(dfd, 0);
	ck_assert_int_eq(store_file_create(dfd, "r.meta", 0, 0, 0644, 0, &f, err, sizeof(err)), 0);
	ck_assert_int_eq(store_file_pwrite(f, "abc", 3, 0, err, sizeof(err)), 0);
	store_file_abort(f);
	ck_assert(!h_exists(rpath("%s", "job/t/r.meta.partial")));
	ck_assert(!h_exists(rpath("%s", "job/t/r.meta")));
	close(dfd);
}
END_TEST

/* A full disk fails the write with "no space" and leaves no *.partial. */
START_TEST(test_enospc)
{
	char err[ERRLEN];
	struct store_file *f;
	if (geteuid() != 0 || mount("tmpfs", root, "tmpfs", 0, "size=1m") != 0) {
		printf("SKIP: needs root to mount tmpfs (%s)\n", strerror(errno));
		return;
	}
	int dfd = store_open_dir(&cfg, rpath("%s", "job/t"), 0, 0, NULL, err, sizeof(err));
	ck_assert_int_ge(dfd, 0);
	char *big = calloc(1, 2 << 20);
	ck_assert_int_eq(store_file_create(dfd, "rank0.safetensors", 0, 0, 0644, 0, &f, err,
					   sizeof(err)), 0);
	int rc = store_file_pwrite(f, big, 2 << 20, 0, err, sizeof(err));
	ck_assert_int_eq(rc, ERR_ENOSPC);
	ck_assert_str_eq(err, "no space left on device writing rank0.safetensors");
	store_file_abort(f);
	ck_assert(!h_exists(rpath("%s", "job/t/rank0.safetensors.partial")));
	/* The same write through the atomic path fails the same way and leaves nothing. */
	rc = store_write_atomic(dfd, "MANIFEST.json", big, 2 << 20, 0, 0, 0644, err, sizeof(err));
	ck_assert_int_eq(rc, ERR_ENOSPC);
	ck_assert(!h_exists(rpath("%s", "job/t/MANIFEST.json.partial")));
	ck_assert(!h_exists(rpath("%s", "job/t/MANIFEST.json")));
	free(big);
	close(dfd);
	umount(root);
}
END_TEST

/* Builds the suite. */
static Suite *store_suite(void)
{
	Suite *s = suite_create("store files");
	TCase *tc = tcase_create("files");
	tcase_add_checked_fixture(tc, scratch_setup, scratch_teardown);
	tcase_add_test(tc, test_open_dir_nested);
	tcase_add_test(tc, test_open_dir_rejects);
	tcase_add_test(tc, test_modes_and_moved_dir);
	tcase_add_test(tc, test_file_write);
	tcase_add_test(tc, test_file_abort);
	tcase_add_test(tc, test_enospc);
	suite_add_tcase(s, tc);
	return s;
}

CHECK_MAIN(store_suite)
