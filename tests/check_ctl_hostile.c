/*
 * check_ctl_hostile.c — dsckptctl rm and prune where another user planted things (DESIGN.md
 * §8): in a job directory everyone may write (mode 1777, as a shared scratch space is), the
 * attacker (dsckpt-atk) plants a link named like a tag that points at the victim's own files,
 * and a tag of its own whose files are links to the victim's file and directory. The victim
 * (dsckpt-vic) prunes and removes there; root removes the attacker's tag while the attacker
 * swaps a directory inside it for a link to the victim's directory, over and over. No file of
 * the victim outside the job directory may be touched. Without root every test says SKIP.
 */
#include "harness_hostile.h"

#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The victim's precious things outside the job directory: a tag-like directory with a
 * manifest, a file and a subdirectory with a file. */
static char precious[300];

/* Makes the victim's precious directory. */
static void make_precious(void)
{
	snprintf(precious, sizeof(precious), "%s/vichome", D->dir);
	user_dir(precious, VIC, 0755);
	ck_assert_int_eq(h_system("cd '%s' && echo m > MANIFEST.json && echo w > "
				  "rank0.safetensors && mkdir sub && echo s > sub/keep && chown -R "
				  VIC " .", precious), 0);
}

/* Fails the test unless every precious file is still there. */
static void check_precious(const char *when)
{
	static const char *const names[] = {"MANIFEST.json", "rank0.safetensors", "sub/keep"};
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		ck_assert_msg(h_exists(h_path("%s/%s", precious, names[i])), "%s/%s is gone %s",
			      precious, names[i], when);
}

/* What a dsckptctl child runs: the argument string, output to a file. */
struct ctlrun {
	const char *args;
	const char *out;
};

/* Runs dsckptctl as the calling user (a child of as_user); its exit status. */
static int ctl_child(void *arg)
{
	const struct ctlrun *r = arg;
	char cmd[2048];
	snprintf(cmd, sizeof(cmd), "%s -s '%s' %s >'%s' 2>&1", h_bin("dsckptctl"), D->socket,
		 r->args, r->out);
	int st = system(cmd);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 100;
}

/* Runs dsckptctl args as user; its exit status, its output in *out (malloc'd). */
static int ctl_as(const char *user, const char *args, char **out)
{
	const char *file = h_path("%s/out/%s.txt", D->dir, user);
	struct ctlrun r = {args, file};
	unlink(file);
	int rc = as_user(user, ctl_child, &r);
	*out = h_read_file(file, NULL);
	if (!*out)
		*out = strdup("");
	return rc;
}

/* Attacker: saves and commits tags t1 and t2 of its job jobA through the daemon (so it owns
 * jobA), then plants there a link "a1" to the victim's precious directory, its own
 * committed-looking tag "a2" (the oldest) holding links to the precious file and directory,
 * an uncommitted tag "a5" (mode 0777) with a link to the precious file, and turns `latest`
 * into a link to the victim's precious manifest. */
static int atk_plant(void *arg)
{
	const char *job = arg;
	char p[600];
	dsckpt_conn_t *c;
	int rc;

	if ((rc = dsckpt_connect(D->socket, &c)) < 0 || (rc = dsckpt_identify(c, "jobA", 0, 1)) < 0)
		return say(1, 1, "attacker: connect: %s", dsckpt_err_name(rc));
	for (int i = 1; i <= 2; i++) {
		dsckpt_save_t *s;
		static uint8_t mem[4096];
		int64_t shape[1] = {sizeof(mem)};
		snprintf(p, sizeof(p), "%s/t%d", job, i);
		if ((rc = dsckpt_save_begin(c, p, "rank0", &s)) < 0 ||
		    (rc = dsckpt_add_tensor(s, "t", "U8", shape, 1, mem, sizeof(mem))) < 0 ||
		    (rc = dsckpt_save_end(s)) < 0 ||
		    (rc = dsckpt_wait(s, DSCKPT_DURABLE, 10000)) < 0 ||
		    (rc = dsckpt_commit(c, p, 10000)) < 0)
			return say(1, 2, "attacker: save %s: %s: %s", p, dsckpt_err_name(rc),
				   dsckpt_last_error(c));
		dsckpt_save_free(s);
	}
	dsckpt_close(c);
	if (chmod(job, 0755) != 0)   /* others may look in, and are lured to */
		return say(1, 9, "chmod: %s", strerror(errno));
	snprintf(p, sizeof(p), "%s/a1", job);
	if (symlink(precious, p) != 0)
		return say(1, 3, "symlink a1: %s", strerror(errno));
	snprintf(p, sizeof(p), "%s/a2", job);
	if (mkdir(p, 0755) != 0)
		return say(1, 4, "mkdir a2: %s", strerror(errno));
	snprintf(p, sizeof(p), "%s/a2/x.safetensors", job);
	if (symlink(h_path("%s/rank0.safetensors", precious), p) != 0)
		return say(1, 5, "symlink x: %s", strerror(errno));
	snprintf(p, sizeof(p), "%s/a2/sub", job);
	if (symlink(h_path("%s/sub", precious), p) != 0)
		return say(1, 6, "symlink sub: %s", strerror(errno));
	snprintf(p, sizeof(p), "%s/a2/MANIFEST.json", job);
	FILE *f = fopen(p, "w");
	if (!f)
		return say(1, 7, "manifest: %s", strerror(errno));
	fputs("{\"format\": \"dsckpt-manifest\", \"version\": 1, \"files\": [], "
	      "\"created_ns\": 1}", f);
	fclose(f);
	snprintf(p, sizeof(p), "%s/a5", job);    /* not committed: prune keeps it */
	if (mkdir(p, 0777) != 0 || chmod(p, 0777) != 0)
		return say(1, 10, "mkdir a5: %s", strerror(errno));
	snprintf(p, sizeof(p), "%s/a5/x.safetensors", job);
	if (symlink(h_path("%s/rank0.safetensors", precious), p) != 0)
		return say(1, 11, "symlink a5/x: %s", strerror(errno));
	snprintf(p, sizeof(p), "%s/latest", job);
	if (unlink(p) != 0 || symlink(h_path("%s/MANIFEST.json", precious), p) != 0)
		return say(1, 8, "latest: %s", strerror(errno));
	return 0;
}

/*
 * Root's clean-up prunes the attacker's job directory: the attacker's older tags (t1, and a2
 * whose files are links into the victim's directory) go, its newest stays, the link a1 is
 * kept as a link, the uncommitted a5 is kept, and `latest`, a link to the victim's manifest,
 * names no tag. The victim, asked to remove a1 or the attacker's a5 (mode 0777, holding a
 * link to the victim's file), is refused. The victim's files all stay.
 */
START_TEST(test_prune_planted)
{
	HOSTILE_BEGIN("ctl prune planted links");
	hd_start(CACHE_32M, NULL);
	make_precious();
	user_dir(h_path("%s/out", D->dir), VIC, 0777);
	char job[400];
	snprintf(job, sizeof(job), "%s/jobA", D->root);
	int rc = as_user(ATK, atk_plant, job);
	ck_assert_msg(rc == 0, "attacker: %s", B->msg[1]);

	const char *o = h_path("%s/prune.txt", D->dir);
	rc = h_system("%s -s '%s' prune --keep 1 '%s' >'%s' 2>&1", h_bin("dsckptctl"), D->socket,
		      job, o);
	char *out = h_read_file(o, NULL);
	ck_assert_msg(rc == 0, "prune exited %d:\n%s", rc, out);
	ck_assert_msg(strstr(out, h_path("removed %s/t1 (", job)) &&
		      strstr(out, h_path("removed %s/a2 (", job)) &&
		      strstr(out, h_path("kept %s/t2: one of the 1 newest", job)) &&
		      strstr(out, h_path("kept %s/a1: a symbolic link: not followed", job)), "%s",
		      out);
	free(out);
	check_precious("after root's prune");
	ck_assert(!h_exists(h_path("%s/a2", job)));

	rc = ctl_as(VIC, h_path("rm '%s/a1'", job), &out);
	ck_assert_msg(rc == 1 && strstr(out, "is a symbolic link, not a tag directory: not "
					"followed"), "rm a1 exited %d:\n%s", rc, out);
	free(out);
	rc = ctl_as(VIC, h_path("rm --force '%s/a5'", job), &out);
	ck_assert_msg(rc == 1 && strstr(out, "owned by another user"), "rm a5 exited %d:\n%s",
		      rc, out);
	free(out);
	check_precious("after the victim's rm");
	struct stat st;
	ck_assert_int_eq(lstat(h_path("%s/a5/x.safetensors", job), &st), 0);
	hd_stop();
}
END_TEST

/* Attacker: in its tag dir arg (made again, with a .partial file, whenever rm took it), swaps
 * directory "sub" (holding a file) for a link to the victim's precious subdirectory and back,
 * until told to stop; n[1] counts the swaps. */
static int atk_swapper(void *arg)
{
	const char *tag = arg;
	char sub[600], tmp[600], ln[600], f[700];
	snprintf(sub, sizeof(sub), "%s/sub", tag);
	snprintf(tmp, sizeof(tmp), "%s/sub.dir", tag);
	snprintf(ln, sizeof(ln), "%s/sub.ln", tag);
	flag_set(F_READY);
	while (!flag_get(F_STOP)) {
		mkdir(tag, 0777);
		mkdir(tmp, 0777);
		snprintf(f, sizeof(f), "%s/file", tmp);
		FILE *fp = fopen(f, "w");
		if (fp)
			fclose(fp);
		snprintf(f, sizeof(f), "%s/r.safetensors.partial", tag);   /* it stays a tag */
		if ((fp = fopen(f, "w")))
			fclose(fp);
		symlink(h_path("%s/sub", precious), ln);
		rename(tmp, sub);      /* a real directory under the name ... */
		rename(ln, sub);       /* ... then a link to the victim's, in one step */
		B->n[1]++;
	}
	return 0;
}

/*
 * Root runs rm --force on the attacker's tag 30 times while the attacker swaps a directory
 * inside it for a link to the victim's directory: rm may fail (a name changed under it) but
 * never follows the link: the victim's files stay.
 */
START_TEST(test_root_rm_race)
{
	HOSTILE_BEGIN("ctl root rm race");
	hd_start(CACHE_32M, NULL);
	make_precious();
	const char *job = h_path("%s/race", D->root);
	ck_assert_int_eq(mkdir(job, 01777), 0);
	ck_assert_int_eq(chmod(job, 01777), 0);
	char tag[300];
	snprintf(tag, sizeof(tag), "%s/a3", job);
	user_dir(tag, ATK, 0777);
	ck_assert_int_eq(h_system("echo x > '%s/r.safetensors.partial' && chown " ATK " '%s/"
				  "r.safetensors.partial'", tag, tag), 0);
	pid_t atk = as_user_spawn(ATK, atk_swapper, tag, 60);
	ck_assert(flag_wait(F_READY, 10000));
	int removed = 0, looped = 0;
	for (int i = 0; i < 30; i++) {
		char *out;
		const char *o = h_path("%s/race.txt", D->dir);
		int rc = h_system("%s -s '%s' rm --force '%s' >'%s' 2>&1", h_bin("dsckptctl"),
				  D->socket, tag, o);
		out = h_read_file(o, NULL);
		ck_assert_msg(rc == 0 || rc == 1, "rm exited %d: %s", rc, out ? out : "");
		removed += rc == 0;
		looped += out && strstr(out, "Too many levels of symbolic links") != NULL;
		if (i == 29)
			printf("ctl root rm race: the last rm said: %s", out ? out : "");
		free(out);
		check_precious("during the race");
	}
	flag_set(F_STOP);
	ck_assert_int_eq(as_user_wait(atk), 0);
	printf("ctl root rm race: %d of 30 rm runs removed the tag, %d met a link where a "
	       "directory had been (O_NOFOLLOW), %lld swaps\n", removed, looped, B->n[1]);
	check_precious("after the race");
	hd_stop();
}
END_TEST

/* Builds the suite. */
static Suite *ctl_hostile_suite(void)
{
	Suite *s = suite_create("ctl hostile");
	h_add_case(s, "prune planted", test_prune_planted, 120, 1);
	h_add_case(s, "root rm race", test_root_rm_race, 120, 1);
	return s;
}

CHECK_MAIN(ctl_hostile_suite)
