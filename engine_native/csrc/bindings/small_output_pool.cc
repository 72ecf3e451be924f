// Note [Small output pool]
// The numpy path returns a new array per allreduce. For a step's small gradients a fresh
// array is a malloc and, when the caller drops it, a free of a few KiB each: 200 x 4 KiB a
// step churned glibc's heap (coalescing, malloc_consolidate) in the calling thread. Outputs
// below numpy_ops._POOL_MIN_BYTES (the large ones have their own pool, Note [Output pool], with
// the same rule) go through a FIFO here instead:
//   - every output handed out is appended; the pool keeps one reference;
//   - an entry is free when the pool holds the only reference to it. A free entry at the
//     front that has the requested dtype and shape, still owns its memory, is writable and has
//     no weak references (whose holder would see it come back to life with new data) is
//     handed out again; any other free entry at the front is dropped;
//   - when the front entry is still held, a new array is made: the oldest entries go once the
//     pool holds more than kMaxArrays arrays or kMaxBytes bytes.
// A training loop submits the same tensors in the same order each step, so the front entry is
// an earlier step's result for the same tensor; a loop that still holds last step's results
// (`outs = step()`) makes the FIFO two steps deep. A caller that keeps a result (in a list, a
// view, a torch tensor from torch.from_numpy: any reference at all) keeps it from reuse: the
// reference count is the test. The 200 x 4 KiB set at np=2 got faster, much of it in the
// core's thread, which now writes results into memory it wrote the step before; a free list of
// raw blocks handed out the same way saved nothing (benchmarks/history/RESULTS-parts-1-10.md,
// "Session 4, later": "Small outputs come from a pool").
#include "bindings/small_output_pool.h"

#include <deque>

namespace hvd::bindings {
namespace {

constexpr size_t kMaxArrays = 4096;
constexpr Py_ssize_t kMaxBytes = 32 << 20;

std::deque<PyObject*> g_pool;  // oldest first; one reference each
Py_ssize_t g_pool_bytes = 0;

enum class Entry { kHeld, kMatches, kStale };

Entry classify(PyObject* obj, PyArray_Descr* descr, int ndim, const npy_intp* dims) {
  if (Py_REFCNT(obj) != 1) return Entry::kHeld;
  auto* arr = reinterpret_cast<PyArrayObject*>(obj);
  if (reinterpret_cast<PyArrayObject_fields*>(arr)->weakreflist != nullptr) return Entry::kStale;
  const int need = NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_WRITEABLE | NPY_ARRAY_OWNDATA;
  if (!PyArray_CHKFLAGS(arr, need) || PyArray_NDIM(arr) != ndim) return Entry::kStale;
  if (!PyArray_EquivTypes(PyArray_DESCR(arr), descr)) return Entry::kStale;
  for (int i = 0; i < ndim; ++i) {
    if (PyArray_DIM(arr, i) != dims[i]) return Entry::kStale;
  }
  return Entry::kMatches;
}

void dropOldest() {
  PyObject* oldest = g_pool.front();
  g_pool.pop_front();
  g_pool_bytes -= PyArray_NBYTES(reinterpret_cast<PyArrayObject*>(oldest));
  Py_DECREF(oldest);  // after the pop: a deallocation cannot see a half-updated pool
}

}  // namespace

PyObject* smallOutput(PyArray_Descr* descr, int ndim, const npy_intp* dims) {
  while (!g_pool.empty()) {
    const Entry front = classify(g_pool.front(), descr, ndim, dims);
    if (front == Entry::kHeld) break;
    if (front == Entry::kStale) {
      dropOldest();
      continue;
    }
    PyObject* out = g_pool.front();
    g_pool.pop_front();
    g_pool.push_back(out);
    Py_INCREF(out);
    return out;
  }
  Py_INCREF(descr);  // stolen by the call
  PyObject* out = PyArray_NewFromDescr(&PyArray_Type, descr, ndim, const_cast<npy_intp*>(dims),
                                       nullptr, nullptr, 0, nullptr);
  if (out == nullptr) return nullptr;
  Py_INCREF(out);
  g_pool.push_back(out);
  g_pool_bytes += PyArray_NBYTES(reinterpret_cast<PyArrayObject*>(out));
  while (g_pool.size() > kMaxArrays || (g_pool_bytes > kMaxBytes && g_pool.size() > 1)) {
    dropOldest();
  }
  return out;
}

}  // namespace hvd::bindings
