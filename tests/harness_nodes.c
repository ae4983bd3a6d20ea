/*
 * harness_nodes.c — many nodes on one shared root for check_nodes and check_nodes_ops: N
 * daemons with distinct "host" values (tiny caches, few threads), PER_NODE ranks per node
 * (connections of the test process), each saving its own byte pattern.
 */
#include "harness_nodes.h"

#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

/* A node as small as the daemon allows: many of them share this machine. */
#define SMALL_NODE "\"copy_threads\": 1, \"restore_threads\": 1,"

/* The nodes started (nodes[0] is the test's daemon D). */
struct hdaemon nodes[MAX_NODES];
int nnodes;

/* Starts n nodes on one root: D (host n000) and n - 1 peers (n001, ...), extra_json added to
 * each one's config. */
void nodes_start(int n, const char *extra_json)
{
	char json[512];

	ck_assert_int_le(n, MAX_NODES);
	snprintf(json, sizeof(json), CHUNK_1M SMALL_NODE "%s \"host\": \"n000\",",
		 extra_json ? extra_json : "");
	d_start(CACHE_1M, json);
	nodes[0] = *D;
	for (int i = 1; i < n; i++) {
		char name[16];
		snprintf(name, sizeof(name), "n%03d", i);
		snprintf(json, sizeof(json), CHUNK_1M SMALL_NODE "%s \"host\": \"%s\",",
			 extra_json ? extra_json : "", name);
		h_daemon_start_peer(&nodes[i], D, name, CACHE_1M, json);
	}
	nnodes = n;
}

/* Stops every node (each must exit 0). */
void nodes_stop(void)
{
	for (int i = 1; i < nnodes; i++)
		ck_assert_int_eq(h_daemon_kill(&nodes[i], SIGTERM), 0);
	nnodes = 0;
	d_stop();
}

/* Connects rank (of world) of job to its node's daemon (node rank / PER_NODE). */
dsckpt_conn_t *nodes_conn(const char *job, int rank, int world)
{
	dsckpt_conn_t *c;
	int rc = dsckpt_connect(nodes[rank / PER_NODE].socket, &c);
	ck_assert_msg(rc == 0, "connect rank %d: %s", rank, dsckpt_err_name(rc));
	CK_DS(c, dsckpt_identify(c, job, rank, world));
	return c;
}

/* Saves rank r's pattern for step into dir (file rank<r>). */
void nodes_save(struct rank *k, int r, const char *dir, int step)
{
	char file[16];
	snprintf(file, sizeof(file), "rank%d", r);
	k->s = save_pattern(k->c, dir, file, N_BYTES,
			    (uint64_t)(1000 * step + r), &k->mem);
}

/* Waits for k's save to reach level (fails the test with where it stopped otherwise). */
void nodes_wait(struct rank *k, int r, int level, int timeout_ms)
{
	int rc = dsckpt_wait(k->s, level, timeout_ms);
	ck_assert_msg(rc >= level, "rank %d (node n%03d): waiting for %s: %s: %s", r,
		      r / PER_NODE, dsckpt_level_name(level),
		      rc < 0 ? dsckpt_err_name(rc) : dsckpt_level_name(rc),
		      dsckpt_last_error(k->c));
}

/* Frees k's save and bytes. */
void nodes_done(struct rank *k)
{
	dsckpt_save_free(k->s);
	dsckpt_host_free(k->mem);
	k->s = NULL;
	k->mem = NULL;
}

/* Uses run (NULL: none) as the run id of the connections opened next. */
void nodes_set_run(const char *run)
{
	const char *vars[] = {"DSCKPT_RUN_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID",
			      "PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid"};
	for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++)
		unsetenv(vars[i]);
	if (run)
		setenv("DSCKPT_RUN_ID", run, 1);
}
