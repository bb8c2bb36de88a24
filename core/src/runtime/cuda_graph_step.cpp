// Whole-step CUDA graphs: see cuda_graph_step.h and docs/backends/cudagraphs.md. Compiled only when
// the CUDA toolkit is found (KILN_HAVE_CUDA); LibTorch's CUDA headers come with the wheel.
#include "cuda_graph_step.h"

#include "kiln/compile.h"

#if defined(KILN_HAVE_CUDA)

#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/StringUtil.h>

#include "kiln/executor.h"
#include "kiln/log.h"
#include "kiln/plugin_registry.h"

namespace kiln::cudagraph {

struct Step::Impl {
  std::shared_ptr<const LoadedPlugin> plugin;
  c10::Device device;
  c10::cuda::CUDAStream stream;
  c10::MempoolId_t pool{0, 0};
  bool pool_used = false;
  std::unique_ptr<PluginGraph> graph;

  Impl(std::shared_ptr<const LoadedPlugin> p, c10::Device d)
      : plugin(std::move(p)), device(d), stream(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, d.index())) {}

  DLDevice dl() const { return DLDevice{kDLCUDA, static_cast<int32_t>(device.index())}; }

  // `to` waits for the work enqueued so far on `from`.
  static void order(const c10::cuda::CUDAStream& from, const c10::cuda::CUDAStream& to) {
    if (from == to) return;
    at::cuda::CUDAEvent ev;
    ev.record(from);
    ev.block(to);
  }
};

Step::Step(std::shared_ptr<const LoadedPlugin> plugin, c10::Device device)
    : impl_(std::make_unique<Impl>(std::move(plugin), device)) {}

Step::~Step() {
  impl_->graph.reset();
  static_outputs.clear();
  static_inputs.clear();
  if (impl_->pool_used) {
    try {
      c10::cuda::CUDACachingAllocator::releasePool(impl_->device.index(), impl_->pool);
    } catch (const std::exception& e) {
      log_warn(std::string("kiln: releasing a CUDA graph's memory pool failed: ") + e.what());
    }
  }
}

bool Step::recorded() const { return impl_->graph != nullptr; }

void Step::warm_up(const std::function<void(void*)>& body, const std::vector<at::Tensor>& live) {
  c10::cuda::CUDAGuard guard(impl_->device);
  const auto current = c10::cuda::getCurrentCUDAStream(impl_->device.index());
  Impl::order(current, impl_->stream);
  {
    c10::cuda::CUDAStreamGuard on_capture_stream(impl_->stream);
    body(impl_->stream.stream());
  }
  Impl::order(impl_->stream, current);
  for (const auto& t : live)
    if (t.defined() && t.is_cuda() && t.has_storage())
      c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), current);
}

void Step::record(const std::function<void(void*)>& body) {
  c10::cuda::CUDAGuard guard(impl_->device);
  const auto current = c10::cuda::getCurrentCUDAStream(impl_->device.index());
  Impl::order(current, impl_->stream);
  const auto dev = impl_->device.index();
  impl_->pool = at::cuda::graph_pool_handle();
  const cudaStream_t capture = impl_->stream.stream();
  c10::cuda::CUDACachingAllocator::beginAllocateToPool(dev, impl_->pool,
                                                       [capture](cudaStream_t s) { return s == capture; });
  impl_->pool_used = true;
  std::string failure;
  try {
    impl_->plugin->graph_capture_begin(impl_->dl(), capture);
  } catch (const std::exception& e) {
    c10::cuda::CUDACachingAllocator::endAllocateToPool(dev, impl_->pool);
    throw CaptureFailed(std::string("the capture could not start: ") + e.what());
  }
  {
    c10::cuda::CUDAStreamGuard on_capture_stream(impl_->stream);
    try {
      body(capture);
    } catch (const std::exception& e) {
      const std::string op = current_node_op();
      std::string what = e.what();
      if (auto nl = what.find('\n'); nl != std::string::npos) what.resize(nl);  // drop ATen's backtrace
      failure = c10::str(op.empty() ? std::string("an error") : "incompatible op " + op, " during capture (", what, ")");
    }
  }
  try {
    impl_->graph = impl_->plugin->graph_capture_end(impl_->dl(), capture);
  } catch (const std::exception& e) {
    if (failure.empty()) failure = std::string("the capture was invalidated: ") + e.what();
    else failure += std::string("; ") + e.what();
  }
  c10::cuda::CUDACachingAllocator::endAllocateToPool(dev, impl_->pool);
  if (!failure.empty()) {
    impl_->graph.reset();
    throw CaptureFailed(failure);
  }
  Impl::order(impl_->stream, current);
}

void Step::replay() {
  c10::cuda::CUDAGuard guard(impl_->device);
  impl_->graph->launch(c10::cuda::getCurrentCUDAStream(impl_->device.index()).stream());
}

bool cuda_available() {
  try {
    return c10::cuda::device_count() > 0;
  } catch (...) {
    return false;
  }
}

}  // namespace kiln::cudagraph

namespace kiln {

namespace {
c10::CachingAllocator::Stat allocated_stat(int device) {
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(device));
  return stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
}
}  // namespace

int64_t cuda_allocated_bytes(int device) { return cudagraph::cuda_available() ? allocated_stat(device).current : 0; }
int64_t cuda_peak_allocated_bytes(int device) { return cudagraph::cuda_available() ? allocated_stat(device).peak : 0; }
void cuda_reset_peak_allocated(int device) {
  if (cudagraph::cuda_available()) c10::cuda::CUDACachingAllocator::resetPeakStats(static_cast<c10::DeviceIndex>(device));
}

}  // namespace kiln

#else  // no CUDA toolkit: nothing records graphs

namespace kiln::cudagraph {
struct Step::Impl {};
Step::Step(std::shared_ptr<const LoadedPlugin>, c10::Device) {
  throw std::runtime_error("kiln was built without the CUDA toolkit or without a CUDA build of LibTorch");
}
Step::~Step() = default;
void Step::warm_up(const std::function<void(void*)>&, const std::vector<at::Tensor>&) {}
void Step::record(const std::function<void(void*)>&) { throw CaptureFailed("kiln was built without CUDA"); }
bool Step::recorded() const { return false; }
void Step::replay() {}
bool cuda_available() { return false; }
}  // namespace kiln::cudagraph

namespace kiln {
int64_t cuda_allocated_bytes(int) { return 0; }
int64_t cuda_peak_allocated_bytes(int) { return 0; }
void cuda_reset_peak_allocated(int) {}
}  // namespace kiln

#endif
