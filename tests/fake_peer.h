/*
 * fake_peer.h — a scripted fake dsckptd for the client suites (check_lib_*.c): a forked
 * process speaking proto/ on a temporary socket to one connection, checking every frame
 * strictly and logging what it saw, one line per request (a "BAD" line fails the test).
 */
#ifndef DSCKPT_FAKE_PEER_H
#define DSCKPT_FAKE_PEER_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "../client/lib/internal.h"

/* How the fake peer misbehaves; a test sets it before fake_start (the peer is forked). */
struct fake_opts {
	int begin_error;      /* answer SAVE_BEGIN with ERROR EACCES */
	int close_on_end;     /* hang up on SAVE_END */
	int bad_id;           /* answer with a wrong request id */
	int wait_level;       /* WAIT answers this level (0: the level asked for) */
	int hello_version;    /* answer HELLO with ERROR EVERSION */
	int load_end_error;   /* answer LOAD_END with ERROR EINVAL naming two tensors */
	int load_level;       /* LOAD_WAIT answers this level (0: LOADED) */
	int hold_regions;     /* hold REGION_ADD replies until this many are held, then answer
				 them together; a client that awaits one first is logged BAD */
	int region_error;     /* answer the n-th REGION_ADD with ERROR ELIMIT (from 1; 0: none) */
};
extern struct fake_opts fake_opts;

/* A fake peer: its socket, its log and its process. */
struct fake {
	char dir[256];
	char path[300];
	char log[300];
	pid_t pid;
};

/* Starts a fake peer listening on a fresh socket. */
void fake_start(struct fake *f);
/* Waits for the fake peer to finish (the client closed) and returns its log (malloc'd). */
char *fake_finish(struct fake *f);
/* Starts a fake peer, connects to it and identifies as rank 0 of 2. */
dsckpt_conn_t *fake_connect(struct fake *f);
/* Counts the lines of a log that contain needle. */
int fake_count(const char *log, const char *needle);
/* Fills a load's destination as the fake peer does: a pattern seeded by the tensor's name. */
void fake_fill(void *p, size_t n, const char *name);
/* Whether n bytes at p hold the fake peer's pattern for name. */
int fake_filled(const void *p, size_t n, const char *name);
/* FNV-1a over bytes, as the peer logs it for each tensor. */
uint64_t fake_fnv(const uint8_t *p, size_t n);

#endif /* DSCKPT_FAKE_PEER_H */
