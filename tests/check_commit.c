/*
 * check_commit.c — COMMIT's state machine (daemon/commit.c) on a real libuv loop and the real
 * waiter layer, without a daemon: a fake save registry the test moves by hand (telling
 * commit_on_save, as save.c's observers are told), a fake store whose store_commit records
 * each start and end in libuv's threadpool and can be held there, and a reply sink that
 * records every answer. A commit waits until its directory's saves are DURABLE, fails on a
 * failed save, times out while it waits, goes on when its client leaves, runs one per user at
 * a time (other users' alongside), and is answered with store_commit's outcome.
 */
#include "../daemon/dsckptd.h"
#include "harness.h"

#include <check.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#define MAX_SAVES 8
#define MAX_EVENTS 32

static uv_loop_t uvloop;
static struct config cfg = {.refs = 1};
static struct daemon dsckptd = {.loop = &uvloop, .config = &cfg};  /* main.c's in the daemon */

/* The fake registry: saves of a directory (named by one letter), a user and a run. */
struct save {
	char dir[8];
	uid_t uid;
	const char *run;
	int level;
	char file[16];
	unsigned rank;
	char error[64];
};
static struct save saves[MAX_SAVES];
static unsigned nsaves;

/* The sink: every answer, in order. */
static struct answer {
	uint64_t conn, req;
	int code;                  /* 0: COMMITTED */
	char text[ERRLEN + 512];   /* the message, or the committed tag */
} answers[MAX_EVENTS];
static unsigned nanswers;

/* The fake store's record (threadpool and loop: under lock): "+A" a commit of A started,
 * "-A" it ended; held[] directories wait in store_commit until released. */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t released = PTHREAD_COND_INITIALIZER;
static char events[MAX_EVENTS][8];
static unsigned nevents;
static char held[8], failing[8];
static char opened[256];          /* the directory store_open_tag opened last */

/* Adds a save of dir by uid in run at level. */
static struct save *add_save(const char *dir, uid_t uid, const char *run, int level,
			     unsigned rank)
{
	ck_assert_uint_lt(nsaves, MAX_SAVES);
	struct save *s = &saves[nsaves++];
	snprintf(s->dir, sizeof(s->dir), "%s", dir);
	s->uid = uid;
	s->run = run;
	s->level = level;
	s->rank = rank;
	snprintf(s->file, sizeof(s->file), "%s%u", dir, rank);
	return s;
}

/* Moves s to level (FAILED with error) and tells commit.c, as save.c's observers are. */
static void set_level(struct save *s, int level, const char *error)
{
	s->level = level;
	snprintf(s->error, sizeof(s->error), "%s", error ? error : "");
	commit_on_save(s);
}

/* The directory identity of a one-letter name. */
static struct store_dirid dirid_of(const char *dir)
{
	return (struct store_dirid){.dev = 1, .ino = (ino_t)dir[0]};
}

/* Fakes of save.c. */
int save_level(const struct save *s)
{
	return s->level;
}

void save_view(const struct save *s, struct save_view *v)
{
	*v = (struct save_view){.uid = s->uid, .run = s->run, .dir = s->dir, .file = s->file,
				.dirid = dirid_of(s->dir), .rank = s->rank, .level = s->level,
				.error = s->level == LEVEL_FAILED ? s->error : NULL};
}

/* Whether s is uid's save of run into the directory id. */
static int save_of(const struct save *s, const struct store_dirid *id, uid_t uid,
		   const char *run)
{
	struct store_dirid d = dirid_of(s->dir);
	return s->uid == uid && d.ino == id->ino && strcmp(s->run, run) == 0;
}

struct save *save_dir_state(const struct store_dirid *id, uid_t uid, const char *run,
			    int *pending)
{
	struct save *bad = NULL;

	*pending = 0;
	for (unsigned i = 0; i < nsaves; i++) {
		if (!save_of(&saves[i], id, uid, run))
			continue;
		if (saves[i].level == LEVEL_FAILED && !bad)
			bad = &saves[i];
		else if (saves[i].level < LEVEL_DURABLE)
			*pending = 1;
	}
	return bad;
}

void save_mark_committed(const struct store_dirid *id, uid_t uid, const char *run)
{
	for (unsigned i = 0; i < nsaves; i++)
		if (saves[i].level == LEVEL_DURABLE && save_of(&saves[i], id, uid, run))
			set_level(&saves[i], LEVEL_COMMITTED, NULL);
}

/* Fakes of the store. */
void store_norm_dir(char *out, size_t len, const char *dir)
{
	snprintf(out, len, "%s", dir);
}

int store_open_tag(const struct config *c, const char *dir, uid_t uid, gid_t gid, int *jobfd,
		   char *err, size_t errlen)
{
	if (strcmp(dir, "missing") == 0 || strncmp(dir, ".gone", 5) == 0)
		return err_set(err, errlen, ERR_ENOENT, "%s: no such directory", dir);
	snprintf(opened, sizeof(opened), "%s", dir);
	*jobfd = open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	return open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
}

/* A staging directory's name is its tag's with a dot before it (".goneX" is "X"'s, moved
 * aside). */
int store_staged_tag(const char *dir, char *tagdir, size_t len)
{
	if (dir[0] != '.')
		return 0;
	snprintf(tagdir, len, "%s", strncmp(dir, ".gone", 5) == 0 ? dir + 5 : dir + 1);
	return 1;
}

int store_dir_id(int dirfd, struct store_dirid *id, char *err, size_t errlen)
{
	*id = dirid_of(opened);
	return 0;
}

/* Records an event of the fake store (lock held; a threadpool thread, where Check may not
 * assert: the test asserts on what was recorded). */
static void note(char sign, const char *dir)
{
	if (nevents < MAX_EVENTS)
		snprintf(events[nevents++], sizeof(events[0]), "%c%s", sign, dir);
}

int store_commit(const struct config *c, const char *dir, unsigned world, const char *run,
		 const struct store_dirid *id, uid_t uid, gid_t gid,
		 struct store_commit_info *info, char *err, size_t errlen)
{
	int rc = 0;

	pthread_mutex_lock(&lock);
	note('+', dir);
	while (strcmp(held, dir) == 0)
		pthread_cond_wait(&released, &lock);
	note('-', dir);
	if (strcmp(failing, dir) == 0)
		rc = err_set(err, errlen, ERR_EIO, "%s: the disk is on fire", dir);
	pthread_mutex_unlock(&lock);
	snprintf(info->tag, sizeof(info->tag), "%s", dir);
	info->files = world;
	info->bytes = 42;
	return rc;
}

void resident_committed(const char *dir)
{
}

/* The reply sink. */
void reply_error(uint64_t conn, uint64_t req, int code, const char *fmt, ...)
{
	va_list ap;

	ck_assert_uint_lt(nanswers, MAX_EVENTS);
	struct answer *a = &answers[nanswers++];
	*a = (struct answer){.conn = conn, .req = req, .code = code};
	va_start(ap, fmt);
	vsnprintf(a->text, sizeof(a->text), fmt, ap);
	va_end(ap);
}

void reply_committed(uint64_t conn, uint64_t req, const struct store_commit_info *info)
{
	ck_assert_uint_lt(nanswers, MAX_EVENTS);
	struct answer *a = &answers[nanswers++];
	*a = (struct answer){.conn = conn, .req = req, .code = 0};
	snprintf(a->text, sizeof(a->text), "%s", info->tag);
}

/* Commits dir for uid's run "r" as request req of connection conn. */
static void commit(uint64_t conn, uint64_t req, const char *dir, uid_t uid, int64_t timeout_ms)
{
	struct owner o = {.conn = conn, .pid = 100, .uid = uid, .gid = uid, .job = "job",
			  .run = "r", .rank = 0, .world = 2};
	commit_request(&o, req, dir, 2, timeout_ms, NULL);
}

/* Runs the loop until n answers came (the threadpool may be held meanwhile, so the loop is
 * never left blocked in a turn). */
static void run_until_answers(unsigned n)
{
	while (nanswers < n) {
		uv_run(&uvloop, UV_RUN_NOWAIT);
		usleep(1000);
	}
}

/* Runs the loop until the fake store saw n events. */
static void run_until_events(unsigned n)
{
	for (;;) {
		pthread_mutex_lock(&lock);
		unsigned have = nevents;
		pthread_mutex_unlock(&lock);
		if (have >= n)
			return;
		uv_run(&uvloop, UV_RUN_NOWAIT);
		usleep(1000);
	}
}

/* Index of event e ("+A"), or -1. */
static int event_at(const char *e)
{
	for (unsigned i = 0; i < nevents; i++)
		if (strcmp(events[i], e) == 0)
			return (int)i;
	return -1;
}

/* Asserts answer i: request req, code, text. */
static void assert_answer(unsigned i, uint64_t req, int code, const char *text)
{
	ck_assert_uint_lt(i, nanswers);
	ck_assert_uint_eq(answers[i].req, req);
	ck_assert_int_eq(answers[i].code, code);
	ck_assert_str_eq(answers[i].text, text);
}

/* A fresh loop, waiter layer (commits outlive their connection, as main.c wires it) and
 * registry. */
static void setup(void)
{
	ck_assert_int_eq(uv_loop_init(&uvloop), 0);
	ck_assert_int_eq(waiter_init(&uvloop), 0);
	waiter_handle(WAITER_COMMIT, commit_wait_end, 1);
	commit_init(&dsckptd);
	nsaves = nanswers = nevents = 0;
	held[0] = failing[0] = 0;
}

/* Everything answered, nothing left running; the loop closes. */
static void teardown(void)
{
	waiter_close();
	uv_run(&uvloop, UV_RUN_DEFAULT);
	ck_assert_uint_eq(commit_running(), 0);
	ck_assert_int_eq(uv_loop_close(&uvloop), 0);
}

/* A commit waits until every save of its directory, user and run is DURABLE. */
START_TEST(test_waits_for_durable)
{
	struct save *a1 = add_save("A", 1000, "r", LEVEL_ACCEPTED, 0);
	add_save("A", 1000, "r", LEVEL_DURABLE, 1);
	struct save *other = add_save("A", 1000, "q", LEVEL_ACCEPTED, 0);   /* another run */

	commit(1, 7, "A", 1000, -1);
	for (int i = 0; i < 20; i++)
		uv_run(&uvloop, UV_RUN_NOWAIT);
	ck_assert_uint_eq(nevents, 0);
	ck_assert_uint_eq(nanswers, 0);
	ck_assert_uint_eq(waiter_count(), 1);
	set_level(a1, LEVEL_SNAPSHOT, NULL);
	ck_assert_uint_eq(waiter_count(), 1);
	set_level(a1, LEVEL_DURABLE, NULL);
	run_until_answers(1);
	assert_answer(0, 7, 0, "A");
	ck_assert_uint_eq(answers[0].conn, 1);
	ck_assert_uint_eq(nevents, 2);
	ck_assert_int_eq(a1->level, LEVEL_COMMITTED);
	ck_assert_int_eq(saves[1].level, LEVEL_COMMITTED);
	ck_assert_int_eq(other->level, LEVEL_ACCEPTED);
}
END_TEST

/* A failed save fails the commit, naming it; nothing is written. */
START_TEST(test_failed_save)
{
	struct save *a1 = add_save("A", 1000, "r", LEVEL_ACCEPTED, 1);

	commit(1, 8, "A", 1000, -1);
	set_level(a1, LEVEL_FAILED, "disk full");
	ck_assert_uint_eq(nanswers, 1);
	assert_answer(0, 8, ERR_EFAILED, "save of A1 (rank 1) failed: disk full");
	ck_assert_uint_eq(waiter_count(), 0);
	ck_assert_uint_eq(nevents, 0);
}
END_TEST

/* A commit times out while it waits (0: on the loop's next turn); one that may run at once
 * does not. */
START_TEST(test_timeout)
{
	struct save *a1 = add_save("A", 1000, "r", LEVEL_ACCEPTED, 0);
	add_save("B", 1000, "r", LEVEL_DURABLE, 0);

	commit(1, 9, "A", 1000, 0);
	ck_assert_uint_eq(nanswers, 0);
	run_until_answers(1);
	assert_answer(0, 9, ERR_ETIMEDOUT, "timed out waiting for saves to be durable");
	set_level(a1, LEVEL_DURABLE, NULL);
	for (int i = 0; i < 20; i++)
		uv_run(&uvloop, UV_RUN_NOWAIT);
	ck_assert_uint_eq(nevents, 0);
	ck_assert_uint_eq(nanswers, 1);
	commit(1, 10, "B", 1000, 0);
	run_until_answers(2);
	assert_answer(1, 10, 0, "B");
}
END_TEST

/* A commit whose client left goes on (reply.c drops its answer by connection id). */
START_TEST(test_client_gone)
{
	struct save *a1 = add_save("A", 1000, "r", LEVEL_ACCEPTED, 0);

	commit(5, 11, "A", 1000, -1);
	waiter_conn_gone(5);
	ck_assert_uint_eq(nanswers, 0);
	set_level(a1, LEVEL_DURABLE, NULL);
	run_until_answers(1);
	assert_answer(0, 11, 0, "A");
	ck_assert_uint_eq(answers[0].conn, 5);
	ck_assert_int_eq(a1->level, LEVEL_COMMITTED);
}
END_TEST

/* One commit per user at a time: a user's second waits for its first to end, another
 * user's runs alongside; a failed store_commit is answered with its error. */
START_TEST(test_one_per_user)
{
	add_save("A", 1000, "r", LEVEL_DURABLE, 0);
	add_save("B", 1000, "r", LEVEL_DURABLE, 0);
	add_save("C", 2000, "r", LEVEL_DURABLE, 0);
	snprintf(held, sizeof(held), "A");
	snprintf(failing, sizeof(failing), "A");

	commit(1, 1, "A", 1000, -1);
	commit(2, 2, "B", 1000, -1);
	commit(3, 3, "C", 2000, -1);
	run_until_events(3);	/* +A, and C's start and end, in some order */
	run_until_answers(1);
	pthread_mutex_lock(&lock);
	ck_assert_int_ge(event_at("+A"), 0);
	ck_assert_int_ge(event_at("-C"), 0);
	ck_assert_int_lt(event_at("+B"), 0);	/* behind A, though its saves are durable */
	held[0] = 0;
	pthread_cond_broadcast(&released);
	pthread_mutex_unlock(&lock);
	run_until_answers(3);
	ck_assert_int_gt(event_at("+B"), event_at("-A"));
	assert_answer(0, 3, 0, "C");
	assert_answer(1, 1, ERR_EIO, "A: the disk is on fire");
	assert_answer(2, 2, 0, "B");
}
END_TEST

/* A directory that cannot be opened is answered at once; nothing is parked. */
START_TEST(test_bad_dir)
{
	commit(1, 12, "missing", 1000, -1);
	ck_assert_uint_eq(nanswers, 1);
	assert_answer(0, 12, ERR_ENOENT, "missing: no such directory");
	ck_assert_uint_eq(waiter_count(), 0);
}
END_TEST

/* A COMMIT of a new version in flight names its staging directory, which the daemon's own
 * commit may be exchanging with the tag right then (the old version under that name until
 * it is moved aside): the commit is of the version its saves went into, whatever the name
 * holds when it is opened. */
START_TEST(test_version_exchanged)
{
	struct owner o = {.conn = 1, .pid = 100, .uid = 1000, .gid = 1000, .job = "job",
			  .run = "r", .rank = 0, .world = 2};
	struct save *n = add_save("N", 1000, "r", LEVEL_ACCEPTED, 0);
	struct save *old = add_save(".N", 1000, "r", LEVEL_DURABLE, 0);  /* the name's now */
	struct store_dirid want = dirid_of("N");

	commit_request(&o, 14, ".N", 2, -1, &want);
	for (int i = 0; i < 20; i++)
		uv_run(&uvloop, UV_RUN_NOWAIT);
	ck_assert_uint_eq(nanswers, 0);	/* the version's save is not durable yet */
	set_level(n, LEVEL_DURABLE, NULL);
	run_until_answers(1);
	assert_answer(0, 14, 0, ".N");
	ck_assert_int_eq(n->level, LEVEL_COMMITTED);
	ck_assert_int_eq(old->level, LEVEL_DURABLE);
	/* Moved aside already: the tag's name is opened, for the same version. */
	struct save *m = add_save("M", 1000, "r", LEVEL_DURABLE, 0);
	want = dirid_of("M");
	commit_request(&o, 15, ".goneM", 2, -1, &want);
	run_until_answers(2);
	assert_answer(1, 15, 0, "M");
	ck_assert_int_eq(m->level, LEVEL_COMMITTED);
}
END_TEST

/* Shutdown answers a waiting commit ESHUTDOWN. */
START_TEST(test_shutdown)
{
	add_save("A", 1000, "r", LEVEL_ACCEPTED, 0);

	commit(1, 13, "A", 1000, 60000);
	waiter_close();
	ck_assert_uint_eq(nanswers, 1);
	assert_answer(0, 13, ERR_ESHUTDOWN, "daemon shutting down");
}
END_TEST

/* The suite. */
static Suite *commit_suite(void)
{
	Suite *s = suite_create("commit");
	TCase *tc = tcase_create("commit");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_waits_for_durable);
	tcase_add_test(tc, test_failed_save);
	tcase_add_test(tc, test_timeout);
	tcase_add_test(tc, test_client_gone);
	tcase_add_test(tc, test_one_per_user);
	tcase_add_test(tc, test_bad_dir);
	tcase_add_test(tc, test_shutdown);
	tcase_add_test(tc, test_version_exchanged);
	suite_add_tcase(s, tc);
	return s;
}

CHECK_MAIN(commit_suite)
