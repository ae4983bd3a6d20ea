/*
 * check_lib_fail.c — libdsckpt's failures against a scripted fake daemon (fake_peer.c):
 * calls out of order, an ERROR reply, a version mismatch, a peer that hangs up or answers
 * the wrong request, and a WAIT that ends FAILED or too early.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fake_peer.h"
#include "harness.h"

/* Calls out of order are refused locally; names and paths are checked before sending. */
START_TEST(test_fake_state)
{
	struct fake f;
	dsckpt_conn_t *c;
	dsckpt_save_t *s;

	fake_start(&f);
	ck_assert_int_eq(dsckpt_connect(f.path, &c), 0);
	ck_assert_int_eq(dsckpt_save_begin(c, "/ck/j/t", "r0", &s), DSCKPT_ESTATE);
	ck_assert_int_eq(dsckpt_commit(c, "/ck/j/t", 0), DSCKPT_ESTATE);
	ck_assert_int_eq(dsckpt_identify(c, "", 0, 1), DSCKPT_EINVAL);
	ck_assert_int_eq(dsckpt_identify(c, "j", 2, 2), DSCKPT_EINVAL);
	ck_assert_int_eq(dsckpt_identify(c, "j", -1, 2), DSCKPT_EINVAL);
	ck_assert_int_eq(dsckpt_identify(c, "j", 0, 65537), DSCKPT_EINVAL);
	ck_assert_int_eq(dsckpt_identify(c, "j", 1, 2), 0);
	ck_assert_int_eq(dsckpt_identify(c, "j", 1, 2), DSCKPT_ESTATE);
	ck_assert_int_eq(dsckpt_save_begin(c, "rel/dir", "r0", &s), DSCKPT_EINVAL);
	ck_assert_int_eq(dsckpt_save_begin(c, "/ck/j/t", ".hidden", &s), DSCKPT_EINVAL);
	ck_assert_int_eq(dsckpt_save_begin(c, "/ck/j/t", "a/b", &s), DSCKPT_EINVAL);
	ck_assert_int_eq(dsckpt_save_begin(c, "/ck/j/t", "", &s), DSCKPT_EINVAL);
	ck_assert_int_eq(dsckpt_save_begin(c, "/ck/j/t", NULL, &s), DSCKPT_EINVAL);
	ck_assert_int_eq(dsckpt_save_begin(c, NULL, "r0", &s), DSCKPT_EINVAL);
	ck_assert_ptr_null(s);
	ck_assert_int_eq(dsckpt_save_begin(c, "/ck/j/t", "r0", &s), 0);
	/* The connection outlives dsckpt_close while a save holds it. */
	dsckpt_close(c);
	ck_assert_int_eq(dsckpt_save_end(s), DSCKPT_EPIPE);
	ck_assert_int_eq(dsckpt_wait(s, DSCKPT_SNAPSHOT, -1), DSCKPT_ESTATE);
	dsckpt_save_free(s);
	char *log = fake_finish(&f);
	ck_assert_int_eq(fake_count(log, "hello"), 1);
	ck_assert_int_eq(fake_count(log, "save_begin"), 1);
	free(log);
}
END_TEST

/* An ERROR reply gives its code and message. */
START_TEST(test_fake_error_reply)
{
	struct fake f;
	dsckpt_conn_t *c;
	dsckpt_save_t *s;

	fake_opts.begin_error = 1;
	c = fake_connect(&f);
	ck_assert_int_eq(dsckpt_save_begin(c, "/etc/x", "r0", &s), DSCKPT_EACCES);
	ck_assert_str_eq(dsckpt_last_error(c), "not under an allowed root");
	/* Deferred, the refusal comes from the call that sends SAVE_BEGIN: here save_end. */
	ck_assert_int_eq(dsckpt_save_begin_flags(c, "/etc/x", "r0", DSCKPT_SAVE_DEFER, &s), 0);
	ck_assert_int_eq(dsckpt_add_blob(s, "b", "x", 1), 0);
	ck_assert_int_eq(dsckpt_save_end(s), DSCKPT_EACCES);
	ck_assert_str_eq(dsckpt_last_error(c), "not under an allowed root");
	ck_assert_int_eq(dsckpt_save_end(s), DSCKPT_ESTATE);
	dsckpt_save_free(s);
	/* Early, SAVE_BEGIN goes at once and its refusal is read by save_end, then told again. */
	ck_assert_int_eq(dsckpt_save_begin_flags(c, "/etc/x", "r0", DSCKPT_SAVE_EARLY, &s), 0);
	ck_assert_int_eq(dsckpt_add_blob(s, "b", "x", 1), 0);
	ck_assert_int_eq(dsckpt_save_end(s), DSCKPT_EACCES);
	ck_assert_str_eq(dsckpt_last_error(c), "not under an allowed root");
	ck_assert_int_eq(dsckpt_add_blob(s, "c", "x", 1), DSCKPT_EACCES);
	ck_assert_str_eq(dsckpt_last_error(c), "not under an allowed root");
	dsckpt_save_free(s);
	/* The connection goes on. */
	ck_assert_int_eq(dsckpt_commit(c, "/ck/j/t", 0), 0);
	dsckpt_close(c);
	free(fake_finish(&f));
}
END_TEST

/* A version mismatch names both versions and ends the connection. */
START_TEST(test_fake_version)
{
	struct fake f;
	dsckpt_conn_t *c;

	fake_opts.hello_version = 1;
	fake_start(&f);
	ck_assert_int_eq(dsckpt_connect(f.path, &c), 0);
	ck_assert_int_eq(dsckpt_identify(c, "j", 0, 1), DSCKPT_EVERSION);
	char want[160];
	snprintf(want, sizeof(want), "protocol version mismatch: dsckptd speaks protocol 9, this "
		 "libdsckpt speaks protocol %d", PROTO_VERSION);
	ck_assert_msg(strstr(dsckpt_last_error(c), want), "%s", dsckpt_last_error(c));
	ck_assert_int_eq(dsckpt_identify(c, "j", 0, 1), DSCKPT_EPIPE);
	dsckpt_close(c);
	free(fake_finish(&f));
}
END_TEST

/* A peer that hangs up: EPIPE now and for every later request. */
START_TEST(test_fake_hangup)
{
	struct fake f;
	dsckpt_conn_t *c;
	dsckpt_save_t *s;
	int64_t shape[1] = {10};

	fake_opts.close_on_end = 1;
	c = fake_connect(&f);
	ck_assert_int_eq(dsckpt_save_begin(c, "/ck/j/t", "r0", &s), 0);
	ck_assert_int_eq(dsckpt_add_tensor(s, "t", "U8", shape, 1, "0123456789", 10), 0);
	ck_assert_int_eq(dsckpt_save_end(s), DSCKPT_EPIPE);
	ck_assert_ptr_nonnull(strstr(dsckpt_last_error(c), f.path));
	ck_assert_int_eq(dsckpt_save_end(s), DSCKPT_ESTATE);
	ck_assert_int_eq(dsckpt_commit(c, "/ck/j/t", 0), DSCKPT_EPIPE);
	ck_assert_ptr_nonnull(strstr(dsckpt_last_error(c), "closed the connection"));
	dsckpt_save_free(s);
	dsckpt_close(c);
	char *log = fake_finish(&f);
	ck_assert_int_eq(fake_count(log, "region_del"), 0);
	free(log);
}
END_TEST

/* A reply to the wrong request is a protocol error that ends the connection. */
START_TEST(test_fake_bad_id)
{
	struct fake f;
	dsckpt_conn_t *c;

	fake_opts.bad_id = 1;
	fake_start(&f);
	ck_assert_int_eq(dsckpt_connect(f.path, &c), 0);
	ck_assert_int_eq(dsckpt_identify(c, "j", 0, 1), DSCKPT_EPROTO);
	ck_assert_int_eq(dsckpt_commit(c, "/x", 0), DSCKPT_ESTATE);
	ck_assert_int_eq(dsckpt_identify(c, "j", 0, 1), DSCKPT_EPIPE);
	dsckpt_close(c);
	free(fake_finish(&f));
}
END_TEST

/* WAIT: FAILED gives EFAILED with the reason; a lower level is a timeout. */
START_TEST(test_fake_wait)
{
	struct fake f;
	dsckpt_conn_t *c;
	dsckpt_save_t *s;
	dsckpt_progress_t p;

	fake_opts.wait_level = _i == 0 ? DSCKPT_FAILED : DSCKPT_ACCEPTED;
	c = fake_connect(&f);
	ck_assert_int_eq(dsckpt_save_begin(c, "/ck/j/t", "r0", &s), 0);
	ck_assert_int_eq(dsckpt_save_end(s), 0);
	if (_i == 0) {
		ck_assert_int_eq(dsckpt_wait(s, DSCKPT_DURABLE, -1), DSCKPT_EFAILED);
		ck_assert_str_eq(dsckpt_last_error(c), "disk full");
		ck_assert_int_eq(dsckpt_save_progress(s, &p), 0);
		ck_assert_int_eq(p.level, DSCKPT_FAILED);
	} else {
		ck_assert_int_eq(dsckpt_wait(s, DSCKPT_DURABLE, 10), DSCKPT_ETIMEDOUT);
		ck_assert_int_eq(dsckpt_wait(s, DSCKPT_ACCEPTED, 10), DSCKPT_ACCEPTED);
	}
	dsckpt_save_free(s);
	dsckpt_close(c);
	free(fake_finish(&f));
}
END_TEST

/* The suite. */
static Suite *lib_fail_suite(void)
{
	Suite *s = suite_create("lib_fail");
	TCase *tc = tcase_create("fake-peer");
	tcase_set_timeout(tc, 20);
	tcase_add_test(tc, test_fake_state);
	tcase_add_test(tc, test_fake_error_reply);
	tcase_add_test(tc, test_fake_version);
	tcase_add_test(tc, test_fake_hangup);
	tcase_add_test(tc, test_fake_bad_id);
	tcase_add_loop_test(tc, test_fake_wait, 0, 2);
	suite_add_tcase(s, tc);
	return s;
}

CHECK_MAIN(lib_fail_suite)
