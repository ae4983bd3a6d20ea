/*
 * verify.h — `dsckptctl verify`'s parts: the run and its report (verify.c), the checks of one
 * safetensors file (verify_st.c), of MANIFEST.json against the directory
 * (verify_manifest.c) and of one file named alone (verify_file.c). The format itself is format/'s; these files only compare.
 */
#ifndef DSCKPTCTL_VERIFY_H
#define DSCKPTCTL_VERIFY_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>
#include <xxh_x86dispatch.h>  /* XXH3 with the CPU's widest vectors (AVX2, AVX-512) */

#include "../../format/format.h"

#define VERIFY_BLOCK (16u << 20)         /* bytes read and hashed at a time */

enum vkind { VK_SAFETENSORS, VK_META, VK_PARTIAL, VK_MANIFEST };

/* One file of the directory, or one the manifest lists. */
struct vfile {
	char *name;
	enum vkind kind;
	int present;            /* a regular file in the directory */
	int listed;             /* named in the manifest */
	uint64_t size;
	cJSON *problems;        /* strings; none: the file is OK */
	char detail[200];       /* what an OK line says */
	/* safetensors only */
	struct st_header *h;    /* the parsed header, once it is sound */
	uint64_t data_start;    /* 8 + header length, once that is sane */
	const struct st_entry **order; /* h's tensors sorted by offset */
	uint64_t *sum;          /* computed checksum of h->t[i], once hashed */
	uint8_t *t_listed;      /* h->t[i] matched by a manifest entry */
	int hashed;             /* structure sound, sum[] and data_xxh3 computed */
	uint64_t data_xxh3;
};

/* One run of verify. */
struct verify {
	int dirfd;
	struct vfile **f;
	size_t n, cap;
	cJSON *problems;        /* about the directory as a whole */
	uint8_t *buf;           /* VERIFY_BLOCK bytes */
	XXH3_state_t *tensor_state, *data_state;
};

/* verify.c */
/* Name of a kind ("safetensors", "meta", "partial", "manifest"). */
const char *verify_kind_name(enum vkind kind);
/* The kind of a file name, or -1 for names verify ignores. */
int verify_classify(const char *name);
/* Records a problem of file f. */
void verify_problem(struct vfile *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Reads exactly len bytes at off: 0, -1 with errno, or 1 if the file ends first. */
int verify_read_at(int fd, void *buf, size_t len, uint64_t off);
/* Records why a verify_read_at of f failed. */
void verify_read_problem(struct vfile *f, int rc);
/* Compares a computed checksum with a recorded one (NULL: absent), naming what and where. */
void verify_sum_compare(struct vfile *f, const char *what, uint64_t have, const char *recorded,
			const char *where);
/* Adds an entry for file name of kind; NULL when memory is gone. */
struct vfile *vfile_add(struct verify *v, const char *name, enum vkind kind);
/* The entry of file name, or NULL. */
struct vfile *vfile_find(struct verify *v, const char *name);
/* Frees an entry. */
void vfile_free(struct vfile *f);
/* Prepares v to check the files of directory dirfd (taken over); -1 once why is printed. */
int verify_begin(struct verify *v, int dirfd);
/* Frees what verify_begin and the checks allocated, and closes the directory. */
void verify_end(struct verify *v);
struct ctl;
/* Sorts the entries, prints the report on what (a directory or a file) and returns the exit
 * status: CTL_OK only when ok and the report was printed. */
int verify_report(const struct ctl *ctl, struct verify *v, const char *what, int committed,
		  int ok);

/* verify_st.c */
/* Checks one safetensors file: header, layout, then every byte against its checksums. */
void verify_st_check(struct verify *v, struct vfile *f);

/* verify_manifest.c */
/* XXH3-64 of a whole file (a .meta file's checksum); -1 with a problem noted. */
int verify_hash_whole(struct verify *v, struct vfile *f, uint64_t *out);
/* Checks the manifest m against the directory: every entry, world coverage, unlisted files. */
void verify_manifest_check(struct verify *v, struct vfile *mf, const struct manifest *m);
/* Checks file f alone against its entry in the manifest m (a problem when it has none). */
void verify_manifest_file(struct verify *v, struct vfile *mf, const struct manifest *m,
			  struct vfile *f);

/* verify_file.c */
/* Checks the one file ctl->arg (a .safetensors or .meta file, or a link beside it naming
 * one): its own structure and checksums, and MANIFEST.json's entry when one lies beside it. */
int verify_file_run(struct ctl *ctl);

#endif /* DSCKPTCTL_VERIFY_H */
