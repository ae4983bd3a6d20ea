/* check_peer_cap.c — peer_max_mib_per_s seen from outside (issue 35 item 2): two real
 * daemons, each in a network namespace of its own joined by veths (tests/netns.c), UCX on
 * TCP, one peer_secret_file, each capped at 4 MiB/s. A 2-rank job commits, rank 0's file of
 * 32 MiB on node 0 and rank 1's of 1 MiB on node 1; rank 0 reaches REPLICATED no sooner than
 * 32 MiB / 4 MiB/s less the bucket's one second of burst after its save began (a lower bound
 * that a busy machine only widens; the rate reached is printed), and `dsckptctl metrics`
 * says node 0 sent and node 1 received exactly rank 0's file's bytes. SKIP without root or
 * ip(8). */
#include "harness_daemon.h"
#include "harness_peer.h"
#include "../daemon/dsckptd.h"

#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define SECRET "cap-suite-secret-0123456789abcdef"
#define CAP_MIB 4
#define BIG (32 * MIB)
#define SMALL (1 * MIB)
#define WAIT_MS 180000

static struct netns ns;
static int usable;

START_TEST(test_cap_holds)
{
	char json[1024], scratch[256], dir[512];
	struct hdaemon n[2];
	dsckpt_conn_t *c[2];
	dsckpt_save_t *s[2];
	void *mem[2];
	struct stat st;

	if (!usable)
		return;
	netns_ucx_env();
	h_tmpdir(scratch, sizeof(scratch));
	const char *secret = hp_secret_file(scratch, 0, SECRET);
	for (int i = 0; i < 2; i++) {
		ck_assert_int_eq(netns_enter(&ns, (unsigned)i), 0);
		snprintf(json, sizeof(json), CHUNK_1M "\"host\": \"%s\", \"peer_secret_file\": "
			 "\"%s\", \"replica_cache_size\": 0.0625, \"peer_max_mib_per_s\": %d,",
			 ns.addr[i], secret, CAP_MIB);
		if (i == 0) {
			d_start(0.0625, json);
			n[0] = *D;
		} else {
			h_daemon_start_peer(&n[1], D, "n1", 0.0625, json);
		}
	}
	snprintf(dir, sizeof(dir), "%s/pj/step0", D->root);
	double t0 = now_mono();
	for (int r = 0; r < 2; r++) {
		char file[16];
		ck_assert_int_eq(dsckpt_connect(n[r].socket, &c[r]), 0);
		CK_DS(c[r], dsckpt_identify(c[r], "pj", r, 2));
		snprintf(file, sizeof(file), "rank%d", r);
		s[r] = save_pattern(c[r], dir, file, r ? SMALL : BIG, 40 + (uint64_t)r, &mem[r]);
	}
	for (int r = 0; r < 2; r++) {
		ck_assert_int_ge(dsckpt_wait(s[r], DSCKPT_DURABLE, WAIT_MS), DSCKPT_DURABLE);
		CK_DS(c[r], dsckpt_seal(c[r], dir));
	}
	int rc = dsckpt_wait(s[0], DSCKPT_REPLICATED, WAIT_MS);
	double secs = now_mono() - t0;
	ck_assert_msg(rc == DSCKPT_REPLICATED, "%s: %s", dsckpt_err_name(rc),
		      dsckpt_last_error(c[0]));
	ck_assert_int_eq(dsckpt_wait(s[1], DSCKPT_REPLICATED, WAIT_MS), DSCKPT_REPLICATED);

	ck_assert_int_eq(stat(h_path("%s/rank0.safetensors", dir), &st), 0);
	double mib = (double)st.st_size / MIB;
	printf("%.1f MiB replicated under a %d MiB/s cap in %.2f s from the save's start "
	       "(%.2f MiB/s)\n", mib, CAP_MIB, secs, mib / secs);
	ck_assert_msg(secs >= mib / CAP_MIB - 1.0, "%.1f MiB in %.2f s under %d MiB/s", mib, secs,
		      CAP_MIB);
	ck_assert_double_eq(hp_metric(n[0].socket, "peer_bytes_sent"), (double)st.st_size);
	ck_assert_double_eq(hp_metric(n[1].socket, "peer_bytes_received"), (double)st.st_size);
	ck_assert_int_eq(stat(h_path("%s/rank1.safetensors", dir), &st), 0);
	ck_assert_double_eq(hp_metric(n[1].socket, "peer_bytes_sent"), (double)st.st_size);

	for (int r = 0; r < 2; r++) {
		dsckpt_save_free(s[r]);
		dsckpt_host_free(mem[r]);
		dsckpt_close(c[r]);
	}
	ck_assert_int_eq(h_daemon_kill(&n[1], SIGTERM), 0);
	d_stop();
	h_rm_rf(scratch);
}
END_TEST

/* The suite. */
static Suite *peer_cap_suite(void)
{
	Suite *s = suite_create("peer_cap");
	TCase *tc = hp_case(s, "peer_cap", 2, &ns, &usable, 300);
	tcase_add_test(tc, test_cap_holds);
	return s;
}

CHECK_MAIN(peer_cap_suite)
