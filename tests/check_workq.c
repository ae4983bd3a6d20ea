/*
 * check_workq.c — the worker → loop completion queue (daemon/workq.c) on a real libuv loop:
 * items pushed from many threads all run once, on the loop thread, in push order per thread;
 * events pushed to a queued item arrive together in one call; closing runs what is pending,
 * even from inside a callback, and nothing runs twice.
 */
#include "../daemon/dsckptd.h"
#include "harness.h"

#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#define THREADS 8
#define PER_THREAD 2000

/* One completion: which thread pushed it, its place in that thread's pushes, and how often
 * and with which events it ran. */
struct item {
	struct workq_item link;
	int thread;
	int seq;
	int runs;
	unsigned events;
};

static uv_loop_t uvloop;
static struct workq *q;
static struct item items[THREADS][PER_THREAD];
static int next_seq[THREADS];      /* (loop) the seq each thread's next item must have */
static int ran;                    /* (loop) items run */
static int out_of_order;           /* (loop) items run before an earlier one of their thread */
static int off_loop;               /* (loop) items run on another thread than the loop's */
static pthread_t loop_thread;
static int close_at = -1;          /* ran count at which a callback closes the queue */

/* The callback: records the run and checks the thread it runs on and the order. */
static void on_item(struct workq_item *it, unsigned events)
{
	struct item *x = (struct item *)((char *)it - offsetof(struct item, link));

	x->runs++;
	x->events |= events;
	if (!pthread_equal(pthread_self(), loop_thread))
		off_loop++;
	if (x->seq != next_seq[x->thread])
		out_of_order++;
	next_seq[x->thread] = x->seq + 1;
	if (++ran == close_at) {
		struct workq *closing = q;
		q = NULL;
		workq_close(closing);	/* a stop from inside a completion */
	}
}

/* A fresh loop and queue; every item zeroed and numbered. */
static void setup(void)
{
	char err[ERRLEN];

	log_init("check_workq", LOG_LVL_ERROR);
	ck_assert_int_eq(uv_loop_init(&uvloop), 0);
	loop_thread = pthread_self();
	memset(items, 0, sizeof(items));
	memset(next_seq, 0, sizeof(next_seq));
	ran = out_of_order = off_loop = 0;
	close_at = -1;
	for (int t = 0; t < THREADS; t++)
		for (int i = 0; i < PER_THREAD; i++)
			items[t][i] = (struct item){.thread = t, .seq = i};
	ck_assert_msg(workq_open(&q, &uvloop, on_item, err, sizeof(err)) == 0, "%s", err);
}

/* Worker thread: pushes its items in order, with event bit 1. */
static void *pusher(void *arg)
{
	int t = (int)(intptr_t)arg;

	for (int i = 0; i < PER_THREAD; i++)
		workq_push(q, &items[t][i].link, 1);
	return NULL;
}

/* Starts THREADS pushers. */
static void start_pushers(pthread_t *th)
{
	for (int t = 0; t < THREADS; t++)
		ck_assert_int_eq(pthread_create(&th[t], NULL, pusher, (void *)(intptr_t)t), 0);
}

/* Every item ran exactly once, with its one event, in order, on the loop thread. */
static void expect_all_once(void)
{
	ck_assert_int_eq(ran, THREADS * PER_THREAD);
	ck_assert_int_eq(out_of_order, 0);
	ck_assert_int_eq(off_loop, 0);
	for (int t = 0; t < THREADS; t++)
		for (int i = 0; i < PER_THREAD; i++) {
			ck_assert_int_eq(items[t][i].runs, 1);
			ck_assert_uint_eq(items[t][i].events, 1);
		}
}

/* Closes the loop once the queue's handle is closed (its close callback runs). */
static void close_loop(void)
{
	uv_run(&uvloop, UV_RUN_NOWAIT);
	ck_assert_int_eq(uv_loop_close(&uvloop), 0);
}

/* Items pushed from many threads while the loop runs: each runs once, in order, on the loop
 * (the async sends coalesce; the loop takes whatever is queued each time). */
START_TEST(test_many_threads)
{
	pthread_t th[THREADS];

	start_pushers(th);
	while (ran < THREADS * PER_THREAD)
		uv_run(&uvloop, UV_RUN_ONCE);
	for (int t = 0; t < THREADS; t++)
		pthread_join(th[t], NULL);
	expect_all_once();
	workq_close(q);
	expect_all_once();	/* nothing again at close */
	close_loop();
}
END_TEST

/* Events pushed to an item still queued arrive together in one call; pushed after it ran,
 * in a call of their own. */
START_TEST(test_events_coalesce)
{
	struct item *x = &items[0][0];

	workq_push(q, &x->link, 1);
	workq_push(q, &x->link, 4);
	workq_push(q, &items[0][1].link, 2);
	workq_run(q);
	ck_assert_int_eq(x->runs, 1);
	ck_assert_uint_eq(x->events, 5);
	ck_assert_int_eq(items[0][1].runs, 1);
	ck_assert_uint_eq(items[0][1].events, 2);
	workq_run(q);	/* nothing pushed since: nothing runs */
	ck_assert_int_eq(ran, 2);
	x->seq = 2;	/* its next run comes after items[0][1] */
	workq_push(q, &x->link, 8);
	uv_run(&uvloop, UV_RUN_ONCE);	/* through the async handle this time */
	ck_assert_int_eq(x->runs, 2);
	ck_assert_uint_eq(x->events, 13);
	ck_assert_int_eq(out_of_order, 0);
	workq_close(q);
	close_loop();
}
END_TEST

/* Items pushed by threads that are gone, the loop never run: closing runs each once. */
START_TEST(test_close_runs_pending)
{
	pthread_t th[THREADS];

	start_pushers(th);
	for (int t = 0; t < THREADS; t++)
		pthread_join(th[t], NULL);
	ck_assert_int_eq(ran, 0);
	workq_close(q);
	expect_all_once();
	close_loop();
}
END_TEST

/* A callback that closes the queue (the engine stopped from a final event): the close runs
 * the rest of the batch, and the batch it interrupted runs nothing twice. */
START_TEST(test_close_from_callback)
{
	pthread_t th[THREADS];

	start_pushers(th);
	for (int t = 0; t < THREADS; t++)
		pthread_join(th[t], NULL);
	close_at = 10;
	workq_run(q);
	ck_assert_ptr_null(q);	/* it did close */
	expect_all_once();
	close_loop();
}
END_TEST

/* The suite. */
static Suite *workq_suite(void)
{
	Suite *s = suite_create("workq");
	TCase *tc = tcase_create("workq");

	tcase_add_checked_fixture(tc, setup, NULL);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_many_threads);
	tcase_add_test(tc, test_events_coalesce);
	tcase_add_test(tc, test_close_runs_pending);
	tcase_add_test(tc, test_close_from_callback);
	suite_add_tcase(s, tc);
	return s;
}

CHECK_MAIN(workq_suite)
