/*
 * check_retention.c — keep_last (daemon/retention.c) on real tags committed in a scratch job
 * directory (store_commit, no daemon): the newest keep stay whatever their names, the tag
 * just committed and the one `latest` names are never deleted, uncommitted tags and files
 * dsckptd did not write stay, nothing of another user is touched, a spent budget deletes
 * nothing, under a root with a remote tier only tags already there (REMOTE.json) go, and
 * what another run left uncommitted before the commit goes.
 */
#include "harness_store.h"

#include <check.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* Writes one rank's file into job/tag and commits it (latest follows). */
static void commit_tag(const char *tag)
{
	const char *dir = rpath("job/%s", tag);

	write_ckpt(dir, "model", 0, "{\"step\": 1}");
	commit_ok(dir, 1);
}

/* The job directory, open. */
static int job_open(void)
{
	int fd = open(rpath("%s", "job"), STORE_DIR_FLAGS);

	ck_assert_int_ge(fd, 0);
	return fd;
}

/* Whether job/tag (or a path below it) is there. */
static int has(const char *rel)
{
	return h_exists(rpath("job/%s", rel));
}

/* Applies keep_last keep in the job directory fd as a commit of tag by uid (of run; NULL:
 * none) would, latest read from the disk, under a root with a remote tier when remote. */
static void apply_in(int fd, const char *tag, uid_t uid, unsigned keep, int remote,
		     const char *run)
{
	char latest[NAME_MAX + 1];

	store_latest_get(fd, latest, sizeof(latest));
	retention_keep(fd, rpath("%s", "job"), tag, store_tag_committed(fd, tag), latest, uid,
		       keep, NULL, remote, run);
}

/* Applies keep_last keep as a commit of tag by uid would, latest read from the disk. */
static void apply(const char *tag, uid_t uid, unsigned keep)
{
	int fd = job_open();

	apply_in(fd, tag, uid, keep, 0, NULL);
	close(fd);
}

/* The newest keep committed tags stay, ordered by commit time, not by name (committed z, y,
 * x, w: w is the newest); older ones go whole; an uncommitted tag and a file beside the tags
 * stay. */
START_TEST(test_keep_newest)
{
	const char *order[] = {"z", "y", "x", "w"};

	for (int i = 0; i < 4; i++)
		commit_tag(order[i]);
	write_ckpt(rpath("job/%s", "u"), "model", 0, NULL);	/* never committed */
	write_text(rpath("job/%s", "notes.txt"), "mine");
	apply("w", 0, 2);
	ck_assert(has("w/" FMT_MANIFEST) && has("w/model.safetensors") && has("w/model.meta"));
	ck_assert(has("x/" FMT_MANIFEST));
	ck_assert(!has("y") && !has("z"));
	ck_assert(has("u/model.safetensors"));
	ck_assert(has("notes.txt"));

	/* keep 1 on the same directory: x goes too; again, nothing more. */
	apply("w", 0, 1);
	ck_assert(has("w") && !has("x") && has("u"));
	apply("w", 0, 1);
	ck_assert(has("w/" FMT_MANIFEST));
}
END_TEST

/* The tag latest names stays even past keep; the tag being committed goes when keep tags
 * dated later are kept (a late commit of an older step, as back-to-back steps of several
 * nodes can land). */
START_TEST(test_current_and_latest)
{
	const char *order[] = {"a", "b", "c", "d", "e"};
	char latest[64];
	int fd;

	for (int i = 0; i < 5; i++)
		commit_tag(order[i]);
	fd = job_open();
	store_latest_get(fd, latest, sizeof(latest));
	ck_assert_str_eq(latest, "e");
	/* A commit of b (older than e) with latest naming a: keep 1 keeps e and a; b, older
	 * than e, goes with c and d. */
	retention_keep(fd, rpath("%s", "job"), "b", store_tag_committed(fd, "b"), "a", 0, 1,
		       NULL, 0, NULL);
	close(fd);
	ck_assert(has("a/" FMT_MANIFEST) && has("e/" FMT_MANIFEST));
	ck_assert(!has("b") && !has("c") && !has("d"));
}
END_TEST

/* In a tag to delete, only the files dsckptd writes go: the manifest and checkpoint files,
 * not a file of the user's, and so the directory stays; a tag holding a directory too. */
START_TEST(test_foreign_files)
{
	commit_tag("old");
	commit_tag("sub");
	commit_tag("new");
	write_text(rpath("job/%s", "old/README"), "the user's");
	ck_assert_int_eq(mkdir(rpath("job/%s", "sub/extra"), 0755), 0);
	apply("new", 0, 1);
	ck_assert(has("old/README"));
	ck_assert(!has("old/" FMT_MANIFEST) && !has("old/model.safetensors") &&
		  !has("old/model.meta"));
	ck_assert(has("sub/extra") && !has("sub/" FMT_MANIFEST));
	ck_assert(has("new/" FMT_MANIFEST));

	/* Half deleted, old no longer reads as committed: nothing more to do there. */
	int fd = job_open();
	ck_assert_uint_eq(store_tag_committed(fd, "old"), 0);
	close(fd);
}
END_TEST

/* Whether the test runs as root (chown); prints a SKIP line when not. */
static int need_root(void)
{
	if (geteuid() == 0)
		return 1;
	printf("SKIP: check_retention: the owner cases chown files (not root)\n");
	return 0;
}

/* Nothing of another user: a tag, a manifest or a file owned by someone else than the job
 * directory's owner stays; a committing user other than root deletes only its own tags. */
START_TEST(test_owners)
{
	if (!need_root())
		return;
	const char *order[] = {"t1", "t2", "t3", "t4", "t5"};
	for (int i = 0; i < 5; i++)
		commit_tag(order[i]);
	ck_assert_int_eq(h_system("chown -R 1000:1000 '%s'", rpath("%s", "job")), 0);
	ck_assert_int_eq(chown(rpath("job/%s", "t1"), 1001, 1001), 0);	/* a tag */
	ck_assert_int_eq(chown(rpath("job/%s", "t2/" FMT_MANIFEST), 1001, 1001), 0);
	ck_assert_int_eq(chown(rpath("job/%s", "t3/model.meta"), 1001, 1001), 0);

	/* Another user committing in the job directory deletes nothing of 1000's. */
	apply("t5", 1001, 1);
	for (int i = 0; i < 5; i++)
		ck_assert_msg(has(h_path("%s/" FMT_MANIFEST, order[i])), "%s", order[i]);

	apply("t5", 1000, 1);
	ck_assert(has("t1/" FMT_MANIFEST));	/* not the job owner's tag: not even counted */
	ck_assert(has("t2/" FMT_MANIFEST) && has("t2/model.safetensors"));
	ck_assert(has("t3/model.meta") && !has("t3/model.safetensors") &&
		  !has("t3/" FMT_MANIFEST));
	ck_assert(!has("t4"));
	ck_assert(has("t5/" FMT_MANIFEST));
}
END_TEST

/* With a budget that runs out while listing or reading, nothing is deleted: a tag whose
 * manifest was not read may be newer than those that were (here c, committed after a and b,
 * is listed after them and its manifest is past the budget); one that suffices deletes as
 * without. */
START_TEST(test_budget)
{
	const char *order[] = {"a", "b", "c", "d"};
	struct stat st;
	int fd;

	for (int i = 0; i < 4; i++)
		commit_tag(order[i]);
	fd = job_open();
	uint64_t ns = store_tag_committed(fd, "d");
	struct store_budget small = {.entries = 3, .bytes = 1 << 20};
	retention_keep(fd, rpath("%s", "job"), "d", ns, "d", 0, 2, &small, 0, NULL);
	ck_assert(small.spent);
	ck_assert(has("a/" FMT_MANIFEST) && has("b/" FMT_MANIFEST) && has("c/" FMT_MANIFEST));

	ck_assert_int_eq(stat(rpath("job/%s", "a/" FMT_MANIFEST), &st), 0);
	struct store_budget two = {.entries = 1000, .bytes = (uint64_t)st.st_size * 5 / 2};
	retention_keep(fd, rpath("%s", "job"), "d", ns, "d", 0, 2, &two, 0, NULL);
	ck_assert(two.spent);
	ck_assert(has("a/" FMT_MANIFEST) && has("b/" FMT_MANIFEST) && has("c/" FMT_MANIFEST));

	struct store_budget enough = {.entries = 1000, .bytes = 1 << 20};
	retention_keep(fd, rpath("%s", "job"), "d", ns, "d", 0, 1, &enough, 0, NULL);
	close(fd);
	ck_assert(!enough.spent);
	ck_assert(!has("a") && !has("b") && !has("c") && has("d/" FMT_MANIFEST));
}
END_TEST

/* Under a root with a remote tier a tag not yet there (no REMOTE.json) is kept past keep;
 * once it has its REMOTE.json it goes, with REMOTE.json itself. */
START_TEST(test_remote_kept)
{
	const char *order[] = {"a", "b", "c"};
	int fd;

	for (int i = 0; i < 3; i++)
		commit_tag(order[i]);
	write_text(rpath("job/%s", "a/" FMT_REMOTE), "{}");
	fd = job_open();
	apply_in(fd, "c", 0, 1, 1, NULL);
	close(fd);
	ck_assert(!has("a"));		/* in the remote: gone whole */
	ck_assert(has("b/" FMT_MANIFEST));	/* not yet: kept */
	ck_assert(has("c/" FMT_MANIFEST));
	write_text(rpath("job/%s", "b/" FMT_REMOTE), "{}");
	apply("c", 0, 1);		/* without a remote the marker does not matter */
	ck_assert(!has("b"));
}
END_TEST

/* Dates path secs seconds ahead (a change after the newest commit). */
static void postdate(const char *path, int secs)
{
	struct timespec t[2];

	clock_gettime(CLOCK_REALTIME, &t[0]);
	t[0].tv_sec += secs;
	t[1] = t[0];
	ck_assert_int_eq(utimensat(AT_FDCWD, path, t, AT_SYMLINK_NOFOLLOW), 0);
}

/* A commit of run r2 removes what run r1 left uncommitted before it (old: r1's file and seal
 * record, all of it; seals: r1's seal record alone), and keeps a tag holding a file of r2 (its
 * run may still seal it), one with a save in flight (a *.partial), one whose file records no
 * run (not attributable), one changed after the commit, one beside whose r1 record another
 * node's is being written (empty), and a staging directory; retention without a run
 * (recovery's) removes none of them. */
START_TEST(test_leftovers)
{
	static const char *kept[] = {"mixed", "busy", "plain", "late", "sealing",
				     ".new.dsckpt-next"};
	unsigned r0 = 0;
	struct seal_record rec = {"h", "job", 2, &r0, 1, "r1", 1, NULL, 0, NULL};
	char *text = seal_record_write(&rec);
	int fd;

	ck_assert_ptr_nonnull(text);
	commit_tag("new");
	write_ckpt_run(rpath("job/%s", "old"), "model", 0, NULL, "h", "r1");
	write_text(rpath("job/%s", "old/SEAL.h.json"), text);
	ck_assert_int_eq(mkdir(rpath("job/%s", "seals"), 0755), 0);
	write_text(rpath("job/%s", "seals/SEAL.h.json"), text);
	ck_assert_int_eq(mkdir(rpath("job/%s", "sealing"), 0755), 0);
	write_text(rpath("job/%s", "sealing/SEAL.h.json"), text);
	write_text(rpath("job/%s", "sealing/SEAL.h2.json"), "");
	write_ckpt_run(rpath("job/%s", "mixed"), "a", 0, NULL, "h", "r1");
	write_ckpt_run(rpath("job/%s", "mixed"), "b", 1, NULL, "h", "r2");
	write_ckpt_run(rpath("job/%s", "busy"), "model", 0, NULL, "h", "r1");
	write_text(rpath("job/%s", "busy/rank1.safetensors.partial"), "x");
	write_ckpt_run(rpath("job/%s", "plain"), "model", 0, NULL, "h", NULL);
	write_ckpt_run(rpath("job/%s", "late"), "model", 0, NULL, "h", "r1");
	write_ckpt_run(rpath("job/%s", ".new.dsckpt-next"), "model", 0, NULL, "h", "r1");
	free(text);
	backdate(rpath("job/%s", "old"), 3600);
	backdate(rpath("job/%s", "seals"), 3600);
	for (size_t i = 0; i < sizeof(kept) / sizeof(kept[0]); i++)
		backdate(rpath("job/%s", kept[i]), 3600);
	postdate(rpath("job/%s", "late"), 3600);
	fd = job_open();
	uint64_t ns = store_tag_committed(fd, "new");
	retention_keep(fd, rpath("%s", "job"), "new", ns, "new", 0, 5, NULL, 0, NULL);
	ck_assert(has("old/model.safetensors"));	/* no run committing: nothing goes */
	apply_in(fd, "new", 0, 5, 0, "r2");
	close(fd);
	ck_assert_msg(!has("old"), "r1's leftover is still there");
	ck_assert_msg(!has("seals"), "r1's seal record alone is still there");
	for (size_t i = 0; i < sizeof(kept) / sizeof(kept[0]); i++)
		ck_assert_msg(has(kept[i]), "%s went", kept[i]);
	ck_assert(has("new/" FMT_MANIFEST));
}
END_TEST

/* The suite. */
static Suite *retention_suite(void)
{
	Suite *s = suite_create("retention");
	TCase *tc = tcase_create("retention");
	tcase_add_checked_fixture(tc, scratch_setup, scratch_teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_keep_newest);
	tcase_add_test(tc, test_current_and_latest);
	tcase_add_test(tc, test_foreign_files);
	tcase_add_test(tc, test_owners);
	tcase_add_test(tc, test_budget);
	tcase_add_test(tc, test_remote_kept);
	tcase_add_test(tc, test_leftovers);
	suite_add_tcase(s, tc);
	return s;
}

CHECK_MAIN(retention_suite)
