/* fake_nvrtc.c: a fake NVRTC that really compiles CUDA C++ kernels for the CPU. Test-only.
 *
 * nvrtcCompileProgram writes the program's source behind a prelude (kPrelude: __global__ and
 * friends defined away, threadIdx/blockIdx/blockDim/gridDim as thread-locals, the bit-cast
 * intrinsics) and, per `extern "C" __global__` kernel taking one parameter by value, a wrapper
 * `fakecuda_run_<name>(grid, block, args)` that runs every block x thread serially, plus
 * `fakecuda_argsize_<name>`. It compiles that with the host C++ compiler ($CXX, else c++) into
 * a shared object in a fresh folder; the "PTX"/"cubin" is the text "FAKECUDA-SO:<path>", which
 * the fake driver (fake_cuda_driver.c) dlopens. --fmad=false becomes -ffp-contract=off. A
 * compiler error is NVRTC_ERROR_COMPILATION with the compiler's output as the log.
 * FAKE_NVRTC_VERSION (default 12090, read per call) sets what nvrtcVersion answers. Each
 * compile's folder is removed when the process exits (a destructor; a killed process leaves
 * its folders); a program compiled before, by any process on this library, is taken from the
 * compile cache beside it (cacheFolder). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define FN_API __attribute__((visibility("default")))

enum { kSuccess = 0, kOutOfMemory = 1, kInvalidInput = 3, kInvalidProgram = 4,
       kInvalidOption = 5, kCompilation = 6 };

typedef struct {
  char* source;
  char* log;
  char* image;  /* "FAKECUDA-SO:<path>" once compiled */
} program;

static const char kPrelude[] =
    "#include <cstring>\n"
    "struct fakecuda_uint3 { unsigned x, y, z; };\n"
    "static thread_local fakecuda_uint3 threadIdx, blockIdx, blockDim, gridDim;\n"
    "#define __global__\n#define __device__\n#define __forceinline__ inline\n"
    "#define __launch_bounds__(...)\n"
    "static inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); "
    "return u; }\n"
    "static inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); "
    "return f; }\n"
    "#line 1 \"program.cu\"\n";

static const char kKernelMark[] = "extern \"C\" __global__ void ";

FN_API int nvrtcVersion(int* major, int* minor) {
  const char* env = getenv("FAKE_NVRTC_VERSION");
  const int code = env != NULL ? atoi(env) : 12090;
  if (major == NULL || minor == NULL) return kInvalidInput;
  *major = code / 1000;
  *minor = (code % 1000) / 10;
  return kSuccess;
}

FN_API const char* nvrtcGetErrorString(int result) {
  switch (result) {
    case kSuccess: return "NVRTC_SUCCESS";
    case kOutOfMemory: return "NVRTC_ERROR_OUT_OF_MEMORY";
    case kInvalidInput: return "NVRTC_ERROR_INVALID_INPUT";
    case kInvalidProgram: return "NVRTC_ERROR_INVALID_PROGRAM";
    case kInvalidOption: return "NVRTC_ERROR_INVALID_OPTION";
    case kCompilation: return "NVRTC_ERROR_COMPILATION";
    default: return "NVRTC_ERROR_INTERNAL_ERROR";
  }
}

FN_API int nvrtcCreateProgram(program** out, const char* src, const char* name, int num_headers,
                              const char* const* headers, const char* const* include_names) {
  (void)name; (void)headers; (void)include_names;
  if (out == NULL || src == NULL || num_headers != 0) return kInvalidInput;
  program* p = calloc(1, sizeof(*p));
  if (p == NULL || (p->source = strdup(src)) == NULL) {
    free(p);
    return kOutOfMemory;
  }
  *out = p;
  return kSuccess;
}

FN_API int nvrtcDestroyProgram(program** p) {
  if (p == NULL || *p == NULL) return kInvalidProgram;
  free((*p)->source);
  free((*p)->log);
  free((*p)->image);
  free(*p);
  *p = NULL;
  return kSuccess;
}

/* Appends a wrapper per kernel of `src` to `out`: after each kKernelMark, an optional
 * __launch_bounds__(...), the name, "(", the parameter's type, its name, ")". */
static int writeWrappers(FILE* out, const char* src) {
  for (const char* at = strstr(src, kKernelMark); at != NULL; at = strstr(at, kKernelMark)) {
    at += sizeof(kKernelMark) - 1;
    if (strncmp(at, "__launch_bounds__(", 18) == 0) at = strchr(at, ')') + 1;
    char name[256], type[256], param[256];
    if (sscanf(at, " %255[A-Za-z0-9_] ( %255[A-Za-z0-9_] %255[A-Za-z0-9_] )", name, type,
               param) != 3) {
      return -1;
    }
    fprintf(out,
            "extern \"C\" __attribute__((visibility(\"default\"))) const unsigned long "
            "fakecuda_argsize_%s = sizeof(%s);\n"
            "extern \"C\" __attribute__((visibility(\"default\"))) void fakecuda_run_%s("
            "unsigned grid, unsigned block, const void* args) {\n"
            "  gridDim = {grid, 1, 1}; blockDim = {block, 1, 1};\n"
            "  for (unsigned b = 0; b < grid; ++b) for (unsigned t = 0; t < block; ++t) {\n"
            "    blockIdx = {b, 0, 0}; threadIdx = {t, 0, 0};\n"
            "    %s(*static_cast<const %s*>(args));\n  }\n}\n",
            name, type, name, name, type);
  }
  return 0;
}

/* The folders this process compiled in, removed at exit (their shared objects stay mapped). */
enum { kMaxFolders = 256 };
static char* g_folders[kMaxFolders];
static int g_folder_count;

static void removeFolder(const char* dir) {
  static const char* const kFiles[] = {"program.cc", "program.so", "log.txt"};
  char path[4200];
  for (size_t i = 0; i < sizeof(kFiles) / sizeof(kFiles[0]); ++i) {
    snprintf(path, sizeof(path), "%s/%s", dir, kFiles[i]);
    unlink(path);
  }
  rmdir(dir);
}

/* Exported for a process that ends in _exit (tests/multiproc/zygote.py): no destructor runs. */
FN_API void fakenvrtc_remove_folders(void) {
  const int count = g_folder_count < kMaxFolders ? g_folder_count : kMaxFolders;
  for (int i = 0; i < count; ++i) {
    if (g_folders[i] == NULL) continue;
    removeFolder(g_folders[i]);
    free(g_folders[i]);
    g_folders[i] = NULL;
  }
}

__attribute__((destructor)) static void removeFoldersAtExit(void) { fakenvrtc_remove_folders(); }

static char* readFile(const char* path) {
  FILE* f = fopen(path, "rb");
  if (f == NULL) return strdup("");
  fseek(f, 0, SEEK_END);
  const long size = ftell(f);
  fseek(f, 0, SEEK_SET);
  char* text = calloc(1, (size_t)size + 1);
  if (text != NULL && fread(text, 1, (size_t)size, f) != (size_t)size) text[0] = '\0';
  fclose(f);
  return text;
}

/* 64-bit FNV-1a: the compile cache's key (a test double's cache, not a security boundary). */
static unsigned long long fnv1a(unsigned long long h, const char* text) {
  for (const unsigned char* c = (const unsigned char*)text; *c != '\0'; ++c) {
    h = (h ^ *c) * 1099511628211ULL;
  }
  return h;
}

/* The compile cache: <this library's folder>/kernel-cache, so the processes using this copy of
 * the library (one per pytest worker) compile a given program once between them (each compile
 * is seconds of CPU, and the core compiles its kernels in every rank). FAKE_NVRTC_CACHE=0
 * compiles every time. Only successful compiles are kept: the compiler writes a name of this
 * process's own in the cache folder, renamed to the program's name once it succeeded (the
 * file appears whole; the same folder, so the rename cannot cross filesystems). */
static int cacheFolder(char* out, size_t size) {
  const char* off = getenv("FAKE_NVRTC_CACHE");
  Dl_info info;
  if ((off != NULL && strcmp(off, "0") == 0) || dladdr((void*)&fnv1a, &info) == 0 ||
      info.dli_fname == NULL) {
    return -1;
  }
  const char* slash = strrchr(info.dli_fname, '/');
  if (slash == NULL) return -1;
  snprintf(out, size, "%.*s/kernel-cache", (int)(slash - info.dli_fname), info.dli_fname);
  return mkdir(out, 0700) == 0 || errno == EEXIST ? 0 : -1;
}

static int setImage(program* p, const char* so_path) {
  free(p->image);
  if (asprintf(&p->image, "FAKECUDA-SO:%s", so_path) < 0) p->image = NULL;
  return p->image != NULL ? kSuccess : kOutOfMemory;
}

FN_API int nvrtcCompileProgram(program* p, int num_options, const char* const* options) {
  if (p == NULL) return kInvalidProgram;
  int contract_off = 0, has_arch = 0;
  for (int i = 0; i < num_options; ++i) {
    if (options[i] == NULL) return kInvalidOption;
    contract_off |= strcmp(options[i], "--fmad=false") == 0;
    has_arch |= strncmp(options[i], "--gpu-architecture=", 19) == 0;
  }
  if (!has_arch) return kInvalidOption;  /* the core always names the device's architecture */
  char* text = NULL;
  size_t text_size = 0;
  FILE* mem = open_memstream(&text, &text_size);
  if (mem == NULL) return kOutOfMemory;
  fputs(kPrelude, mem);
  fputs(p->source, mem);
  fputs("\n", mem);
  const int wrapped = writeWrappers(mem, p->source);
  fclose(mem);
  if (wrapped != 0) {
    free(text);
    free(p->log);
    p->log = strdup("fake NVRTC: a kernel's signature is not `name(Type param)`");
    return kCompilation;
  }
  const char* cxx = getenv("CXX") != NULL && getenv("CXX")[0] != '\0' ? getenv("CXX") : "c++";
  char flags[4400];
  snprintf(flags, sizeof(flags), "%s -std=c++17 -O2 -fPIC -shared -fvisibility=hidden %s", cxx,
           contract_off ? "-ffp-contract=off" : "");
  char cache[4096], cached[4200];
  const int caching = cacheFolder(cache, sizeof(cache)) == 0;
  if (caching) {
    snprintf(cached, sizeof(cached), "%s/%016llx.so", cache,
             fnv1a(fnv1a(14695981039346656037ULL, flags), text));
    if (access(cached, R_OK) == 0) {
      free(text);
      free(p->log);
      p->log = strdup("");
      return setImage(p, cached);
    }
  }
  const char* tmp = getenv("TMPDIR") != NULL ? getenv("TMPDIR") : "/tmp";
  char dir[4096], src_path[4200], so_path[4200], log_path[4200], cmd[17200];
  snprintf(dir, sizeof(dir), "%s/fakenvrtc-XXXXXX", tmp);
  if (mkdtemp(dir) == NULL) {
    free(text);
    return kOutOfMemory;
  }
  const int slot = __atomic_fetch_add(&g_folder_count, 1, __ATOMIC_RELAXED);
  if (slot < kMaxFolders) g_folders[slot] = strdup(dir);
  snprintf(src_path, sizeof(src_path), "%s/program.cc", dir);
  snprintf(so_path, sizeof(so_path), "%s/program.so", dir);
  snprintf(log_path, sizeof(log_path), "%s/log.txt", dir);
  FILE* out = fopen(src_path, "w");
  const int written = out != NULL && fwrite(text, 1, text_size, out) == text_size;
  if (out != NULL) fclose(out);
  free(text);
  if (!written) return kOutOfMemory;
  /* Another process may be storing the same program: either copy is whole. */
  char staged[4300] = "";
  if (caching) snprintf(staged, sizeof(staged), "%s.%d", cached, (int)getpid());
  const char* target = caching ? staged : so_path;
  snprintf(cmd, sizeof(cmd), "%s -o '%s' '%s' > '%s' 2>&1", flags, target, src_path, log_path);
  const int status = system(cmd);
  free(p->log);
  p->log = readFile(log_path);
  if (status != 0) {
    if (caching) unlink(staged);
    return kCompilation;
  }
  return setImage(p, caching && rename(staged, cached) == 0 ? cached : target);
}

static int getSize(const char* text, size_t* size) {
  if (size == NULL) return kInvalidInput;
  if (text == NULL) return kInvalidProgram;
  *size = strlen(text) + 1;
  return kSuccess;
}

static int getBytes(const char* text, char* out) {
  if (out == NULL) return kInvalidInput;
  if (text == NULL) return kInvalidProgram;
  memcpy(out, text, strlen(text) + 1);
  return kSuccess;
}

FN_API int nvrtcGetProgramLogSize(program* p, size_t* size) {
  return p == NULL ? kInvalidProgram : getSize(p->log != NULL ? p->log : "", size);
}
FN_API int nvrtcGetProgramLog(program* p, char* out) {
  return p == NULL ? kInvalidProgram : getBytes(p->log != NULL ? p->log : "", out);
}
FN_API int nvrtcGetPTXSize(program* p, size_t* size) {
  return p == NULL ? kInvalidProgram : getSize(p->image, size);
}
FN_API int nvrtcGetPTX(program* p, char* out) {
  return p == NULL ? kInvalidProgram : getBytes(p->image, out);
}
FN_API int nvrtcGetCUBINSize(program* p, size_t* size) { return nvrtcGetPTXSize(p, size); }
FN_API int nvrtcGetCUBIN(program* p, char* out) { return nvrtcGetPTX(p, out); }
