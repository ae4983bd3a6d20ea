/*
 * check_socket_group.c — who may connect to a root daemon: "socket_group" gives the socket to
 * a group (mode 0660), whose members connect and others are refused with words that name the
 * group to join; a socket left in group root is not answered with "usermod -aG root" but with
 * the socket_group to set; an unknown group is a configuration error. Real users (dsckpt-vic
 * in the group, dsckpt-atk not), a real root daemon, dsckptctl run as each.
 */
#include "harness_hostile.h"
#include "harness_daemon.h"

#include <check.h>
#include <grp.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Runs dsckptctl status as user; its exit status, and what it printed into out. */
static int status_as(const char *user, char *out, size_t len)
{
	int p[2];
	size_t n = 0;
	ssize_t k;

	ck_assert_int_eq(pipe(p), 0);
	fflush(stdout);
	pid_t pid = as_user_spawn(user, exec_ctl_status, &p[1], 20);
	close(p[1]);
	while (n < len - 1 && (k = read(p[0], out + n, len - 1 - n)) > 0)
		n += (size_t)k;
	out[n] = '\0';
	close(p[0]);
	return as_user_wait(pid);
}

/* Starts the root daemon with extra_json (mode and group), its directories open to users. */
static void start(const char *extra_json)
{
	h_daemon_start(D, CACHE_8M, extra_json);
	ck_assert_int_eq(chmod(D->dir, 0755), 0);
	ck_assert_int_eq(chmod(D->root, 0755), 0);
}

/* socket_group "dsckpt-vic" with mode 0660: the socket is that group's; the victim (of the
 * group) connects, the attacker is refused and told which group admits it. */
START_TEST(test_socket_group)
{
	HOSTILE_BEGIN("socket_group");
	char out[4096];
	uid_t vuid;
	gid_t vgid;
	struct stat st;

	user_ids(VIC, &vuid, &vgid);
	start("\"socket_mode\": \"0660\", \"socket_group\": \"" VIC "\", \"chunk_size\": 1,");
	ck_assert_int_eq(stat(D->socket, &st), 0);
	ck_assert_msg(st.st_gid == vgid && (st.st_mode & 0777) == 0660,
		      "the socket is group %u mode %o; want %u and 0660", (unsigned)st.st_gid,
		      (unsigned)(st.st_mode & 0777), (unsigned)vgid);
	int rc = status_as(VIC, out, sizeof(out));
	ck_assert_msg(rc == 0, "dsckptctl status as a member of socket_group: %s: %s",
		      status_str(rc), out);
	rc = status_as(ATK, out, sizeof(out));
	ck_assert_msg(rc == 1 && strstr(out, "Permission denied") &&
		      strstr(out, "mode 0660, group " VIC ": its owner and the members of group "
			     VIC " may connect") && strstr(out, "usermod -aG " VIC " $USER"),
		      "dsckptctl status outside socket_group said: %s", out);
	hd_stop();
}
END_TEST

/* Without socket_group a root daemon's socket is group root: an outsider is told the
 * socket_group to set, never to join group root. */
START_TEST(test_group_root)
{
	HOSTILE_BEGIN("socket group root");
	char out[4096];

	start("\"socket_mode\": \"0660\", \"chunk_size\": 1,");
	int rc = status_as(ATK, out, sizeof(out));
	ck_assert_msg(rc == 1 && strstr(out, "group root: its owner and the members") &&
		      strstr(out, "\"socket_group\": \"dsckpt\"") &&
		      !strstr(out, "usermod -aG root"), "dsckptctl said: %s", out);
	hd_stop();
}
END_TEST

/* A socket_group that names no group is one configuration error, with how to make it. */
START_TEST(test_unknown_group)
{
	char dir[256], out[600];

	h_tmpdir(dir, sizeof(dir));
	FILE *f = fopen(h_path("%s/c.json", dir), "w");
	fprintf(f, "{\"allowed_roots\": [\"%s\"], \"socket\": \"%s/d.sock\","
		" \"socket_group\": \"no-such-group-x\"}\n", dir, dir);
	fclose(f);
	snprintf(out, sizeof(out), "%s/out", dir);
	ck_assert_int_eq(h_system("%s -n -c '%s/c.json' >'%s' 2>&1", h_bin("dsckptd"), dir, out),
			 1);
	char *said = h_read_file(out, NULL);
	ck_assert_msg(said && strstr(said, "c.json: option 'socket_group': no group "
				     "'no-such-group-x' on this machine (make it: groupadd "),
		      "%s", said);
	free(said);
	h_rm_rf(dir);
}
END_TEST

/* The suite. */
static Suite *socket_group_suite(void)
{
	Suite *s = suite_create("socket group");
	h_add_case(s, "socket_group", test_socket_group, 60, 1);
	h_add_case(s, "group root", test_group_root, 60, 1);
	h_add_case(s, "unknown group", test_unknown_group, 30, 1);
	return s;
}

CHECK_MAIN(socket_group_suite)
