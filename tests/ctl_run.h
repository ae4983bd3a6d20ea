/*
 * ctl_run.h — dsckptctl run as an operator would, for the ctl suites (check_ctl*.c): each
 * test gets a scratch directory (checkpoints go below ctl_root), runs the binary with
 * arguments and checks what it printed.
 */
#ifndef DSCKPT_CTL_RUN_H
#define DSCKPT_CTL_RUN_H

#include <string.h>

/* The scratch directory of a test, and ctl_scratch/ckpt below it. */
extern char ctl_scratch[256];
extern char ctl_root[300];
/* Output of the last ctl() run (stdout and stderr together). */
extern char *ctl_out;

/* Makes the scratch directory (a checked fixture's setup). */
void ctl_setup(void);
/* Removes it and forgets the last output. */
void ctl_teardown(void);
/* Formats a path below ctl_root into one of 16 static buffers, used in turn. */
const char *ctl_path(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Runs dsckptctl with args, keeps its output in ctl_out, returns its exit status. */
int ctl(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Where the table row starting with first (then a space) and containing word begins, or
 * NULL. */
const char *ctl_row(const char *first, const char *word);

/* Asserts that the last output contains s. */
#define ck_out_has(s) \
	ck_assert_msg(strstr(ctl_out, s) != NULL, "no \"%s\" in:\n%s", s, ctl_out)
/* Asserts that a row starts with first and contains word. */
#define ck_row(first, word) \
	ck_assert_msg(ctl_row(first, word), "no row %s ... %s in:\n%s", first, word, ctl_out)

#endif /* DSCKPT_CTL_RUN_H */
