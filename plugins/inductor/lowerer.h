// What an op's lowering works with (op_registry.h): the LoweredGraph being built and the helpers
// that turn a node into loop-IR definitions (loaders that broadcast, pointwise bodies, views as
// index remaps, reductions, hidden intermediates), plus the argument decoding several ops share.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <kiln/plugin_api.hpp>

#include "loop_ir.h"

namespace kiln::inductor {

// A value's definition at an index: what pointwise bodies and loaders are.
using Loader = std::function<int(ExprPool&, const Idx&)>;

// The run-time scalar index of an argument, -1 for a constant.
int32_t rt_scalar(const plugin::Arg& a);

int64_t norm_dim(int64_t d, int64_t nd);

bool is_number(const plugin::Arg& a);

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape);

// Reduction dims of an optional int list argument: None or [] means all dims.
std::vector<int64_t> reduce_dims(const plugin::Arg& a, int64_t nd);

// max_pool2d's window, from kernel_size, stride, padding, dilation and ceil_mode (lists of one or
// two; an empty stride is the kernel size). Without a window, `why` says which argument the
// generated kernel does not take.
struct PoolWindow {
  int64_t kh = 0, kw = 0, sh = 0, sw = 0;
};
std::optional<PoolWindow> pool_window(const plugin::Node& n, size_t first_arg, std::string* why);

// An index as an i64 value of the expression pool (max-pool's argmax).
int index_value(ExprPool& p, const Index& ix);

// An i64 index value clamped into [0, n - 1], so that a bad index read from data (a class target,
// an embedding row) can never address outside its tensor; eager rejects such an index anyway.
int clamped_index(ExprPool& p, int i64_value, int64_t n);

class Lowerer {
 public:
  Lowerer(const plugin::Graph& g, LoweredGraph* out, bool cuda = false) : g_(g), L_(out), cuda_(cuda) {}

  const plugin::Graph& graph() const { return g_; }
  // Whether the kernels are generated for CUDA (codegen_cuda.h) rather than the CPU: where a
  // lowering's best form differs by device (batch norm's statistics).
  bool cuda() const { return cuda_; }
  // Loaders keep this pointer: the LoweredGraph never moves while they live.
  const LoweredGraph* lowered() const { return L_; }
  ValueInfo& val(int64_t v) { return L_->values[static_cast<size_t>(v)]; }

  // The next position in the topological order (node results, hidden intermediates).
  int next_order() { return order_++; }

  // A scalar argument as a parameter of the generated code (a run-time scalar stays one).
  int param(const plugin::Arg& a);

  // A hidden intermediate (softmax's max, layer norm's variance): contiguous, always materialized;
  // float when `ty` is bfloat16.
  int hidden(std::vector<int64_t> shape, Ty ty);

  // Right-aligned broadcasting of `in` to an index of rank out_rank.
  static Idx bidx(const std::vector<int64_t>& in_shape, const Idx& idx);
  // A loader of `v` broadcast to the index of another value.
  Loader bload(int64_t v, Ty as);

  void pointwise(int64_t out, Loader body);
  void view(int64_t out, int64_t src, std::function<Idx(const Idx&)> remap);
  // out[o] = scale * combine_r body(full input index); `dims` are the reduced dims of `in_shape`.
  void reduction(int out, const std::vector<int64_t>& in_shape, const std::vector<int64_t>& dims, bool keepdim,
                 const std::string& combine, double scale, Loader body);

  static std::vector<int64_t> keep_shape(const std::vector<int64_t>& shape, const std::vector<int64_t>& dims);

 private:
  const plugin::Graph& g_;
  LoweredGraph* L_;
  bool cuda_ = false;
  int order_ = 0;
};

}  // namespace kiln::inductor
