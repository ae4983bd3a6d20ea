/*
 * cache_numa.c — the machine's NUMA topology as cache.c cuts its pools by it: the online
 * nodes that have CPUs (and those CPUs), and the node of a PCI device (a GPU), read from sysfs
 * (or, for tests, a fake tree in its place).
 */
#include "dsckptd.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Where the NUMA topology is read; tests point it at a fake tree. */
static const char *sysfs_root = "/sys";

/* Test hook: reads the NUMA topology under root instead of /sys (NULL restores /sys). */
void cache_set_sysfs(const char *root)
{
	sysfs_root = root ? root : "/sys";
}

/* Reads the first line of sysfs_root/<path> into buf (newline dropped); -1 if unreadable. */
static int sysfs_line(char *buf, size_t len, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static int sysfs_line(char *buf, size_t len, const char *fmt, ...)
{
	char rel[256], path[512];
	va_list ap;
	FILE *f;

	va_start(ap, fmt);
	vsnprintf(rel, sizeof(rel), fmt, ap);
	va_end(ap);
	snprintf(path, sizeof(path), "%s/%s", sysfs_root, rel);
	if ((f = fopen(path, "re")) == NULL)
		return -1;
	if (fgets(buf, (int)len, f) == NULL)
		buf[0] = '\0';
	fclose(f);
	buf[strcspn(buf, "\n")] = '\0';
	return 0;
}

/* Parses a kernel list ("0-3,8,10-11", "" is empty) into set (CPUs, or node ids); -1 if bad. */
static int cache_parse_list(const char *s, cpu_set_t *set)
{
	CPU_ZERO(set);
	while (*s) {
		char *end;
		unsigned long a = strtoul(s, &end, 10), b = a;
		if (end == s)
			return -1;
		if (*end == '-') {
			s = end + 1;
			b = strtoul(s, &end, 10);
			if (end == s || b < a)
				return -1;
		}
		if (b >= CPU_SETSIZE)
			return -1;
		for (unsigned long i = a; i <= b; i++)
			CPU_SET(i, set);
		s = end;
		if (*s == ',')
			s++;
		else if (*s)
			return -1;
	}
	return 0;
}

/*
 * Finds the NUMA nodes to split the cache over: online nodes that have CPUs (memory-only
 * nodes, such as a Grace Hopper GPU's own memory, are left out), with their CPUs. Returns how
 * many (ids in nodes[], ascending); 0 or 1 means the cache is not split.
 */
unsigned cache_nodes(int nodes[CACHE_MAX_NODES], cpu_set_t cpus[CACHE_MAX_NODES])
{
	char line[4096];
	cpu_set_t online;
	unsigned n = 0;

	if (sysfs_line(line, sizeof(line), "devices/system/node/online") < 0 ||
	    cache_parse_list(line, &online) < 0)
		return 0;
	for (int i = 0; i < CPU_SETSIZE; i++) {
		if (!CPU_ISSET(i, &online))
			continue;
		if (i >= CACHE_MAX_NODES) {
			log_warnx("NUMA node %d is beyond the %d supported: one cache pool", i,
				  CACHE_MAX_NODES);
			return 0;
		}
		if (sysfs_line(line, sizeof(line), "devices/system/node/node%d/cpulist", i) < 0 ||
		    cache_parse_list(line, &cpus[n]) < 0 || CPU_COUNT(&cpus[n]) == 0)
			continue;
		nodes[n++] = i;
	}
	return n;
}

/* NUMA node of a PCI device ("0000:3b:00.0", any case) from sysfs; -1 if unknown. */
int cache_pci_node(const char *busid)
{
	char id[32], line[32], *end;
	long node;
	size_t i;

	for (i = 0; busid[i] && i < sizeof(id) - 1; i++)
		id[i] = (char)(busid[i] >= 'A' && busid[i] <= 'F' ? busid[i] - 'A' + 'a' : busid[i]);
	id[i] = '\0';
	if (sysfs_line(line, sizeof(line), "bus/pci/devices/%s/numa_node", id) < 0)
		return -1;
	node = strtol(line, &end, 10);
	return end == line || *end || node < 0 || node >= CACHE_MAX_NODES ? -1 : (int)node;
}
