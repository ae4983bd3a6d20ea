/* errors.c — the library version and the names of error codes and levels. */
#include "internal.h"

/* Version of the loaded library. */
const char *dsckpt_version(void)
{
	return DSCKPT_VERSION_STRING;
}

/* Message for an error code. */
const char *dsckpt_strerror(int err)
{
	switch (err) {
#define XX(name, value, msg) case DSCKPT_##name: return msg;
		DSCKPT_ERRNO_MAP(XX)
#undef XX
	case DSCKPT_OK:
		return "success";
	}
	return "unknown error";
}

/* Name of an error code. */
const char *dsckpt_err_name(int err)
{
	switch (err) {
#define XX(name, value, msg) case DSCKPT_##name: return #name;
		DSCKPT_ERRNO_MAP(XX)
#undef XX
	case DSCKPT_OK:
		return "OK";
	}
	return "UNKNOWN";
}

/* Name of a level. */
const char *dsckpt_level_name(int level)
{
	switch (level) {
	case DSCKPT_FAILED:
		return "FAILED";
	case DSCKPT_NONE:
		return "NONE";
	case DSCKPT_ACCEPTED:
		return "ACCEPTED";
	case DSCKPT_SNAPSHOT:
		return "SNAPSHOT";
	case DSCKPT_DURABLE:
		return "DURABLE";
	case DSCKPT_COMMITTED:
		return "COMMITTED";
	}
	return "UNKNOWN";
}

/* Maps an errno value from a system call to the closest DSCKPT_E* code. */
int lib_errno(int e)
{
	switch (e) {
	case ENOMEM:
	case EMFILE:	/* out of descriptors: the closest code we have */
	case ENFILE:
		return DSCKPT_ENOMEM;
	case EACCES:
		return DSCKPT_EACCES;
	case EPERM:
		return DSCKPT_EPERM;
	case ENOSPC:
		return DSCKPT_ENOSPC;
	case EINVAL:
		return DSCKPT_EINVAL;
	case EMSGSIZE:
		return DSCKPT_EMSGSIZE;
	case EPIPE:
	case ECONNRESET:
	case ENOTCONN:
		return DSCKPT_EPIPE;
	}
	return DSCKPT_EIO;
}
