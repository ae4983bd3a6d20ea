/* errors.c — names and messages of the error codes and levels, and the errno map. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>

#include "errors.h"

/* Message for a code. */
const char *err_message(int code)
{
	switch (code) {
#define XX(name, value, msg) case ERR_##name: return msg;
		ERR_TABLE(XX)
#undef XX
	case ERR_OK:
		return "success";
	}
	return "unknown error";
}

/* Name of a code. */
const char *err_name(int code)
{
	switch (code) {
#define XX(name, value, msg) case ERR_##name: return #name;
		ERR_TABLE(XX)
#undef XX
	case ERR_OK:
		return "OK";
	}
	return "UNKNOWN";
}

/* The closest code for an errno value. */
int err_from_errno(int e)
{
	switch (e) {
	case EPERM:
		return ERR_EPERM;
	case ENOENT:
		return ERR_ENOENT;
	case EACCES:
	case EROFS:     /* a read-only mount refuses like a permission would */
		return ERR_EACCES;
	case ENOSPC:
	case EDQUOT:
		return ERR_ENOSPC;
	case ENAMETOOLONG:
		return ERR_ENAMETOOLONG;
	case ENOMEM:
	case EMFILE:    /* out of descriptors: the closest code there is */
	case ENFILE:
		return ERR_ENOMEM;
	case EEXIST:
		return ERR_EEXIST;
	case EINVAL:
		return ERR_EINVAL;
	case EBADF:
		return ERR_EBADF;
	case EMSGSIZE:
		return ERR_EMSGSIZE;
	case ETIMEDOUT:
		return ERR_ETIMEDOUT;
	case EPIPE:
	case ECONNRESET:
	case ENOTCONN:
		return ERR_EPIPE;
	}
	return ERR_EIO;
}

/* Name of a level. */
const char *level_name(int level)
{
	switch (level) {
	case LEVEL_FAILED:
		return "FAILED";
	case LEVEL_NONE:
		return "NONE";
	case LEVEL_ACCEPTED:
		return "ACCEPTED";
	case LEVEL_SNAPSHOT:
		return "SNAPSHOT";
	case LEVEL_DURABLE:
		return "DURABLE";
	case LEVEL_COMMITTED:
		return "COMMITTED";
	case LEVEL_REMOTE:
		return "REMOTE";
	case LEVEL_REPLICATED:
		return "REPLICATED";
	}
	return "UNKNOWN";
}

/* Formats a message into err (when err is not NULL) and returns code. */
int err_set(char *err, size_t errlen, int code, const char *fmt, ...)
{
	va_list ap;

	if (err && errlen) {
		va_start(ap, fmt);
		vsnprintf(err, errlen, fmt, ap);
		va_end(ap);
	}
	return code;
}
