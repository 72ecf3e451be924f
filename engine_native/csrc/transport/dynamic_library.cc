// Loading a library with dlopen (dynamic_library.h). For each candidate, in order:
//   (a) a path that does not exist, or a name the system loader cannot find, is "not found";
//   (b) dlopen(RTLD_NOW | RTLD_LOCAL) — a corrupt file or a missing dependency fails here;
//   (c) the version entry point (ncclGetVersion, nvrtcVersion, ...) must exist and answer;
//   (d) the version must be at least the spec's minimum;
//   (e) every symbol of the table must resolve;
//   (f) where the spec asks, the version must suit what is already loaded (NVRTC vs driver).
// A candidate failing (b)-(f) is closed again (nothing of it has run but its version query), so
// a later bare-name candidate with the same soname cannot pick it up. The first candidate that
// passes is never closed: streams, communicators and modules may outlive any caller.
#include "transport/dynamic_library.h"

#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <utility>
#include <vector>

#include "common/logging.h"

namespace hvd::transport {

void* SymbolBinder::find(const char* name) const { return dlsym(handle_, name); }

std::string SymbolBinder::missingList() const {
  std::string out;
  for (const auto& name : missing_) out += (out.empty() ? "" : ", ") + name;
  return out;
}

namespace {

bool isPath(const std::string& candidate) { return candidate.find('/') != std::string::npos; }

std::string absolute(const char* path) {
  if (path == nullptr || path[0] == '\0') return "";
  if (path[0] == '/') return path;
  char cwd[4096];
  if (getcwd(cwd, sizeof(cwd)) == nullptr) return path;
  return std::string(cwd) + "/" + path;
}

int queryVersion(const LibrarySpec& spec, void* version_fn, int* code) {
  if (spec.query_version != nullptr) return spec.query_version(version_fn, code);
  return reinterpret_cast<int (*)(int*)>(version_fn)(code);
}

std::string versionPhrase(const LibrarySpec& spec, int version) {
  return std::string(spec.what) + " " + spec.version_text(version) + " (version code " +
         std::to_string(version) + ")";
}

// One candidate through steps (a)-(f). On success returns the handle, the resolved path and
// the version; on failure nullptr and *rejection filled in.
void* tryCandidate(const LibrarySpec& spec, const std::string& candidate,
                   const std::function<void(SymbolBinder&)>& bind, std::string* path,
                   int* version, Rejection* rejection) {
  rejection->candidate = candidate;
  struct stat info;
  if (isPath(candidate) && stat(candidate.c_str(), &info) != 0) {  // (a)
    rejection->reason = "not found";
    rejection->not_found = true;
    return nullptr;
  }
  dlerror();
  void* handle = dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);  // (b)
  if (handle == nullptr) {
    const char* err = dlerror();
    const std::string text = err != nullptr ? err : "unknown dlopen error";
    rejection->not_found = !isPath(candidate) && text.find("No such file") != std::string::npos;
    rejection->reason = rejection->not_found ? "not found on the system loader path"
                                             : "cannot be loaded: " + text;
    return nullptr;
  }
  auto reject = [&](std::string reason) -> void* {
    rejection->reason = std::move(reason);
    dlclose(handle);
    return nullptr;
  };
  void* version_fn = dlsym(handle, spec.version_symbol);  // (c)
  if (version_fn == nullptr) {
    return reject(std::string("is not ") + spec.what + " (it has no " + spec.version_symbol +
                  ")");
  }
  Dl_info where;
  *path = absolute(dladdr(version_fn, &where) != 0 ? where.dli_fname : candidate.c_str());
  int code = 0;
  const int result = queryVersion(spec, version_fn, &code);
  if (result != 0) {
    return reject(std::string(spec.version_symbol) + " failed (error " +
                  std::to_string(result) + ")");
  }
  if (code < spec.min_version) {  // (d)
    return reject("is " + versionPhrase(spec, code) + "; this core needs " + spec.what + " " +
                  spec.version_text(spec.min_version) + " or newer");
  }
  SymbolBinder binder(handle);  // (e)
  bind(binder);
  if (!binder.complete()) {
    return reject("is " + versionPhrase(spec, code) + " but lacks " + binder.missingList());
  }
  const std::string unsuitable = spec.compatible != nullptr ? spec.compatible(code) : "";  // (f)
  if (!unsuitable.empty()) return reject(unsuitable);
  *version = code;
  return handle;
}

// The one message a failed search gives: every candidate and why it was passed over (the ones
// merely not found together, as "looked for"), then the spec's fix.
std::string failureMessage(const LibrarySpec& spec, const std::vector<Rejection>& rejected) {
  std::string missing, unusable;
  for (const auto& r : rejected) {
    if (r.not_found) {
      missing += (missing.empty() ? "" : ", ") + r.candidate;
    } else {
      unusable += (unusable.empty() ? "" : "; ") + r.candidate + " " + r.reason;
    }
  }
  std::string out;
  if (rejected.empty()) {
    out = std::string(spec.title) + " was not found: no candidate library was given.";
  } else if (unusable.empty()) {
    out = std::string(spec.title) + " was not found (looked for " + missing + ").";
  } else {
    out = std::string("No usable ") + spec.title + ": " + unusable + ".";
    if (!missing.empty()) out += " Also looked for " + missing + ".";
  }
  return out + " " + spec.fix;
}

}  // namespace

LoadResult loadFirstUsable(const LibrarySpec& spec, const std::vector<std::string>& candidates,
                           const std::function<void(SymbolBinder&)>& bind) {
  LoadResult result;
  for (const auto& candidate : candidates) {
    Rejection rejection;
    std::string path;
    int version = 0;
    if (tryCandidate(spec, candidate, bind, &path, &version, &rejection) == nullptr) {
      HVD_LOG(kDebug, "transport") << spec.title << ": " << candidate << " " << rejection.reason;
      result.rejected.push_back(std::move(rejection));
      continue;
    }
    for (const auto& r : result.rejected) {
      if (!r.not_found) {
        HVD_LOG(kWarning, "transport") << spec.title << ": skipped " << r.candidate << " ("
                                       << r.reason << ")";
      }
    }
    HVD_LOG(kInfo, "transport") << "loaded " << spec.what << " " << spec.version_text(version)
                                << " from " << path;
    result.ok = true;
    result.path = std::move(path);
    result.version = version;
    return result;
  }
  result.error = failureMessage(spec, result.rejected);
  return result;
}

}  // namespace hvd::transport
