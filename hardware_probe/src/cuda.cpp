// CUDA devices through the driver API, loaded at run time: kiln links no CUDA library, so one
// build runs on machines with and without NVIDIA's driver. The few driver entry points used are
// declared here with the driver's C ABI (CUresult and CUdevice are ints).
#include <dlfcn.h>

#include <cstdio>
#include <cstring>

#include "probe_internal.h"

namespace kiln::hw::detail {

namespace {

using CUresult = int;
using CUdevice = int;
constexpr CUresult kCudaSuccess = 0;
constexpr CUresult kCudaErrorNoDevice = 100;
constexpr int kAttrMultiprocessorCount = 16;
constexpr int kAttrComputeCapabilityMajor = 75;
constexpr int kAttrComputeCapabilityMinor = 76;

struct Driver {
  CUresult (*cuInit)(unsigned) = nullptr;
  CUresult (*cuDriverGetVersion)(int*) = nullptr;
  CUresult (*cuDeviceGetCount)(int*) = nullptr;
  CUresult (*cuDeviceGet)(CUdevice*, int) = nullptr;
  CUresult (*cuDeviceGetName)(char*, int, CUdevice) = nullptr;
  CUresult (*cuDeviceGetAttribute)(int*, int, CUdevice) = nullptr;
  CUresult (*cuDeviceTotalMem_v2)(size_t*, CUdevice) = nullptr;
  CUresult (*cuDeviceGetPCIBusId)(char*, int, CUdevice) = nullptr;
  CUresult (*cuGetErrorName)(CUresult, const char**) = nullptr;  // optional

  std::string error(CUresult r) const {
    const char* name = nullptr;
    if (cuGetErrorName && cuGetErrorName(r, &name) == kCudaSuccess && name)
      return std::string(name) + " (" + std::to_string(r) + ")";
    return "CUDA error " + std::to_string(r);
  }
};

template <typename F>
bool bind(void* lib, const char* name, F& fn, std::string* missing) {
  fn = reinterpret_cast<F>(::dlsym(lib, name));
  if (!fn && missing) *missing += std::string(missing->empty() ? "" : ", ") + name;
  return fn != nullptr;
}

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  return s;
}

}  // namespace

std::vector<Device> cuda_from_driver(const Tree& t, const std::string& library, std::string* status,
                                     bool* driver_found) {
  std::vector<Device> out;
  *driver_found = false;
  // The library stays loaded for the life of the process: unloading a driver that has been
  // initialised is not supported by NVIDIA and buys nothing.
  void* lib = ::dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* err = ::dlerror();
    std::string e = err ? err : "";
    if (e.empty() || e.find("No such file") != std::string::npos)
      *status = "no CUDA driver (" + library + " not found)";
    else *status = "no CUDA driver (" + library + " could not be loaded: " + e + ")";
    return out;
  }
  *driver_found = true;

  Driver d;
  std::string missing;
  bind(lib, "cuInit", d.cuInit, &missing);
  bind(lib, "cuDriverGetVersion", d.cuDriverGetVersion, &missing);
  bind(lib, "cuDeviceGetCount", d.cuDeviceGetCount, &missing);
  bind(lib, "cuDeviceGet", d.cuDeviceGet, &missing);
  bind(lib, "cuDeviceGetName", d.cuDeviceGetName, &missing);
  bind(lib, "cuDeviceGetAttribute", d.cuDeviceGetAttribute, &missing);
  bind(lib, "cuDeviceTotalMem_v2", d.cuDeviceTotalMem_v2, &missing);
  bind(lib, "cuDeviceGetPCIBusId", d.cuDeviceGetPCIBusId, &missing);
  bind(lib, "cuGetErrorName", d.cuGetErrorName, nullptr);
  if (!missing.empty()) {
    *status = "CUDA driver " + library + " lacks " + missing;
    t.warn(*status);
    return out;
  }

  int version = 0;
  std::string version_text = "driver";
  if (d.cuDriverGetVersion(&version) == kCudaSuccess && version > 0)
    version_text = "driver " + std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);

  CUresult r = d.cuInit(0);
  if (r == kCudaErrorNoDevice) {
    *status = "CUDA " + version_text + " present, no CUDA device (" + d.error(r) + ")";
    return out;
  }
  if (r != kCudaSuccess) {
    *status = "CUDA " + version_text + " present, cuInit failed: " + d.error(r);
    t.warn(*status);
    return out;
  }
  int count = 0;
  r = d.cuDeviceGetCount(&count);
  if (r != kCudaSuccess) {
    *status = "CUDA " + version_text + ": cuDeviceGetCount failed: " + d.error(r);
    t.warn(*status);
    return out;
  }

  for (int i = 0; i < count; ++i) {
    CUdevice dev = 0;
    if ((r = d.cuDeviceGet(&dev, i)) != kCudaSuccess) {
      t.warn("CUDA device " + std::to_string(i) + ": cuDeviceGet failed: " + d.error(r));
      continue;
    }
    Device x;
    x.kind = DeviceKind::cuda;
    x.index = i;
    char name[256] = {0};
    if (d.cuDeviceGetName(name, sizeof name - 1, dev) == kCudaSuccess) x.name = name;
    else x.name = "CUDA device " + std::to_string(i);
    auto attr = [&](int a, int& outv, const char* what) {
      CUresult e = d.cuDeviceGetAttribute(&outv, a, dev);
      if (e != kCudaSuccess) t.warn("CUDA device " + std::to_string(i) + ": cannot read " + what + ": " + d.error(e));
    };
    attr(kAttrComputeCapabilityMajor, x.cuda.cc_major, "the compute capability");
    attr(kAttrComputeCapabilityMinor, x.cuda.cc_minor, "the compute capability");
    attr(kAttrMultiprocessorCount, x.cuda.multiprocessor_count, "the multiprocessor count");
    size_t bytes = 0;
    if ((r = d.cuDeviceTotalMem_v2(&bytes, dev)) == kCudaSuccess) x.cuda.total_memory_bytes = bytes;
    else t.warn("CUDA device " + std::to_string(i) + ": cannot read its memory size: " + d.error(r));
    char bus[64] = {0};
    if (d.cuDeviceGetPCIBusId(bus, sizeof bus - 1, dev) == kCudaSuccess) x.pci_bus_id = lower(bus);
    out.push_back(std::move(x));
  }
  *status = std::to_string(out.size()) + " CUDA device" + (out.size() == 1 ? "" : "s") + " through " + library + " (" +
            version_text + ")";
  return out;
}

}  // namespace kiln::hw::detail
