/*
 * save_int.h — a save as save.c (its requests up to SAVE_END) and save_wait.c (WAIT: its
 * levels and progress) share it. Nothing else includes it.
 */
#ifndef DSCKPT_SAVE_INT_H
#define DSCKPT_SAVE_INT_H

#include "internal.h"

/* Where a save stands on this side: open for tensors, handed over, or broken. */
enum save_state { SAVE_OPEN, SAVE_ENDED, SAVE_BROKEN };

/* A save being made (dsckpt_save_t). */
struct dsckpt_save {
	dsckpt_conn_t *c;      /* holds a reference */
	uint64_t id;           /* the daemon's save id */
	enum save_state state;
	struct lib_entries es;      /* the SAVE_ADD tensor entries, encoded by add_tensor */
	struct lib_names tnames, bnames;
	struct lib_stages stages;   /* host memory the library did not allocate, copied */
	void *stream;          /* from dsckpt_save_set_stream; NULL: the legacy default stream */
	uint64_t plan;         /* the plan whose tensors come first; 0: none */
	msgpack_sbuffer held;  /* blob maps held for the last request, encoded */
	msgpack_packer hpk;
	uint32_t nheld;
	char *dir, *file;      /* a deferred save's, until its SAVE_BEGIN is sent (else NULL) */
	int early;             /* its SAVE_BEGIN is posted, the reply not read yet */
	uint64_t serial;       /* unique in the process: which save a prepared plan is for */
	int refused;           /* what the posted SAVE_BEGIN's reply said, when it failed */
	char *refusal;
};

#endif
