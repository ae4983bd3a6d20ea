/*
 * errors.h — error codes and save levels: one table for the daemon, the library and
 * dsckptctl. The wire (ERROR, WAIT replies) and the tools' exit paths carry these numbers.
 * client/dsckpt.h republishes them as DSCKPT_E* for users, because an installed header must
 * stand alone; client/lib/errors.c asserts at compile time that both tables agree.
 */
#ifndef DSCKPT_FORMAT_ERRORS_H
#define DSCKPT_FORMAT_ERRORS_H

#include <stddef.h>

/* XX(name, value, message). Values follow errno where one fits. Never renumber a code. */
#define ERR_TABLE(XX)                                                          \
	XX(EPERM, -1, "operation not permitted")                               \
	XX(ENOENT, -2, "no such file or directory")                            \
	XX(EIO, -5, "input/output error")                                      \
	XX(EBADF, -9, "bad file descriptor")                                   \
	XX(ENOMEM, -12, "out of memory")                                       \
	XX(EACCES, -13, "permission denied")                                   \
	XX(EBUSY, -16, "resource busy")                                        \
	XX(EEXIST, -17, "already exists")                                      \
	XX(EINVAL, -22, "invalid argument")                                    \
	XX(ENOSPC, -28, "no space left on device")                             \
	XX(EPIPE, -32, "connection to the daemon broken")                      \
	XX(ERANGE, -34, "value out of range")                                  \
	XX(ENAMETOOLONG, -36, "name too long")                                 \
	XX(EPROTO, -71, "malformed message")                                   \
	XX(EMSGSIZE, -90, "message too long")                                  \
	XX(ENOTSUP, -95, "not supported")                                      \
	XX(ETIMEDOUT, -110, "timed out")                                       \
	XX(ECONNREFUSED, -111, "daemon not reachable")                         \
	XX(EFAILED, -1000, "save failed")                                      \
	XX(EVERSION, -1001, "protocol version mismatch")                       \
	XX(ESTATE, -1002, "call out of order")                                 \
	XX(ENOCUDA, -1003, "CUDA not available")                               \
	XX(ECHECKSUM, -1004, "checksum mismatch")                              \
	XX(EINCOMPLETE, -1005, "checkpoint incomplete")                        \
	XX(ESHUTDOWN, -1006, "daemon shutting down")                           \
	XX(ELIMIT, -1007, "per-user limit of the daemon reached")

/* The codes: ERR_EINVAL, ERR_EFAILED, ... (ERR_OK = 0). */
enum err_code {
#define ERR_XX_(name, value, msg) ERR_##name = (value),
	ERR_TABLE(ERR_XX_)
#undef ERR_XX_
	ERR_OK = 0
};

/* Levels of a save, in order; FAILED is terminal and carries a reason. */
enum level {
	LEVEL_FAILED = -1,
	LEVEL_NONE = 0,
	LEVEL_ACCEPTED = 1,  /* validated, sources open; the daemon owns it */
	LEVEL_SNAPSHOT = 2,  /* every byte is in the daemon */
	LEVEL_DURABLE = 3,   /* files written, fsynced and renamed into place */
	LEVEL_COMMITTED = 4, /* the checkpoint directory is committed */
	LEVEL_REMOTE = 5,    /* the committed tag, its manifest and latest are in the remote tier */
	LEVEL_REPLICATED = 6 /* this node's files of the committed tag are held by `replicas`
				peers (and it is REMOTE first where its root has a remote tier) */
};

/* Message for a code ("invalid argument"; "success" for 0, "unknown error" otherwise). */
const char *err_message(int code);
/* Name of a code ("EINVAL"; "OK" for 0, "UNKNOWN" otherwise). */
const char *err_name(int code);
/* The closest code for an errno value from a system call (EIO when none is closer). */
int err_from_errno(int e);
/* Name of a level ("DURABLE"; "UNKNOWN" for others). */
const char *level_name(int level);
/* Formats a message into err (when err is not NULL) and returns code. */
int err_set(char *err, size_t errlen, int code, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

#endif /* DSCKPT_FORMAT_ERRORS_H */
