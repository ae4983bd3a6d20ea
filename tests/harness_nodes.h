/*
 * harness_nodes.h — many nodes on one shared root (check_nodes, check_nodes_ops): daemons
 * with distinct "host" values, nodes[0] the test's daemon D, PER_NODE ranks on each.
 */
#ifndef DSCKPT_HARNESS_NODES_H
#define DSCKPT_HARNESS_NODES_H

#include "harness_daemon.h"

#define MAX_NODES 64
#define PER_NODE 2
#define N_BYTES (16 * 1024)
#define CACHE_1M 0.001 /* just above the least cache (1/1024 GiB, which %g rounds below) */

/* The nodes started (nodes[0] is the test's daemon D), nnodes of them. */
extern struct hdaemon nodes[MAX_NODES];
extern int nnodes;

/* One rank: its connection, its save of the current tag and the save's bytes. */
struct rank {
	dsckpt_conn_t *c;
	dsckpt_save_t *s;
	void *mem;
};

/* Starts n nodes on one root: D (host n000) and n - 1 peers (n001, ...), extra_json added to
 * each one's config. */
void nodes_start(int n, const char *extra_json);
/* Stops every node (each must exit 0). */
void nodes_stop(void);
/* Connects rank (of world) of job to its node's daemon (node rank / PER_NODE). */
dsckpt_conn_t *nodes_conn(const char *job, int rank, int world);
/* Saves rank r's pattern for step into dir (file rank<r>). */
void nodes_save(struct rank *k, int r, const char *dir, int step);
/* Waits for k's save to reach level (fails the test with where it stopped otherwise). */
void nodes_wait(struct rank *k, int r, int level, int timeout_ms);
/* Frees k's save and bytes. */
void nodes_done(struct rank *k);
/* Uses run (NULL: none) as the run id of the connections opened next. */
void nodes_set_run(const char *run);

#endif
