/*
 * check_lib_stage.c — host memory the library did not allocate (plain malloc) is staged
 * into the library's shared memory (client/lib/stage.c): a save seen at SNAPSHOT gives its
 * staging memory to the next save of the connection (which then copies into pages already in
 * place instead of faulting in fresh ones), a save freed before SNAPSHOT was seen does not, and every file holds exactly the bytes of its own save, also when the copy
 * is split between threads. Real daemon, real socket; the staging memory is read from
 * /proc/self/maps (memfd:dsckpt-stage).
 */
#include "harness_daemon.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Bytes of the large save: several slices of the split copy. */
#define BIG (80 * MIB)

/* The inodes of this process's staging mappings (at most max) into out; their number. */
static int stage_inodes(unsigned long *out, int max)
{
	FILE *f = fopen("/proc/self/maps", "r");
	char line[512];
	int n = 0;

	ck_assert_ptr_nonnull(f);
	while (fgets(line, sizeof(line), f)) {
		unsigned long ino;
		if (!strstr(line, "memfd:dsckpt-stage") ||
		    sscanf(line, "%*s %*s %*s %*s %lu", &ino) != 1)
			continue;
		int seen = 0;
		for (int i = 0; i < n; i++)
			seen |= out[i] == ino;
		if (!seen && n < max)
			out[n++] = ino;
	}
	fclose(f);
	return n;
}

/* Saves n bytes of seed's pattern from malloc'd memory as dir/rank0 and waits for level
 * (NONE: not at all); the save, not freed. */
static dsckpt_save_t *save_heap(dsckpt_conn_t *c, const char *dir, size_t n, uint64_t seed,
				int level)
{
	uint8_t *heap = malloc(n);
	int64_t shape[1] = {(int64_t)n};
	dsckpt_save_t *s;

	ck_assert_ptr_nonnull(heap);
	h_pattern_fill(heap, n, seed);
	CK_DS(c, dsckpt_save_begin(c, dir, "rank0", &s));
	CK_DS(c, dsckpt_add_tensor(s, "t", "U8", shape, 1, heap, n));
	CK_DS(c, dsckpt_save_end(s));
	memset(heap, 0xee, n);	/* staged: the save no longer reads it */
	free(heap);
	if (level != DSCKPT_NONE)
		wait_level(c, s, level, 60000);
	return s;
}

/*
 * Three saves of malloc'd memory on one connection: the second copies into the first's staging
 * memory (one memfd throughout), the third, larger than it, into new memory; each file holds
 * its own bytes. A save freed before it was seen at SNAPSHOT leaves nothing for the next.
 */
START_TEST(test_stage_reused)
{
	unsigned long first[8], now[8];

	d_start(CACHE_32M, CHUNK_1M);
	dsckpt_conn_t *c = conn_open("stage", 0, 1);
	dsckpt_save_t *s = save_heap(c, h_path("%s/stage/s1", D->root), 3 * MIB, 1,
				     DSCKPT_SNAPSHOT);
	ck_assert_int_eq(stage_inodes(first, 8), 1);

	/* The first save, not freed yet, was seen at SNAPSHOT: its memory serves the second. */
	dsckpt_save_t *s2 = save_heap(c, h_path("%s/stage/s2", D->root), 5 * MIB, 2,
				      DSCKPT_DURABLE);
	ck_assert_msg(stage_inodes(now, 8) == 1 && now[0] == first[0],
		      "the second save did not reuse the first one's staging memory");
	wait_level(c, s, DSCKPT_DURABLE, 60000);
	dsckpt_save_free(s);
	dsckpt_save_free(s2);
	ck_assert_msg(stage_inodes(now, 8) == 1 && now[0] == first[0],
		      "freeing the saves dropped the kept staging memory");
	check_pattern_file(h_path("%s/stage/s1", D->root), "rank0", 3 * MIB, 1);
	check_pattern_file(h_path("%s/stage/s2", D->root), "rank0", 5 * MIB, 2);

	s = save_heap(c, h_path("%s/stage/s3", D->root), BIG, 3, DSCKPT_DURABLE);
	ck_assert_int_eq(stage_inodes(now, 8), 2);	/* the 64 MiB arena was too small */
	dsckpt_save_free(s);
	check_pattern_file(h_path("%s/stage/s3", D->root), "rank0", BIG, 3);

	/* Freed before anything said SNAPSHOT: its memory may still be read, so it goes. */
	s = save_heap(c, h_path("%s/stage/s4", D->root), BIG, 4, DSCKPT_NONE);
	ck_assert_int_eq(stage_inodes(now, 8), 2);	/* it took the large arena from the pool */
	dsckpt_save_free(s);
	ck_assert_int_eq(stage_inodes(now, 8), 1);
	ck_assert_int_eq(ctl(NULL, "wait --dir %s/stage/s4 --timeout 60", D->root), 0);
	check_pattern_file(h_path("%s/stage/s4", D->root), "rank0", BIG, 4);
	dsckpt_close(c);
	ck_assert_int_eq(stage_inodes(now, 8), 0);	/* the pool goes with the connection */
	d_stop();
}
END_TEST

/* The suite. */
static Suite *lib_stage_suite(void)
{
	Suite *s = suite_create("lib stage");
	h_add_case(s, "stage reused", test_stage_reused, 180, 1);
	return s;
}

CHECK_MAIN(lib_stage_suite)
