// The cudagraphs backend: no fusion. It claims no nodes (the host runs every node eagerly) and
// provides the ABI's device-graph functions, with which kiln records the whole compiled step
// (forward, backward, optimizer) on a CUDA stream into one CUDA graph and replays it
// (core/src/runtime/cuda_graph_step.cpp; docs/backends/cudagraphs.md). The same functions wrap the
// chosen backend's step in `reduce-overhead` and `max-autotune`.
//
// The plugin owns only the graphs; the memory the recorded kernels touch is the host's (a private
// pool of LibTorch's caching allocator). Links the CUDA runtime, never LibTorch.
#include <kiln/plugin_api.hpp>

#include <string>
#include <vector>

#if defined(KILN_CUDAGRAPHS_WITH_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace {

using namespace kiln::plugin;

#if defined(KILN_CUDAGRAPHS_WITH_CUDA)
// "cudaErrorStreamCaptureUnsupported: operation not permitted when stream is capturing"
std::string cuda_error(cudaError_t e) { return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e); }

void check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  throw Error(e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver ? KILN_ERROR_UNAVAILABLE : KILN_ERROR_INTERNAL,
              std::string(what) + " failed: " + cuda_error(e));
}

// One of the host's copies in the recorded graph: its node, its kind, and where the last launch
// copied between.
struct CopyNode {
  cudaGraphNode_t node = nullptr;
  cudaMemcpyKind kind = cudaMemcpyDeviceToDevice;
  KilnGraphCopy now{};
};

class CudaGraph : public GraphExec {
 public:
  // graph: kept (with the copy nodes, which name nodes of it) when there are copies to re-point.
  CudaGraph(cudaGraphExec_t exec, cudaGraph_t graph, std::vector<CopyNode> copies)
      : exec_(exec), graph_(graph), copies_(std::move(copies)) {}
  ~CudaGraph() override {
    // Relaxed, so that destroying a graph while another thread captures is not an error.
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&mode);
    cudaGraphExecDestroy(exec_);
    if (graph_) cudaGraphDestroy(graph_);
    cudaThreadExchangeStreamCaptureMode(&mode);
  }
  void launch(void* stream) override {
    check(cudaGraphLaunch(exec_, static_cast<cudaStream_t>(stream)), "cudaGraphLaunch");
  }
  // The SDK layer has checked that n is the number recorded (copies_.size()).
  void launch_with_copies(void* stream, const KilnGraphCopy* copies, size_t n) override {
    for (size_t k = 0; k < n; ++k) {
      auto& c = copies_[k];
      const KilnGraphCopy& want = copies[k];
      if (want.bytes != c.now.bytes || !want.dst || !want.src)
        throw Error(KILN_ERROR_INVALID_ARGUMENT, "graph_launch: copy " + std::to_string(k) + " of " +
                                                     std::to_string(want.bytes) +
                                                     " bytes (null address?); it was "
                                                     "recorded with " +
                                                     std::to_string(c.now.bytes));
      if (want.dst == c.now.dst && want.src == c.now.src) continue;
      // Only later launches see it; those already enqueued keep their addresses.
      const cudaError_t e = cudaGraphExecMemcpyNodeSetParams1D(exec_, c.node, want.dst, want.src, want.bytes, c.kind);
      if (e != cudaSuccess) {
        (void)cudaGetLastError();
        c.now = KilnGraphCopy{nullptr, nullptr, c.now.bytes};  // unknown: set again next time
        throw Error(KILN_ERROR_INVALID_ARGUMENT, "graph_launch: re-pointing copy " + std::to_string(k) +
                                                     " failed (cudaGraphExecMemcpyNodeSetParams1D: " + cuda_error(e) +
                                                     "); nothing was launched");
      }
      c.now = want;
    }
    launch(stream);
  }

 private:
  cudaGraphExec_t exec_;
  cudaGraph_t graph_;
  std::vector<CopyNode> copies_;
};

// The graph's 1-D copy nodes: where each copies from and to, and how many bytes.
struct FoundCopy {
  cudaGraphNode_t node;
  const char* dst;
  const char* src;
  size_t bytes;
  cudaMemcpyKind kind;
};

std::vector<FoundCopy> copy_nodes(cudaGraph_t graph) {
  size_t n = 0;
  check(cudaGraphGetNodes(graph, nullptr, &n), "cudaGraphGetNodes");
  std::vector<cudaGraphNode_t> nodes(n);
  check(cudaGraphGetNodes(graph, nodes.data(), &n), "cudaGraphGetNodes");
  std::vector<FoundCopy> found;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type{};
    if (cudaGraphNodeGetType(node, &type) != cudaSuccess || type != cudaGraphNodeTypeMemcpy) continue;
    cudaMemcpy3DParms p{};
    if (cudaGraphMemcpyNodeGetParams(node, &p) != cudaSuccess || p.srcArray || p.dstArray) continue;
    if (p.extent.height > 1 || p.extent.depth > 1) continue;  // not a 1-D copy
    const char* src = static_cast<const char*>(p.srcPtr.ptr) + p.srcPos.x;
    const char* dst = static_cast<const char*>(p.dstPtr.ptr) + p.dstPos.x;
    found.push_back({node, dst, src, p.extent.width, p.kind});
  }
  return found;
}
#endif

class CudaGraphsPlugin : public Plugin {
 public:
  using Plugin::Plugin;

  static Descriptor describe() {
    Descriptor d;
    d.name = "cudagraphs";
    d.version = "0.3.0";
    d.vendor = "kiln";
    d.description = "CUDA graph capture and replay of the whole step, no fusion";
    d.device_kinds = KILN_DEVICE_MASK_CUDA;
    d.modes = KILN_MODE_BIT(KILN_MODE_DEFAULT) | KILN_MODE_BIT(KILN_MODE_REDUCE_OVERHEAD);
    d.concurrent_execution_safe = false;
    // Choosing this backend means "record the whole step as a CUDA graph", in every mode.
    d.whole_step_graph = true;
#if defined(KILN_CUDAGRAPHS_WITH_CUDA)
    d.device_graphs = true;
    d.graph_copies = true;
#endif
    return d;
  }

  Availability available(const Devices& devices) override {
#if !defined(KILN_CUDAGRAPHS_WITH_CUDA)
    (void)devices;
    return Availability::no("built without the CUDA toolkit");
#else
    const KilnDeviceInfo* gpu = devices.first(KILN_DEVICE_CUDA);
    if (!gpu) return Availability::no("needs a CUDA device; none found");
    // Below a compiler (inductor, 200): without fusion, replaying the step is what is left to gain.
    return Availability::yes(std::to_string(devices.count(KILN_DEVICE_CUDA)) + " CUDA device(s), first " + gpu->name,
                             100);
#endif
  }

  // No fusion: every node runs on the host's eager executor, inside the recorded graph.
  std::vector<int64_t> claim(const Graph&) override { return {}; }

  std::unique_ptr<Executable> compile(const Graph&, const CompileOptions&) override {
    throw Unimplemented("cudagraphs compiles no subgraphs; kiln runs the nodes eagerly inside the CUDA graph");
  }

#if defined(KILN_CUDAGRAPHS_WITH_CUDA)
  void graph_capture_begin(DLDevice device, void* stream) override {
    if (device.device_type != kDLCUDA)
      throw Error(KILN_ERROR_INVALID_ARGUMENT, "graph_capture_begin: not a CUDA device");
    if (!stream)
      throw Error(KILN_ERROR_INVALID_ARGUMENT, "graph_capture_begin: the legacy default stream cannot be captured");
    check(cudaSetDevice(device.device_id), "cudaSetDevice");
    // Thread-local: only this thread's unsafe calls (a host sync) invalidate the capture; other
    // threads (a data loader) may go on using CUDA.
    check(cudaStreamBeginCapture(static_cast<cudaStream_t>(stream), cudaStreamCaptureModeThreadLocal),
          "cudaStreamBeginCapture");
  }

  std::unique_ptr<GraphExec> graph_capture_end(DLDevice device, void* stream) override {
    return end(device, stream, {});
  }

  std::unique_ptr<GraphExec> graph_capture_end_with_copies(DLDevice device, void* stream,
                                                           const std::vector<KilnGraphCopy>& copies) override {
    return end(device, stream, copies);
  }

 private:
  std::unique_ptr<GraphExec> end(DLDevice device, void* stream, const std::vector<KilnGraphCopy>& wanted) {
    (void)device;
    cudaGraph_t graph = nullptr;
    const cudaError_t end = cudaStreamEndCapture(static_cast<cudaStream_t>(stream), &graph);
    // A failed capture leaves its error as the thread's last error; clear it so that the next
    // kernel launch check in the host does not report it again.
    (void)cudaGetLastError();
    if (end != cudaSuccess || !graph) {
      if (graph) cudaGraphDestroy(graph);
      throw Error(KILN_ERROR_INTERNAL, "cudaStreamEndCapture failed: " +
                                           cuda_error(end != cudaSuccess ? end : cudaErrorStreamCaptureInvalidated));
    }
    size_t nodes = 0;
    cudaGraphGetNodes(graph, nullptr, &nodes);
    // The host's copies, each found exactly once among the graph's copy nodes.
    std::vector<CopyNode> copies;
    try {
      const std::vector<FoundCopy> found = wanted.empty() ? std::vector<FoundCopy>{} : copy_nodes(graph);
      for (size_t k = 0; k < wanted.size(); ++k) {
        const KilnGraphCopy& w = wanted[k];
        const FoundCopy* hit = nullptr;
        int hits = 0;
        for (const auto& f : found)
          if (f.dst == w.dst && f.src == w.src && f.bytes == w.bytes) hit = &f, ++hits;
        if (hits != 1)
          throw Error(KILN_ERROR_INTERNAL,
                      "graph_capture_end: copy " + std::to_string(k) + " (" + std::to_string(w.bytes) + " bytes) is " +
                          (hits ? "in the graph " + std::to_string(hits) + " times"
                                : std::string("not among its ") + std::to_string(found.size()) + " copy nodes"));
        copies.push_back(CopyNode{hit->node, hit->kind, w});
      }
    } catch (...) {
      cudaGraphDestroy(graph);
      throw;
    }
    cudaGraphExec_t exec = nullptr;
    // AutoFreeOnLaunch: correct also when LibTorch runs on cudaMallocAsync and a graph allocation
    // outlives a replay.
    const cudaError_t inst = cudaGraphInstantiateWithFlags(&exec, graph, cudaGraphInstantiateFlagAutoFreeOnLaunch);
    if (inst != cudaSuccess || copies.empty()) {
      cudaGraphDestroy(graph);
      graph = nullptr;
    }
    check(inst, "cudaGraphInstantiateWithFlags");
    host().log(KILN_LOG_DEBUG, "recorded a CUDA graph of " + std::to_string(nodes) + " nodes, " +
                                   std::to_string(copies.size()) + " of them copies each launch re-points");
    return std::make_unique<CudaGraph>(exec, graph, std::move(copies));
  }
#endif
};

}  // namespace

KILN_DEFINE_PLUGIN(CudaGraphsPlugin)
