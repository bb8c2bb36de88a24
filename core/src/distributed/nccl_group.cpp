// The NCCL process group, for models on CUDA GPUs: built where the CUDA toolkit and NCCL's header
// (the torch wheel's nvidia-nccl package) are found at configure time (KILN_HAVE_NCCL), else empty.
// group.cpp says, before it gets here, when this process sees no GPU or kiln has no NCCL.
#if KILN_HAVE_NCCL
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include "ddp.h"

namespace kiln::distributed {

c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                    int local_rank, std::chrono::milliseconds timeout) {
  // Each rank drives the GPU of its local rank, as torchrun's one process per GPU expects.
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(local_rank));
  auto opts = c10d::ProcessGroupNCCL::Options::create();
  opts->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, opts);
}

}  // namespace kiln::distributed
#endif
