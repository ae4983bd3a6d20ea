/*
 * _freeze.c — dsckpt._match's freeze(), same_frozen() and encode_tree(): a warm save's leaves
 * encoded in C in dsckpt._tree's format, and whether they would encode to the bytes the last
 * save encoded, so that _shape.Leaves reuses them instead of encoding again.
 *
 * freeze(obj) returns (copy, nodes). copy is obj, a tree of exact dict, OrderedDict (without
 * attributes), list and tuple over exact str, bytes, int, float, bool and None, copied into
 * new containers that share its atoms and repeat its aliasing (one copy per container object,
 * however often it is met); nodes is how many str, bytes and containers it met, the size
 * same_frozen's tables start at. freeze returns None for anything else: another type (a
 * subclass included), a cycle, a tree deeper than MAX_DEPTH. A copy does not change when obj is later changed in place, and encoding it gives the bytes that
 * encoding obj gives: the same types, values, order and aliasing.
 *
 * same_frozen(frozen, obj) is true only when obj would encode to the same bytes as copy:
 * the same exact types, equal atoms (floats bit for bit: 0.0 and -0.0 differ, a NaN equals
 * itself), dicts with the same keys in the same order, and the same aliasing of str, bytes
 * and containers (an object met again exactly where frozen met one of its objects again;
 * stricter than the encoding, which numbers containers only). Neither runs Python code, but
 * for what an allocation's garbage collection may run; every borrowed object is held while
 * it is looked at.
 *
 * encode_tree(obj) writes what dsckpt._tree.encode writes for plain values (None, bool, ints
 * of 64 bits, float, complex, str, bytes, list, tuple, dict, OrderedDict without attributes,
 * containers met again as references) and returns NotImplemented for anything else, which
 * the Python encoder then writes (tests/python/test_tree.py checks that the two agree).
 *
 * Built into the _match module (_match.c's method table).
 */
#define PY_SSIZE_T_CLEAN
#define Py_LIMITED_API 0x030B0000
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_freeze.h"

#define MAX_DEPTH 64
#define PRESIZE_MAX (1 << 20)  /* the most entries a comparison's tables are made for at once */
#define TREE_MAX_DEPTH 100     /* dsckpt._tree.MAX_DEPTH */

/* Objects met, by address: an open-addressing table of (address, value). */
struct seen {
	uintptr_t *keys;
	intptr_t *vals;
	size_t mask;
	size_t n;
};

/* Frees s's arrays. */
static void seen_free(struct seen *s)
{
	PyMem_Free(s->keys);
	PyMem_Free(s->vals);
}

/* The slot of p in s: its own, or the empty one where it would go. */
static size_t seen_slot(const struct seen *s, uintptr_t p)
{
	size_t h = (size_t)(((uint64_t)p * 0x9E3779B97F4A7C15ull) >> 29) & s->mask;

	while (s->keys[h] && s->keys[h] != p)
		h = (h + 1) & s->mask;
	return h;
}

/* Grows s's table to hold at least n (or doubles it); -1 with MemoryError set when out of
 * memory. */
static int seen_grow(struct seen *s, size_t n)
{
	struct seen g = { .mask = s->mask ? s->mask * 2 + 1 : 63, .n = s->n };

	while (g.mask < 2 * n)
		g.mask = g.mask * 2 + 1;

	g.keys = PyMem_Calloc(g.mask + 1, sizeof(*g.keys));
	g.vals = PyMem_Calloc(g.mask + 1, sizeof(*g.vals));
	if (!g.keys || !g.vals) {
		seen_free(&g);
		PyErr_NoMemory();
		return -1;
	}
	for (size_t i = 0; s->keys && i <= s->mask; i++) {
		if (s->keys[i]) {
			size_t h = seen_slot(&g, s->keys[i]);

			g.keys[h] = s->keys[i];
			g.vals[h] = s->vals[i];
		}
	}
	seen_free(s);
	*s = g;
	return 0;
}

/* Looks o up in s: 1 and *val its value when met before; else adds it with value add and
 * returns 0; -1 when out of memory. */
static int seen_meet(struct seen *s, PyObject *o, intptr_t add, intptr_t *val)
{
	size_t h;

	if ((s->n + 1) * 2 > s->mask && seen_grow(s, 0) < 0)
		return -1;
	h = seen_slot(s, (uintptr_t)o);
	if (s->keys[h]) {
		*val = s->vals[h];
		return 1;
	}
	s->keys[h] = (uintptr_t)o;
	s->vals[h] = add;
	s->n++;
	return 0;
}

static PyObject *od_type;   /* collections.OrderedDict */

/* Whether t is an atom: an immutable leaf type that freeze shares instead of copying. */
static int is_atom(PyObject *o)
{
	PyTypeObject *t = Py_TYPE(o);

	return o == Py_None || t == &PyBool_Type || t == &PyLong_Type || t == &PyFloat_Type ||
	       t == &PyUnicode_Type || t == &PyBytes_Type;
}

/* 1 when od (an exact OrderedDict) has no attributes, 0 when it has, -1 on error. */
static int od_bare(PyObject *od)
{
	PyObject *d = PyObject_GetAttrString(od, "__dict__");
	Py_ssize_t n;

	if (!d)
		return -1;
	n = PyDict_Check(d) ? PyDict_Size(d) : 1;
	Py_DECREF(d);
	return n == 0;
}

/* A dict's or OrderedDict's items in the order they are encoded, each as new references. */
struct pairs {
	PyObject *dict;     /* an exact dict, read with PyDict_Next */
	Py_ssize_t pos;
	PyObject *it;       /* else an iterator over its items() */
};

/* Opens p over o, an exact dict or OrderedDict; -1 on error. */
static int pairs_open(struct pairs *p, PyObject *o)
{
	PyObject *items;

	*p = (struct pairs){ 0 };
	if (Py_TYPE(o) == &PyDict_Type) {
		p->dict = o;
		return 0;
	}
	if (!(items = PyObject_CallMethod(o, "items", NULL)))
		return -1;
	p->it = PyObject_GetIter(items);
	Py_DECREF(items);
	return p->it ? 0 : -1;
}

/* The next key and value, as new references: 1, or 0 at the end, -1 on error. */
static int pairs_next(struct pairs *p, PyObject **k, PyObject **v)
{
	PyObject *pair;

	if (p->dict) {
		if (!PyDict_Next(p->dict, &p->pos, k, v))
			return 0;
		Py_INCREF(*k);
		Py_INCREF(*v);
		return 1;
	}
	if (!(pair = PyIter_Next(p->it)))
		return PyErr_Occurred() ? -1 : 0;
	if (!PyTuple_Check(pair) || PyTuple_Size(pair) != 2) {
		Py_DECREF(pair);
		PyErr_SetString(PyExc_TypeError, "items() gave something other than a pair");
		return -1;
	}
	*k = Py_NewRef(PyTuple_GetItem(pair, 0));
	*v = Py_NewRef(PyTuple_GetItem(pair, 1));
	Py_DECREF(pair);
	return 1;
}

/* Closes p. */
static void pairs_close(struct pairs *p)
{
	Py_XDECREF(p->it);
}

/* The item i of list or tuple o, as a new reference (NULL with IndexError when o shrank). */
static PyObject *item_at(PyObject *o, Py_ssize_t i)
{
	PyObject *item = PyList_Check(o) ? PyList_GetItem(o, i) : PyTuple_GetItem(o, i);

	return item ? Py_NewRef(item) : NULL;
}

/* A copy being made: the containers met, each with its copy, and how many str, bytes and
 * containers it met (at most the entries a comparison with it makes on each side). */
struct freezer {
	struct seen copies;
	size_t nodes;
};

static int copy_node(struct freezer *f, PyObject *o, int depth, PyObject **out);

/* Fills c, a new list or tuple of o's length, with copies of o's items; 1, 0 or -1 as
 * copy_node. */
static int copy_items(struct freezer *f, PyObject *o, PyObject *c, int depth)
{
	Py_ssize_t n = PyList_Check(o) ? PyList_Size(o) : PyTuple_Size(o);
	PyObject *item, *ci;
	int r;

	for (Py_ssize_t i = 0; i < n; i++) {
		if (!(item = item_at(o, i)))
			return -1;
		r = copy_node(f, item, depth + 1, &ci);
		Py_DECREF(item);
		if (r <= 0)
			return r;
		if ((PyList_Check(c) ? PyList_SetItem(c, i, ci) : PyTuple_SetItem(c, i, ci)) < 0)
			return -1;
	}
	return 1;
}

/* Puts copies of o's items, in order, into c, an empty dict or OrderedDict; 1, 0 or -1 as
 * copy_node. */
static int copy_pairs(struct freezer *f, PyObject *o, PyObject *c, int depth)
{
	PyObject *k, *v, *ck, *cv;
	struct pairs p;
	int more, r = 1;

	if (pairs_open(&p, o) < 0)
		return -1;
	while (r > 0 && (more = pairs_next(&p, &k, &v)) != 0) {
		if (more < 0) {
			r = -1;
			break;
		}
		if ((r = copy_node(f, k, depth + 1, &ck)) > 0) {
			if ((r = copy_node(f, v, depth + 1, &cv)) > 0) {
				r = PyObject_SetItem(c, ck, cv) < 0 ? -1 : 1;
				Py_DECREF(cv);
			}
			Py_DECREF(ck);
		}
		Py_DECREF(k);
		Py_DECREF(v);
	}
	pairs_close(&p);
	return r;
}

/* Whether o is a container that freeze copies: 1, 0, or -1 on error. */
static int is_container(PyObject *o)
{
	PyTypeObject *t = Py_TYPE(o);

	if (t == &PyList_Type || t == &PyTuple_Type || t == &PyDict_Type)
		return 1;
	return (PyObject *)t == od_type ? od_bare(o) : 0;
}

/* Sets the value of o, met before, in s. */
static void seen_set(struct seen *s, PyObject *o, intptr_t val)
{
	s->vals[seen_slot(s, (uintptr_t)o)] = val;
}

/* Copies o into *out (a new reference): 1; 0 when o is not what freeze copies (see the
 * file's opening comment); -1 on error. copies maps each container met to its copy (0 while
 * it is being copied: met again then, it is a cycle). */
static int copy_node(struct freezer *f, PyObject *o, int depth, PyObject **out)
{
	PyTypeObject *t = Py_TYPE(o);
	PyObject *c;
	intptr_t met;
	Py_ssize_t n;
	int r;

	if (is_atom(o)) {
		f->nodes += t == &PyUnicode_Type || t == &PyBytes_Type;
		*out = Py_NewRef(o);
		return 1;
	}
	f->nodes++;
	if (depth >= MAX_DEPTH || (r = is_container(o)) <= 0)
		return depth >= MAX_DEPTH ? 0 : r;
	if ((r = seen_meet(&f->copies, o, 0, &met)) != 0) {
		if (r > 0 && met)
			*out = Py_NewRef((PyObject *)met);
		return r < 0 ? -1 : met ? 1 : 0;
	}
	if (t == &PyList_Type || t == &PyTuple_Type) {
		n = t == &PyList_Type ? PyList_Size(o) : PyTuple_Size(o);
		c = t == &PyList_Type ? PyList_New(n) : PyTuple_New(n);
		r = c ? copy_items(f, o, c, depth) : -1;
	} else {
		c = t == &PyDict_Type ? PyDict_New() : PyObject_CallNoArgs(od_type);
		r = c ? copy_pairs(f, o, c, depth) : -1;
	}
	if (r <= 0) {
		Py_XDECREF(c);
		return r;
	}
	seen_set(&f->copies, o, (intptr_t)c);  /* the tree being made holds c */
	*out = c;
	return 1;
}

/* Objects met by a comparison, on each side, numbered in the order met. */
struct cmp {
	struct seen a, b;
	intptr_t next;
};

static int same_node(struct cmp *c, PyObject *a, PyObject *b);

/* Whether lists or tuples a and b (of one type) have the same items: 1, 0, or -1. */
static int same_items(struct cmp *c, PyObject *a, PyObject *b)
{
	Py_ssize_t n = PyList_Check(a) ? PyList_Size(a) : PyTuple_Size(a);
	Py_ssize_t m = PyList_Check(b) ? PyList_Size(b) : PyTuple_Size(b);
	PyObject *x, *y;
	int r = n == m;

	for (Py_ssize_t i = 0; r > 0 && i < n; i++) {
		x = item_at(a, i);
		y = x ? item_at(b, i) : NULL;
		r = y ? same_node(c, x, y) : -1;
		Py_XDECREF(x);
		Py_XDECREF(y);
	}
	return r;
}

/* Whether dicts or OrderedDicts a and b (of one type) have the same items in the same order:
 * 1, 0, or -1. */
static int same_pairs(struct cmp *c, PyObject *a, PyObject *b)
{
	PyObject *ka, *va, *kb, *vb;
	struct pairs pa, pb;
	int ma, mb, r;

	if ((r = PyObject_Size(a) == PyObject_Size(b)) <= 0 || (r = is_container(b)) <= 0)
		return PyErr_Occurred() ? -1 : r;
	if (pairs_open(&pa, a) < 0)
		return -1;
	if (pairs_open(&pb, b) < 0) {
		pairs_close(&pa);
		return -1;
	}
	while (r > 0) {
		if ((ma = pairs_next(&pa, &ka, &va)) < 0)
			r = -1;
		else if ((mb = pairs_next(&pb, &kb, &vb)) < 0)
			r = -1;
		else if (ma != mb)
			r = 0;
		else if (!ma)
			break;
		if (r > 0 && (r = same_node(c, ka, kb)) > 0)
			r = same_node(c, va, vb);
		if (ma > 0) {
			Py_DECREF(ka);
			Py_DECREF(va);
		}
		if (ma >= 0 && mb > 0) {
			Py_DECREF(kb);
			Py_DECREF(vb);
		}
	}
	pairs_close(&pa);
	pairs_close(&pb);
	return r;
}

/* Whether b would encode to what frozen a encodes to (see the file's opening comment): 1, 0,
 * or -1 on error. */
static int same_node(struct cmp *c, PyObject *a, PyObject *b)
{
	PyTypeObject *t = Py_TYPE(a);
	intptr_t ia = -1, ib = -1;
	double x, y;
	int ra, rb;

	if (Py_TYPE(b) != t)
		return 0;
	if (a == Py_None || t == &PyBool_Type)
		return a == b;
	if (t == &PyLong_Type)
		return a == b || PyObject_RichCompareBool(a, b, Py_EQ);
	if (t == &PyFloat_Type) {
		x = PyFloat_AsDouble(a);
		y = PyFloat_AsDouble(b);
		return memcmp(&x, &y, sizeof(x)) == 0;
	}
	/* What is numbered: met again on both sides at once, or new on both. */
	if ((ra = seen_meet(&c->a, a, c->next, &ia)) < 0 ||
	    (rb = seen_meet(&c->b, b, c->next, &ib)) < 0)
		return -1;
	if (ra || rb)
		return ra && rb && ia == ib;
	c->next++;
	if (t == &PyUnicode_Type) {
		if (a == b)
			return 1;
		ra = PyUnicode_Compare(a, b);
		return ra == -1 && PyErr_Occurred() ? -1 : ra == 0;
	}
	if (t == &PyBytes_Type)
		return PyBytes_Size(a) == PyBytes_Size(b) &&
		       memcmp(PyBytes_AsString(a), PyBytes_AsString(b), (size_t)PyBytes_Size(a)) == 0;
	if (t == &PyList_Type || t == &PyTuple_Type)
		return same_items(c, a, b);
	if (t == &PyDict_Type || (PyObject *)t == od_type)
		return same_pairs(c, a, b);
	return 0;  /* nothing else is frozen */
}

/* freeze(obj): (copy, nodes) of obj (see the file's opening comment), or None. */
PyObject *dsckpt_freeze(PyObject *self, PyObject *obj)
{
	struct freezer f = { 0 };
	PyObject *copy;
	int r;

	(void)self;
	r = copy_node(&f, obj, 0, &copy);
	seen_free(&f.copies);
	if (r < 0)
		return NULL;
	if (r == 0)
		Py_RETURN_NONE;
	return Py_BuildValue("(Nn)", copy, (Py_ssize_t)f.nodes);
}

/* same_frozen(frozen, obj): whether obj would encode to what frozen's copy encodes to. */
PyObject *dsckpt_same_frozen(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
	struct cmp c = { 0 };
	Py_ssize_t nodes = 0;
	int r;

	(void)self;
	if (nargs != 2 || !PyTuple_Check(args[0]) || PyTuple_Size(args[0]) != 2 ||
	    (nodes = PyLong_AsSsize_t(PyTuple_GetItem(args[0], 1))) < 0) {
		if (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_TypeError)) {
			PyErr_Clear();
			PyErr_SetString(PyExc_TypeError,
					"same_frozen(frozen, obj): frozen as freeze() made it");
		}
		return NULL;
	}
	nodes = nodes < PRESIZE_MAX ? nodes : PRESIZE_MAX;
	if (seen_grow(&c.a, (size_t)nodes) < 0 || seen_grow(&c.b, (size_t)nodes) < 0) {
		seen_free(&c.a);
		seen_free(&c.b);
		return NULL;
	}
	r = same_node(&c, PyTuple_GetItem(args[0], 0), args[1]);
	seen_free(&c.a);
	seen_free(&c.b);
	return r < 0 ? NULL : PyBool_FromLong(r);
}

/* ---- encode_tree: the plain values of dsckpt._tree's format, in C ---- */

/* An encoding being written: its bytes and the containers met (address → number << 1, the
 * low bit set while a tuple's items are being written). */
struct tree_out {
	unsigned char *buf;
	size_t len, cap;
	struct seen met;
	intptr_t next;
};

/* Appends n bytes to t; -1 with MemoryError set when out of memory. */
static int put(struct tree_out *t, const void *p, size_t n)
{
	if (t->len + n > t->cap) {
		size_t cap = t->cap ? t->cap : 256;
		unsigned char *grown;

		while (cap < t->len + n)
			cap *= 2;
		if (!(grown = PyMem_Realloc(t->buf, cap))) {
			PyErr_NoMemory();
			return -1;
		}
		t->buf = grown;
		t->cap = cap;
	}
	memcpy(t->buf + t->len, p, n);
	t->len += n;
	return 0;
}

/* Appends a tag and a little-endian unsigned number of n bytes (n <= 8). */
static int put_tag_le(struct tree_out *t, char tag, uint64_t v, int n)
{
	unsigned char b[9];
	int k = 0;

	if (tag)
		b[k++] = (unsigned char)tag;
	for (int i = 0; i < n; i++)
		b[k++] = (unsigned char)(v >> (8 * i));
	return put(t, b, (size_t)k);
}

/* Appends a tag and a double's bits. */
static int put_double(struct tree_out *t, char tag, double d)
{
	uint64_t bits;

	memcpy(&bits, &d, sizeof(bits));
	return put_tag_le(t, tag, bits, 8);
}

/* Appends a tag, a u32 length and n bytes (a str's or bytes' contents); 0 when n does not
 * fit a u32. */
static int put_sized(struct tree_out *t, char tag, const char *p, Py_ssize_t n)
{
	if ((uint64_t)n > UINT32_MAX)
		return 0;
	return put_tag_le(t, tag, (uint64_t)n, 4) < 0 || put(t, p, (size_t)n) < 0 ? -1 : 1;
}

static int tree_node(struct tree_out *t, PyObject *o, int depth);

/* Appends a container's encoding, or a reference to it; 1, 0 (not encodable in C: a tuple
 * inside itself, too deep, an OrderedDict with attributes, too long) or -1. */
static int tree_container(struct tree_out *t, PyObject *o, int depth)
{
	PyTypeObject *tp = Py_TYPE(o);
	int is_list = tp == &PyList_Type, is_tuple = tp == &PyTuple_Type;
	intptr_t met, number = t->next;
	Py_ssize_t n = PyObject_Size(o);
	PyObject *k, *v, *item;
	struct pairs p;
	int r, more;

	if ((r = seen_meet(&t->met, o, number << 1 | is_tuple, &met)) != 0) {
		if (r < 0)
			return -1;
		if (met & 1)
			return 0;  /* a tuple inside itself */
		return put_tag_le(t, 'r', (uint64_t)(met >> 1), 4) < 0 ? -1 : 1;
	}
	if (n < 0)
		return -1;
	if (depth >= TREE_MAX_DEPTH || (uint64_t)n > UINT32_MAX)
		return 0;
	if ((PyObject *)tp == od_type && (r = od_bare(o)) <= 0)
		return r;  /* attributes: Python writes them */
	t->next++;
	if (put_tag_le(t, is_list ? 'l' : is_tuple ? 't' : tp == &PyDict_Type ? 'd' : 'o',
		       (uint64_t)n, 4) < 0)
		return -1;
	r = 1;
	if (is_list || is_tuple) {
		for (Py_ssize_t i = 0; r > 0 && i < n; i++) {
			if (!(item = item_at(o, i)))
				return -1;
			r = tree_node(t, item, depth + 1);
			Py_DECREF(item);
		}
	} else {
		if (pairs_open(&p, o) < 0)
			return -1;
		while (r > 0 && (more = pairs_next(&p, &k, &v)) != 0) {
			r = more < 0 ? -1 : tree_node(t, k, depth + 1);
			if (r > 0)
				r = tree_node(t, v, depth + 1);
			if (more > 0) {
				Py_DECREF(k);
				Py_DECREF(v);
			}
		}
		pairs_close(&p);
		if (r > 0 && (PyObject *)tp == od_type)
			r = put_tag_le(t, 0, 0, 4) < 0 ? -1 : 1;  /* no attributes */
	}
	if (r > 0 && is_tuple)
		seen_set(&t->met, o, number << 1);
	return r;
}

/* Appends o's encoding: 1, 0 when o is not a plain value C encodes (another type, an int
 * beyond 64 bits, a str with lone surrogates, ...: dsckpt._tree.encode does), -1 on error. */
static int tree_node(struct tree_out *t, PyObject *o, int depth)
{
	PyTypeObject *tp = Py_TYPE(o);
	const char *p;
	Py_ssize_t n;
	long long ll;
	int overflow;

	if (o == Py_None)
		return put(t, "N", 1) < 0 ? -1 : 1;
	if (tp == &PyBool_Type)
		return put(t, o == Py_True ? "T" : "F", 1) < 0 ? -1 : 1;
	if (tp == &PyLong_Type) {
		ll = PyLong_AsLongLongAndOverflow(o, &overflow);
		if (ll == -1 && PyErr_Occurred())
			return -1;
		return overflow ? 0 : put_tag_le(t, 'i', (uint64_t)ll, 8) < 0 ? -1 : 1;
	}
	if (tp == &PyFloat_Type)
		return put_double(t, 'f', PyFloat_AsDouble(o)) < 0 ? -1 : 1;
	if (tp == &PyUnicode_Type) {
		if (!(p = PyUnicode_AsUTF8AndSize(o, &n))) {
			PyErr_Clear();  /* lone surrogates: Python writes them */
			return 0;
		}
		return put_sized(t, 's', p, n);
	}
	if (tp == &PyBytes_Type) {
		if (PyBytes_AsStringAndSize(o, (char **)&p, &n) < 0)
			return -1;
		return put_sized(t, 'b', p, n);
	}
	if (tp == &PyComplex_Type)
		return put_double(t, 'c', PyComplex_RealAsDouble(o)) < 0 ||
		       put_double(t, 0, PyComplex_ImagAsDouble(o)) < 0 ? -1 : 1;
	if (tp == &PyList_Type || tp == &PyTuple_Type || tp == &PyDict_Type ||
	    (PyObject *)tp == od_type)
		return tree_container(t, o, depth);
	return 0;
}

/* encode_tree(obj): obj as dsckpt._tree.encode writes it (bytes), or NotImplemented when it
 * holds anything but plain values C encodes. */
PyObject *dsckpt_encode_tree(PyObject *self, PyObject *obj)
{
	struct tree_out t = { 0 };
	PyObject *out = NULL;
	int r;

	(void)self;
	r = tree_node(&t, obj, 0);
	if (r > 0)
		out = PyBytes_FromStringAndSize((const char *)t.buf, (Py_ssize_t)t.len);
	else if (r == 0)
		out = Py_NewRef(Py_NotImplemented);
	PyMem_Free(t.buf);
	seen_free(&t.met);
	return out;
}

/* Finds collections.OrderedDict; -1 on error. */
int dsckpt_freeze_init(void)
{
	PyObject *collections = PyImport_ImportModule("collections");

	if (!collections)
		return -1;
	od_type = PyObject_GetAttrString(collections, "OrderedDict");
	Py_DECREF(collections);
	return od_type ? 0 : -1;
}
