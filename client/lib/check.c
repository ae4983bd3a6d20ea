/*
 * check.c — what the library checks before anything is sent, so that a bad argument fails
 * with a precise message and costs no round trip: tensor and blob names, dtypes, shapes and
 * sizes, file names and checkpoint directories. The daemon checks all of it again.
 */
#include "internal.h"
#include "../../format/format.h"

#include <stdio.h>
#include <string.h>

#define CHECK_FILE_MAX 128

/* Size in bytes of a safetensors dtype name (format/dtype.c's table, the daemon's too). */
unsigned lib_check_dtype(const char *dtype)
{
	return dtype_size(dtype);
}

/* Checks a tensor or blob name. */
static int check_name(const char *what, const char *name, char *why, size_t whylen)
{
	if (!name || !*name) {
		snprintf(why, whylen, "%s name is empty", what);
		return DSCKPT_EINVAL;
	}
	if (strlen(name) > PROTO_MAX_NAME) {
		snprintf(why, whylen, "%s name is longer than %d bytes", what, PROTO_MAX_NAME);
		return DSCKPT_ENAMETOOLONG;
	}
	return 0;
}

/* Checks a tensor's name, dtype, shape and size. */
int lib_check_tensor(const char *name, const char *dtype, const int64_t *shape, int ndim,
		     const void *ptr, size_t nbytes, char *why, size_t whylen)
{
	uint64_t n = 1;
	unsigned size;
	int e = check_name("tensor", name, why, whylen);

	if (e < 0)
		return e;
	if (strcmp(name, "__metadata__") == 0) {
		snprintf(why, whylen, "tensor name __metadata__ is reserved by safetensors");
		return DSCKPT_EINVAL;
	}
	if (!dtype || (size = lib_check_dtype(dtype)) == 0) {
		snprintf(why, whylen, "tensor %s: unknown dtype %s", name, dtype ? dtype : "NULL");
		return DSCKPT_EINVAL;
	}
	if (ndim < 0 || ndim > PROTO_MAX_DIMS || (ndim > 0 && !shape)) {
		snprintf(why, whylen, "tensor %s: ndim %d is not in 0..%d (with a shape)", name,
			 ndim, PROTO_MAX_DIMS);
		return DSCKPT_EINVAL;
	}
	for (int i = 0; i < ndim; i++) {
		if (shape[i] < 0) {
			snprintf(why, whylen, "tensor %s: dimension %d is negative", name, i);
			return DSCKPT_EINVAL;
		}
		if (__builtin_mul_overflow(n, (uint64_t)shape[i], &n)) {
			snprintf(why, whylen, "tensor %s: shape overflows 64 bits", name);
			return DSCKPT_ERANGE;
		}
	}
	if (__builtin_mul_overflow(n, size, &n)) {
		snprintf(why, whylen, "tensor %s: size overflows 64 bits", name);
		return DSCKPT_ERANGE;
	}
	if (n != nbytes) {
		snprintf(why, whylen, "tensor %s: nbytes %zu, but shape and dtype %s make %" PRIu64,
			 name, nbytes, dtype, n);
		return DSCKPT_EINVAL;
	}
	if (!ptr && nbytes > 0) {
		snprintf(why, whylen, "tensor %s: pointer is NULL", name);
		return DSCKPT_EINVAL;
	}
	return 0;
}

/* Checks a blob's name and data. */
int lib_check_blob(const char *name, const void *data, size_t len, char *why, size_t whylen)
{
	int e = check_name("blob", name, why, whylen);
	if (e < 0)
		return e;
	if (!data && len > 0) {
		snprintf(why, whylen, "blob %s: data is NULL", name);
		return DSCKPT_EINVAL;
	}
	return 0;
}

/* Checks a file name: [A-Za-z0-9._-]{1,128}, not starting with a dot. */
int lib_check_file(dsckpt_conn_t *c, const char *file)
{
	size_t n = file ? strlen(file) : 0;

	if (n == 0 || n > CHECK_FILE_MAX || file[0] == '.' ||
	    strspn(file, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
			 "0123456789._-") != n)
		return lib_conn_fail(c, DSCKPT_EINVAL, "file name must match [A-Za-z0-9._-]{1,%d} "
				     "and not start with a dot", CHECK_FILE_MAX);
	return 0;
}

/* Checks a checkpoint directory: absolute, at most PROTO_MAX_STR bytes. */
int lib_check_dir(dsckpt_conn_t *c, const char *dir)
{
	if (!dir || dir[0] != '/')
		return lib_conn_fail(c, DSCKPT_EINVAL, "checkpoint directory must be absolute");
	if (strlen(dir) > PROTO_MAX_STR)
		return lib_conn_fail(c, DSCKPT_ENAMETOOLONG,
				     "checkpoint directory is longer than %d bytes",
				     PROTO_MAX_STR);
	return 0;
}
