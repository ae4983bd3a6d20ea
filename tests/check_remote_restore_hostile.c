/*
 * check_remote_restore_hostile.c — restores from a remote tier against a hostile user
 * (DESIGN.md §8, issue 33.7): the victim's committed tag lives only in the root's file://
 * tier (the node was replaced: empty root, fresh daemon). The attacker names it in a load, in
 * a PREFETCH of the tag and of the victim's job (its remote latest): each refused (EACCES),
 * and nothing of it appears in the local tier or the daemon's cache. The victim then loads
 * its own tag: its bytes, the pulled files its own and private. Two real users
 * (harness_hostile.h); without root the test says SKIP.
 */
#include "harness_hostile.h"

#include <check.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define NV (3 * 1024 * 1024)  /* bytes of the victim's tensor "t": three cache chunks */

/* PREFETCH of dir (with wait): 0 or the refusal's code. */
static int r_prefetch(int fd, const char *dir, struct res *res)
{
	struct proto_out o;

	out_map(&o, PROTO_PREFETCH, 2);
	proto_kv_str(&o.pk, "dir", dir);
	proto_kv_bool(&o.pk, "wait", 1);
	return r_call(fd, &o, 0, NULL, NULL, res, 30000);
}

/* The attacker: rc[1] its load of the victim's remote tag, rc[2] a PREFETCH of that tag,
 * rc[3] of the victim's job (its remote latest); msg[1..3] their messages. */
static int atk_remote(void *arg)
{
	struct res r;
	const char *vdir = h_path("%s/jobV/t1", D->root);
	int fd = r_trainer("jobA", &r);
	int mfd = memfd_pattern(NV, 1, 1);

	(void)arg;
	if (fd < 0 || mfd < 0 || r_region(fd, 1, mfd, NV, &r) < 0)
		return say(1, 1, "HELLO/REGION_ADD: %s", r.msg);
	B->rc[1] = r_load(fd, vdir, "rank0", NV, &r);
	snprintf(B->msg[1], sizeof(B->msg[1]), "%s", r.msg);
	B->rc[2] = r_prefetch(fd, vdir, &r);
	snprintf(B->msg[2], sizeof(B->msg[2]), "%s", r.msg);
	B->rc[3] = r_prefetch(fd, h_path("%s/jobV", D->root), &r);
	snprintf(B->msg[3], sizeof(B->msg[3]), "%s", r.msg);
	close(fd);
	return 0;
}

/* The victim on the replacement node: rc[4] its load of its own tag, n[4] where its bytes
 * first differ from what it saved (NV: nowhere). */
static int vic_restore(void *arg)
{
	struct res r;
	uint64_t seed = *(uint64_t *)arg;
	int fd = r_trainer("jobV", &r);
	int mfd = memfd_pattern(NV, 99, 1);

	if (fd < 0 || mfd < 0 || r_region(fd, 1, mfd, NV, &r) < 0)
		return say(4, 1, "HELLO/REGION_ADD: %s", r.msg);
	B->rc[4] = r_load(fd, h_path("%s/jobV/t1", D->root), "rank0", NV, &r);
	snprintf(B->msg[4], sizeof(B->msg[4]), "%s", r.msg);
	uint8_t *p = mmap(NULL, NV, PROT_READ, MAP_SHARED, mfd, 0);
	if (p == MAP_FAILED)
		return say(4, 2, "mmap: %s", strerror(errno));
	B->n[4] = (long long)h_pattern_diff(p, NV, seed);
	munmap(p, NV);
	close(fd);
	return 0;
}

/* The cache's bytes held by resident files, as dsckptctl metrics --json says. */
static long long resident_bytes(void)
{
	char *out = NULL;
	long long n = -1;

	ck_assert_int_eq(ctl(&out, "metrics --json"), 0);
	const char *k = strstr(out, "\"cache_resident\":");
	if (k)
		n = atoll(k + strlen("\"cache_resident\":"));
	free(out);
	return n;
}

/* The victim's tag, only in the remote tier of a replaced node: refused to the attacker with
 * nothing of it put where the attacker could read it; loaded by the victim. */
START_TEST(test_steal_remote)
{
	HOSTILE_BEGIN("restore another user's remote-only tag");
	struct vic v = {.n = NV, .seed = 71, .commit = 1, .wait_ms = 10000};
	uid_t vuid;
	gid_t vgid;
	struct stat st;

	hd_start(CACHE_32M, NULL);
	v.dir = h_path("%s/jobV/t1", D->root);
	victim_check(as_user(VIC, victim_main, &v), &v, "");
	const char *shared = h_path("%s/shared", D->dir);
	ck_assert_int_eq(h_system("mkdir -p %s && cp -a %s/jobV %s/", shared, D->root, shared), 0);
	/* The replacement node: the daemon SIGKILLed, the root empty, the file tier configured. */
	d_kill(SIGKILL);
	h_rm_rf(D->root);
	ck_assert_int_eq(mkdir(D->root, 0755), 0);
	ck_assert_int_eq(h_system("sed -i 's#\"allowed_roots\": \\[\"%s\"\\]#\"allowed_roots\": "
				  "[{\"path\": \"%s\", \"remote\": \"file://%s\"}]#' %s", D->root,
				  D->root, shared, D->config), 0);
	ck_assert(h_file_has(D->config, "file://"));
	d_restart(0);

	int ac = as_user(ATK, atk_remote, NULL);
	ck_assert_msg(ac == 0, "attacker: %s: %s", status_str(ac), B->msg[1]);
	ck_assert_msg(B->rc[1] == DSCKPT_EACCES, "load: %s: %s", code_name(B->rc[1]), B->msg[1]);
	ck_assert_msg(B->rc[2] == DSCKPT_EACCES, "prefetch of the tag: %s: %s",
		      code_name(B->rc[2]), B->msg[2]);
	ck_assert_msg(B->rc[3] == DSCKPT_EACCES, "prefetch of the job: %s: %s",
		      code_name(B->rc[3]), B->msg[3]);
	ck_assert_msg(!h_exists(h_path("%s/jobV", D->root)), "the victim's job appeared locally");
	ck_assert_int_eq(resident_bytes(), 0);

	ac = as_user(VIC, vic_restore, &v.seed);
	ck_assert_msg(ac == 0, "victim: %s: %s", status_str(ac), B->msg[4]);
	ck_assert_msg(B->rc[4] == 0 && B->n[4] == NV, "victim's load: %s: %s, differs at %lld",
		      code_name(B->rc[4]), B->msg[4], B->n[4]);
	user_ids(VIC, &vuid, &vgid);
	ck_assert_int_eq(stat(h_path("%s/jobV/t1/rank0.safetensors", D->root), &st), 0);
	ck_assert_uint_eq(st.st_uid, vuid);
	ck_assert_uint_eq(st.st_mode & 0077, 0);
	ck_assert_int_eq(stat(h_path("%s/jobV", D->root), &st), 0);
	ck_assert_uint_eq(st.st_uid, vuid);
	hd_alive("after the attacks");
	hd_stop();
}
END_TEST

/* The suite. */
static Suite *remote_restore_hostile_suite(void)
{
	Suite *s = suite_create("remote_restore_hostile");
	TCase *tc = tcase_create("remote_restore_hostile");
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_steal_remote);
	suite_add_tcase(s, tc);
	return s;
}

CHECK_MAIN(remote_restore_hostile_suite)
