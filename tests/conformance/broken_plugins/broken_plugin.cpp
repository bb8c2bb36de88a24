// A small float32 relu/neg backend built three times, each with one deliberate defect, to prove
// that the conformance suite reports each defect for what it is and still finishes:
//   BROKEN_WRONG_RESULT  relu returns its input unchanged       -> Numeric.UnaryPointwise failed
//   BROKEN_CRASH         execute writes through a null pointer  -> crashed
//   BROKEN_HANG          execute never returns                  -> hung
// Apart from its defect it is a conforming plugin (tests/conformance/CMakeLists.txt checks that
// the cases that do not execute still pass).
#include <chrono>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <kiln/plugin_api.hpp>

#ifndef BROKEN_NAME
#error "define BROKEN_NAME"
#endif

namespace {

using namespace kiln::plugin;

bool plain(const Value& v) { return is_float32(v.dtype()) && v.device().device_type == kDLCPU && v.is_contiguous(); }

bool takes(const Graph& g, const Node& n) {
  if ((n.op() != "aten::relu" && n.op() != "aten::neg") || n.num_args() != 1 || n.outputs().size() != 1) return false;
  if (!n.arg(0).is_tensor()) return false;
  const Value in = g.value(n.arg(0).tensor_index()), out = g.value(n.outputs()[0]);
  return plain(in) && plain(out) && in.shape() == out.shape();
}

struct Step {
  bool relu;
  int64_t in, out;  // value indices
};

class Program : public Executable {
 public:
  Program(std::vector<Step> steps, std::vector<int64_t> inputs, std::vector<int64_t> outputs, std::map<int64_t, int64_t> numel)
      : steps_(std::move(steps)), inputs_(std::move(inputs)), outputs_(std::move(outputs)), numel_(std::move(numel)) {}

  void execute(const DLTensor* in, size_t n_in, DLTensor* out, size_t n_out, void*) override {
    if (n_in != inputs_.size() || n_out != outputs_.size())
      throw Error(KILN_ERROR_INVALID_ARGUMENT, "wrong number of inputs or outputs");
    std::map<int64_t, float*> buf;
    std::vector<std::vector<float>> scratch;
    auto bind = [&](const DLTensor* t, int64_t v) {
      Tensor x(t);
      if (!is_float32(x.dtype()) || !x.is_contiguous() || x.numel() != numel_.at(v))
        throw Error(KILN_ERROR_INVALID_ARGUMENT, "tensor for value " + std::to_string(v) + " has the wrong dtype or shape");
      buf[v] = x.data<float>();
    };
    for (size_t i = 0; i < n_in; ++i) bind(&in[i], inputs_[i]);
    for (size_t i = 0; i < n_out; ++i) bind(&out[i], outputs_[i]);
#if defined(BROKEN_CRASH)
    *static_cast<volatile float*>(nullptr) = 1.f;
#elif defined(BROKEN_HANG)
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
#endif
    for (const Step& s : steps_) {
      if (!buf.count(s.out)) {
        scratch.emplace_back(static_cast<size_t>(numel_.at(s.out)));
        buf[s.out] = scratch.back().data();
      }
      const float* x = buf.at(s.in);
      float* y = buf.at(s.out);
      for (int64_t k = 0; k < numel_.at(s.out); ++k) {
#if defined(BROKEN_WRONG_RESULT)
        y[k] = s.relu ? x[k] : -x[k];
#else
        y[k] = s.relu ? (x[k] > 0.f ? x[k] : 0.f) : -x[k];
#endif
      }
    }
    // An output that is a graph input passes through.
    for (size_t i = 0; i < n_out; ++i)
      for (size_t j = 0; j < n_in; ++j)
        if (outputs_[i] == inputs_[j])
          for (int64_t k = 0; k < numel_.at(outputs_[i]); ++k) Tensor(&out[i]).data<float>()[k] = Tensor(&in[j]).data<float>()[k];
  }

 private:
  std::vector<Step> steps_;
  std::vector<int64_t> inputs_, outputs_;
  std::map<int64_t, int64_t> numel_;
};

class Broken : public Plugin {
 public:
  using Plugin::Plugin;
  static Descriptor describe() {
    Descriptor d;
    d.name = BROKEN_NAME;
    d.version = "0.0.1";
    d.vendor = "kiln conformance tests";
    d.description = "a relu/neg backend with a deliberate defect";
    d.device_kinds = KILN_DEVICE_MASK_CPU;
    return d;
  }
  Availability available(const Devices& devices) override {
    if (!devices.first(KILN_DEVICE_CPU)) return Availability::no("needs a CPU");
    return Availability::yes("CPU");
  }
  std::vector<int64_t> claim(const Graph& g) override {
    std::vector<int64_t> out;
    for (size_t i = 0; i < g.num_nodes(); ++i)
      if (takes(g, g.node(static_cast<int64_t>(i)))) out.push_back(static_cast<int64_t>(i));
    return out;
  }
  std::unique_ptr<Executable> compile(const Graph& g, const CompileOptions& options) override {
    if (options.mode != KILN_MODE_DEFAULT) throw Error(KILN_ERROR_INVALID_ARGUMENT, "only the default mode");
    for (const auto& kv : options.options) throw Error(KILN_ERROR_INVALID_ARGUMENT, "unknown option '" + kv.first + "'");
    std::map<int64_t, int64_t> numel;
    for (int64_t v : g.inputs()) numel[v] = g.value(v).numel();
    for (int64_t v : g.outputs()) numel[v] = g.value(v).numel();
    std::vector<Step> steps;
    for (size_t i = 0; i < g.num_nodes(); ++i) {
      Node n = g.node(static_cast<int64_t>(i));
      if (!takes(g, n)) throw Error(KILN_ERROR_INVALID_ARGUMENT, "node " + std::to_string(i) + " (" + n.op() + ") is not mine");
      const int64_t out = n.outputs()[0];
      numel[out] = g.value(out).numel();
      steps.push_back({n.op() == "aten::relu", n.arg(0).tensor_index(), out});
    }
    return std::make_unique<Program>(std::move(steps), g.inputs(), g.outputs(), std::move(numel));
  }
};

}  // namespace

KILN_DEFINE_PLUGIN(Broken)
