/*
 * fuzz_config.c — libFuzzer target for the config loader: each input is written to a temporary
 * file and loaded; any crash, leak or sanitizer report is a bug.
 */
#include "../daemon/dsckptd.h"

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Loads data as a config file and frees whatever came out. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static char path[32];
	static int fd = -1;
	struct config *cfg;
	char err[1024];

	if (fd < 0) {
		log_init("fuzz_config", LOG_LVL_ERROR);
		/* An unlinked file read through /proc/self/fd: nothing is left behind. */
		if ((fd = open("/tmp", O_RDWR | O_TMPFILE, 0600)) < 0)
			abort();
		snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	}
	if (ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != (ssize_t)size)
		abort();
	if (config_load(path, &cfg, err, sizeof(err)) == 0)
		config_free(cfg);
	return 0;
}
