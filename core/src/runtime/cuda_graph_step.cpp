// Whole-step CUDA graphs: see cuda_graph_step.h and docs/backends/cudagraphs.md. Compiled only when
// the CUDA toolkit is found (KILN_HAVE_CUDA); LibTorch's CUDA headers come with the wheel.
#include "cuda_graph_step.h"

#include "kiln/compile.h"

#if defined(KILN_HAVE_CUDA)

#include <ATen/core/CachingHostAllocator.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include "kiln/internal/executor.h"
#include "kiln/log.h"
#include "kiln/internal/plugin_registry.h"

namespace kiln::cudagraph {

namespace {

// An exception's message without ATen's backtrace and CUDA's hints (the lines after the first).
std::string first_line(const char* what) {
  std::string s(what);
  if (auto nl = s.find('\n'); nl != std::string::npos) s.resize(nl);
  return s;
}

// The reason of a capture whose body threw: the op being run and the error. CUDA running out of
// memory is no fault of the op: the recording allocates from a private pool of its own, and
// LibTorch's allocator cannot free cached blocks to make room while a capture is underway, so a
// device that the warm-up still fitted can refuse the recording's memory. Said as such (a plugin's
// call_eager passes LibTorch's message on, not its type).
std::string body_failure(const std::exception& e) {
  const std::string op = current_node_op();
  const bool oom = dynamic_cast<const c10::OutOfMemoryError*>(&e) != nullptr ||
                   std::string(e.what()).find("CUDA out of memory") != std::string::npos;
  if (oom)
    return c10::str("out of memory", op.empty() ? std::string() : " in " + op, " during capture (",
                    first_line(e.what()), ")");
  return c10::str(op.empty() ? std::string("an error") : "incompatible op " + op, " during capture (",
                  first_line(e.what()), ")");
}

// LibTorch's CUDA graph, for a step that draws random numbers. In LibTorch 2.11:
//   capture_begin(pool, mode): registers the current device's default CUDA generator with the
//     graph (CUDAGeneratorImpl::register_graph: its state allocates the one-element seed and offset
//     device tensors at the first registration), runs CUDAGeneratorState::capture_prologue on every
//     registered state (capturing_ = true, offset_intragraph_ = 0, tensors filled), then
//     beginAllocateToPool (device and pinned host allocators, filters keyed on the capture id) and
//     cudaStreamBeginCapture on the current stream. While capturing, philox_cuda_state hands
//     kernels pointers to the tensors plus the offset counted so far in the graph.
//   capture_end(): cudaStreamEndCapture, endAllocateToPool (both allocators), capture_epilogue
//     (capturing_ = false; its offset_intragraph_ is the whole-graph increment), instantiate.
//   replay(): replay_prologue(increment) per state (fills the tensors with the generator's seed and
//     current offset on the current stream, then advances the offset by the increment, as the eager
//     ops would have), then cudaGraphLaunch on the current stream.
//   ~CUDAGraph: unregister_graph per state, then reset(): releasePool if capture_end got that far.
// Those CUDAGeneratorState methods are not exported; CUDAGraph's are, and call them.
//
// If capture_begin or capture_end throws half-way, CUDAGraph leaves behind what only its protected
// members say: a generator still in capture mode (every later eager random op would then fail with
// "Offset increment outside graph capture encountered unexpectedly"), allocator filters that point
// at this object, and a pool reference nobody releases. abandon() undoes them.
struct RandomGraph : at::cuda::CUDAGraph {
  RandomGraph() : at::cuda::CUDAGraph(/*keep_graph=*/false) {}

  // After a registration that threw: the state may be in the graph's map without the graph in
  // the state's set, and ~CUDAGraph's unregister_graph would then throw from a destructor.
  void forget_generators() { captured_generator_states_.clear(); }

  // After capture_begin or capture_end threw. Noexcept: it runs on the way to CaptureFailed.
  void abandon(cudaStream_t stream) noexcept {
    if (capture_ended_) return;  // capture_end got past the epilogue: ~CUDAGraph releases the rest
    // A capture still open (capture_begin threw after cudaStreamBeginCapture).
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &status) == cudaSuccess && status != cudaStreamCaptureStatusNone) {
      cudaGraph_t g = nullptr;
      (void)cudaStreamEndCapture(stream, &g);
      if (g) (void)cudaGraphDestroy(g);
    }
    (void)cudaGetLastError();
    // What capture_epilogue would have done (it returns offset_intragraph_, reset by the next
    // prologue). The generator's own offset was not advanced by the capture: it stays where the
    // warm-up left it, as after an eager step.
    for (auto& entry : captured_generator_states_) entry.first->capturing_ = false;
    // capture_begin sets mempool_id_ just before beginAllocateToPool (a fresh handle: that cannot
    // fail) and capture_end ends the allocation right after cudaStreamEndCapture: end it here
    // unless capture_end did, then drop the pool reference beginAllocateToPool took (reset() only
    // does when capture_ended_).
    if (mempool_id_.first == 0 && mempool_id_.second == 0) return;  // failed before the allocators
    const auto quietly = [](const auto& f) {
      try {
        f();
      } catch (...) {
      }
    };
    quietly([&] { c10::cuda::CUDACachingAllocator::endAllocateToPool(capture_dev_, mempool_id_); });
    quietly([&] { at::getHostAllocator(at::kCUDA)->end_allocate_to_pool(mempool_id_); });
    quietly([&] { c10::cuda::CUDACachingAllocator::releasePool(capture_dev_, mempool_id_); });
    quietly([&] { at::getHostAllocator(at::kCUDA)->release_pool(mempool_id_); });
  }
};

}  // namespace

struct Step::Impl {
  std::shared_ptr<const LoadedPlugin> plugin;
  c10::Device device;
  bool random;
  std::shared_ptr<GraphPool> shared;  // the pool it records into, when shared with other Steps
  c10::cuda::CUDAStream stream;
  c10::MempoolId_t pool{0, 0};
  bool pool_used = false;                     // this Step holds the pool's reference (the plugin path)
  std::unique_ptr<PluginGraph> graph;         // the plugin path
  std::unique_ptr<RandomGraph> random_graph;  // a step that draws random numbers; owns its pool reference
  std::vector<KilnGraphCopy> copies;          // recorded by record_copy, re-pointed by replays

  Impl(std::shared_ptr<const LoadedPlugin> p, c10::Device d, bool r, std::shared_ptr<GraphPool> sp)
      : plugin(std::move(p)),
        device(d),
        random(r),
        shared(std::move(sp)),
        stream(shared ? c10::cuda::CUDAStream(c10::cuda::CUDAStream::UNCHECKED, shared->stream())
                      : c10::cuda::getStreamFromPool(/*isHighPriority=*/false, d.index())) {}

  DLDevice dl() const { return DLDevice{kDLCUDA, static_cast<int32_t>(device.index())}; }

  // record() of a step that draws random numbers, after the capture stream waited for the
  // current one: at::cuda::CUDAGraph on the capture stream, into `pool`.
  void record_random(const std::function<void(void*)>& body);

  // `to` waits for the work enqueued so far on `from`.
  static void order(const c10::cuda::CUDAStream& from, const c10::cuda::CUDAStream& to) {
    if (from == to) return;
    at::cuda::CUDAEvent ev;
    ev.record(from);
    ev.block(to);
  }
};

GraphPool::GraphPool(c10::Device device)
    : device_(device), stream_(c10::Stream::DEFAULT, device.is_cuda() ? device : c10::Device(c10::kCUDA, 0)) {
  if (!device.is_cuda()) throw std::invalid_argument("kiln: a CUDA graph pool on " + device.str());
  stream_ = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index()).unwrap();
  const c10::MempoolId_t id = at::cuda::graph_pool_handle();
  c10::cuda::CUDACachingAllocator::createOrIncrefPool(device.index(), id);
  id_ = {id.first, id.second};
}

GraphPool::~GraphPool() {
  try {
    c10::cuda::CUDACachingAllocator::releasePool(device_.index(), c10::MempoolId_t{id_.first, id_.second});
  } catch (const std::exception& e) {
    log_warn(std::string("kiln: releasing the CUDA graphs' shared memory pool failed: ") + e.what());
  }
}

Step::Step(std::shared_ptr<const LoadedPlugin> plugin, c10::Device device, bool draws_random_numbers,
           std::shared_ptr<GraphPool> shared_pool)
    : impl_(std::make_unique<Impl>(std::move(plugin), device, draws_random_numbers, std::move(shared_pool))) {
  if (impl_->shared && impl_->shared->device() != device)
    throw std::invalid_argument("kiln: a CUDA graph on " + device.str() + " given the pool of " +
                                impl_->shared->device().str());
}

Step::~Step() {
  impl_->graph.reset();
  impl_->random_graph.reset();  // unregisters the generator, releases its pool reference
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

bool Step::recorded() const { return impl_->graph != nullptr || impl_->random_graph != nullptr; }
bool Step::draws_random_numbers() const { return impl_->random; }

void Step::warm_up(const std::function<void(void*)>& body, const std::vector<at::Tensor>& live) {
  c10::cuda::CUDAGuard guard(impl_->device);
  const auto current = c10::cuda::getCurrentCUDAStream(impl_->device.index());
  Impl::order(current, impl_->stream);
  {
    c10::cuda::CUDAStreamGuard on_capture_stream(impl_->stream);
    try {
      body(impl_->stream.stream());
    } catch (...) {
      // What the caller does next (put back what the step wrote, run it eagerly) runs on the
      // current stream: after everything the failed warm-up enqueued.
      Impl::order(impl_->stream, current);
      throw;
    }
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
  impl_->copies.clear();
  impl_->pool = impl_->shared ? c10::MempoolId_t{impl_->shared->id().first, impl_->shared->id().second}
                              : at::cuda::graph_pool_handle();
  const cudaStream_t capture = impl_->stream.stream();
  if (impl_->random) {
    impl_->record_random(body);
    Impl::order(impl_->stream, current);
    return;
  }
  c10::cuda::CUDACachingAllocator::beginAllocateToPool(dev, impl_->pool,
                                                       [capture](cudaStream_t s) { return s == capture; });
  impl_->pool_used = true;
  std::string failure;
  bool body_ran = false;
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
      body_ran = true;
    } catch (const std::exception& e) {
      failure = body_failure(e);
    }
  }
  try {
    impl_->graph = impl_->plugin->graph_capture_end(impl_->dl(), capture,
                                                    failure.empty() ? impl_->copies : std::vector<KilnGraphCopy>{});
  } catch (const std::exception& e) {
    if (failure.empty()) failure = std::string("the capture was invalidated: ") + e.what();
    else failure += std::string("; ") + e.what();
  }
  c10::cuda::CUDACachingAllocator::endAllocateToPool(dev, impl_->pool);
  if (!failure.empty()) {
    impl_->graph.reset();
    // So that this Step may record again (the runner retries without copies): the pool goes once
    // the caller has dropped the tensors the body allocated in it.
    const bool copies_refused = body_ran && !impl_->copies.empty();
    impl_->copies.clear();
    c10::cuda::CUDACachingAllocator::releasePool(dev, impl_->pool);
    impl_->pool_used = false;
    if (copies_refused) throw CopiesRefused(failure);
    throw CaptureFailed(failure);
  }
  Impl::order(impl_->stream, current);
}

void Step::Impl::record_random(const std::function<void(void*)>& body) {
  const cudaStream_t capture = stream.stream();
  auto graph = std::make_unique<RandomGraph>();
  // Registered here, with the step's current stream current, although capture_begin registers the
  // current device's default generator too (a second registration changes nothing): the first
  // registration allocates the generator's seed and offset tensors, and on this stream they are
  // ordered with the replays that fill and read them, and with their free after the last graph.
  try {
    graph->register_generator_state(at::cuda::detail::getDefaultCUDAGenerator(device.index()));
  } catch (const std::exception& e) {
    graph->forget_generators();
    throw CaptureFailed("the CUDA generator could not be registered with the graph: " + first_line(e.what()));
  }
  std::string failure;
  {
    c10::cuda::CUDAStreamGuard on_capture_stream(stream);
    try {
      // Thread-local mode, as the kiln plugin's graph_capture_begin: only this thread's unsafe
      // calls invalidate the capture.
      graph->capture_begin(pool, cudaStreamCaptureModeThreadLocal);
    } catch (const std::exception& e) {
      graph->abandon(capture);
      throw CaptureFailed("the capture could not start: " + first_line(e.what()));
    }
    try {
      body(capture);
    } catch (const std::exception& e) {
      failure = body_failure(e);
    }
    try {
      graph->capture_end();
    } catch (const std::exception& e) {
      graph->abandon(capture);
      if (failure.empty()) failure = "the capture was invalidated: " + first_line(e.what());
      else failure += "; " + first_line(e.what());
    }
  }
  if (!failure.empty()) throw CaptureFailed(failure);  // ~RandomGraph: unregisters, releases what is left
  random_graph = std::move(graph);
}

void Step::replay(const std::vector<KilnGraphCopy>& copies) {
  c10::cuda::CUDAGuard guard(impl_->device);
  if (impl_->random_graph) {
    impl_->random_graph->replay();  // replay_prologue, then cudaGraphLaunch on the current stream
    return;
  }
  impl_->graph->launch(c10::cuda::getCurrentCUDAStream(impl_->device.index()).stream(), copies);
}

bool Step::takes_copies() const { return !impl_->random && impl_->plugin && impl_->plugin->repoints_graph_copies(); }

size_t Step::record_copy(void* dst, const void* src, size_t bytes, bool host_src, void* stream) {
  if (!takes_copies() || bytes == 0) throw std::logic_error("kiln: record_copy on a graph that takes no copies");
  const cudaError_t e = cudaMemcpyAsync(dst, src, bytes, host_src ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToDevice,
                                        static_cast<cudaStream_t>(stream));
  if (e != cudaSuccess)
    throw std::runtime_error(std::string("cudaMemcpyAsync of a graph's copy failed: ") + cudaGetErrorString(e));
  impl_->copies.push_back(KilnGraphCopy{dst, src, bytes});
  return impl_->copies.size() - 1;
}

size_t Step::num_copies() const { return impl_->graph ? impl_->copies.size() : 0; }

bool cuda_available() {
  try {
    return c10::cuda::device_count() > 0;
  } catch (...) {
    return false;
  }
}

void* current_stream(const c10::Device& device) {
  if (!device.is_cuda()) return nullptr;
  return c10::cuda::getCurrentCUDAStream(device.index()).stream();
}

void release_pinned_after_current_work(const at::Tensor& host, const c10::Device& device) {
  if (!host.defined() || !host.is_pinned()) return;
  const auto& data = host.storage().data_ptr();
  at::getHostAllocator(at::kCUDA)->record_event(data.get(), data.get_context(),
                                                c10::cuda::getCurrentCUDAStream(device.index()).unwrap());
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
  if (cudagraph::cuda_available())
    c10::cuda::CUDACachingAllocator::resetPeakStats(static_cast<c10::DeviceIndex>(device));
}

}  // namespace kiln

#else  // no CUDA toolkit: nothing records graphs

namespace kiln::cudagraph {
GraphPool::GraphPool(c10::Device device) : device_(device), stream_(c10::Stream::DEFAULT, device) {
  throw std::runtime_error("kiln was built without the CUDA toolkit or without a CUDA build of LibTorch");
}
GraphPool::~GraphPool() = default;
struct Step::Impl {};
Step::Step(std::shared_ptr<const LoadedPlugin>, c10::Device, bool, std::shared_ptr<GraphPool>) {
  throw std::runtime_error("kiln was built without the CUDA toolkit or without a CUDA build of LibTorch");
}
Step::~Step() = default;
void Step::warm_up(const std::function<void(void*)>&, const std::vector<at::Tensor>&) {}
void Step::record(const std::function<void(void*)>&) { throw CaptureFailed("kiln was built without CUDA"); }
bool Step::recorded() const { return false; }
bool Step::draws_random_numbers() const { return false; }
void Step::replay(const std::vector<KilnGraphCopy>&) {}
bool Step::takes_copies() const { return false; }
size_t Step::record_copy(void*, const void*, size_t, bool, void*) { throw std::logic_error("kiln: no CUDA"); }
size_t Step::num_copies() const { return 0; }
bool cuda_available() { return false; }
void* current_stream(const c10::Device&) { return nullptr; }
void release_pinned_after_current_work(const at::Tensor&, const c10::Device&) {}
}  // namespace kiln::cudagraph

namespace kiln {
int64_t cuda_allocated_bytes(int) { return 0; }
int64_t cuda_peak_allocated_bytes(int) { return 0; }
void cuda_reset_peak_allocated(int) {}
}  // namespace kiln

#endif
