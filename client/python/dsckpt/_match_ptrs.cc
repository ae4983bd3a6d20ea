/*
 * _match_ptrs.cc — the C++ part of dsckpt._match (_match.c): calls of torch's C function from
 * a tensor object to its data pointer, inside a try block. That function throws a C++
 * exception for an object that is not a tensor or a tensor without storage (sparse, MKLDNN),
 * which must not unwind through C and Python frames (std::terminate); here it means only
 * that the object is not what was recorded.
 */
#include <cstddef>
#include <cxxabi.h>

struct _object;  // Python's PyObject

extern "C" int dsckpt_match_pointers(void *(*fn)(_object *), _object *const *objs, size_t n,
				     const size_t *want);

/* 1 when fn(objs[i]) is want[i] for every i; 0 at the first that differs or that fn refuses. */
extern "C" int dsckpt_match_pointers(void *(*fn)(_object *), _object *const *objs, size_t n,
				     const size_t *want)
{
	for (size_t i = 0; i < n; i++) {
		try {
			if (reinterpret_cast<size_t>(fn(objs[i])) != want[i])
				return 0;
		} catch (abi::__forced_unwind &) {
			throw;  // a thread being cancelled goes on unwinding
		} catch (...) {
			return 0;
		}
	}
	return 1;
}
