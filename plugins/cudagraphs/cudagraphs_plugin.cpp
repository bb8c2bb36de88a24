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

class CudaGraph : public GraphExec {
 public:
  explicit CudaGraph(cudaGraphExec_t exec) : exec_(exec) {}
  ~CudaGraph() override {
    // Relaxed, so that destroying a graph while another thread captures is not an error.
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&mode);
    cudaGraphExecDestroy(exec_);
    cudaThreadExchangeStreamCaptureMode(&mode);
  }
  void launch(void* stream) override {
    check(cudaGraphLaunch(exec_, static_cast<cudaStream_t>(stream)), "cudaGraphLaunch");
  }

 private:
  cudaGraphExec_t exec_;
};
#endif

class CudaGraphsPlugin : public Plugin {
 public:
  using Plugin::Plugin;

  static Descriptor describe() {
    Descriptor d;
    d.name = "cudagraphs";
    d.version = "0.2.0";
    d.vendor = "kiln";
    d.description = "CUDA graph capture and replay of the whole step, no fusion";
    d.device_kinds = KILN_DEVICE_MASK_CUDA;
    d.modes = KILN_MODE_BIT(KILN_MODE_DEFAULT) | KILN_MODE_BIT(KILN_MODE_REDUCE_OVERHEAD);
    d.concurrent_execution_safe = false;
    // Choosing this backend means "record the whole step as a CUDA graph", in every mode.
    d.whole_step_graph = true;
#if defined(KILN_CUDAGRAPHS_WITH_CUDA)
    d.device_graphs = true;
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
    cudaGraphExec_t exec = nullptr;
    // AutoFreeOnLaunch: correct also when LibTorch runs on cudaMallocAsync and a graph allocation
    // outlives a replay.
    const cudaError_t inst = cudaGraphInstantiateWithFlags(&exec, graph, cudaGraphInstantiateFlagAutoFreeOnLaunch);
    cudaGraphDestroy(graph);
    check(inst, "cudaGraphInstantiateWithFlags");
    host().log(KILN_LOG_DEBUG, "recorded a CUDA graph of " + std::to_string(nodes) + " nodes");
    return std::make_unique<CudaGraph>(exec);
  }
#endif
};

}  // namespace

KILN_DEFINE_PLUGIN(CudaGraphsPlugin)
