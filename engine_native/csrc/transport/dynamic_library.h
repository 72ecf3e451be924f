// DynamicLibrary: loads one optional library (NCCL, the CUDA runtime, NVRTC, the CUDA driver)
// with dlopen from a list of candidates and publishes its function table, so the core is never
// compiled or linked against CUDA (DESIGN §3 "Boundary"). The search and its report are the same
// for every library (dynamic_library.cc); what differs is a LibrarySpec and a bind function.
// Thread-safe: load() is called on any thread, api() is lock-free; a loaded library is never
// unloaded, and after a failure the next load() tries again (the user may have installed it).
#pragma once

#include <atomic>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

namespace hvd::transport {

// Resolves the symbols of one table from one handle, remembering the missing ones.
class SymbolBinder {
 public:
  explicit SymbolBinder(void* handle) : handle_(handle) {}

  template <typename Fn>
  void bind(const char* name, Fn* slot) {
    void* symbol = find(name);
    if (symbol == nullptr) {
      missing_.push_back(name);
    } else {
      *slot = reinterpret_cast<Fn>(symbol);
    }
  }

  // A symbol the caller can do without (its slot stays nullptr).
  template <typename Fn>
  void bindOptional(const char* name, Fn* slot) {
    void* symbol = find(name);
    if (symbol != nullptr) *slot = reinterpret_cast<Fn>(symbol);
  }

  bool complete() const { return missing_.empty(); }
  std::string missingList() const;  // "ncclSend, ncclRecv"

 private:
  void* find(const char* name) const;

  void* handle_;
  std::vector<std::string> missing_;
};

// What differs between the libraries; the procedure in dynamic_library.cc is shared.
struct LibrarySpec {
  const char* what;            // "NCCL", "the CUDA driver": as in "is the CUDA driver 12.8"
  const char* title;           // "NCCL", "CUDA driver": as in "No usable CUDA driver: ..."
  const char* version_symbol;  // "ncclGetVersion": must exist and answer a code
  int min_version;             // the oldest usable version code
  std::string (*version_text)(int code);  // 2804 -> "2.8.4"
  // Calls the version entry point; nullptr for the usual `int f(int* code)`.
  int (*query_version)(void* version_fn, int* code);
  // "" when a library of version `code` is usable here, else why not; may be nullptr.
  std::string (*compatible)(int code);
  const char* fix;             // how to get a usable one (names the HVD_*_LIBRARY override)
};

// Why one candidate was passed over.
struct Rejection {
  std::string candidate;  // as given
  std::string reason;     // "not found", "cannot be loaded: ...", "is NCCL 2.8.4 (...) ..."
  bool not_found = false;
};

struct LoadResult {
  bool ok = false;
  std::string path;       // the loaded library (absolute), empty when none
  int version = 0;        // its version code, 0 when none
  std::string error;      // why none was loaded: every rejected candidate and the fix
  std::vector<Rejection> rejected;  // candidates passed over, in the order tried
};

// Tries `candidates` in order and keeps the first usable one; `bind` fills the caller's table
// from a loaded candidate (it may run for several candidates; only the winner's table is used).
// A candidate containing '/' is a file path; any other a name for the system loader
// (LD_LIBRARY_PATH, ldconfig), e.g. "libnccl.so.2".
LoadResult loadFirstUsable(const LibrarySpec& spec, const std::vector<std::string>& candidates,
                           const std::function<void(SymbolBinder&)>& bind);

// One library's published table and last result.
template <typename Api>
class DynamicLibrary {
 public:
  using BindFn = void (*)(SymbolBinder&, Api*);
  DynamicLibrary(const LibrarySpec& spec, BindFn bind) : spec_(spec), bind_(bind) {}

  // Once one is loaded, later calls return its result and ignore their candidates.
  LoadResult load(const std::vector<std::string>& candidates) {
    std::lock_guard<std::mutex> lock(mu_);
    if (api() != nullptr) return last_;
    // table_ is written only here, before publication: a rejected candidate's partial table
    // is overwritten by the next one and never published.
    last_ = loadFirstUsable(spec_, candidates, [this](SymbolBinder& binder) {
      table_ = Api();
      bind_(binder, &table_);
    });
    if (last_.ok) published_.store(&table_, std::memory_order_release);
    return last_;
  }

  // The last result, without trying anything.
  LoadResult lastResult() {
    std::lock_guard<std::mutex> lock(mu_);
    return last_;
  }

  // nullptr until a load succeeded, then the same table for the life of the process.
  const Api* api() const { return published_.load(std::memory_order_acquire); }

  const LibrarySpec& spec() const { return spec_; }

 private:
  const LibrarySpec spec_;
  const BindFn bind_;
  std::mutex mu_;
  Api table_;
  std::atomic<const Api*> published_{nullptr};
  LoadResult last_;
};

}  // namespace hvd::transport
