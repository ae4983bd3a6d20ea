/*
 * _tproof.cpp — the proof of a warm save's tensors in C++ against the installed torch, a
 * speed-up that dsckpt._torchext builds at run time (unless DSCKPT_TORCH_EXT=0) and
 * _handover._Tensors uses instead of its pointer list and TensorGuards.
 *
 * record(tensors, shared) describes each tensor of a list in one array: its Python type, data
 * pointer, dispatch key set, dtype, device, requires_grad, storage offset (only where shared
 * says its storage has other views: a lone view is saved the same at any offset), sizes and
 * strides, read from the TensorImpl. check(record, tensors) says whether a list of tensors is
 * described the same, in one pass with no Python call: the type first (an object of another
 * type is never unpacked), then the key set (a tensor of another layout, whose sizes or
 * strides torch would refuse to give, stops there). Whatever torch throws (a tensor without
 * storage) means "not the same"; no exception leaves this file.
 */
#include <Python.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstdint>
#include <vector>

namespace {

constexpr const char *CAPSULE = "dsckpt._tproof.record";
constexpr int64_t ANY_OFFSET = -1;

struct Record {
	std::vector<int64_t> v;   // per tensor: FIXED fields, then dim sizes and dim strides
	Py_ssize_t n;
};

enum { TYPE, DATA, KEYS, DTYPE, DEVICE, GRAD, OFFSET, DIM, FIXED };

// The fixed fields of tensor object obj (its type checked by the caller), as record keeps them.
void fixed(PyObject *obj, const at::Tensor &t, bool offset, int64_t out[FIXED])
{
	const c10::TensorImpl *impl = t.unsafeGetTensorImpl();
	out[TYPE] = reinterpret_cast<int64_t>(Py_TYPE(obj));
	out[KEYS] = static_cast<int64_t>(impl->key_set().raw_repr());
	out[DTYPE] = static_cast<int64_t>(c10::typeMetaToScalarType(impl->dtype()));
	out[DEVICE] = (static_cast<int64_t>(t.device().type()) << 16) + t.device().index() + 1;
	out[GRAD] = t.requires_grad();
	out[DATA] = reinterpret_cast<int64_t>(t.const_data_ptr());  // no copy-on-write
	out[OFFSET] = offset ? impl->storage_offset() : ANY_OFFSET;
	out[DIM] = impl->dim();
}

// Frees a record (the capsule's destructor).
void record_free(PyObject *capsule)
{
	delete static_cast<Record *>(PyCapsule_GetPointer(capsule, CAPSULE));
}

// record(tensors, shared): a capsule describing each tensor, or None when one is not a tensor
// torch describes (no storage, no strides).
PyObject *tproof_record(PyObject *, PyObject *args)
{
	PyObject *list, *shared;

	if (!PyArg_ParseTuple(args, "O!O!", &PyList_Type, &list, &PyList_Type, &shared))
		return nullptr;
	Py_ssize_t n = PyList_GET_SIZE(list);
	if (PyList_GET_SIZE(shared) != n) {
		PyErr_SetString(PyExc_ValueError, "record: tensors and shared differ in length");
		return nullptr;
	}
	auto *r = new Record{{}, n};
	try {
		for (Py_ssize_t i = 0; i < n; i++) {
			PyObject *obj = PyList_GET_ITEM(list, i);
			if (!THPVariable_Check(obj))
				throw std::invalid_argument("not a tensor");
			const at::Tensor &t = THPVariable_Unpack(obj);
			int64_t f[FIXED];
			fixed(obj, t, PyObject_IsTrue(PyList_GET_ITEM(shared, i)) == 1, f);
			r->v.insert(r->v.end(), f, f + FIXED);
			r->v.insert(r->v.end(), t.sizes().begin(), t.sizes().end());
			r->v.insert(r->v.end(), t.strides().begin(), t.strides().end());
		}
	} catch (...) {
		delete r;
		Py_RETURN_NONE;
	}
	PyObject *capsule = PyCapsule_New(r, CAPSULE, record_free);
	if (!capsule)
		delete r;
	return capsule;
}

// Whether tensors are those r describes; false at the first difference or throw.
bool same(const Record &r, PyObject *list)
{
	const int64_t *v = r.v.data(), *end = v + r.v.size();

	try {
		for (Py_ssize_t i = 0; i < r.n; i++) {
			PyObject *obj = PyList_GET_ITEM(list, i);
			if (end - v < FIXED || reinterpret_cast<int64_t>(Py_TYPE(obj)) != v[TYPE])
				return false;
			const at::Tensor &t = THPVariable_Unpack(obj);
			const c10::TensorImpl *impl = t.unsafeGetTensorImpl();
			if (static_cast<int64_t>(impl->key_set().raw_repr()) != v[KEYS])
				return false;
			int64_t f[FIXED];
			fixed(obj, t, v[OFFSET] != ANY_OFFSET, f);
			for (int k = 0; k < FIXED; k++)
				if (f[k] != v[k])
					return false;
			int64_t dim = v[DIM];
			if (end - v < FIXED + 2 * dim)
				return false;
			auto sizes = impl->sizes();
			auto strides = impl->strides();
			for (int64_t k = 0; k < dim; k++)
				if (sizes[k] != v[FIXED + k] || strides[k] != v[FIXED + dim + k])
					return false;
			v += FIXED + 2 * dim;
		}
	} catch (...) {
		return false;
	}
	return true;
}

// check(record, tensors): whether tensors are described as record says.
PyObject *tproof_check(PyObject *, PyObject *args)
{
	PyObject *capsule, *list;

	if (!PyArg_ParseTuple(args, "OO!", &capsule, &PyList_Type, &list))
		return nullptr;
	auto *r = static_cast<Record *>(PyCapsule_GetPointer(capsule, CAPSULE));
	if (!r)
		return nullptr;
	return PyBool_FromLong(PyList_GET_SIZE(list) == r->n && same(*r, list));
}

PyMethodDef methods[] = {
	{"record", tproof_record, METH_VARARGS, "record(tensors, shared) -> capsule or None"},
	{"check", tproof_check, METH_VARARGS, "check(record, tensors) -> bool"},
	{nullptr, nullptr, 0, nullptr},
};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "dsckpt_tproof_1",
		      "A warm save's tensor proof in C++ (dsckpt/_tproof.cpp).", -1, methods,
		      nullptr, nullptr, nullptr, nullptr};

}  // namespace

// The module, under the name dsckpt._torchext gives torch's extension loader.
PyMODINIT_FUNC PyInit_dsckpt_tproof_1(void)
{
	return PyModule_Create(&module);
}
