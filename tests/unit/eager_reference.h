// What the backend tests compare a compiled group against: fresh random inputs for a graph, the
// graph run by kiln's eager executor, and the relative error of a result. Shared by the tests of
// every backend that runs graphs through the real host (inductor, ipex).
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "kiln/internal/executor.h"
#include "kiln/ir.h"

namespace kiln::test {

// Random inputs with the graph's own shapes, strides and dtypes. Names pick the distribution:
// "pos*" positive floats, "target*" class indices in [0, 5) (one of them -100 for "target_ignore").
inline std::vector<at::Tensor> make_inputs(const ir::Graph& g) {
  std::vector<at::Tensor> ins;
  for (const auto& in : g.inputs) {
    const auto& m = g.value(in.value).meta;
    at::Tensor t = at::empty_strided(m.shape, m.strides, at::TensorOptions(m.dtype));
    if (m.dtype == at::kLong) {
      t.copy_(at::randint(0, 5, m.shape, at::kLong));
      if (in.name == "target_ignore" && t.numel() > 1) t.view(-1)[1] = -100;
    } else if (m.dtype == at::kBool) {
      t.copy_(at::rand(m.shape) > 0.5);
    } else {
      t.copy_(at::randn(m.shape, at::TensorOptions(m.dtype)));
      if (in.name.rfind("pos", 0) == 0) t.abs_().add_(0.1);
    }
    ins.push_back(t);
  }
  return ins;
}

// The graph's outputs from an environment of values (by value index).
inline std::vector<at::Tensor> outputs_of(const ir::Graph& g, const std::vector<at::Tensor>& env) {
  std::vector<at::Tensor> outs;
  for (const auto& o : g.outputs) outs.push_back(env[o.value]);
  return outs;
}

// The graph's outputs from kiln's eager executor on `inputs`.
inline std::vector<at::Tensor> run_eager(const ir::Graph& g, const std::vector<at::Tensor>& inputs) {
  std::vector<at::Tensor> env(g.values.size());
  for (size_t i = 0; i < inputs.size(); ++i) env[g.inputs[i].value] = inputs[i];
  EagerExecutor(g).run(env);
  return outputs_of(g, env);
}

// ||out - ref|| / ||ref|| in float64.
inline double rel_error(const at::Tensor& out, const at::Tensor& ref) {
  at::Tensor o = out.to(at::kDouble), r = ref.to(at::kDouble);
  return (o - r).norm().item<double>() / std::max(r.norm().item<double>(), 1e-30);
}

}  // namespace kiln::test
