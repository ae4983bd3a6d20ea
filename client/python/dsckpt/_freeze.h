/* _freeze.h — dsckpt._match's freeze(), same_frozen() and encode_tree() (see _freeze.c). */
#ifndef DSCKPT_FREEZE_H
#define DSCKPT_FREEZE_H

#include <Python.h>

/* freeze(obj): (copy, nodes) of a tree of plain containers and atoms, or None. */
PyObject *dsckpt_freeze(PyObject *self, PyObject *obj);

/* same_frozen(frozen, obj): whether obj would encode to what frozen's copy encodes to. */
PyObject *dsckpt_same_frozen(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

/* encode_tree(obj): obj in dsckpt._tree's format, or NotImplemented. */
PyObject *dsckpt_encode_tree(PyObject *self, PyObject *obj);

/* Looks up what the functions need at the module's import; -1 on error. */
int dsckpt_freeze_init(void);

#endif
