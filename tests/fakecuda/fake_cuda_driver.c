/* fake_cuda_driver.c: a fake libcuda.so.1 for the device kernels (engine_native/csrc/transport/
 * cuda), on top of the fake cudart (it links against it: build.py). Test-only.
 *
 * Contexts are the fake cudart's devices: the current context is the calling thread's current
 * device (cudaGetDevice), retaining a primary context and making it current is cudaSetDevice.
 * A module is the shared object the fake NVRTC (fake_nvrtc.c) built, named by its image
 * "FAKECUDA-SO:<path>"; a function is its fakecuda_run_<name> wrapper. cuLaunchKernel copies
 * the one kernel parameter (fakecuda_argsize_<name> bytes, as CUDA copies arguments at launch)
 * and queues the run with cudaLaunchHostFunc, so it runs in stream order with the fake
 * cudart's copies, events and NCCL calls. FAKE_CUDA_CC (default "9.0") is the compute
 * capability every device reports; FAKE_CUDA_DRIVER_VERSION (default 12090) the version. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FD_API __attribute__((visibility("default")))

enum { kSuccess = 0, kInvalidValue = 1, kOutOfMemory = 2, kInvalidImage = 200,
       kInvalidContext = 201, kNotFound = 500, kInvalidHandle = 400, kLaunchFailed = 719 };

/* The fake cudart's entry points used here. */
int cudaGetDevice(int* device);
int cudaSetDevice(int device);
int cudaGetDeviceCount(int* count);
int cudaLaunchHostFunc(void* stream, void (*fn)(void*), void* user_data);
int fakeCudaAllocationRange(const void* pointer, void** base, size_t* bytes);

typedef void (*run_fn)(unsigned grid, unsigned block, const void* args);
typedef struct {
  run_fn run;
  size_t arg_bytes;
  int loaded; /* cuFuncGetAttribute was called: no lazy load at the first launch */
} function;

typedef struct {
  run_fn run;
  unsigned grid, block;
  unsigned char args[];
} launch;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static long launches;
static long functions_got, functions_loaded, lazy_launches;
static unsigned last_grid, last_block;

FD_API int cuDriverGetVersion(int* version) {
  const char* env = getenv("FAKE_CUDA_DRIVER_VERSION");
  if (version == NULL) return kInvalidValue;
  *version = env != NULL ? atoi(env) : 12090;
  return kSuccess;
}

FD_API int cuInit(unsigned flags) { return flags == 0 ? kSuccess : kInvalidValue; }

static const char* errorName(int result) {
  switch (result) {
    case kSuccess: return "CUDA_SUCCESS";
    case kInvalidValue: return "CUDA_ERROR_INVALID_VALUE";
    case kOutOfMemory: return "CUDA_ERROR_OUT_OF_MEMORY";
    case kInvalidImage: return "CUDA_ERROR_INVALID_IMAGE";
    case kInvalidContext: return "CUDA_ERROR_INVALID_CONTEXT";
    case kInvalidHandle: return "CUDA_ERROR_INVALID_HANDLE";
    case kNotFound: return "CUDA_ERROR_NOT_FOUND";
    case kLaunchFailed: return "CUDA_ERROR_LAUNCH_FAILED";
    default: return NULL;
  }
}

FD_API int cuGetErrorName(int result, const char** text) {
  if (text == NULL || errorName(result) == NULL) return kInvalidValue;
  *text = errorName(result);
  return kSuccess;
}

FD_API int cuGetErrorString(int result, const char** text) {
  if (text == NULL || errorName(result) == NULL) return kInvalidValue;
  *text = result == kSuccess ? "no error" : "fake driver error";
  return kSuccess;
}

/* A context handle is device + 1 (never NULL). */
FD_API int cuCtxGetCurrent(void** ctx) {
  int device = 0;
  if (ctx == NULL) return kInvalidValue;
  if (cudaGetDevice(&device) != 0) return kInvalidContext;
  *ctx = (void*)(long)(device + 1);
  return kSuccess;
}

FD_API int cuCtxSetCurrent(void* ctx) {
  return ctx != NULL && cudaSetDevice((int)(long)ctx - 1) == 0 ? kSuccess : kInvalidContext;
}

FD_API int cuCtxGetDevice(int* device) {
  if (device == NULL) return kInvalidValue;
  return cudaGetDevice(device) == 0 ? kSuccess : kInvalidContext;
}

FD_API int cuDevicePrimaryCtxRetain(void** ctx, int device) {
  int count = 0;
  if (ctx == NULL || cudaGetDeviceCount(&count) != 0 || device < 0 || device >= count) {
    return kInvalidValue;
  }
  *ctx = (void*)(long)(device + 1);
  return kSuccess;
}

FD_API int cuDeviceGetAttribute(int* value, int attribute, int device) {
  const char* cc = getenv("FAKE_CUDA_CC") != NULL ? getenv("FAKE_CUDA_CC") : "9.0";
  int count = 0, major = 0, minor = 0;
  if (value == NULL || cudaGetDeviceCount(&count) != 0 || device < 0 || device >= count) {
    return kInvalidValue;
  }
  if (sscanf(cc, "%d.%d", &major, &minor) != 2) return kInvalidValue;
  if (attribute == 75) *value = major;       /* COMPUTE_CAPABILITY_MAJOR */
  else if (attribute == 76) *value = minor;  /* COMPUTE_CAPABILITY_MINOR */
  else return kInvalidValue;
  return kSuccess;
}

/* CUdeviceptr is unsigned long long; the _v2 name is the one cuda.h maps to. */
FD_API int cuMemGetAddressRange_v2(unsigned long long* base, size_t* bytes,
                                   unsigned long long pointer) {
  void* start = NULL;
  size_t size = 0;
  if (fakeCudaAllocationRange((const void*)(uintptr_t)pointer, &start, &size) != 0) {
    return kInvalidValue;
  }
  if (base != NULL) *base = (unsigned long long)(uintptr_t)start;
  if (bytes != NULL) *bytes = size;
  return kSuccess;
}

FD_API int cuModuleLoadData(void** module, const void* image) {
  static const char kMagic[] = "FAKECUDA-SO:";
  if (module == NULL || image == NULL) return kInvalidValue;
  if (strncmp(image, kMagic, sizeof(kMagic) - 1) != 0) return kInvalidImage;
  void* handle = dlopen((const char*)image + sizeof(kMagic) - 1, RTLD_NOW | RTLD_LOCAL);
  if (handle == NULL) return kInvalidImage;
  *module = handle;
  return kSuccess;
}

FD_API int cuModuleGetFunction(function** out, void* module, const char* name) {
  char symbol[512];
  if (out == NULL || module == NULL || name == NULL) return kInvalidValue;
  snprintf(symbol, sizeof(symbol), "fakecuda_run_%s", name);
  void* run = dlsym(module, symbol);
  snprintf(symbol, sizeof(symbol), "fakecuda_argsize_%s", name);
  const unsigned long* size = dlsym(module, symbol);
  if (run == NULL || size == NULL) return kNotFound;
  function* f = malloc(sizeof(*f));  /* lives as long as the module: never unloaded */
  if (f == NULL) return kOutOfMemory;
  *(void**)&f->run = run;
  f->arg_bytes = *size;
  f->loaded = 0;
  pthread_mutex_lock(&mu);
  ++functions_got;
  pthread_mutex_unlock(&mu);
  *out = f;
  return kSuccess;
}

/* Note [fake lazy loading]: CUDA 12.2+ loads a function's code at its first launch unless
 * something forces it earlier (cuFuncGetAttribute, cuFuncLoad). The fake marks a function
 * loaded here and counts launches of functions never loaded (fakeCuLazyLaunches). Answers
 * CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK (0) only. */
FD_API int cuFuncGetAttribute(int* value, int attribute, function* f) {
  if (value == NULL || f == NULL) return kInvalidValue;
  if (attribute != 0) return kInvalidValue;
  *value = 1024;
  pthread_mutex_lock(&mu);
  if (!f->loaded) ++functions_loaded;
  f->loaded = 1;
  pthread_mutex_unlock(&mu);
  return kSuccess;
}

/* Test hooks: functions got (cuModuleGetFunction), loaded (cuFuncGetAttribute), and launches
 * of functions never loaded. */
FD_API long fakeCuFunctionsGot(void) { return __atomic_load_n(&functions_got, __ATOMIC_RELAXED); }
FD_API long fakeCuFunctionsLoaded(void) {
  return __atomic_load_n(&functions_loaded, __ATOMIC_RELAXED);
}
FD_API long fakeCuLazyLaunches(void) { return __atomic_load_n(&lazy_launches, __ATOMIC_RELAXED); }

static void runLaunch(void* arg) {
  launch* l = arg;
  l->run(l->grid, l->block, l->args);
  free(l);
}

FD_API int cuLaunchKernel(function* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                          unsigned by, unsigned bz, unsigned shared_bytes, void* stream,
                          void** params, void** extra) {
  if (f == NULL) return kInvalidHandle;
  if (gx == 0 || bx == 0 || bx > 1024 || gy != 1 || gz != 1 || by != 1 || bz != 1 ||
      shared_bytes != 0 || extra != NULL || params == NULL || params[0] == NULL) {
    return kInvalidValue;  /* the fake runs 1-D launches of one by-value parameter only */
  }
  launch* l = malloc(sizeof(*l) + f->arg_bytes);
  if (l == NULL) return kOutOfMemory;
  l->run = f->run;
  l->grid = gx;
  l->block = bx;
  memcpy(l->args, params[0], f->arg_bytes);
  const int result = cudaLaunchHostFunc(stream, runLaunch, l);
  if (result != 0) {
    free(l);
    return kInvalidHandle;
  }
  pthread_mutex_lock(&mu);
  ++launches;
  if (!f->loaded) ++lazy_launches;
  last_grid = gx;
  last_block = bx;
  pthread_mutex_unlock(&mu);
  return kSuccess;
}

/* Test hooks: how many kernels were launched, and the last launch's grid and block sizes. */
FD_API long fakeCuLaunches(void) {
  pthread_mutex_lock(&mu);
  const long n = launches;
  pthread_mutex_unlock(&mu);
  return n;
}

FD_API long fakeCuLastGeometry(void) {
  pthread_mutex_lock(&mu);
  const long g = (long)last_grid * 100000 + last_block;
  pthread_mutex_unlock(&mu);
  return g;
}
