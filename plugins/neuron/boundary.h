// How a group's inputs and outputs lie in memory, and how they are handed to PJRT. PJRT's buffers
// (and XLA's views of memory it does not own) are dense and row-major; LibTorch's tensors are often
// dense in another order of their dims (a transposed weight, `t(w)` with strides {1, K}; a
// channels-last activation). Such a tensor is the dense row-major tensor of its dims in storage
// order, outermost first: @main takes (or returns) that one and transposes it to (or from) the
// shape the graph uses, so PJRT reads and writes the tensor's memory as it is, with no copy.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <kiln/plugin_api.hpp>

#include "pjrt_runtime.h"

namespace kiln::neuron {

// The order of a tensor's dims in its memory, outermost first, when its strides are a permutation
// of a dense layout (every element of its storage range used exactly once: sorted by stride, the
// strides are the running products of the sizes); nullopt when they are not (overlapping, with
// gaps, expanded with stride 0). Size-1 dims, whose strides say nothing, keep their own places,
// so a row-major tensor's order is 0, 1, ..., n-1 whatever its size-1 dims' strides; so is that
// of a tensor without elements.
std::optional<std::vector<int64_t>> storage_order(const std::vector<int64_t>& shape,
                                                  const std::vector<int64_t>& strides);

// Whether `strides` are the dense strides of the dims taken in `order` (empty: row-major).
bool dense_in_order(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides,
                    const std::vector<int64_t>& order);

// Whether `order` (from storage_order) is 0, 1, ..., n-1, or empty.
bool is_row_major(const std::vector<int64_t>& order);

// "[a, b, c]", for messages.
std::string ints_text(const std::vector<int64_t>& v);

// A tensor at the group's boundary as PJRT takes it, for a parameter or result of @main declared in
// storage `order` (empty: row-major): the dims in that order over the tensor's own memory when its
// strides are dense in that order; else the same dims with the tensor's byte strides taken in that
// order (a host tensor is copied from them into a device buffer, a result copied densely and
// scattered; a CUDA tensor cannot be viewed so and is an error where it is used). Throws
// kiln::plugin::Unimplemented for a dtype PJRT is not given.
HostTensor boundary_tensor(const DLTensor& t, const std::vector<int64_t>& order);

}  // namespace kiln::neuron
