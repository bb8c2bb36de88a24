// Whole-step CUDA graphs (docs/backends/cudagraphs.md): the compiled step's executor run, recorded
// on a capture stream into one CUDA graph through a plugin's ABI 1.2 graph functions, with its
// memory in a private pool of LibTorch's caching allocator, then replayed. Internal to the core;
// compiled_step.cpp drives it. Built only with the CUDA toolkit (KILN_HAVE_CUDA); this header
// includes no CUDA headers.
#pragma once

#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

namespace kiln {

class LoadedPlugin;

namespace cudagraph {

// A capture that failed; what() is the reason, as specific as PyTorch's "skipping cudagraphs due
// to ...".
class CaptureFailed : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Step {
 public:
  // A dedicated capture stream and a private memory pool on `device`; graphs through `plugin`.
  Step(std::shared_ptr<const LoadedPlugin> plugin, c10::Device device);
  ~Step();  // destroys the graph, frees the static tensors, releases the pool
  Step(const Step&) = delete;
  Step& operator=(const Step&) = delete;

  // Runs body(stream) uncaptured on the capture stream, ordered after the current stream's work
  // and before its later work (the warm-up: cuBLAS/cuDNN handles and workspaces of the capture
  // stream, allocator blocks). The tensors in `live` (read after body ran) are handed to the current stream.
  void warm_up(const std::function<void(void* stream)>& body, const std::vector<at::Tensor>& live);
  // Records body(stream) on the capture stream, allocations going to the private pool. Throws
  // CaptureFailed with the reason (the op that broke it and the CUDA error) after ending the
  // capture; the caller then drops every tensor the body allocated and destroys this Step.
  void record(const std::function<void(void* stream)>& body);
  bool recorded() const;
  // One replay on the current stream.
  void replay();

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

}  // namespace cudagraph
}  // namespace kiln
