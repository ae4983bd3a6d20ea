/* errors.c — the library version and the names of error codes and levels (format/errors.c
 * holds the one table; this file checks that the public header repeats it exactly). */
#include "internal.h"
#include "../../format/errors.h"

#define XX(name, value, msg) _Static_assert((int)DSCKPT_##name == (int)ERR_##name, #name);
DSCKPT_ERRNO_MAP(XX)
#undef XX
_Static_assert((int)DSCKPT_FAILED == LEVEL_FAILED && (int)DSCKPT_NONE == LEVEL_NONE &&
	       (int)DSCKPT_ACCEPTED == LEVEL_ACCEPTED && (int)DSCKPT_SNAPSHOT == LEVEL_SNAPSHOT &&
	       (int)DSCKPT_DURABLE == LEVEL_DURABLE && (int)DSCKPT_COMMITTED == LEVEL_COMMITTED &&
	       (int)DSCKPT_REMOTE == LEVEL_REMOTE && (int)DSCKPT_REPLICATED == LEVEL_REPLICATED,
	       "levels");

/* Version of the loaded library. */
const char *dsckpt_version(void)
{
	return DSCKPT_VERSION_STRING;
}

/* Message for an error code. */
const char *dsckpt_strerror(int err)
{
	return err_message(err);
}

/* Name of an error code. */
const char *dsckpt_err_name(int err)
{
	return err_name(err);
}

/* Name of a level. */
const char *dsckpt_level_name(int level)
{
	return level_name(level);
}

/* Maps an errno value from a system call to the closest DSCKPT_E* code. */
int lib_errno(int e)
{
	return err_from_errno(e);
}
