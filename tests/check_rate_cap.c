/* check_rate_cap.c — rate_cap.c, the token bucket that peer_max_mib_per_s and
 * upload_max_mib_per_s take their bytes from: a cap of R MiB/s lets N bytes through no
 * sooner than N / R seconds less the bucket's one second of burst, however many threads take
 * from it at once; an idle bucket fills to one second, not more; no cap (0, or none) never
 * waits. Only lower bounds are asserted (a busy machine only makes things slower); the rates
 * reached are printed. */
#include "harness.h"
#include "../daemon/dsckptd.h"

#include <check.h>
#include <pthread.h>
#include <stdio.h>

#define MIB (1024.0 * 1024.0)
#define PIECE (64 * 1024)
#define THREADS 4
#define SLACK 0.01    /* seconds: the clocks' rounding, never the machine's speed */

/* What each taker takes: bytes in PIECE pieces from cap. */
struct taker {
	struct rate_cap *cap;
	size_t bytes;
};

/* A thread taking its bytes, a piece at a time. */
static void *take_all(void *arg)
{
	struct taker *t = arg;

	for (size_t done = 0; done < t->bytes; done += PIECE)
		rate_cap_take(t->cap, PIECE);
	return NULL;
}

/* Takes bytes in all from cap over n threads at once; the seconds it took. */
static double take_threads(struct rate_cap *cap, size_t bytes, unsigned n)
{
	pthread_t th[THREADS];
	struct taker t = { cap, bytes / n };
	double t0 = now_mono();

	for (unsigned i = 0; i < n; i++)
		ck_assert_int_eq(pthread_create(&th[i], NULL, take_all, &t), 0);
	for (unsigned i = 0; i < n; i++)
		pthread_join(th[i], NULL);
	return now_mono() - t0;
}

/* 16 MiB through a 4 MiB/s cap shared by four threads: no sooner than 4 s less the burst. */
START_TEST(test_cap_shared)
{
	struct rate_cap *cap = rate_cap_new(4);
	size_t bytes = 16 * (size_t)MIB;

	ck_assert_ptr_nonnull(cap);
	double s = take_threads(cap, bytes, THREADS);
	printf("16 MiB through a 4 MiB/s cap, 4 threads: %.2f s (%.2f MiB/s)\n", s,
	       bytes / MIB / s);
	ck_assert_msg(s >= 16.0 / 4 - 1 - SLACK, "%.3f s", s);
	rate_cap_free(cap);
}
END_TEST

/* An idle bucket holds one second: after 2.5 s idle, 12 MiB at 4 MiB/s take 2 s at least
 * (a bucket that kept filling would let 10 MiB through at once). */
START_TEST(test_idle_burst_bounded)
{
	struct rate_cap *cap = rate_cap_new(4);
	size_t bytes = 12 * (size_t)MIB;

	ck_assert_ptr_nonnull(cap);
	h_sleep_ms(2500);
	double s = take_threads(cap, bytes, 1);
	printf("12 MiB through a 4 MiB/s cap idle 2.5 s: %.2f s (%.2f MiB/s)\n", s,
	       bytes / MIB / s);
	ck_assert_msg(s >= 12.0 / 4 - 1 - SLACK, "%.3f s", s);
	rate_cap_free(cap);
}
END_TEST

/* A fractional cap (0.5 MiB/s) holds too: 1.5 MiB no sooner than 2 s. */
START_TEST(test_cap_fraction)
{
	struct rate_cap *cap = rate_cap_new(0.5);
	size_t bytes = 3 * (size_t)MIB / 2;

	ck_assert_ptr_nonnull(cap);
	double s = take_threads(cap, bytes, 2);
	printf("1.5 MiB through a 0.5 MiB/s cap, 2 threads: %.2f s\n", s);
	ck_assert_msg(s >= 1.5 / 0.5 - 1 - SLACK, "%.3f s", s);
	rate_cap_free(cap);
}
END_TEST

/* No cap: 0 MiB/s and NULL let a GiB through without a wait (a wait of its size would be
 * 256 s at least at any cap a test would set, so the case's time limit tells). */
START_TEST(test_no_cap)
{
	struct rate_cap *cap = rate_cap_new(0);

	ck_assert_ptr_nonnull(cap);
	for (int i = 0; i < 1024; i++) {
		rate_cap_take(cap, (size_t)MIB);
		rate_cap_take(NULL, (size_t)MIB);
	}
	rate_cap_free(cap);
	rate_cap_free(NULL);
}
END_TEST

/* The suite. */
static Suite *rate_cap_suite(void)
{
	Suite *s = suite_create("rate_cap");
	TCase *tc = tcase_create("rate_cap");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_cap_shared);
	tcase_add_test(tc, test_idle_burst_bounded);
	tcase_add_test(tc, test_cap_fraction);
	tcase_add_test(tc, test_no_cap);
	suite_add_tcase(s, tc);
	return s;
}

CHECK_MAIN(rate_cap_suite)
