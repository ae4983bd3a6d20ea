/*
 * metaops.h — the counter page the LD_PRELOAD shim tests/metaops.c shares with check_nodes:
 * one 64-bit counter per kind of metadata operation, then one per kind and class of path it
 * names, then each process's total (by pid), added to by every daemon that maps it.
 */
#ifndef DSCKPT_METAOPS_H
#define DSCKPT_METAOPS_H

#define METAOPS_PAGE 4096
enum { METAOPS_OPEN, METAOPS_STAT, METAOPS_RENAME, METAOPS_UNLINK, METAOPS_MKDIR, METAOPS_KINDS };
/* What an operation's path names, by its last component: a seal record, a checkpoint file
 * (.safetensors, .meta), the manifest, latest, a directory (".", a name without a dot: a tag,
 * a job, a component of the root), a system file (/proc, /sys, /dev, /etc), or else. */
enum { METAOPS_P_SEAL, METAOPS_P_FILE, METAOPS_P_MANIFEST, METAOPS_P_LATEST, METAOPS_P_DIR,
       METAOPS_P_SYS, METAOPS_P_OTHER, METAOPS_PATHS };
/* The counter of kind on paths of class p, after the METAOPS_KINDS totals. */
#define METAOPS_AT(kind, p) (METAOPS_KINDS + (kind) * METAOPS_PATHS + (p))
/* Then the processes counting, each in the first free slot: its pid, and its total. */
#define METAOPS_PROCS 128
#define METAOPS_PID(i) (METAOPS_AT(METAOPS_KINDS, 0) + (i))
#define METAOPS_PROC(i) (METAOPS_PID(METAOPS_PROCS) + (i))

#endif
