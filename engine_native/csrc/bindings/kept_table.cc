// The kept-references table shared by the C per-tensor paths (bindings/kept_table.h).
#include "bindings/kept_table.h"

#include <algorithm>
#include <vector>

#include "bindings/core_calls.h"
#include "runtime/runtime.h"

namespace hvd::bindings {
namespace {

struct Kept {
  int64_t handle = 0;  // 0: slot free
  PyObject* keep = nullptr;
  PyObject* output = nullptr;
  PyObject* finish = nullptr;  // nullptr: synchronize returns `output`
  KeptBy by = KeptBy::kNumpy;
  ResultConverter convert = nullptr;  // set: synchronize returns convert(finish, result)
};
// By the handle's slot (its low 32 bits), which the HandleTable reuses: bounded by the ops in
// flight at once.
std::vector<Kept> g_kept;
// Handles whose entries a synchronizeKept took out for its wait (still "kept" to isKept).
std::vector<int64_t> g_waiting;

// Drops a Kept's references after its slot was reset: a destructor run by a DECREF may call
// back into an enqueue and grow g_kept, so no reference into it is held meanwhile.
void dropRefs(const Kept& k) {
  Py_XDECREF(k.keep);
  Py_XDECREF(k.output);
  Py_XDECREF(k.finish);
}

Kept* keptFor(int64_t handle) {
  const size_t slot = static_cast<size_t>(handle & 0xffffffff);
  if (handle <= 0 || slot >= g_kept.size() || g_kept[slot].handle != handle) return nullptr;
  return &g_kept[slot];
}

}  // namespace

void keepRefs(int64_t handle, PyObject* keep, PyObject* output, PyObject* finish, KeptBy by) {
  const size_t slot = static_cast<size_t>(handle & 0xffffffff);
  if (slot >= g_kept.size()) g_kept.resize(std::max(slot + 1, g_kept.size() * 2));
  Py_XINCREF(keep);
  Py_XINCREF(output);
  Py_XINCREF(finish);
  // A slot still held belongs to a handle that was released without synchronize (a plain
  // wait() after an abort): its op is over, so its references can go.
  const Kept stale = g_kept[slot];
  g_kept[slot] = Kept{handle, keep, output, finish, by};
  dropRefs(stale);
}

void convertKeptResult(int64_t handle, ResultConverter convert) {
  Kept* k = keptFor(handle);
  if (k != nullptr) k->convert = convert;
}

bool isKept(int64_t handle) {
  return keptFor(handle) != nullptr ||
         std::find(g_waiting.begin(), g_waiting.end(), handle) != g_waiting.end();
}

PyObject* synchronizeKept(int64_t handle) {
  // Taken out of the table before the wait: the wait frees the handle's slot, and an enqueue on
  // another thread may take that slot (keepRefs then drops what it holds as stale) before this
  // thread reads the table again. That happened when a wait released the GIL before its fast
  // path (TF1 session threads got None for an aligned group's output).
  Kept* k = keptFor(handle);
  const Kept mine = k != nullptr ? *k : Kept();
  if (k != nullptr) {
    *k = Kept();
    g_waiting.push_back(handle);
  }
  PyObject* result = nullptr;
  if (mine.convert != nullptr) {
    common::Status status;
    runtime::OpResult op_result;
    if (waitResult(handle, &status, &op_result)) {
      result = status.isOk() ? mine.convert(mine.finish, mine.output, op_result)
                             : raiseStatus(status);
    }
  } else {
    result = waitHandle(handle);
  }
  if (mine.handle != 0) g_waiting.erase(std::find(g_waiting.begin(), g_waiting.end(), handle));
  if (result == nullptr) {
    // An interrupted wait (Ctrl-C, or any exception a signal handler raised) leaves the op
    // pending and its handle known (so its slot is still its own): its memory stays kept.
    // Otherwise the op failed and is over (wait released the handle): let go.
    if (mine.handle != 0) {
      if (runtime::Runtime::instance().handles().poll(handle) >= 0) {
        g_kept[static_cast<size_t>(handle & 0xffffffff)] = mine;  // the table only grows
      } else {
        dropRefs(mine);
      }
    }
    return nullptr;
  }
  if (mine.handle == 0) return result;  // nothing kept: the core's own result
  PyObject* out = nullptr;
  if (mine.convert != nullptr) {
    out = result;  // converted already
    Py_INCREF(out);
  } else if (mine.finish == nullptr) {
    out = mine.output != nullptr ? mine.output : Py_None;
    Py_INCREF(out);
  } else {
    out = PyObject_CallOneArg(mine.finish, result);
  }
  Py_DECREF(result);
  dropRefs(mine);
  return out;
}

void releaseKept(KeptBy by) {
  std::vector<Kept> dropped;  // reset first: a destructor run below may enqueue again
  for (Kept& k : g_kept) {
    if (k.handle != 0 && k.by == by) {
      dropped.push_back(k);
      k = Kept();
    }
  }
  for (const Kept& k : dropped) dropRefs(k);
}

}  // namespace hvd::bindings
