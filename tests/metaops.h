/*
 * metaops.h — the counter page the LD_PRELOAD shim tests/metaops.c shares with check_nodes:
 * one 64-bit counter per kind of metadata operation, added to by every daemon that maps it.
 */
#ifndef DSCKPT_METAOPS_H
#define DSCKPT_METAOPS_H

#define METAOPS_PAGE 4096
enum { METAOPS_OPEN, METAOPS_STAT, METAOPS_RENAME, METAOPS_UNLINK, METAOPS_MKDIR, METAOPS_KINDS };

#endif
