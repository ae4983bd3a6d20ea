/* pull.c — dsckptctl pull: a checkpoint read ahead of its load into the daemon's cache
 * (PREFETCH), pulled first from the root's remote tier when only that holds it. A launcher
 * runs it before the trainer starts, so that the trainer's restore is a hot one. */
#include "ctl.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* pull [--wait] JOB[/TAG]: the path made absolute (it need not exist on this node yet). */
int pull_run(struct ctl *ctl)
{
	char path[PATH_MAX], cwd[PATH_MAX], b1[32], b2[32];
	dsckpt_prefetch_info_t info;
	int e;

	if (ctl->arg[0] == '/') {
		snprintf(path, sizeof(path), "%s", ctl->arg);
	} else if (!getcwd(cwd, sizeof(cwd)) ||
		   snprintf(path, sizeof(path), "%s/%s", cwd, ctl->arg) >= (int)sizeof(path)) {
		out_err("%s: cannot make the path absolute", ctl->arg);
		return CTL_FAIL;
	}
	dsckpt_conn_t *c = query_open(ctl);
	if (!c)
		return CTL_FAIL;
	e = dsckpt_prefetch(c, path, NULL, ctl->wait, &info);
	if (e < 0) {
		out_err("pull %s: %s", path, dsckpt_last_error(c));
		dsckpt_close(c);
		return CTL_FAIL;
	}
	dsckpt_close(c);
	if (ctl->json) {
		cJSON *doc = cJSON_CreateObject();
		if (doc && cJSON_AddStringToObject(doc, "dir", info.dir) &&
		    cJSON_AddStringToObject(doc, "tag", info.tag) &&
		    cJSON_AddBoolToObject(doc, "done", ctl->wait) &&
		    (!ctl->wait ||
		     (cJSON_AddNumberToObject(doc, "bytes_pulled", (double)info.bytes_pulled) &&
		      cJSON_AddNumberToObject(doc, "bytes_cached", (double)info.bytes_cached) &&
		      cJSON_AddNumberToObject(doc, "seconds", info.seconds))))
			return out_json(doc);
		cJSON_Delete(doc);
		out_err("out of memory");
		return CTL_FAIL;
	}
	if (!ctl->wait) {
		printf("prefetching %s\n", info.dir);
		return CTL_OK;
	}
	printf("%s: %s pulled from the remote tier, %s in the daemon's cache, %.3f s\n",
	       info.dir, out_bytes(info.bytes_pulled, b1, sizeof(b1)),
	       out_bytes(info.bytes_cached, b2, sizeof(b2)), info.seconds);
	return CTL_OK;
}
