/*
 * export.c — `dsckptctl export TAG OUT`: runs `python -m dsckpt export` (client/python's
 * dsckpt/__main__.py) with the same arguments. Merging DCP's, ZeRO's and FSDP's shards into full
 * tensors needs torch's planners and DeepSpeed's layouts, which live in Python; one
 * implementation serves both names. The interpreter is $DSCKPT_PYTHON, else python3 (the one
 * `pip install client/python` installed the package for); -s is passed as $DSCKPT_SOCKET.
 */
#include "ctl.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define EXPORT_PYTHON "python3"

/* Replaces this process with python -m dsckpt export and the n arguments args; returns only
 * when that cannot start (CTL_FAIL, once why is printed). */
int export_exec(const struct ctl *ctl, int n, char **args)
{
	const char *python = getenv("DSCKPT_PYTHON");
	char **argv = calloc((size_t)n + 5, sizeof(*argv));

	if (!python || !*python)
		python = EXPORT_PYTHON;
	if (!argv) {
		out_err("out of memory");
		return CTL_FAIL;
	}
	argv[0] = (char *)python;
	argv[1] = "-m";
	argv[2] = "dsckpt";
	argv[3] = "export";
	memcpy(argv + 4, args, (size_t)n * sizeof(*argv));
	if (ctl->socket && setenv("DSCKPT_SOCKET", ctl->socket, 1) != 0) {
		out_err("setenv: %s", strerror(errno));
		free(argv);
		return CTL_FAIL;
	}
	fflush(stdout);
	execvp(python, argv);
	out_err("export runs '%s -m dsckpt export' (the dsckpt Python package: pip install "
		"client/python), but %s cannot be run: %s; $DSCKPT_PYTHON names the interpreter",
		python, python, strerror(errno));
	free(argv);
	return CTL_FAIL;
}
