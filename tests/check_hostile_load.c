/*
 * check_hostile_load.c — loads against hostile users (DESIGN.md §8): a user must not read
 * another's checkpoint through the daemon, whether by naming it, through a symbolic or hard
 * link in a directory of its own, or while the daemon still holds it in its cache; and a
 * destination that refuses the daemon's writes fails that load alone. Two real users
 * (harness_hostile.h); without root every test says SKIP.
 */
#include "harness_hostile.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define NV (256 * 1024)  /* bytes of the victim's tensor "t" */

/* Attacker of test_steal: a save of its own into jobA/t1, then links to the victim's file
 * beside it, and a load of each way in. rc[1..4]: the victim's file named, through a
 * symbolic link, through a hard link (EEXIST when the kernel refused to make one), and its own
 * file (0: loaded, its own bytes). */
static int atk_steal(void *arg)
{
	struct res r;
	const char *vdir = h_path("%s/jobV/t1", D->root), *adir = h_path("%s/jobA/t1", D->root);
	int fd = r_trainer("jobA", &r);
	int mfd = memfd_pattern(NV, 60, 1);
	if (fd < 0 || mfd < 0 || r_region(fd, 1, mfd, NV, &r) < 0)
		return say(1, 1, "HELLO/REGION_ADD: %s", r.msg);
	int64_t save = r_begin(fd, adir, "rank0", &r);
	if (save < 0 || r_end(fd, save, NV, 0, &r) < 0 ||
	    r_wait(fd, save, DSCKPT_DURABLE, 20000, &r) != DSCKPT_DURABLE)
		return say(1, 2, "own save: %s", r.msg);
	/* Fresh destination bytes: whatever a load writes is what the daemon gave. */
	uint8_t *p = mmap(NULL, NV, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
	if (p == MAP_FAILED)
		return say(1, 3, "mmap: %s", strerror(errno));
	memset(p, 0, NV);
	B->rc[1] = r_load(fd, vdir, "rank0", NV, &r);
	symlink(h_path("%s/rank0.safetensors", vdir), h_path("%s/sym.safetensors", adir));
	B->rc[2] = r_load(fd, adir, "sym", NV, &r);
	if (link(h_path("%s/rank0.safetensors", vdir), h_path("%s/hard.safetensors", adir)) == 0)
		B->rc[3] = r_load(fd, adir, "hard", NV, &r);
	else
		B->rc[3] = DSCKPT_EEXIST;
	memset(p, 0, NV);
	B->rc[4] = r_load(fd, adir, "rank0", NV, &r);
	B->n[4] = (long long)h_pattern_diff(p, NV, 60);
	munmap(p, NV);
	close(fd);
	return 0;
}

/* The victim's committed checkpoint, resident in the daemon's cache: the attacker cannot
 * load it by name (EACCES), through a symbolic link (EACCES) or a hard link (refused by the
 * kernel, or EACCES: the file is not the attacker's); its own file loads with its own bytes. */
START_TEST(test_steal)
{
	HOSTILE_BEGIN("load another user's checkpoint");
	struct vic v = {.n = NV, .seed = 70, .commit = 1, .wait_ms = 10000};

	hd_start(CACHE_32M, NULL);
	v.dir = h_path("%s/jobV/t1", D->root);
	victim_check(as_user(VIC, victim_main, &v), &v, "");
	int ac = as_user(ATK, atk_steal, NULL);
	ck_assert_msg(ac == 0, "attacker: %s: %s", status_str(ac), B->msg[1]);
	ck_assert_msg(B->rc[1] == DSCKPT_EACCES, "by name: %s", code_name(B->rc[1]));
	ck_assert_msg(B->rc[2] == DSCKPT_EACCES, "symbolic link: %s", code_name(B->rc[2]));
	ck_assert_msg(B->rc[3] == DSCKPT_EACCES || B->rc[3] == DSCKPT_EEXIST, "hard link: %s",
		      code_name(B->rc[3]));
	ck_assert_msg(B->rc[4] == 0 && B->n[4] == NV, "own file: %s, differs at %lld",
		      code_name(B->rc[4]), B->n[4]);
	victim_check(0, &v, "after the attacks");
	hd_alive("after the attacks");
	hd_stop();
}
END_TEST

/* Attacker of test_sealed_dst: loads its own file into a memfd sealed against writes after it
 * was registered; rc[1]: the load's outcome, msg[1] its message. Then into a region sealed
 * once the load was accepted (rc[2]: what the load ends with). */
static int atk_sealed(void *arg)
{
	struct res r;
	const char *adir = h_path("%s/jobA/t1", D->root);
	int fd = r_trainer("jobA", &r);
	int mfd = memfd_pattern(NV, 61, 1);
	if (fd < 0 || mfd < 0 || r_region(fd, 1, mfd, NV, &r) < 0)
		return say(1, 1, "HELLO/REGION_ADD: %s", r.msg);
	int64_t save = r_begin(fd, adir, "rank0", &r);
	if (save < 0 || r_end(fd, save, NV, 0, &r) < 0 ||
	    r_wait(fd, save, DSCKPT_DURABLE, 20000, &r) != DSCKPT_DURABLE)
		return say(1, 2, "own save: %s", r.msg);
	if (fcntl(mfd, F_ADD_SEALS, F_SEAL_WRITE) != 0)
		return say(1, 3, "F_SEAL_WRITE: %s", strerror(errno));
	B->rc[1] = r_load(fd, adir, "rank0", NV, &r);
	snprintf(B->msg[1], sizeof(B->msg[1]), "%s", r.msg);
	/* Sealed between LOAD_END and the daemon's writes: the load fails, nothing else. */
	int m2 = memfd_pattern(NV, 62, 1);
	struct proto_out o;
	if (m2 < 0 || r_region(fd, 2, m2, NV, &r) < 0)
		return say(1, 4, "second region: %s", r.msg);
	out_map(&o, PROTO_LOAD_BEGIN, 2);
	proto_kv_str(&o.pk, "dir", adir);
	proto_kv_str(&o.pk, "file", "rank0");
	if (r_call(fd, &o, 0, NULL, "load", &r, 10000) != 0)
		return say(1, 5, "LOAD_BEGIN: %s", r.msg);
	int64_t load = r.v;
	out_map(&o, PROTO_LOAD_END, 2);
	proto_kv_u64(&o.pk, "load", (uint64_t)load);
	proto_key(&o.pk, "tensors");
	msgpack_pack_array(&o.pk, 1);
	pack_u8(&o.pk, "t", 2, 0, NV);
	int rc = r_call(fd, &o, 0, NULL, "level", &r, 10000);
	fcntl(m2, F_ADD_SEALS, F_SEAL_WRITE);	/* races the daemon's writes */
	if (rc == 0) {
		out_map(&o, PROTO_LOAD_WAIT, 2);
		proto_kv_u64(&o.pk, "load", (uint64_t)load);
		proto_kv_i64(&o.pk, "timeout_ms", 20000);
		rc = r_call(fd, &o, 0, NULL, "level", &r, 30000);
		B->rc[2] = rc != 0 ? rc : r.v == 2 ? 0 : DSCKPT_EFAILED;
	} else {
		B->rc[2] = rc;
	}
	close(fd);
	return 0;
}

/* A destination that refuses writes (a memfd sealed with F_SEAL_WRITE): refused with EPERM
 * before any byte moves, or, sealed while the load runs, that load fails; the daemon goes
 * on, the victim saves as ever. */
START_TEST(test_sealed_dst)
{
	HOSTILE_BEGIN("load into a write-sealed memfd");
	struct vic v = {.n = NV, .seed = 71, .commit = 1, .wait_ms = 10000};

	hd_start(CACHE_32M, NULL);
	int ac = as_user(ATK, atk_sealed, NULL);
	ck_assert_msg(ac == 0, "attacker: %s: %s", status_str(ac), B->msg[1]);
	ck_assert_msg(B->rc[1] == DSCKPT_EPERM && strstr(B->msg[1], "sealed against writing"),
		      "load into a sealed memfd: %s: %s", code_name(B->rc[1]), B->msg[1]);
	/* Sealed while the load runs: it either finished first or failed; never more. */
	ck_assert_msg(B->rc[2] == 0 || B->rc[2] == DSCKPT_EFAILED, "sealed during the load: %s",
		      code_name(B->rc[2]));
	hd_alive("after the sealed destination");
	v.dir = h_path("%s/jobV/t1", D->root);
	victim_check(as_user(VIC, victim_main, &v), &v, "after the sealed destination");
	hd_stop();
}
END_TEST

/* The suite. */
static Suite *hostile_load_suite(void)
{
	Suite *s = suite_create("hostile load");
	h_add_case(s, "steal", test_steal, 60, 1);
	h_add_case(s, "sealed destination", test_sealed_dst, 60, 1);
	return s;
}

CHECK_MAIN(hostile_load_suite)
