/*
 * _match.c — dsckpt._match: Shape.match (client/python/dsckpt/_shape.py) in one pass per
 * level, an optional speed-up that _shape.py falls back from when it is not built.
 *
 * match(plan, root) walks root level by level, breadth first, as Shape.match_py does, and
 * returns the same thing: (tensors, leaves), or None when root's containers are not those
 * recorded. It knows nothing of tensors: the plan's codes say which child is a tensor, a
 * container of the next level or a leaf, as the recorded masks do. compile(levels) makes the
 * plan once (a capsule of C arrays over the levels, which it keeps) from a tuple of levels
 * that _shape._plan builds, each a tuple of:
 *
 *   types       tuple: each container's exact type
 *   lens        bytes: each container's len(), native Py_ssize_t
 *   flags       bytes: per container, FLAG_DICT (children: values, else items) and
 *               FLAG_ATTRS (its vars() holds leaves)
 *   keys        tuple: the keys of the level's dicts, in order (str and int only)
 *   attr_lens   bytes: the len() of each vars() of a FLAG_ATTRS container, Py_ssize_t
 *   attr_keys   tuple: their keys, in order
 *   codes       bytes: per child (dict values first, then sequence items) CODE_LEAF,
 *               CODE_TENSOR or CODE_SUB
 *   all_tensors bool: every child is a tensor (the level's codes are then not read)
 *
 * The order of the calls that may run Python code (len() of a subclass, iter() and values()
 * of a dict that is not exactly dict, vars()) is Python's: per level every type, then every
 * len(), the keys, the attributes, the children. Where Python would compare keys that are
 * neither exact str nor exact int (whose == may run code), or read a vars() that is not a
 * dict, match returns NotImplemented and the caller takes the Python path.
 *
 * The containers met are kept, each with a reference, in one array (each level a run of it)
 * until the final check that they are distinct objects, as Python's containers list keeps
 * them.
 *
 * same_pointers(fn, tensors, ptrs) is the pointer part of a warm save's proof
 * (_handover._Tensors): one call of torch's C function per tensor instead of a Python call
 * of Tensor.data_ptr and an int to compare.
 *
 * Built against the limited API of Python 3.11 (abi3): one .so serves 3.11 and later.
 */
#define PY_SSIZE_T_CLEAN
#define Py_LIMITED_API 0x030B0000
#include <Python.h>
#include "_freeze.h"

/* Bump with _shape.py's match_module(...) argument when the plan's layout changes. */
#define MATCH_PLAN_VERSION 1
#define PLAN_CAPSULE "dsckpt._match.plan"

#define FLAG_DICT 1
#define FLAG_ATTRS 2
#define CODE_LEAF 0
#define CODE_TENSOR 1
#define CODE_SUB 2

/* Verdicts of a step: go on, not the recorded shape, take the Python path, or an error set. */
enum verdict { GO_ON, MISMATCH, FALLBACK, ERROR };

/* One level of a compiled plan; the objects are borrowed from the plan's tuples. */
struct level {
	PyObject **types, **keys, **attr_keys;
	const Py_ssize_t *lens, *attr_lens;
	const unsigned char *flags, *codes;
	Py_ssize_t ntypes, nkeys, nattrs, nattr_keys, ncodes;
	int all_tensors, any_attrs;
};

/* A compiled plan: its levels, the tuple they point into (one reference), the containers a
 * match meets. */
struct plan {
	PyObject *src;
	struct level *levels;
	Py_ssize_t nlevels, ncontainers;
};

/* What a match fills: tensors, leaves, and every container met (a reference each). */
struct walk {
	PyObject *tensors, *leaves;
	PyObject **held;
	Py_ssize_t nheld, cap;
};

PyMODINIT_FUNC PyInit__match(void);

/* The number of Py_ssize_t in a bytes object (*out: them), or -1 with an error set. */
static Py_ssize_t ssizes_read(PyObject *b, const Py_ssize_t **out)
{
	Py_ssize_t n = PyBytes_Size(b);

	if (n < 0)
		return -1;
	if (n % (Py_ssize_t)sizeof(Py_ssize_t)) {
		PyErr_SetString(PyExc_ValueError, "dsckpt._match: a lengths field is not whole");
		return -1;
	}
	*out = (const Py_ssize_t *)PyBytes_AsString(b);
	return n / (Py_ssize_t)sizeof(Py_ssize_t);
}

/* A C array of a tuple's items (borrowed; *n: their number), or NULL with an error set. */
static PyObject **items_read(PyObject *t, Py_ssize_t *n)
{
	PyObject **out;

	*n = PyTuple_Size(t);
	if (!(out = PyMem_Calloc(*n ? *n : 1, sizeof(*out)))) {
		PyErr_NoMemory();
		return NULL;
	}
	for (Py_ssize_t i = 0; i < *n; i++)
		out[i] = PyTuple_GetItem(t, i);
	return out;
}

/* Reads one level's tuple into lv; -1 with an error set when it is malformed. */
static int level_read(PyObject *t, struct level *lv)
{
	PyObject *f[8];
	Py_ssize_t nlens, nflags;

	if (!PyTuple_Check(t) || PyTuple_Size(t) != 8) {
		PyErr_SetString(PyExc_TypeError, "dsckpt._match: a plan level is not an 8-tuple");
		return -1;
	}
	for (int i = 0; i < 8; i++)
		f[i] = PyTuple_GetItem(t, i);
	if (!PyTuple_Check(f[0]) || !PyBytes_Check(f[1]) || !PyBytes_Check(f[2]) ||
	    !PyTuple_Check(f[3]) || !PyBytes_Check(f[4]) || !PyTuple_Check(f[5]) ||
	    !PyBytes_Check(f[6])) {
		PyErr_SetString(PyExc_TypeError, "dsckpt._match: a plan level's field types");
		return -1;
	}
	if (!(lv->types = items_read(f[0], &lv->ntypes)) ||
	    !(lv->keys = items_read(f[3], &lv->nkeys)) ||
	    !(lv->attr_keys = items_read(f[5], &lv->nattr_keys)) ||
	    (nlens = ssizes_read(f[1], &lv->lens)) < 0 ||
	    (lv->nattrs = ssizes_read(f[4], &lv->attr_lens)) < 0 ||
	    (lv->all_tensors = PyObject_IsTrue(f[7])) < 0)
		return -1;
	lv->flags = (const unsigned char *)PyBytes_AsString(f[2]);
	nflags = PyBytes_Size(f[2]);
	lv->codes = (const unsigned char *)PyBytes_AsString(f[6]);
	lv->ncodes = PyBytes_Size(f[6]);
	if (nlens != lv->ntypes || nflags != lv->ntypes) {
		PyErr_SetString(PyExc_ValueError, "dsckpt._match: a plan level's lengths disagree");
		return -1;
	}
	for (Py_ssize_t i = 0; i < lv->ncodes; i++)
		if (lv->codes[i] > CODE_SUB) {
			PyErr_SetString(PyExc_ValueError, "dsckpt._match: a child's code");
			return -1;
		}
	lv->any_attrs = 0;
	for (Py_ssize_t i = 0; i < lv->ntypes; i++)
		lv->any_attrs |= (lv->flags[i] & FLAG_ATTRS) != 0;
	return 0;
}

/* Frees a plan: its arrays and its reference to the levels' tuple. */
static void plan_free(struct plan *p)
{
	for (Py_ssize_t l = 0; p->levels && l < p->nlevels; l++) {
		PyMem_Free(p->levels[l].types);
		PyMem_Free(p->levels[l].keys);
		PyMem_Free(p->levels[l].attr_keys);
	}
	PyMem_Free(p->levels);
	Py_XDECREF(p->src);
	PyMem_Free(p);
}

/* The capsule's destructor. */
static void plan_capsule_free(PyObject *capsule)
{
	plan_free(PyCapsule_GetPointer(capsule, PLAN_CAPSULE));
}

/* compile(levels): the plan of a tuple of levels, a capsule for match(). */
static PyObject *match_compile(PyObject *self, PyObject *src)
{
	struct plan *p;
	PyObject *capsule;

	if (!PyTuple_Check(src)) {
		PyErr_SetString(PyExc_TypeError, "compile(levels: tuple)");
		return NULL;
	}
	if (!(p = PyMem_Calloc(1, sizeof(*p))))
		return PyErr_NoMemory();
	p->src = Py_NewRef(src);
	p->nlevels = PyTuple_Size(src);
	if (!(p->levels = PyMem_Calloc(p->nlevels ? p->nlevels : 1, sizeof(*p->levels)))) {
		plan_free(p);
		return PyErr_NoMemory();
	}
	for (Py_ssize_t l = 0; l < p->nlevels; l++) {
		if (level_read(PyTuple_GetItem(src, l), &p->levels[l]) < 0) {
			plan_free(p);
			return NULL;
		}
		p->ncontainers += p->levels[l].ntypes;
	}
	if (!(capsule = PyCapsule_New(p, PLAN_CAPSULE, plan_capsule_free)))
		plan_free(p);
	return capsule;
}

/* Keeps a container of the next level (a new reference); -1 with an error set. */
static int held_push(struct walk *w, PyObject *c)
{
	if (w->nheld == w->cap) {
		Py_ssize_t cap = w->cap * 2 + 16;
		PyObject **grown = PyMem_Realloc(w->held, cap * sizeof(*grown));

		if (!grown) {
			PyErr_NoMemory();
			return -1;
		}
		w->held = grown;
		w->cap = cap;
	}
	w->held[w->nheld++] = Py_NewRef(c);
	return 0;
}

/* Whether a key is compared here: exact str and int compare without running Python code. */
static int key_plain(PyObject *k)
{
	return PyUnicode_CheckExact(k) || PyLong_CheckExact(k);
}

/* The len() of an exact dict, list or tuple, which runs no Python code; -1 for another type. */
static Py_ssize_t size_pure(PyObject *c)
{
	if (PyDict_CheckExact(c))
		return PyDict_Size(c);
	if (PyList_CheckExact(c))
		return PyList_Size(c);
	if (PyTuple_CheckExact(c))
		return PyTuple_Size(c);
	return -1;
}

/* Checks each container of the level (held[lo..hi)) for its exact type (a metaclass of its
 * own may define ==: Python's), then its len(): every len() is taken before the verdict, as
 * Python's list of them is (those of exact dicts, lists and tuples run no code and are taken
 * with the types). */
static enum verdict level_shape(struct walk *w, Py_ssize_t lo, Py_ssize_t hi,
				const struct level *lv)
{
	enum verdict v = GO_ON;
	Py_ssize_t n;
	int odd = 0;

	if (hi - lo != lv->ntypes)
		return MISMATCH;
	for (Py_ssize_t i = 0; i < lv->ntypes; i++) {
		PyObject *c = w->held[lo + i], *want = lv->types[i];
		PyTypeObject *t = Py_TYPE(c);

		if ((PyObject *)t != want) {
			if (Py_TYPE((PyObject *)t) != &PyType_Type || Py_TYPE(want) != &PyType_Type)
				return FALLBACK;
			return MISMATCH;
		}
		if ((n = size_pure(c)) < 0)
			odd = 1;
		else if (n != lv->lens[i])
			v = MISMATCH;
	}
	for (Py_ssize_t i = 0; odd && i < lv->ntypes; i++) {
		PyObject *c = w->held[lo + i];

		if (size_pure(c) >= 0)
			continue;
		if ((n = PyObject_Size(c)) < 0)
			return ERROR;
		if (n != lv->lens[i])
			v = MISMATCH;
	}
	return v;
}

/* Compares k with the at-th of the nwant recorded keys; counts it. MISMATCH sticks in *v. */
static enum verdict key_check(PyObject *k, PyObject *const *want, Py_ssize_t nwant,
			      Py_ssize_t *at, enum verdict *v)
{
	Py_ssize_t i = (*at)++;
	int eq;

	if (*v == MISMATCH)
		return GO_ON;  /* Python stops comparing at the first difference */
	if (i >= nwant) {
		*v = MISMATCH;
		return GO_ON;
	}
	if (k == want[i])
		return GO_ON;
	if (!key_plain(k))
		return FALLBACK;
	if ((eq = PyObject_RichCompareBool(k, want[i], Py_EQ)) < 0)
		return ERROR;
	if (!eq)
		*v = MISMATCH;
	return GO_ON;
}

/* Checks the keys of every dict of the level against the recorded ones (iter() of each dict,
 * as Python's chain of them: all of it, for the code an iterator may run). */
static enum verdict level_keys(struct walk *w, Py_ssize_t lo, const struct level *lv)
{
	enum verdict v = GO_ON, step;
	Py_ssize_t at = 0;

	for (Py_ssize_t i = 0; i < lv->ntypes; i++) {
		PyObject *c = w->held[lo + i], *k, *val, *it;
		Py_ssize_t pos = 0;

		if (!(lv->flags[i] & FLAG_DICT))
			continue;
		if (PyDict_CheckExact(c)) {
			while (PyDict_Next(c, &pos, &k, &val))
				if ((step = key_check(k, lv->keys, lv->nkeys, &at, &v)) != GO_ON)
					return step;
			continue;
		}
		if (!(it = PyObject_GetIter(c)))
			return ERROR;
		while ((k = PyIter_Next(it))) {
			step = key_check(k, lv->keys, lv->nkeys, &at, &v);
			Py_DECREF(k);
			if (step != GO_ON) {
				Py_DECREF(it);
				return step;
			}
		}
		Py_DECREF(it);
		if (PyErr_Occurred())
			return ERROR;
	}
	if (at != lv->nkeys)
		v = MISMATCH;
	return v;
}

/* Checks the level's attribute dicts (vars() of each FLAG_ATTRS container: all of them, then
 * their lens, then their keys) and appends their values to the leaves. */
static enum verdict level_attrs(struct walk *w, Py_ssize_t lo, const struct level *lv)
{
	PyObject *attrs = PyList_New(0), *d, *k, *val;
	enum verdict v = GO_ON, step = GO_ON;
	Py_ssize_t at = 0, n;

	if (!attrs)
		return ERROR;
	for (Py_ssize_t i = 0; i < lv->ntypes; i++) {
		if (!(lv->flags[i] & FLAG_ATTRS))
			continue;
		if (!(d = PyObject_GetAttrString(w->held[lo + i], "__dict__"))) {
			if (PyErr_ExceptionMatches(PyExc_AttributeError)) {  /* as vars() says it */
				PyErr_Clear();
				PyErr_SetString(PyExc_TypeError,
						"vars() argument must have __dict__ attribute");
			}
			step = ERROR;
			goto out;
		}
		if (PyList_Append(attrs, d) < 0)
			step = ERROR;
		else if (!PyDict_CheckExact(d))
			step = FALLBACK;
		Py_DECREF(d);
		if (step != GO_ON)
			goto out;
	}
	if ((n = PyList_Size(attrs)) != lv->nattrs) {
		PyErr_SetString(PyExc_ValueError, "dsckpt._match: attribute lengths disagree");
		step = ERROR;
		goto out;
	}
	for (Py_ssize_t i = 0; i < n; i++)
		if (PyDict_Size(PyList_GetItem(attrs, i)) != lv->attr_lens[i])
			v = MISMATCH;
	for (Py_ssize_t i = 0; i < n && v == GO_ON; i++) {
		Py_ssize_t pos = 0;

		while (PyDict_Next(PyList_GetItem(attrs, i), &pos, &k, &val))
			if ((step = key_check(k, lv->attr_keys, lv->nattr_keys, &at, &v)) != GO_ON)
				goto out;
	}
	if (v == GO_ON && at != lv->nattr_keys)
		v = MISMATCH;
	for (Py_ssize_t i = 0; i < n && v == GO_ON; i++) {
		Py_ssize_t pos = 0;

		while (PyDict_Next(PyList_GetItem(attrs, i), &pos, &k, &val))
			if (PyList_Append(w->leaves, val) < 0) {
				step = ERROR;
				goto out;
			}
	}
out:
	Py_DECREF(attrs);
	return step != GO_ON ? step : v;
}

/* Puts the at-th child where its code says: tensors, leaves or the next level. A child past
 * the codes is dropped, as compress() drops it, unless every child is a tensor. */
static int child_route(PyObject *child, Py_ssize_t at, const struct level *lv,
		       struct walk *w)
{
	if (lv->all_tensors)
		return PyList_Append(w->tensors, child);
	if (at >= lv->ncodes)
		return 0;
	switch (lv->codes[at]) {
	case CODE_TENSOR:
		return PyList_Append(w->tensors, child);
	case CODE_SUB:
		return held_push(w, child);
	case CODE_LEAF:
		return PyList_Append(w->leaves, child);
	}
	return 0;  /* level_read let no other code in */
}

/* Routes every child of an iterable (a dict's values(), a sequence subclass's items). */
static int children_iter(PyObject *iterable, Py_ssize_t *at, const struct level *lv,
			 struct walk *w)
{
	PyObject *it = PyObject_GetIter(iterable), *child;
	int rc = 0;

	if (!it)
		return -1;
	while (rc == 0 && (child = PyIter_Next(it))) {
		rc = child_route(child, (*at)++, lv, w);
		Py_DECREF(child);
	}
	Py_DECREF(it);
	return rc < 0 || PyErr_Occurred() ? -1 : 0;
}

/* Routes the children of one container: a dict's values, a sequence's items. */
static int container_children(PyObject *c, int is_dict, Py_ssize_t *at,
			      const struct level *lv, struct walk *w)
{
	PyObject *k, *val, *values;
	Py_ssize_t pos = 0, n;
	int rc;

	if (is_dict && PyDict_CheckExact(c)) {
		while (PyDict_Next(c, &pos, &k, &val))
			if (child_route(val, (*at)++, lv, w) < 0)
				return -1;
		return 0;
	}
	if (is_dict) {  /* OrderedDict, a subclass: its own values(), as methodcaller calls it */
		if (!(values = PyObject_CallMethod(c, "values", NULL)))
			return -1;
		rc = children_iter(values, at, lv, w);
		Py_DECREF(values);
		return rc;
	}
	if (PyList_CheckExact(c)) {
		for (Py_ssize_t i = 0; i < PyList_Size(c); i++)
			if (child_route(PyList_GetItem(c, i), (*at)++, lv, w) < 0)
				return -1;
		return 0;
	}
	if (PyTuple_CheckExact(c)) {
		n = PyTuple_Size(c);
		for (Py_ssize_t i = 0; i < n; i++)
			if (child_route(PyTuple_GetItem(c, i), (*at)++, lv, w) < 0)
				return -1;
		return 0;
	}
	return children_iter(c, at, lv, w);
}

/* Routes the level's children: every dict's values, then every sequence's items (those of
 * dicts only when dicts is set: level_plain has routed them). */
static int level_children(struct walk *w, Py_ssize_t lo, const struct level *lv, int dicts,
			  Py_ssize_t at)
{
	for (; dicts >= 0; dicts--)
		for (Py_ssize_t i = 0; i < lv->ntypes; i++) {
			int is_dict = lv->flags[i] & FLAG_DICT;

			if (is_dict == dicts &&
			    container_children(w->held[lo + i], is_dict, &at, lv, w) < 0)
				return -1;
		}
	return 0;
}

/* Checks the keys of a level whose dicts are all exact dicts and routes their values in the
 * same pass (between Python's keys and values nothing runs code here), then the sequences'
 * items. */
static enum verdict level_plain(struct walk *w, Py_ssize_t lo, const struct level *lv)
{
	enum verdict v = GO_ON, step;
	Py_ssize_t keys = 0, at = 0;

	for (Py_ssize_t i = 0; i < lv->ntypes; i++) {
		PyObject *c = w->held[lo + i], *k, *val;
		Py_ssize_t pos = 0;

		if (!(lv->flags[i] & FLAG_DICT))
			continue;
		while (PyDict_Next(c, &pos, &k, &val)) {
			if ((step = key_check(k, lv->keys, lv->nkeys, &keys, &v)) != GO_ON)
				return step;
			if (v == MISMATCH)
				return v;  /* nothing here runs code: no need to go on */
			if (child_route(val, at++, lv, w) < 0)
				return ERROR;
		}
	}
	if (keys != lv->nkeys)
		return MISMATCH;
	return level_children(w, lo, lv, 0, at) < 0 ? ERROR : GO_ON;
}

/* Matches the level held[lo..hi): checks it and routes its children (those of the next
 * level pushed on held). Python's order: types, lens, keys, attributes, children. */
static enum verdict level_match(struct walk *w, Py_ssize_t lo, Py_ssize_t hi,
				const struct level *lv)
{
	enum verdict v;
	int plain = !lv->any_attrs;

	if ((v = level_shape(w, lo, hi, lv)) != GO_ON)
		return v;
	for (Py_ssize_t i = 0; plain && i < lv->ntypes; i++)
		if (lv->flags[i] & FLAG_DICT)
			plain = PyDict_CheckExact(w->held[lo + i]);
	if (plain)
		return level_plain(w, lo, lv);
	if ((v = level_keys(w, lo, lv)) != GO_ON)
		return v;
	if (lv->any_attrs && (v = level_attrs(w, lo, lv)) != GO_ON)
		return v;
	return level_children(w, lo, lv, 1, 0) < 0 ? ERROR : GO_ON;
}

/* Whether the held containers are distinct objects (an open-addressed set of their
 * addresses); -1 with an error set when out of memory. */
static int held_distinct(const struct walk *w)
{
	size_t cap = 16, mask;
	uintptr_t *set;
	int distinct = 1;

	while (cap < 2 * (size_t)w->nheld)
		cap <<= 1;
	mask = cap - 1;
	if (!(set = PyMem_Calloc(cap, sizeof(*set)))) {
		PyErr_NoMemory();
		return -1;
	}
	for (Py_ssize_t i = 0; i < w->nheld && distinct; i++) {
		uintptr_t p = (uintptr_t)w->held[i];
		size_t h = (size_t)(((uint64_t)p * 0x9E3779B97F4A7C15ull) >> 32) & mask;

		while (set[h] && set[h] != p)
			h = (h + 1) & mask;
		distinct = set[h] != p;
		set[h] = p;
	}
	PyMem_Free(set);
	return distinct;
}

/* Walks root through every level of p; returns the verdict, w filled on GO_ON. */
static enum verdict plan_walk(const struct plan *p, PyObject *root, struct walk *w)
{
	Py_ssize_t lo = 0, hi;
	enum verdict v;
	int distinct;

	if (held_push(w, root) < 0)
		return ERROR;
	for (Py_ssize_t l = 0; l < p->nlevels; l++) {
		hi = w->nheld;
		if ((v = level_match(w, lo, hi, &p->levels[l])) != GO_ON)
			return v;
		lo = hi;
	}
	if (w->nheld != lo)  /* containers below the last level */
		return MISMATCH;
	if ((distinct = held_distinct(w)) < 0)
		return ERROR;
	return distinct ? GO_ON : MISMATCH;
}

/* match(plan, root): (tensors, leaves) when root's containers are the plan's, None when not,
 * NotImplemented when the Python path must decide (see the file's opening comment). */
static PyObject *match_match(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
	struct walk w = {0};
	struct plan *p;
	PyObject *out = NULL;
	enum verdict v;

	if (nargs != 2) {
		PyErr_SetString(PyExc_TypeError, "match(plan, root)");
		return NULL;
	}
	if (!(p = PyCapsule_GetPointer(args[0], PLAN_CAPSULE)))
		return NULL;
	w.tensors = PyList_New(0);
	w.leaves = PyList_New(0);
	w.cap = p->ncontainers + 1;
	if (!(w.held = PyMem_Malloc(w.cap * sizeof(*w.held))))
		PyErr_NoMemory();
	if (!w.tensors || !w.leaves || !w.held)
		goto done;
	v = plan_walk(p, args[1], &w);
	if (v == GO_ON)
		out = PyTuple_Pack(2, w.tensors, w.leaves);
	else if (v == MISMATCH)
		out = Py_NewRef(Py_None);
	else if (v == FALLBACK)
		out = Py_NewRef(Py_NotImplemented);
done:
	for (Py_ssize_t i = 0; i < w.nheld; i++)
		Py_DECREF(w.held[i]);
	PyMem_Free(w.held);
	Py_XDECREF(w.tensors);
	Py_XDECREF(w.leaves);
	return out;
}

/* torch's function from a tensor object to its data pointer (see same_pointers). */
typedef void *(*data_ptr_fn)(PyObject *);

/* In _match_ptrs.cc: 1 when fn(objs[i]) is want[i] for each of n objects, else 0 (also
 * where fn throws). */
int dsckpt_match_pointers(data_ptr_fn fn, PyObject *const *objs, size_t n, const size_t *want);

/* same_pointers(fn, tensors, ptrs): whether fn(tensor) is, for every tensor of the list in
 * turn, the pointer at its place in ptrs (bytes of native size_t). fn is the address of
 * torch's C function from a tensor object to its data pointer, which refuses (by a C++
 * exception, caught in _match_ptrs.cc) what is not a tensor with storage: one call per
 * object, no Python call and no Python int. */
static PyObject *match_same_pointers(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
	PyObject **objs;
	data_ptr_fn fn;
	Py_ssize_t n, nbytes;
	char *want;
	int same;

	if (nargs != 3 || !PyList_Check(args[1]) || !PyBytes_Check(args[2])) {
		PyErr_SetString(PyExc_TypeError, "same_pointers(fn, list, bytes)");
		return NULL;
	}
	if (!(fn = (data_ptr_fn)PyLong_AsVoidPtr(args[0]))) {
		if (!PyErr_Occurred())
			PyErr_SetString(PyExc_ValueError, "same_pointers: fn is 0");
		return NULL;
	}
	if ((n = PyList_Size(args[1])) < 0 || PyBytes_AsStringAndSize(args[2], &want, &nbytes) < 0)
		return NULL;
	if (nbytes != n * (Py_ssize_t)sizeof(size_t))
		Py_RETURN_FALSE;
	if (!(objs = PyMem_Malloc((n ? n : 1) * sizeof(*objs))))
		return PyErr_NoMemory();
	for (Py_ssize_t i = 0; i < n; i++)
		objs[i] = PyList_GetItem(args[1], i);   /* borrowed: the list holds them */
	same = dsckpt_match_pointers(fn, objs, (size_t)n, (const size_t *)want);
	PyMem_Free(objs);
	return PyBool_FromLong(same);
}

static PyMethodDef match_methods[] = {
	{"compile", match_compile, METH_O, "compile(levels) -> the plan match() reads"},
	{"match", (PyCFunction)(void (*)(void))match_match, METH_FASTCALL,
	 "match(plan, root) -> (tensors, leaves), None, or NotImplemented (use Python)"},
	{"same_pointers", (PyCFunction)(void (*)(void))match_same_pointers, METH_FASTCALL,
	 "same_pointers(fn, tensors, ptrs) -> whether each tensor's data pointer is recorded"},
	{"freeze", dsckpt_freeze, METH_O, "freeze(obj) -> (copy, nodes) of plain containers, or None"},
	{"same_frozen", (PyCFunction)(void (*)(void))dsckpt_same_frozen, METH_FASTCALL,
	 "same_frozen(frozen, obj) -> whether obj encodes to what frozen's copy encodes to"},
	{"encode_tree", dsckpt_encode_tree, METH_O,
	 "encode_tree(obj) -> obj in dsckpt._tree's format, or NotImplemented"},
	{NULL, NULL, 0, NULL},
};

static struct PyModuleDef match_module = {
	PyModuleDef_HEAD_INIT, "dsckpt._match",
	"Shape.match of dsckpt._shape in C (see _match.c).", -1, match_methods,
	NULL, NULL, NULL, NULL,
};

/* The module: compile(), match(), same_pointers(), freeze(), same_frozen() (_freeze.c) and
 * PLAN_VERSION, which _shape.py checks before use. */
PyMODINIT_FUNC PyInit__match(void)
{
	PyObject *m = PyModule_Create(&match_module);

	if (m && (PyModule_AddIntConstant(m, "PLAN_VERSION", MATCH_PLAN_VERSION) < 0 ||
		  dsckpt_freeze_init() < 0)) {
		Py_DECREF(m);
		return NULL;
	}
	return m;
}
