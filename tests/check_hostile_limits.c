/*
 * check_hostile_limits.c — one user holding more than its share: open saves, host regions
 * beyond the kernel's mapping limit, and floods of tensors in one save; each is refused with
 * ELIMIT naming its per-user limit, and the victim's save goes through.
 * Each test is one way an unprivileged trainer could attack a daemon running as root (DESIGN.md
 * §8), run by two real users (harness_hostile.h), and asserts what the daemon must do instead.
 * Without root every test says SKIP.
 */
#include "harness_hostile.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- 1. starvation by count ---- */

/* Attacker of test_starve_saves: SAVE_BEGIN without end until refused (1,100 at most);
 * n[1] counts the accepted ones, slot 1 holds the refusal. Keeps them until F_STOP. */
static int atk_saves(void *arg)
{
	struct res r;
	int fd = r_trainer("jobA", &r);

	if (fd < 0) {
		flag_set(F_READY);
		return say(1, 1, "HELLO: %s", r.msg);
	}
	for (int i = 0; i < 1100; i++) {
		int64_t save = r_begin(fd, h_path("%s/jobA/t1", D->root), h_path("f%d", i), &r);
		if (save < 0) {
			B->rc[1] = (int)save;
			say(1, 0, "%s", r.msg);
			break;
		}
		B->n[1]++;
	}
	flag_set(F_READY);
	flag_wait(F_STOP, 60000);
	close(fd);
	return 0;
}

/* Many open saves of one user (the daemon at RLIMIT_NOFILE 1024): limited per user, and
 * the victim's save goes through. */
START_TEST(test_starve_saves)
{
	HOSTILE_BEGIN("starvation: open saves");
	struct rlimit rl = {1024, 1024};
	struct vic v = {.n = 16 * MIB, .seed = 31, .wait_ms = 10000};

	ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
	hd_start(CACHE_32M, NULL);
	v.dir = h_path("%s/jobV/t1", D->root);
	pid_t ap = as_user_spawn(ATK, atk_saves, NULL, 90);
	ck_assert_msg(flag_wait(F_READY, 60000), "the attacker did not finish opening saves");
	int vc = as_user_wait(as_user_spawn(VIC, victim_main, &v, 20));
	flag_set(F_STOP);
	as_user_wait(ap);

	hd_alive("after one user held many saves open");
	victim_check(vc, &v, h_path("while the attacker held %lld saves open (its refusal: %s "
				    "'%s')", B->n[1], code_name(B->rc[1]), B->msg[1]));
	ck_assert_msg(B->rc[1] == DSCKPT_ELIMIT && strstr(B->msg[1], "max_saves_per_user") &&
			      B->n[1] == 256,
		      "the attacker opened %lld saves, then got %s '%s'; want ELIMIT naming "
		      "max_saves_per_user after 256", B->n[1], code_name(B->rc[1]), B->msg[1]);
	hd_stop();
}
END_TEST

/*
 * Attacker of test_starve_regions: registers max_map_count + 5000 host regions over 10
 * connections, one sealed 4 KiB memfd sent with each, 32 in flight per connection, until the
 * first refusal. n[1] counts accepted ones, n[2] is the target, slot 1 the refusal.
 */
static int atk_regions(void *arg)
{
	enum { NC = 10, WINDOW = 32 };
	long long mmc = 65530, target;
	FILE *f = fopen("/proc/sys/vm/max_map_count", "r");
	struct res r;
	int fds[NC];

	if (f) {
		if (fscanf(f, "%lld", &mmc) != 1)
			mmc = 65530;
		fclose(f);
	}
	target = mmc + 5000 < 300000 ? mmc + 5000 : 300000;
	B->n[2] = target;
	int mfd = memfd_pattern(4096, 41, 1);
	if (mfd < 0) {
		flag_set(F_READY);
		return say(2, 1, "memfd: %s", strerror(errno));
	}
	for (int c = 0; c < NC; c++) {
		if ((fds[c] = r_trainer("jobA", &r)) < 0) {
			flag_set(F_READY);
			return say(2, 2, "HELLO: %s", r.msg);
		}
	}
	long long per = (target + NC - 1) / NC;
	int stop = 0;
	for (int c = 0; c < NC && !stop; c++) {
		long long sent = 0, answered = 0;
		while (answered < sent || (!stop && sent < per)) {
			while (!stop && sent < per && sent - answered < WINDOW) {
				struct proto_out o;
				out_map(&o, PROTO_REGION_ADD, 3);
				proto_kv_u64(&o.pk, "region", (uint64_t)sent + 1);
				proto_kv_str(&o.pk, "kind", "host");
				proto_kv_u64(&o.pk, "size", 4096);
				if (raw_send(fds[c], &o, 1, &mfd, 1) < 0) {
					stop = 1;
					break;
				}
				sent++;
			}
			if (answered == sent)
				break;
			int rc = r_recv(fds[c], NULL, &r, 20000);
			answered++;
			if (rc == 0) {
				B->n[1]++;
			} else if (!stop) {
				stop = 1;
				B->rc[1] = rc;
				say(1, 0, "%s", r.msg);
			}
			if (r.type < 0)
				break;
		}
	}
	flag_set(F_READY);
	flag_wait(F_STOP, 120000);
	return 0;
}

/* More host regions than the kernel allows mappings: limited per user, and the victim's
 * save goes through. */
START_TEST(test_starve_regions)
{
	HOSTILE_BEGIN("starvation: host regions");
	struct vic v = {.n = 16 * MIB, .seed = 32, .wait_ms = 10000};

	hd_start(CACHE_32M, NULL);
	v.dir = h_path("%s/jobV/t1", D->root);
	double t0 = now_s();
	pid_t ap = as_user_spawn(ATK, atk_regions, NULL, 150);
	ck_assert_msg(flag_wait(F_READY, 120000), "the attacker did not finish its regions");
	double took = now_s() - t0;
	int vc = as_user_wait(as_user_spawn(VIC, victim_main, &v, 20));
	flag_set(F_STOP);
	int ac = as_user_wait(ap);

	ck_assert_msg(ac == 0, "attacker: %s: %s", status_str(ac), B->msg[2]);
	hd_alive("after one user registered many regions");
	victim_check(vc, &v, h_path("while the attacker held %lld host regions (registered in "
				    "%.1f s; its refusal: %s '%s')", B->n[1], took,
				    code_name(B->rc[1]), B->msg[1]));
	ck_assert_msg(B->rc[1] == DSCKPT_ELIMIT && strstr(B->msg[1], "max_regions_per_user") &&
			      B->n[1] <= 4096,
		      "the attacker registered %lld of %lld regions, then got %s '%s'; want ELIMIT "
		      "naming max_regions_per_user by 4096", B->n[1], B->n[2],
		      code_name(B->rc[1]), B->msg[1]);
	hd_stop();
}
END_TEST

/* ---- 2. tensors ---- */

/*
 * Sends SAVE_ADDs to save of count tensors named by their index zero-padded to namelen
 * characters, batch at a time, from index first; returns 0, or the first refusal's code
 * (res holds its message). *accepted: the daemon's tensor total after the last reply.
 */
static int add_named(int fd, int64_t save, long long first, long long count, int namelen,
		     int batch, long long *accepted, struct res *res)
{
	char name[PROTO_MAX_NAME + 1];

	for (long long i = first; i < first + count; i += batch) {
		long long n = first + count - i < batch ? first + count - i : batch;
		struct proto_out o;
		out_map(&o, PROTO_SAVE_ADD, 2);
		proto_kv_u64(&o.pk, "save", (uint64_t)save);
		proto_key(&o.pk, "tensors");
		msgpack_pack_array(&o.pk, (uint32_t)n);
		for (long long k = i; k < i + n; k++) {
			snprintf(name, sizeof(name), "%0*lld", namelen, k);
			pack_u8(&o.pk, name, 1, (uint64_t)(k % (long long)MIB), 1);
		}
		int rc = r_call(fd, &o, 0, NULL, "tensors", res, 60000);
		if (rc < 0)
			return rc;
		*accepted = res->v;
	}
	return 0;
}

/*
 * Attacker of test_tensor_flood. First 300,000 one-byte tensors with 16-character names into
 * jobA/t0 (rc[6], n[6]: the refusal and the count accepted), whose header stays far below
 * safetensors' limit. Then 1,000,000 with 200-character names into jobA/t1 (rc[1], n[1]).
 * Then as many 512-character
 * names as accepted, up to 262,144, into jobA/t2 (again into t3, without the refused batch,
 * when one was refused: rc[2], n[2]), then SAVE_END (rc[3]), WAIT DURABLE (n[3]) and COMMIT
 * (rc[4]) of that tag.
 */
static int atk_flood(void *arg)
{
	struct res r;
	int fd = r_trainer("jobA", &r);
	int mfd = memfd_pattern(MIB, 53, 1);

	if (fd < 0 || mfd < 0 || r_region(fd, 1, mfd, MIB, &r) < 0)
		return say(5, 1, "HELLO/REGION_ADD: %s", r.msg);
	int64_t save = r_begin(fd, h_path("%s/jobA/t0", D->root), "rank0", &r);
	if (save < 0)
		return say(5, 2, "SAVE_BEGIN t0: %s", r.msg);
	B->rc[6] = add_named(fd, save, 0, 300000, 16, 50000, &B->n[6], &r);
	say(6, 0, "%s", r.msg);
	if (B->rc[6] == 0)
		r_abort(fd, save, &r);
	if ((save = r_begin(fd, h_path("%s/jobA/t1", D->root), "rank0", &r)) < 0)
		return say(5, 2, "SAVE_BEGIN t1: %s", r.msg);
	B->rc[1] = add_named(fd, save, 0, 1000000, 200, 50000, &B->n[1], &r);
	say(1, 0, "%s", r.msg);
	if (B->rc[1] == 0)
		r_abort(fd, save, &r);	/* all taken: that is the failure, no need to write it */

	const char *tag = h_path("%s/jobA/t2", D->root);
	if ((save = r_begin(fd, tag, "rank0", &r)) < 0)
		return say(5, 3, "SAVE_BEGIN t2: %s", r.msg);
	B->rc[2] = add_named(fd, save, 0, 262144, 512, 25000, &B->n[2], &r);
	say(2, 0, "%s", r.msg);
	if (B->rc[2] < 0) {
		/* The refused batch abandoned t2: what was accepted before it, again. */
		long long again = 0;
		tag = h_path("%s/jobA/t3", D->root);
		if ((save = r_begin(fd, tag, "rank0", &r)) < 0)
			return say(5, 4, "SAVE_BEGIN t3: %s", r.msg);
		if (B->n[2] > 0 && add_named(fd, save, 0, B->n[2], 512, 25000, &again, &r) < 0)
			return say(5, 5, "adding the %lld accepted tensors again: %s", B->n[2],
				   r.msg);
	}
	struct proto_out o;
	out_map(&o, PROTO_SAVE_END, 1);
	proto_kv_u64(&o.pk, "save", (uint64_t)save);
	B->rc[3] = r_call(fd, &o, 0, NULL, NULL, &r, 60000);
	say(3, 0, "%s", r.msg);
	if (B->rc[3] == 0) {
		B->n[3] = r_wait(fd, save, DSCKPT_DURABLE, 90000, &r);
		if (B->n[3] == DSCKPT_DURABLE) {
			r_commit_send(fd, tag);
			B->rc[4] = r_recv(fd, NULL, &r, 60000);
			say(4, 0, "%s", r.msg);
		} else {
			B->rc[4] = DSCKPT_EFAILED;
			say(4, 0, "not durable: %s", r.msg);
		}
	}
	close(fd);
	return 0;
}

/* Too many tensors in one save: refused with ELIMIT (max_tensors_per_save) before SAVE_END,
 * a million with long names too, and whatever save of max-length names is accepted also
 * commits. */
START_TEST(test_tensor_flood)
{
	HOSTILE_BEGIN("tensor flood");
	hd_start(CACHE_32M, NULL);
	int ac = as_user_wait(as_user_spawn(ATK, atk_flood, NULL, 170));
	ck_assert_msg(ac == 0, "attacker: %s: %s", status_str(ac), B->msg[5]);
	hd_alive("after the tensor flood");
	ck_assert_msg(B->rc[6] == DSCKPT_ELIMIT && strstr(B->msg[6], "max_tensors_per_save") &&
			      B->n[6] <= 262144,
		      "one save took %lld tensors with 16-character names (then %s '%s'); want "
		      "ELIMIT naming max_tensors_per_save by 262,144 (1,000,000 with 200-character "
		      "names: %lld taken, %s; the save of %lld 512-character names: SAVE_END %s, "
		      "COMMIT %s '%s')", B->n[6], code_name(B->rc[6]), B->msg[6], B->n[1],
		      code_name(B->rc[1]), B->n[2], code_name(B->rc[3]), code_name(B->rc[4]),
		      B->msg[4]);
	/* 262,144 names of 200 characters make a header of about 130 MB: the header limit
	 * may refuse them first, which is as good. */
	ck_assert_msg(B->n[1] <= 262144 && ((B->rc[1] == DSCKPT_ELIMIT &&
					     strstr(B->msg[1], "max_tensors_per_save")) ||
					    (B->rc[1] < 0 && strstr(B->msg[1], "header"))),
		      "one save took %lld tensors with 200-character names (then %s '%s'); want a "
		      "refusal by 262,144 naming max_tensors_per_save or the header limit",
		      B->n[1], code_name(B->rc[1]), B->msg[1]);
	ck_assert_msg(B->rc[3] == 0 && B->n[3] == DSCKPT_DURABLE && B->rc[4] == 0,
		      "a save of %lld tensors with 512-character names (%s '%s' while adding) was "
		      "accepted but did not commit: SAVE_END %s '%s', WAIT %lld, COMMIT %s '%s'",
		      B->n[2], code_name(B->rc[2]), B->msg[2], code_name(B->rc[3]), B->msg[3],
		      B->n[3], code_name(B->rc[4]), B->msg[4]);
	hd_stop();
}
END_TEST

/* Builds the suite: one test case per group, each with a time limit that fits it. */
static Suite *hostile_limits_suite(void)
{
	Suite *s = suite_create("hostile limits");
	h_add_case(s, "starve saves", test_starve_saves, 120, 1);
	h_add_case(s, "starve regions", test_starve_regions, 180, 1);
	h_add_case(s, "tensor flood", test_tensor_flood, 200, 1);
	return s;
}

CHECK_MAIN(hostile_limits_suite)
