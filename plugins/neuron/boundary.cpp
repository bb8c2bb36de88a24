#include "boundary.h"

#include <algorithm>

namespace kiln::neuron {

std::optional<std::vector<int64_t>> storage_order(const std::vector<int64_t>& shape,
                                                  const std::vector<int64_t>& strides) {
  const size_t n = shape.size();
  std::vector<int64_t> order(n);
  for (size_t d = 0; d < n; ++d) order[d] = static_cast<int64_t>(d);
  if (strides.size() != n) return std::nullopt;
  int64_t numel = 1;
  for (int64_t s : shape) numel *= s;
  if (numel == 0) return order;  // nothing is read or written
  // The dims of more than one element, outermost (largest stride) first; among equal strides (which
  // overlap, and fail below) in their own order.
  std::vector<int64_t> big;
  for (size_t d = 0; d < n; ++d)
    if (shape[d] != 1) big.push_back(static_cast<int64_t>(d));
  std::stable_sort(big.begin(), big.end(), [&](int64_t a, int64_t b) {
    return strides[static_cast<size_t>(a)] > strides[static_cast<size_t>(b)];
  });
  int64_t expect = 1;
  for (size_t k = big.size(); k-- > 0;) {
    const auto d = static_cast<size_t>(big[k]);
    if (strides[d] != expect) return std::nullopt;
    expect *= shape[d];
  }
  // They take the places of the dims of more than one element, in storage order; size-1 dims stay.
  size_t k = 0;
  for (size_t d = 0; d < n; ++d)
    if (shape[d] != 1) order[d] = big[k++];
  return order;
}

bool dense_in_order(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides,
                    const std::vector<int64_t>& order) {
  const size_t n = shape.size();
  if (strides.size() != n || (!order.empty() && order.size() != n)) return false;
  int64_t numel = 1;
  for (int64_t s : shape) numel *= s;
  if (numel == 0) return true;
  int64_t expect = 1;
  for (size_t k = n; k-- > 0;) {
    const auto d = static_cast<size_t>(order.empty() ? static_cast<int64_t>(k) : order[k]);
    if (shape[d] != 1 && strides[d] != expect) return false;
    expect *= shape[d];
  }
  return true;
}

bool is_row_major(const std::vector<int64_t>& order) {
  for (size_t d = 0; d < order.size(); ++d)
    if (order[d] != static_cast<int64_t>(d)) return false;
  return true;
}

std::string ints_text(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

namespace {

PJRT_Buffer_Type pjrt_type(DLDataType t) {
  if (kiln::plugin::is_float32(t)) return PJRT_Buffer_Type_F32;
  if (t.code == kDLInt && t.bits == 64 && t.lanes == 1) return PJRT_Buffer_Type_S64;
  throw kiln::plugin::Unimplemented("a " + kiln::plugin::dtype_name(t) + " tensor at the group's boundary");
}

}  // namespace

HostTensor boundary_tensor(const DLTensor& t, const std::vector<int64_t>& order) {
  HostTensor h;
  h.type = pjrt_type(t.dtype);
  const std::vector<int64_t> shape(t.shape, t.shape + t.ndim);
  std::vector<int64_t> strides(static_cast<size_t>(t.ndim));
  int64_t n = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    strides[static_cast<size_t>(d)] = t.strides ? t.strides[d] : n;
    n *= t.shape[d];
  }
  const size_t rank = shape.size();
  if (!order.empty() && order.size() != rank)
    throw kiln::plugin::Error(KILN_ERROR_INTERNAL, "neuron: a rank-" + std::to_string(rank) +
                                                       " tensor at the group's boundary, compiled for rank " +
                                                       std::to_string(order.size()));
  for (size_t k = 0; k < rank; ++k)
    h.dims.push_back(shape[static_cast<size_t>(order.empty() ? static_cast<int64_t>(k) : order[k])]);
  h.data = static_cast<char*>(t.data) + t.byte_offset;
  const int64_t es = t.dtype.bits / 8;
  h.bytes = static_cast<size_t>(n * es);
  h.on_device = t.device.device_type == kDLCUDA;
  if (!dense_in_order(shape, strides, order))
    for (size_t k = 0; k < rank; ++k)
      h.byte_strides.push_back(strides[static_cast<size_t>(order.empty() ? static_cast<int64_t>(k) : order[k])] * es);
  return h;
}

}  // namespace kiln::neuron
