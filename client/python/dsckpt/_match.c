/*
 * _match.c — dsckpt._match: Shape.match (client/python/dsckpt/_shape.py) in one pass per
 * level, an optional speed-up that _shape.py falls back from when it is not built.
 *
 * match(plan, root) walks root level by level, breadth first, as Shape._match_py does, and
 * returns the same thing: (tensors, leaves), or None when root's containers are not those
 * recorded. It knows nothing of tensors: the plan's codes say which child is a tensor, a
 * container of the next level or a leaf, as the recorded masks do. Each level of the plan is
 * a tuple that Shape._plan builds once:
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
 * Built against the limited API of Python 3.11 (abi3): one .so serves 3.11 and later.
 */
#define PY_SSIZE_T_CLEAN
#define Py_LIMITED_API 0x030B0000
#include <Python.h>
#include <string.h>

/* Bump with _shape.py's _PLAN_VERSION when the plan's layout changes. */
#define MATCH_PLAN_VERSION 1

#define FLAG_DICT 1
#define FLAG_ATTRS 2
#define CODE_LEAF 0
#define CODE_TENSOR 1
#define CODE_SUB 2

/* Verdicts of a step: go on, not the recorded shape, take the Python path, or an error set. */
enum verdict { GO_ON, MISMATCH, FALLBACK, ERROR };

/* One level of the plan, its bytes and tuples borrowed from the plan. */
struct level {
	PyObject *types, *keys, *attr_keys;
	const Py_ssize_t *lens, *attr_lens;
	const unsigned char *flags, *codes;
	Py_ssize_t ntypes, nkeys, nattrs, ncodes;
	int all_tensors;
};

/* The lists a match fills: tensors, leaves, and every level's containers (kept alive for
 * the final check that they are distinct, as Python's containers list keeps them). */
struct walk {
	PyObject *tensors, *leaves, *held;
};

PyMODINIT_FUNC PyInit__match(void);

/* The number of Py_ssize_t in a bytes object, or -1 with an error set when it is not a whole
 * number of them. */
static Py_ssize_t ssize_count(PyObject *b, const Py_ssize_t **out)
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

/* Reads one level's tuple of the plan into lv; -1 with an error set when it is malformed. */
static int level_read(PyObject *t, struct level *lv)
{
	PyObject *f[8];
	Py_ssize_t nlens, nflags, nattr_lens;

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
	lv->types = f[0];
	lv->ntypes = PyTuple_Size(f[0]);
	if ((nlens = ssize_count(f[1], &lv->lens)) < 0 ||
	    (nattr_lens = ssize_count(f[4], &lv->attr_lens)) < 0)
		return -1;
	lv->flags = (const unsigned char *)PyBytes_AsString(f[2]);
	nflags = PyBytes_Size(f[2]);
	lv->keys = f[3];
	lv->nkeys = PyTuple_Size(f[3]);
	lv->attr_keys = f[5];
	lv->nattrs = nattr_lens;
	lv->codes = (const unsigned char *)PyBytes_AsString(f[6]);
	lv->ncodes = PyBytes_Size(f[6]);
	lv->all_tensors = PyObject_IsTrue(f[7]);
	if (lv->all_tensors < 0)
		return -1;
	if (nlens != lv->ntypes || nflags != lv->ntypes) {
		PyErr_SetString(PyExc_ValueError, "dsckpt._match: a plan level's lengths disagree");
		return -1;
	}
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

/* Checks each container's exact type (a metaclass of its own may define ==: Python's), then
 * its len(): every len() is taken before the verdict, as Python's list of them is (those of
 * exact dicts, lists and tuples run no code and are taken with the types). */
static enum verdict level_shape(PyObject *level, const struct level *lv, int *odd)
{
	enum verdict v = GO_ON;
	Py_ssize_t n;

	if (PyList_Size(level) != lv->ntypes)
		return MISMATCH;
	*odd = 0;
	for (Py_ssize_t i = 0; i < lv->ntypes; i++) {
		PyObject *c = PyList_GetItem(level, i), *want = PyTuple_GetItem(lv->types, i);
		PyTypeObject *t = Py_TYPE(c);

		if ((PyObject *)t != want) {
			if (Py_TYPE((PyObject *)t) != &PyType_Type || Py_TYPE(want) != &PyType_Type)
				return FALLBACK;
			return MISMATCH;
		}
		if ((n = size_pure(c)) < 0)
			*odd = 1;
		else if (n != lv->lens[i])
			v = MISMATCH;
	}
	for (Py_ssize_t i = 0; *odd && i < lv->ntypes; i++) {
		PyObject *c = PyList_GetItem(level, i);

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
static enum verdict key_check(PyObject *k, PyObject *wanted, Py_ssize_t nwant, Py_ssize_t *at,
			      enum verdict *v)
{
	Py_ssize_t i = (*at)++;
	PyObject *want;
	int eq;

	if (*v == MISMATCH)
		return GO_ON;  /* Python stops comparing at the first difference */
	if (i >= nwant) {
		*v = MISMATCH;
		return GO_ON;
	}
	want = PyTuple_GetItem(wanted, i);
	if (k == want)
		return GO_ON;
	if (!key_plain(k))
		return FALLBACK;
	eq = PyObject_RichCompareBool(k, want, Py_EQ);
	if (eq < 0)
		return ERROR;
	if (!eq)
		*v = MISMATCH;
	return GO_ON;
}

/* Checks the keys of every dict of the level against the recorded ones (iter() of each dict,
 * as Python's chain of them). */
static enum verdict level_keys(PyObject *level, const struct level *lv)
{
	enum verdict v = GO_ON, step;
	Py_ssize_t at = 0;

	for (Py_ssize_t i = 0; i < lv->ntypes; i++) {
		PyObject *c = PyList_GetItem(level, i), *k, *v_, *it;
		Py_ssize_t pos = 0;

		if (!(lv->flags[i] & FLAG_DICT))
			continue;
		if (PyDict_CheckExact(c)) {
			while (PyDict_Next(c, &pos, &k, &v_))
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

/* Checks the level's attribute dicts (vars() of each FLAG_ATTRS container: their lens, then
 * their keys) and appends their values to the leaves. */
static enum verdict level_attrs(PyObject *level, const struct level *lv, struct walk *w)
{
	PyObject *attrs = PyList_New(0), *d, *k, *val;
	enum verdict v = GO_ON, step = GO_ON;
	Py_ssize_t at = 0, n = 0, natt_keys = PyTuple_Size(lv->attr_keys);

	if (!attrs)
		return ERROR;
	for (Py_ssize_t i = 0; i < lv->ntypes; i++) {
		if (!(lv->flags[i] & FLAG_ATTRS))
			continue;
		d = PyObject_GetAttrString(PyList_GetItem(level, i), "__dict__");
		if (!d) {
			if (PyErr_ExceptionMatches(PyExc_AttributeError)) {
				PyErr_Clear();
				PyErr_SetString(PyExc_TypeError,
						"vars() argument must have __dict__ attribute");
			}
			step = ERROR;
			goto out;
		}
		if (PyList_Append(attrs, d) < 0) {
			Py_DECREF(d);
			step = ERROR;
			goto out;
		}
		Py_DECREF(d);
		if (!PyDict_CheckExact(d)) {
			step = FALLBACK;
			goto out;
		}
	}
	n = PyList_Size(attrs);
	if (n != lv->nattrs) {
		PyErr_SetString(PyExc_ValueError, "dsckpt._match: attribute lengths disagree");
		step = ERROR;
		goto out;
	}
	for (Py_ssize_t i = 0; i < n; i++)
		if (PyDict_Size(PyList_GetItem(attrs, i)) != lv->attr_lens[i])
			v = MISMATCH;
	if (v == MISMATCH)
		goto out;
	for (Py_ssize_t i = 0; i < n; i++) {
		Py_ssize_t pos = 0;

		while (PyDict_Next(PyList_GetItem(attrs, i), &pos, &k, &val))
			if ((step = key_check(k, lv->attr_keys, natt_keys, &at, &v)) != GO_ON)
				goto out;
	}
	if (at != natt_keys)
		v = MISMATCH;
	if (v == MISMATCH)
		goto out;
	for (Py_ssize_t i = 0; i < n; i++) {
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
		       struct walk *w, PyObject *next)
{
	if (lv->all_tensors)
		return PyList_Append(w->tensors, child);
	if (at >= lv->ncodes)
		return 0;
	switch (lv->codes[at]) {
	case CODE_TENSOR:
		return PyList_Append(w->tensors, child);
	case CODE_SUB:
		return PyList_Append(next, child);
	default:
		return PyList_Append(w->leaves, child);
	}
}

/* Routes every child of an iterable (a dict's values(), a sequence subclass's items). */
static int children_iter(PyObject *iterable, Py_ssize_t *at, const struct level *lv,
			 struct walk *w, PyObject *next)
{
	PyObject *it = PyObject_GetIter(iterable), *child;
	int rc = 0;

	if (!it)
		return -1;
	while (rc == 0 && (child = PyIter_Next(it))) {
		rc = child_route(child, (*at)++, lv, w, next);
		Py_DECREF(child);
	}
	Py_DECREF(it);
	return rc < 0 || PyErr_Occurred() ? -1 : 0;
}

/* Routes the children of one container: a dict's values, a sequence's items. */
static int container_children(PyObject *c, int is_dict, Py_ssize_t *at,
			      const struct level *lv, struct walk *w, PyObject *next)
{
	PyObject *k, *val, *values;
	Py_ssize_t pos = 0, n;
	int rc;

	if (is_dict && PyDict_CheckExact(c)) {
		while (PyDict_Next(c, &pos, &k, &val))
			if (child_route(val, (*at)++, lv, w, next) < 0)
				return -1;
		return 0;
	}
	if (is_dict) {  /* OrderedDict, a subclass: its own values(), as methodcaller calls it */
		if (!(values = PyObject_CallMethod(c, "values", NULL)))
			return -1;
		rc = children_iter(values, at, lv, w, next);
		Py_DECREF(values);
		return rc;
	}
	if (PyList_CheckExact(c)) {
		for (Py_ssize_t i = 0; i < PyList_Size(c); i++)
			if (child_route(PyList_GetItem(c, i), (*at)++, lv, w, next) < 0)
				return -1;
		return 0;
	}
	if (PyTuple_CheckExact(c)) {
		n = PyTuple_Size(c);
		for (Py_ssize_t i = 0; i < n; i++)
			if (child_route(PyTuple_GetItem(c, i), (*at)++, lv, w, next) < 0)
				return -1;
		return 0;
	}
	return children_iter(c, at, lv, w, next);
}

/* Routes the level's children: every dict's values, then every sequence's items. */
static int level_children(PyObject *level, const struct level *lv, struct walk *w,
			  PyObject *next)
{
	Py_ssize_t at = 0;

	for (int dicts = 1; dicts >= 0; dicts--)
		for (Py_ssize_t i = 0; i < lv->ntypes; i++) {
			int is_dict = lv->flags[i] & FLAG_DICT;

			if (is_dict == dicts &&
			    container_children(PyList_GetItem(level, i), is_dict, &at, lv, w,
					       next) < 0)
				return -1;
		}
	return 0;
}

/* Checks the keys of a level whose dicts are all exact dicts and routes their values in
 * the same pass (nothing runs Python code between Python's keys and values here), then the
 * sequences' items. */
static enum verdict level_plain(PyObject *level, const struct level *lv, struct walk *w,
				PyObject *next)
{
	enum verdict v = GO_ON, step;
	Py_ssize_t keys = 0, at = 0;

	for (Py_ssize_t i = 0; i < lv->ntypes; i++) {
		PyObject *c = PyList_GetItem(level, i), *k, *val;
		Py_ssize_t pos = 0;

		if (!(lv->flags[i] & FLAG_DICT))
			continue;
		while (PyDict_Next(c, &pos, &k, &val)) {
			if ((step = key_check(k, lv->keys, lv->nkeys, &keys, &v)) != GO_ON)
				return step;
			if (v == MISMATCH)
				return v;  /* nothing here runs code: no need to go on */
			if (child_route(val, at++, lv, w, next) < 0)
				return ERROR;
		}
	}
	if (keys != lv->nkeys)
		v = MISMATCH;
	if (v != GO_ON)
		return v;
	for (Py_ssize_t i = 0; i < lv->ntypes; i++)
		if (!(lv->flags[i] & FLAG_DICT) &&
		    container_children(PyList_GetItem(level, i), 0, &at, lv, w, next) < 0)
			return ERROR;
	return GO_ON;
}

/* Matches one level: checks it and routes its children (next: the next level, filled).
 * Python's order: types, lens, keys, attributes, children. */
static enum verdict level_match(PyObject *level, const struct level *lv, struct walk *w,
				PyObject *next)
{
	enum verdict v;
	int odd, any_attrs = 0, plain = 1;

	if ((v = level_shape(level, lv, &odd)) != GO_ON)
		return v;
	for (Py_ssize_t i = 0; i < lv->ntypes; i++) {
		any_attrs |= lv->flags[i] & FLAG_ATTRS;
		if (lv->flags[i] & FLAG_DICT)
			plain &= PyDict_CheckExact(PyList_GetItem(level, i));
	}
	if (plain && !any_attrs)
		return level_plain(level, lv, w, next);
	if ((v = level_keys(level, lv)) != GO_ON)
		return v;
	if (any_attrs && (v = level_attrs(level, lv, w)) != GO_ON)
		return v;
	return level_children(level, lv, w, next) < 0 ? ERROR : GO_ON;
}

/* Whether the containers of every held level are distinct objects (an open-addressed set
 * of their addresses); -1 with an error set when out of memory. */
static int containers_distinct(PyObject *held)
{
	Py_ssize_t total = 0, nlevels = PyList_Size(held);
	size_t cap = 16, mask;
	uintptr_t *set;
	int distinct = 1;

	for (Py_ssize_t l = 0; l < nlevels; l++)
		total += PyList_Size(PyList_GetItem(held, l));
	while (cap < 2 * (size_t)total)
		cap <<= 1;
	mask = cap - 1;
	if (!(set = PyMem_Calloc(cap, sizeof(*set)))) {
		PyErr_NoMemory();
		return -1;
	}
	for (Py_ssize_t l = 0; l < nlevels && distinct; l++) {
		PyObject *level = PyList_GetItem(held, l);

		for (Py_ssize_t i = 0; i < PyList_Size(level) && distinct; i++) {
			uintptr_t p = (uintptr_t)PyList_GetItem(level, i);
			size_t h = (size_t)((p >> 4) * 0x9E3779B97F4A7C15ull) & mask;

			while (set[h] && set[h] != p)
				h = (h + 1) & mask;
			if (set[h] == p)
				distinct = 0;
			set[h] = p;
		}
	}
	PyMem_Free(set);
	return distinct;
}

/* Walks root through every level of plan; returns the verdict, w filled on GO_ON. */
static enum verdict plan_walk(PyObject *plan, PyObject *root, struct walk *w)
{
	PyObject *level = PyList_New(1), *next;
	Py_ssize_t nlevels = PyTuple_Size(plan);
	struct level lv;
	enum verdict v = GO_ON;
	int distinct;

	if (!level)
		return ERROR;
	Py_INCREF(root);
	PyList_SetItem(level, 0, root);  /* steals the reference */
	for (Py_ssize_t l = 0; l < nlevels; l++) {
		if (PyList_Append(w->held, level) < 0 || level_read(PyTuple_GetItem(plan, l), &lv) < 0 ||
		    !(next = PyList_New(0))) {
			Py_DECREF(level);
			return ERROR;
		}
		Py_DECREF(level);  /* held keeps it */
		v = level_match(level, &lv, w, next);
		level = next;
		if (v != GO_ON)
			break;
	}
	if (v == GO_ON && PyList_Size(level) != 0)
		v = MISMATCH;
	Py_DECREF(level);
	if (v != GO_ON)
		return v;
	if ((distinct = containers_distinct(w->held)) < 0)
		return ERROR;
	return distinct ? GO_ON : MISMATCH;
}

/* match(plan, root): (tensors, leaves) when root's containers are plan's, None when not,
 * NotImplemented when the Python path must decide (see the file's opening comment). */
static PyObject *match_match(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
	PyObject *plan, *root, *out = NULL;
	struct walk w;
	enum verdict v;

	if (nargs != 2 || !PyTuple_Check(args[0])) {
		PyErr_SetString(PyExc_TypeError, "match(plan: tuple, root)");
		return NULL;
	}
	plan = args[0];
	root = args[1];
	w.tensors = PyList_New(0);
	w.leaves = PyList_New(0);
	w.held = PyList_New(0);
	if (!w.tensors || !w.leaves || !w.held)
		goto done;
	v = plan_walk(plan, root, &w);
	if (v == GO_ON)
		out = PyTuple_Pack(2, w.tensors, w.leaves);
	else if (v == MISMATCH)
		out = Py_NewRef(Py_None);
	else if (v == FALLBACK)
		out = Py_NewRef(Py_NotImplemented);
done:
	Py_XDECREF(w.tensors);
	Py_XDECREF(w.leaves);
	Py_XDECREF(w.held);
	return out;
}

static PyMethodDef match_methods[] = {
	{"match", (PyCFunction)(void (*)(void))match_match, METH_FASTCALL,
	 "match(plan, root) -> (tensors, leaves), None, or NotImplemented (use Python)"},
	{NULL, NULL, 0, NULL},
};

static struct PyModuleDef match_module = {
	PyModuleDef_HEAD_INIT, "dsckpt._match",
	"Shape.match of dsckpt._shape in C (see _match.c).", -1, match_methods,
	NULL, NULL, NULL, NULL,
};

/* The module: match() and PLAN_VERSION, which _shape.py checks before using it. */
PyMODINIT_FUNC PyInit__match(void)
{
	PyObject *m = PyModule_Create(&match_module);

	if (m && PyModule_AddIntConstant(m, "PLAN_VERSION", MATCH_PLAN_VERSION) < 0) {
		Py_DECREF(m);
		return NULL;
	}
	return m;
}
