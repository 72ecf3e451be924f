// Note [Output array pools]
// The numpy API returns a new array per op. A fresh small array is a malloc and, when the
// caller drops it, a free: 200 x 4 KiB a step churned glibc's heap (coalescing,
// malloc_consolidate) in the calling thread. A fresh large one costs more than the op itself
// on a fast path: the kernel zeroes every new page (64 MiB out of place spent ~45 % of its
// time there). So results come from one of two pools of live arrays, by size:
//   - every array handed out is appended; the pool keeps one reference. An entry is free when
//     the pool holds the only reference to it: a caller that keeps a result (in a list, a
//     view, a torch tensor from torch.from_numpy: any reference at all) keeps it from reuse;
//   - a free entry of the requested dtype and shape that still owns its memory, is writable
//     and has no weak references (whose holder would see it come back to life with new data)
//     is handed out again and moves to the back; a free entry that can never be handed out
//     (read-only, a view now, weakly referenced) is dropped;
//   - small arrays (< kLargeBytes): only the front entry is looked at, a FIFO. A training loop
//     submits the same tensors in the same order each step, so the front is an earlier step's
//     result for the same tensor; a loop that still holds last step's results (`outs =
//     step()`) makes the FIFO two steps deep. A free front entry of another shape is dropped.
//     Behind a held front (a baseline the caller kept) the next kLookPast entries are
//     candidates too, looked past in place when they do not fit (more held results than that
//     at the front, a list of every step's loss, still make new arrays): a FIFO
//     that stopped at a held front made every later call a new array in cold memory (a 4 KiB
//     allreduce between two ranks: 5.6 against 3.7 us while one earlier result was kept and a
//     small allreduce of another shape came after it). Bounded by 4,096 arrays and 32 MiB;
//   - large arrays: every entry is looked at (there are at most 4; 512 MiB), so one loop's
//     few large results of different shapes each find theirs, whatever the order.
// When no entry fits, a new array is made; the oldest entries go once a pool is over its
// bounds, and an array larger than its pool's byte bound is never pooled. The small pool made
// the 200 x 4 KiB set at np=2 faster, much of it in the core's thread, which now writes
// results into memory it wrote the step before; a free list of raw
// blocks handed out the same way saved nothing (benchmarks/history/RESULTS-parts-1-10.md,
// "Session 4, later": "Small outputs come from a pool").
#include "bindings/output_array_pool.h"

#include <deque>

namespace hvd::bindings {
namespace {

constexpr Py_ssize_t kLargeBytes = 1 << 20;
constexpr size_t kLookPast = 4;  // entries behind a held small-pool front a call looks at

enum class Entry { kHeld, kMatches, kOtherShape, kUnusable };

Entry classify(PyObject* obj, PyArray_Descr* descr, int ndim, const npy_intp* dims) {
  if (Py_REFCNT(obj) != 1) return Entry::kHeld;
  auto* arr = reinterpret_cast<PyArrayObject*>(obj);
  if (reinterpret_cast<PyArrayObject_fields*>(arr)->weakreflist != nullptr) {
    return Entry::kUnusable;
  }
  const int need = NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_WRITEABLE | NPY_ARRAY_OWNDATA;
  if (!PyArray_CHKFLAGS(arr, need)) return Entry::kUnusable;
  if (PyArray_NDIM(arr) != ndim || !PyArray_EquivTypes(PyArray_DESCR(arr), descr)) {
    return Entry::kOtherShape;
  }
  for (int i = 0; i < ndim; ++i) {
    if (PyArray_DIM(arr, i) != dims[i]) return Entry::kOtherShape;
  }
  return Entry::kMatches;
}

class ArrayPool {
 public:
  // looks_past_front: every entry is a candidate (the large pool), else only the front.
  ArrayPool(size_t max_arrays, Py_ssize_t max_bytes, bool looks_past_front)
      : max_arrays_(max_arrays), max_bytes_(max_bytes), looks_past_front_(looks_past_front) {}

  PyObject* take(PyArray_Descr* descr, int ndim, const npy_intp* dims) {
    for (size_t i = 0; i < entries_.size();) {
      const Entry entry = classify(entries_[i].array, descr, ndim, dims);
      if (entry == Entry::kMatches) {
        const Pooled out = entries_[i];
        entries_.erase(entries_.begin() + static_cast<std::ptrdiff_t>(i));
        entries_.push_back(out);
        Py_INCREF(out.array);
        ++reused_;
        return out.array;
      }
      const bool droppable = entry == Entry::kUnusable ||
                             (entry == Entry::kOtherShape && !looks_past_front_);
      if (looks_past_front_ && droppable) {
        drop(i);
      } else if (looks_past_front_) {
        ++i;
      } else if (droppable && i == 0) {
        drop(i);  // the front: its next take would be ours again
      } else if (i < kLookPast && (i > 0 || entry == Entry::kHeld)) {
        ++i;  // behind a held front: each stays where it is for its next turn
      } else {
        break;
      }
    }
    Py_INCREF(descr);  // stolen by the call
    PyObject* out = PyArray_NewFromDescr(&PyArray_Type, descr, ndim,
                                         const_cast<npy_intp*>(dims), nullptr, nullptr, 0,
                                         nullptr);
    if (out == nullptr) return nullptr;
    ++made_;
    const Py_ssize_t bytes = PyArray_NBYTES(reinterpret_cast<PyArrayObject*>(out));
    if (bytes > max_bytes_) return out;  // never pooled: it alone would pass the bound
    Py_INCREF(out);
    entries_.push_back({out, bytes});
    bytes_ += bytes;
    while (entries_.size() > max_arrays_ || bytes_ > max_bytes_) drop(0);
    return out;
  }

  unsigned long long reused() const { return reused_; }
  unsigned long long made() const { return made_; }

 private:
  // An entry and its bytes when pooled (a user may resize a result in place later).
  struct Pooled {
    PyObject* array;
    Py_ssize_t bytes;
  };

  void drop(size_t i) {
    const Pooled entry = entries_[i];
    entries_.erase(entries_.begin() + static_cast<std::ptrdiff_t>(i));
    bytes_ -= entry.bytes;
    Py_DECREF(entry.array);  // after the erase: a deallocation cannot see a half-updated pool
  }

  const size_t max_arrays_;
  const Py_ssize_t max_bytes_;
  const bool looks_past_front_;
  std::deque<Pooled> entries_;  // oldest first; one reference each
  Py_ssize_t bytes_ = 0;
  unsigned long long reused_ = 0;  // arrays handed out again
  unsigned long long made_ = 0;    // new arrays
};

// Never destroyed: entries may outlive the interpreter's teardown order.
ArrayPool& smallPool() {
  static auto* pool = new ArrayPool(4096, 32 << 20, false);
  return *pool;
}
ArrayPool& largePool() {
  static auto* pool = new ArrayPool(4, Py_ssize_t{512} << 20, true);
  return *pool;
}

}  // namespace

PyObject* pooledOutputLike(PyArrayObject* array) {
  return pooledOutput(PyArray_DESCR(array), PyArray_NDIM(array), PyArray_DIMS(array));
}

PyObject* pooledOutput(PyArray_Descr* descr, int ndim, const npy_intp* dims) {
  Py_ssize_t bytes = PyDataType_ELSIZE(descr);
  for (int i = 0; i < ndim; ++i) bytes *= dims[i];
  ArrayPool& pool = bytes < kLargeBytes ? smallPool() : largePool();
  return pool.take(descr, ndim, dims);
}

PyObject* pyOutputPoolCounts(PyObject*, PyObject*) {
  return Py_BuildValue("{s:K,s:K,s:K,s:K}", "small_reused", smallPool().reused(), "small_made",
                       smallPool().made(), "large_reused", largePool().reused(), "large_made",
                       largePool().made());
}

PyObject* pyOutputLike(PyObject*, PyObject* array) {
  if (!PyArray_Check(array)) {
    PyErr_SetString(PyExc_TypeError, "output_like(array): a numpy array");
    return nullptr;
  }
  auto* arr = reinterpret_cast<PyArrayObject*>(array);
  if (!PyArray_CheckExact(array) || !PyArray_IS_C_CONTIGUOUS(arr)) {
    return PyArray_NewLikeArray(arr, NPY_KEEPORDER, nullptr, 1);  // np.empty_like's result
  }
  return pooledOutputLike(arr);
}

}  // namespace hvd::bindings
