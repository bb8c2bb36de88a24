// Whole-step CUDA graphs (docs/backends/cudagraphs.md): the compiled step's executor run, recorded
// on a capture stream into one CUDA graph through a plugin's graph functions (KILN_CAPABILITY_DEVICE_GRAPHS), with its
// memory in a private pool of LibTorch's caching allocator, then replayed. A step that draws
// random numbers is recorded with LibTorch's own at::cuda::CUDAGraph instead (see Step's
// constructor). Internal to the core; the step runner (step_runner.cpp) drives it. Built only with the CUDA toolkit
// (KILN_HAVE_CUDA); this header includes no CUDA headers.
#pragma once

#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/Stream.h>

#include "kiln/plugin_api.h"

namespace kiln {

class LoadedPlugin;

namespace cudagraph {

// A capture that failed; what() is the reason, as specific as PyTorch's "skipping cudagraphs due
// to ...".
class CaptureFailed : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The step was recorded, but the plugin could not end the capture with the copies record_copy
// made (it found them not, or not once, among the graph's copy nodes): recording again without
// copies may succeed.
class CopiesRefused : public CaptureFailed {
 public:
  using CaptureFailed::CaptureFailed;
};

// One memory pool that several whole-step graphs record into: the graphs of one dynamic step, a
// graph per shape, as PyTorch's CUDA graph trees share one pool. Memory a recording freed (its
// temporaries) is handed to the next recording, so the graphs of forty lengths take about the
// memory of the largest rather than the sum of all. Safe because kiln replays one graph at a time,
// in stream order, and a replay's results are consumed before the next replay begins: its
// returned tensors are copies, and its gradients are replaced by the next step's own (a tensor
// that a graph reads in place and that moved is recorded again, step_runner.cpp). Holds a reference
// to the pool for its life, so that memory an evicted graph gave back waits for the next shape.
class GraphPool {
 public:
  explicit GraphPool(c10::Device device);  // throws where CUDA is unusable
  ~GraphPool();
  GraphPool(const GraphPool&) = delete;
  GraphPool& operator=(const GraphPool&) = delete;
  c10::Device device() const { return device_; }
  // The allocator's pool id (c10::MempoolId_t's two halves).
  std::pair<unsigned long long, unsigned long long> id() const { return id_; }
  // The stream every graph of the pool warms up and records on: the allocator hands a free block
  // only to an allocation on the stream it was made on, so graphs recorded on streams of their own
  // would never reuse each other's memory.
  c10::Stream stream() const { return stream_; }

 private:
  c10::Device device_;
  std::pair<unsigned long long, unsigned long long> id_{0, 0};
  c10::Stream stream_;
};

class Step {
 public:
  // A dedicated capture stream and a private memory pool on `device`; graphs through `plugin`.
  //
  // draws_random_numbers: the body draws from LibTorch's CUDA generator (native_dropout,
  // bernoulli, rand...). A raw capture would bake the generator's seed and offset into the graph,
  // so every replay would draw the same numbers. Such a step is recorded and replayed with
  // at::cuda::CUDAGraph, as PyTorch does: the default CUDA generator of `device` is registered with
  // the graph, the capture reads its seed and offset from device tensors, and each replay first
  // fills them with the generator's current seed and offset, then advances the offset by what the
  // whole step consumed. A replay then draws exactly the numbers the eager step would draw from
  // the same generator state (a seed set between steps included), and leaves the generator where
  // the eager step would. The plugin's graph functions are not used for such a step. Without the
  // flag a random op in the body fails the capture (CaptureFailed: LibTorch refuses to advance a
  // generator that is not registered with a capture). A random op drawing from another
  // generator (another device's, or an explicit one) fails the capture too.
  //
  // shared_pool: record into this pool, shared with other Steps (null: a private pool of its own).
  Step(std::shared_ptr<const LoadedPlugin> plugin, c10::Device device, bool draws_random_numbers = false,
       std::shared_ptr<GraphPool> shared_pool = nullptr);
  ~Step();  // destroys the graph, frees the static tensors, releases the pool
  Step(const Step&) = delete;
  Step& operator=(const Step&) = delete;

  // Runs body(stream) uncaptured on the capture stream, ordered after the current stream's work
  // and before its later work (the warm-up: cuBLAS/cuDNN handles and workspaces of the capture
  // stream, allocator blocks). The tensors in `live` (read after body ran) are handed to the current stream.
  void warm_up(const std::function<void(void* stream)>& body, const std::vector<at::Tensor>& live);
  // Records body(stream) on the capture stream, allocations going to the private pool. Throws
  // CaptureFailed with the reason (the op that broke it and the CUDA error) after ending the
  // capture; the caller then drops every tensor the body allocated, and destroys this Step or (a
  // step that draws no random numbers) records again. The
  // recorded work does not run, so it draws no random numbers: the generator stays where the
  // warm-up left it, and the first replay draws what the next eager step would.
  void record(const std::function<void(void* stream)>& body);
  bool recorded() const;
  // Whether this Step records with at::cuda::CUDAGraph and the CUDA generator (the constructor's flag).
  bool draws_random_numbers() const;
  // One replay on the current stream (for a step that draws random numbers: the generator's seed
  // and offset are filled in, and the offset advanced, first, on that stream). copies: empty, or
  // this replay's addresses for every copy record_copy recorded, in its order (the plugin re-points
  // those that changed; KilnGraphLaunchArgs).
  void replay(const std::vector<KilnGraphCopy>& copies = {});

  // Whether the graph can hold copies whose addresses each replay changes: the plugin re-points
  // them (ABI 2.3, KILN_CAPABILITY_GRAPH_COPIES), and the step draws no random numbers.
  bool takes_copies() const;
  // Inside record's body: enqueues a 1-D copy of `bytes` > 0 on `stream` (device to device, or from
  // pinned host memory when host_src) that replays re-point; returns its index.
  size_t record_copy(void* dst, const void* src, size_t bytes, bool host_src, void* stream);
  size_t num_copies() const;

  // Tensors the graph reads or writes that this Step keeps alive and in place: static inputs
  // (copied into before each replay) and the recorded outputs (in the private pool).
  std::vector<at::Tensor> static_inputs;
  std::vector<at::Tensor> static_outputs;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Whether CUDA is usable in this process (a device and a driver).
bool cuda_available();

// `host`, pinned memory from LibTorch's caching host allocator that work already enqueued on the
// current stream of `device` reads (a graph's copy), is not handed out again before that work ran.
void release_pinned_after_current_work(const at::Tensor& host, const c10::Device& device);

// LibTorch's current stream on `device` as a cudaStream_t, what a plugin's execute is given so
// that its kernels and the ATen ops around them (its own call_eager ones too) are ordered on one
// stream; NULL for other devices, and where kiln is built without CUDA.
void* current_stream(const c10::Device& device);

}  // namespace cudagraph
}  // namespace kiln
