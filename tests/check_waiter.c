/*
 * check_waiter.c — the waiter layer (daemon/waiter.c) alone, on a real libuv loop, with a
 * recording handler per tag instead of wait.c, load.c and commit.c: a published level ends
 * exactly the waits it satisfies (reached or failed, that tag and key only), in the order they
 * were parked; deadlines end waits in deadline order and a wait without one keeps no timer
 * running; a departed connection's waits are dropped unless their tag outlives it; handlers
 * may park and publish again; closing drops everything and leaves the loop closable.
 */
#include "../daemon/dsckptd.h"
#include "harness.h"

#include <check.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#define MAX_ENDS 64

static uv_loop_t uvloop;
static struct waiter_end ends[MAX_ENDS];   /* every end the handlers saw, in order */
static unsigned nends;
static int repark;                         /* the handler parks its request again once */

/* Records an end. */
static void on_end(const struct waiter_end *e)
{
	ck_assert_uint_lt(nends, MAX_ENDS);
	ends[nends++] = *e;
	if (repark && e->how == WAITER_REACHED) {
		repark = 0;
		struct waiter_on on = {.tag = e->on.tag, .key = e->on.key, .level = e->level + 1};
		ck_assert_int_eq(waiter_add(e->conn, e->req + 100, &on, -1), 0);
		waiter_publish(WAITER_LOAD, 9, 5);	/* publishing from a handler is fine */
	}
}

/* Parks request req of conn on tag's key until level. */
static void park(uint64_t conn, uint64_t req, enum waiter_tag tag, uint64_t key, int level,
		 int64_t timeout_ms)
{
	struct waiter_on on = {.tag = tag, .key = key, .level = level};
	ck_assert_int_eq(waiter_add(conn, req, &on, timeout_ms), 0);
}

/* Asserts that end i is request req ended how (at level, when reached). */
static void assert_end(unsigned i, uint64_t req, enum waiter_how how, int level)
{
	ck_assert_uint_lt(i, nends);
	ck_assert_uint_eq(ends[i].req, req);
	ck_assert_int_eq(ends[i].how, how);
	if (how == WAITER_REACHED)
		ck_assert_int_eq(ends[i].level, level);
}

/* A fresh loop and layer; commits outlive their connection, as in the daemon. */
static void setup(void)
{
	ck_assert_int_eq(uv_loop_init(&uvloop), 0);
	ck_assert_int_eq(waiter_init(&uvloop), 0);
	waiter_handle(WAITER_SAVE, on_end, 0);
	waiter_handle(WAITER_LOAD, on_end, 0);
	waiter_handle(WAITER_COMMIT, on_end, 1);
	nends = 0;
	repark = 0;
}

/* Closes the layer and the loop: nothing may be left open. */
static void teardown(void)
{
	waiter_close();
	uv_run(&uvloop, UV_RUN_DEFAULT);
	ck_assert_int_eq(uv_loop_close(&uvloop), 0);
}

/* A level ends the waits it reaches, of that tag and key only, in parking order. */
START_TEST(test_publish_reaches)
{
	park(1, 10, WAITER_SAVE, 5, 3, -1);	/* DURABLE */
	park(1, 11, WAITER_SAVE, 5, 2, -1);	/* SNAPSHOT */
	park(2, 12, WAITER_SAVE, 5, 4, -1);	/* COMMITTED */
	park(1, 13, WAITER_SAVE, 6, 2, -1);	/* another save */
	park(1, 14, WAITER_LOAD, 5, 2, -1);	/* a load of the same id */
	waiter_publish(WAITER_SAVE, 5, 1);
	ck_assert_uint_eq(nends, 0);
	waiter_publish(WAITER_SAVE, 5, 3);
	ck_assert_uint_eq(nends, 2);
	assert_end(0, 10, WAITER_REACHED, 3);
	assert_end(1, 11, WAITER_REACHED, 3);
	ck_assert(waiter_parked(WAITER_SAVE, 5));
	ck_assert(waiter_parked(WAITER_SAVE, 6));
	ck_assert(waiter_parked(WAITER_LOAD, 5));
	ck_assert(!waiter_parked(WAITER_COMMIT, 5));
	ck_assert_uint_eq(waiter_count(), 3);
	waiter_publish(WAITER_SAVE, 5, 4);
	assert_end(2, 12, WAITER_REACHED, 4);
	ck_assert(!waiter_parked(WAITER_SAVE, 5));
	ck_assert_uint_eq(waiter_count(), 2);
}
END_TEST

/* A negative level (failed) ends every wait on its key, whatever level it waited for. */
START_TEST(test_publish_failed)
{
	park(1, 20, WAITER_SAVE, 7, 4, -1);
	park(1, 21, WAITER_SAVE, 7, 2, -1);
	park(1, 22, WAITER_SAVE, 8, 2, -1);
	waiter_publish(WAITER_SAVE, 7, LEVEL_FAILED);
	ck_assert_uint_eq(nends, 2);
	assert_end(0, 20, WAITER_REACHED, LEVEL_FAILED);
	assert_end(1, 21, WAITER_REACHED, LEVEL_FAILED);
	ck_assert_uint_eq(waiter_count(), 1);
}
END_TEST

/* Deadlines end waits in deadline order, 0 on the loop's next turn; a wait without a
 * deadline keeps no timer alive, so the loop returns once only such waits are left. */
START_TEST(test_deadlines)
{
	park(1, 30, WAITER_SAVE, 1, 3, 80);
	park(1, 31, WAITER_SAVE, 2, 3, -1);
	park(1, 32, WAITER_SAVE, 3, 3, 20);
	park(1, 33, WAITER_LOAD, 4, 2, 0);
	ck_assert_uint_eq(nends, 0);	/* 0 is not "now": the next turn */
	uv_run(&uvloop, UV_RUN_DEFAULT);
	ck_assert_uint_eq(nends, 3);
	assert_end(0, 33, WAITER_TIMEOUT, 0);
	assert_end(1, 32, WAITER_TIMEOUT, 0);
	assert_end(2, 30, WAITER_TIMEOUT, 0);
	ck_assert(waiter_parked(WAITER_SAVE, 2));
	ck_assert(!uv_loop_alive(&uvloop));
	/* A wait that ended early leaves no timer behind either. */
	park(1, 34, WAITER_SAVE, 5, 3, 60000);
	ck_assert(uv_loop_alive(&uvloop));
	waiter_publish(WAITER_SAVE, 5, 3);
	ck_assert(!uv_loop_alive(&uvloop));
	assert_end(3, 34, WAITER_REACHED, 3);
}
END_TEST

/* A departed connection's waits are dropped, others' stay; a commit's outlives it. */
START_TEST(test_conn_gone)
{
	park(1, 40, WAITER_SAVE, 1, 3, -1);
	park(2, 41, WAITER_SAVE, 1, 3, -1);
	park(1, 42, WAITER_LOAD, 2, 2, 60000);
	park(1, 43, WAITER_COMMIT, 3, 1, -1);
	waiter_conn_gone(1);
	ck_assert_uint_eq(nends, 2);
	assert_end(0, 40, WAITER_DROPPED, 0);
	assert_end(1, 42, WAITER_DROPPED, 0);
	ck_assert(!uv_loop_alive(&uvloop));	/* the dropped deadline is forgotten */
	waiter_publish(WAITER_COMMIT, 3, 1);
	assert_end(2, 43, WAITER_REACHED, 1);
	ck_assert_uint_eq(ends[2].conn, 1);
	waiter_publish(WAITER_SAVE, 1, 3);
	assert_end(3, 41, WAITER_REACHED, 3);
	ck_assert_uint_eq(ends[3].conn, 2);
}
END_TEST

/* A handler may park again and publish: the new wait is not ended by the publication that
 * ended the old one. */
START_TEST(test_handler_reenters)
{
	park(1, 50, WAITER_SAVE, 1, 2, -1);
	park(1, 51, WAITER_LOAD, 9, 5, -1);
	repark = 1;
	waiter_publish(WAITER_SAVE, 1, 2);
	ck_assert_uint_eq(nends, 2);
	assert_end(0, 50, WAITER_REACHED, 2);
	assert_end(1, 51, WAITER_REACHED, 5);
	ck_assert(waiter_parked(WAITER_SAVE, 1));	/* request 150, until level 3 */
	waiter_publish(WAITER_SAVE, 1, 3);
	assert_end(2, 150, WAITER_REACHED, 3);
}
END_TEST

/* Closing drops every wait, commits too. */
START_TEST(test_close_drops)
{
	park(1, 60, WAITER_SAVE, 1, 2, 1000);
	park(2, 61, WAITER_COMMIT, 2, 1, -1);
	waiter_close();
	ck_assert_uint_eq(nends, 2);
	assert_end(0, 60, WAITER_DROPPED, 0);
	assert_end(1, 61, WAITER_DROPPED, 0);
	ck_assert_uint_eq(waiter_count(), 0);
}
END_TEST

/* The suite. */
static Suite *waiter_suite(void)
{
	Suite *s = suite_create("waiter");
	TCase *tc = tcase_create("waiter");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, test_publish_reaches);
	tcase_add_test(tc, test_publish_failed);
	tcase_add_test(tc, test_deadlines);
	tcase_add_test(tc, test_conn_gone);
	tcase_add_test(tc, test_handler_reenters);
	tcase_add_test(tc, test_close_drops);
	suite_add_tcase(s, tc);
	return s;
}

CHECK_MAIN(waiter_suite)
