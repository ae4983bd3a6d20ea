/*
 * check_daemon_early.c — early saves (DSCKPT_SAVE_EARLY) against a real daemon: SAVE_BEGIN
 * goes out at once and its reply is read at save_end or by the connection's next request.
 * Saves from a plan, with loose tensors over several frames and with blobs are written
 * exactly; other requests, saves and early saves in between on the one connection each get
 * their own reply; a refused begin (a file being saved, a directory outside the roots) is
 * told at save_end and at every later call with the daemon's reason, and the connection goes
 * on; an early save freed or closed before its end leaves nothing behind.
 */
#include "harness_daemon.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define NT 16        /* tensors of the plan */
#define TB 4096      /* bytes of each */

/* Checks dir/file.safetensors: the plan's tensors hold mem's bytes. */
static void check_planned(const char *dir, const char *file, const uint8_t *mem)
{
	struct stf f;
	int64_t shape = TB;
	char name[16];

	stf_load(&f, h_path("%s/%s.safetensors", dir, file));
	for (int i = 0; i < NT; i++) {
		snprintf(name, sizeof(name), "p.%d", i);
		const uint8_t *b = stf_tensor(&f, name, "U8", &shape, 1, TB);
		ck_assert_msg(memcmp(b, mem + (size_t)i * TB, TB) == 0, "%s/%s: wrong bytes", dir,
			      name);
	}
	stf_free(&f);
}

/* Ends s, waits DURABLE and frees it. */
static void end_durable(dsckpt_conn_t *c, dsckpt_save_t *s)
{
	CK_DS(c, dsckpt_save_end(s));
	wait_level(c, s, DSCKPT_DURABLE, 30000);
	dsckpt_save_free(s);
}

/*
 * Early saves from a plan with a blob, and of 20,000 loose tensors (SAVE_ADD frames after the
 * reply is read); a plain save, a STATUS-like wait and a second early save come between an
 * early save's begin and its end, and the two early saves end in the other order. Every file
 * holds its bytes.
 */
START_TEST(test_early_saves)
{
	enum { MANY = 20000 };
	d_start(CACHE_16M, CHUNK_1M);
	dsckpt_conn_t *c = conn_open("early", 0, 1);
	uint8_t *mem = dsckpt_host_alloc((size_t)NT * TB), *bytes = dsckpt_host_alloc(MANY);
	dsckpt_tensor_t t[NT];
	char names[NT][16];
	int64_t shape, one = 1;
	dsckpt_plan_t *p;
	dsckpt_save_t *a, *b, *plain;
	void *pm;
	const char *d1 = h_path("%s/early/s1", D->root), *d2 = h_path("%s/early/s2", D->root);

	ck_assert_int_eq(dsckpt_save_begin_flags(c, d1, "rank0", DSCKPT_SAVE_EARLY |
						 DSCKPT_SAVE_DEFER, &a), DSCKPT_EINVAL);
	ck_assert_ptr_nonnull(strstr(dsckpt_last_error(c), "not both"));
	ck_assert_int_eq(dsckpt_save_begin_flags(c, d1, "rank0", 4, &a), DSCKPT_EINVAL);
	ck_assert_ptr_nonnull(strstr(dsckpt_last_error(c), "0x4"));
	shape = TB;
	plan_specs(t, names, NT, &shape, mem);
	h_pattern_fill(mem, (size_t)NT * TB, 11);
	h_pattern_fill(bytes, MANY, 12);
	CK_DS(c, dsckpt_plan_create(c, t, NT, &p));

	CK_DS(c, dsckpt_save_begin_flags(c, d1, "rank0", DSCKPT_SAVE_EARLY, &a));
	CK_DS(c, dsckpt_add_plan(a, p));
	CK_DS(c, dsckpt_add_blob(a, "meta", "early", 5));
	/* Another save on the connection reads a's reply first, then its own. */
	plain = save_pattern(c, d1, "rank1", 5000, 13, &pm);
	wait_level(c, plain, DSCKPT_DURABLE, 30000);
	dsckpt_save_free(plain);
	dsckpt_host_free(pm);
	/* A second early save: posting it reads a's reply if still unread. */
	CK_DS(c, dsckpt_save_begin_flags(c, d2, "rank0", DSCKPT_SAVE_EARLY, &b));
	for (int i = 0; i < MANY; i++) {
		char name[16];
		snprintf(name, sizeof(name), "m.%d", i);
		CK_DS(c, dsckpt_add_tensor(b, name, "U8", &one, 1, bytes + i, 1));
	}
	end_durable(c, b);
	end_durable(c, a);

	check_planned(d1, "rank0", mem);
	check_pattern_file(d1, "rank1", 5000, 13);
	struct stf f;
	stf_load(&f, h_path("%s/rank0.safetensors", d2));
	for (int i = 0; i < MANY; i += 1999) {
		char name[16];
		snprintf(name, sizeof(name), "m.%d", i);
		ck_assert_uint_eq(*stf_tensor(&f, name, "U8", &one, 1, 1), bytes[i]);
	}
	stf_free(&f);
	size_t mlen;
	char *meta = h_read_file(h_path("%s/rank0.meta", d1), &mlen);
	ck_assert_msg(meta && memmem(meta, mlen, "early", 5), "%s/rank0.meta: no blob", d1);
	free(meta);
	ck_assert_int_eq(has_partial(D->root), 0);
	dsckpt_plan_free(p);
	dsckpt_host_free(mem);
	dsckpt_host_free(bytes);
	dsckpt_close(c);
	d_stop();
}
END_TEST

/*
 * Begins the daemon refuses, posted early: a file being saved (EBUSY) and a directory through
 * a symlink out of the roots. Tensors are still added (the reply is not read yet); save_end
 * and every later call on the save return the daemon's code and reason; nothing is created
 * outside; the connection serves the next save.
 */
START_TEST(test_early_refused)
{
	d_start(CACHE_16M, CHUNK_1M);
	dsckpt_conn_t *c = conn_open("early", 0, 1);
	uint8_t *mem = dsckpt_host_alloc((size_t)NT * TB);
	int64_t shape = TB;
	dsckpt_save_t *first, *s;
	const char *dir = h_path("%s/early/busy", D->root);
	const char *outside = h_path("%s/outside", D->dir);

	h_pattern_fill(mem, (size_t)NT * TB, 21);
	CK_DS(c, dsckpt_save_begin(c, dir, "rank0", &first));
	CK_DS(c, dsckpt_save_begin_flags(c, dir, "rank0", DSCKPT_SAVE_EARLY, &s));
	CK_DS(c, dsckpt_add_tensor(s, "w", "U8", &shape, 1, mem, TB));
	ck_assert_int_eq(dsckpt_save_end(s), DSCKPT_EBUSY);
	ck_assert_ptr_nonnull(strstr(dsckpt_last_error(c), "already being saved"));
	ck_assert_int_eq(dsckpt_add_tensor(s, "x", "U8", &shape, 1, mem, TB), DSCKPT_EBUSY);
	ck_assert_ptr_nonnull(strstr(dsckpt_last_error(c), "already being saved"));
	ck_assert_int_eq(dsckpt_save_end(s), DSCKPT_EBUSY);
	ck_assert_int_eq(dsckpt_wait(s, DSCKPT_SNAPSHOT, 0), DSCKPT_ESTATE);
	dsckpt_save_free(s);
	CK_DS(c, dsckpt_add_tensor(first, "w", "U8", &shape, 1, mem, TB));
	end_durable(c, first);

	ck_assert_int_eq(mkdir(outside, 0755), 0);
	ck_assert_int_eq(symlink(outside, h_path("%s/escape", D->root)), 0);
	CK_DS(c, dsckpt_save_begin_flags(c, h_path("%s/escape/t1", D->root), "rank0",
					 DSCKPT_SAVE_EARLY, &s));
	CK_DS(c, dsckpt_add_tensor(s, "w", "U8", &shape, 1, mem, TB));
	int rc = dsckpt_save_end(s);
	ck_assert_msg(rc < 0 && rc != DSCKPT_EPIPE, "save_end through a symlink: %d", rc);
	ck_assert_msg(dsckpt_last_error(c)[0] != 0, "no reason given");
	dsckpt_save_free(s);
	ck_assert_int_eq(h_system("test -z \"$(ls -A '%s')\"", outside), 0);

	save_and_commit(c, h_path("%s/early/next", D->root), 22);
	dsckpt_host_free(mem);
	dsckpt_close(c);
	d_stop();
}
END_TEST

/*
 * An early save freed before its end: the daemon forgets it (the same file saves again at
 * once, no .partial stays). One whose connection is closed before its end: save_end says the
 * connection was closed, and freeing it after is safe.
 */
START_TEST(test_early_dropped)
{
	d_start(CACHE_16M, CHUNK_1M);
	dsckpt_conn_t *c = conn_open("early", 0, 1);
	uint8_t *mem = dsckpt_host_alloc(TB);
	int64_t shape = TB;
	dsckpt_save_t *s;
	const char *dir = h_path("%s/early/dropped", D->root);

	h_pattern_fill(mem, TB, 31);
	CK_DS(c, dsckpt_save_begin_flags(c, dir, "rank0", DSCKPT_SAVE_EARLY, &s));
	CK_DS(c, dsckpt_add_tensor(s, "w", "U8", &shape, 1, mem, TB));
	dsckpt_save_free(s);
	CK_DS(c, dsckpt_save_begin_flags(c, dir, "rank0", DSCKPT_SAVE_EARLY, &s));
	CK_DS(c, dsckpt_add_tensor(s, "w", "U8", &shape, 1, mem, TB));
	end_durable(c, s);
	ck_assert_int_eq(has_partial(dir), 0);

	CK_DS(c, dsckpt_save_begin_flags(c, h_path("%s/early/closed", D->root), "rank0",
					 DSCKPT_SAVE_EARLY, &s));
	dsckpt_close(c);
	ck_assert_int_eq(dsckpt_save_end(s), DSCKPT_EPIPE);
	dsckpt_save_free(s);

	/* The daemon aborted the closed connection's save: a new connection saves the file. */
	c = conn_open("early", 0, 1);
	CK_DS(c, dsckpt_save_begin_flags(c, h_path("%s/early/closed", D->root), "rank0",
					 DSCKPT_SAVE_EARLY, &s));
	CK_DS(c, dsckpt_add_tensor(s, "w", "U8", &shape, 1, mem, TB));
	end_durable(c, s);
	ck_assert_int_eq(has_partial(D->root), 0);
	dsckpt_host_free(mem);
	dsckpt_close(c);
	d_stop();
}
END_TEST

static Suite *early_suite(void)
{
	Suite *s = suite_create("early");
	h_add_case(s, "saves", test_early_saves, 60, 1);
	h_add_case(s, "refused", test_early_refused, 30, 1);
	h_add_case(s, "dropped", test_early_dropped, 30, 1);
	return s;
}

CHECK_MAIN(early_suite)
