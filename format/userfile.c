/*
 * userfile.c — opening a file in a tree users can write (a job directory, a tag) for reading.
 *
 * Whoever owns the directory chooses what a name is: a FIFO, whose open blocks until a writer
 * comes (forever, for a daemon that opens it); a device; a symbolic link to anything; a file
 * hard-linked from elsewhere; a file of a terabyte. So a name there is opened without
 * blocking (O_NONBLOCK: neither a FIFO nor a lease to break can hold the open up), without
 * following a link, without becoming a controlling terminal, and only what fstat then shows
 * as a regular file within the caller's size bound is kept; O_NONBLOCK is cleared again for
 * the reads. The daemon reads every such file through here (start-up recovery and every
 * request), and dsckptctl does too.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "format.h"

/* Words for what a non-regular file is. */
static const char *userfile_kind(mode_t m)
{
	return S_ISFIFO(m) ? "a FIFO" : S_ISCHR(m) ? "a character device" :
	       S_ISBLK(m) ? "a block device" : S_ISSOCK(m) ? "a socket" :
	       S_ISDIR(m) ? "a directory" : S_ISLNK(m) ? "a symbolic link" : "not a file";
}

/* Opens dirfd/name for reading as a file of a user-writable tree must be (see format.h). */
int userfile_open(int dirfd, const char *name, uint64_t max, int flags, struct stat *out,
		  char *why, size_t whylen)
{
	struct stat st;
	int e, fd = openat(dirfd, name, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC);

	if (fd < 0) {
		e = errno;
		snprintf(why, whylen, "%s", e == ELOOP ? "a symbolic link (not followed)" :
			 e == EWOULDBLOCK ? "held by a lease of another process" : strerror(e));
		return -e;
	}
	if (fstat(fd, &st) < 0) {
		e = errno;
		snprintf(why, whylen, "stat: %s", strerror(e));
		goto fail;
	}
	if (!S_ISREG(st.st_mode)) {
		e = EINVAL;
		snprintf(why, whylen, "not a regular file: %s", userfile_kind(st.st_mode));
		goto fail;
	}
	if ((flags & USERFILE_ONE_LINK) && st.st_nlink > 1) {
		e = EMLINK;
		snprintf(why, whylen, "has %ju hard links (dsckptd never makes a second one)",
			 (uintmax_t)st.st_nlink);
		goto fail;
	}
	if ((uint64_t)st.st_size > max) {
		e = EFBIG;
		snprintf(why, whylen, "%jd bytes, more than the %" PRIu64 " read of it",
			 (intmax_t)st.st_size, max);
		goto fail;
	}
	if (fcntl(fd, F_SETFL, 0) < 0) {
		e = errno;
		snprintf(why, whylen, "fcntl: %s", strerror(e));
		goto fail;
	}
	if (out)
		*out = st;
	return fd;

fail:
	close(fd);
	return -e;
}

/* Reads up to len bytes at off of fd, retrying short reads and EINTR; how many, or -1. */
ssize_t userfile_pread(int fd, void *buf, size_t len, uint64_t off)
{
	size_t got = 0;

	while (got < len) {
		ssize_t r = pread(fd, (char *)buf + got, len - got, (off_t)(off + got));
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -1;
		if (r == 0)
			break;
		got += (size_t)r;
	}
	return (ssize_t)got;
}

/* Reads the whole of dirfd/name, opened as userfile_open does, NUL-terminated (see format.h). */
char *userfile_read(int dirfd, const char *name, uint64_t max, int flags, size_t *len,
		    int *err, char *why, size_t whylen)
{
	struct stat st;
	char *buf;
	int fd = userfile_open(dirfd, name, max, flags, &st, why, whylen);

	*err = fd < 0 ? -fd : 0;
	if (fd < 0)
		return NULL;
	if (!(buf = malloc((size_t)st.st_size + 1))) {
		*err = ENOMEM;
		snprintf(why, whylen, "out of memory");
		close(fd);
		return NULL;
	}
	ssize_t n = userfile_pread(fd, buf, (size_t)st.st_size, 0);
	if (n != st.st_size) {
		*err = n < 0 ? errno : EIO;
		snprintf(why, whylen, "read error: %s", n < 0 ? strerror(errno) : "file shrank");
		free(buf);
		close(fd);
		return NULL;
	}
	close(fd);
	buf[n] = '\0';
	*len = (size_t)n;
	return buf;
}
