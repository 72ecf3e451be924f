// compileWithNvrtc (kernel_compiler.h): create, compile, fetch the log, fetch the image,
// destroy, every NVRTC result checked and named.
#include "transport/cuda/kernel_compiler.h"

namespace hvd::transport::cuda {
namespace {

std::string nvrtcError(const NvrtcApi& nvrtc, int result, const char* call) {
  const char* text = nvrtc.getErrorString(result);
  return std::string(call) + " failed: " + (text != nullptr ? text : "unknown NVRTC error") +
         " (" + std::to_string(result) + ")";
}

std::string programLog(const NvrtcApi& nvrtc, NvrtcProgram program) {
  size_t size = 0;
  if (nvrtc.getProgramLogSize(program, &size) != kNvrtcSuccess || size <= 1) return "";
  std::string log(size, '\0');
  if (nvrtc.getProgramLog(program, log.data()) != kNvrtcSuccess) return "";
  log.resize(log.find('\0') == std::string::npos ? log.size() : log.find('\0'));
  return log;
}

}  // namespace

common::Status compileWithNvrtc(const NvrtcApi& nvrtc, const std::string& source,
                                const std::string& name, const std::vector<std::string>& options,
                                bool ptx, std::string* image) {
  NvrtcProgram program = nullptr;
  int result = nvrtc.createProgram(&program, source.c_str(), name.c_str(), 0, nullptr, nullptr);
  if (result != kNvrtcSuccess) {
    return common::internalError("compiling " + name + ": " +
                                 nvrtcError(nvrtc, result, "nvrtcCreateProgram"));
  }
  std::vector<const char*> argv;
  for (const auto& option : options) argv.push_back(option.c_str());
  result = nvrtc.compileProgram(program, static_cast<int>(argv.size()), argv.data());
  const std::string log = programLog(nvrtc, program);
  std::string error;
  if (result != kNvrtcSuccess) {
    std::string joined;
    for (const auto& option : options) joined += " " + option;
    error = "compiling " + name + " (options:" + joined + "): " +
            nvrtcError(nvrtc, result, "nvrtcCompileProgram") +
            (log.empty() ? std::string(", no log") : "; NVRTC log:\n" + log) +
            "\nThis is a bug in hvd-magic's kernel source or an NVRTC too old for this GPU: "
            "report it with this message, or pip install a newer nvidia-cuda-nvrtc-cu12.";
  } else {
    size_t size = 0;
    result = ptx ? nvrtc.getPtxSize(program, &size) : nvrtc.getCubinSize(program, &size);
    if (result == kNvrtcSuccess) {
      image->assign(size, '\0');
      result = ptx ? nvrtc.getPtx(program, image->data()) : nvrtc.getCubin(program, image->data());
    }
    if (result != kNvrtcSuccess) {
      error = "compiling " + name + ": " +
              nvrtcError(nvrtc, result, ptx ? "nvrtcGetPTX" : "nvrtcGetCUBIN");
    }
  }
  nvrtc.destroyProgram(&program);
  return error.empty() ? common::Status::ok() : common::internalError(error);
}

}  // namespace hvd::transport::cuda
