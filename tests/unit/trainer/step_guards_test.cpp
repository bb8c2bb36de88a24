// compile_step on the things ordinary training loops do between and inside steps: several
// optimizers, a checkpoint loaded mid-training, a hyper-parameter that changes an optimizer's
// arithmetic, parameters replaced, dropout, gradient clipping, the environment, shapes whose capture
// failed. Every test runs the same loop through LibTorch eager from the same seed and compares bit
// for bit: the backend is "eager" (kiln's capture, passes and executor on ATen's own kernels), so
// any difference is kiln changing what the step computes.
#include <cstdlib>
#include <functional>
#include <cstdio>
#include <unistd.h>
#include <random>

#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/nn/functional/dropout.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/nn/modules/embedding.h>
#include <torch/optim/adam.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>
#include <torch/serialize.h>
#include <torch/utils.h>

#include "kiln/compile.h"
#include "kiln/trainer.h"
#include "log_capture.h"

namespace nn = torch::nn;

namespace {

uint64_t fresh_seed() { return std::random_device{}() | (static_cast<uint64_t>(std::random_device{}()) << 32); }

kiln::TrainingArguments eager_backend() {
  kiln::TrainingArguments a;
  a.torch_compile = true;
  a.torch_compile_backend = "eager";
  return a;
}

at::Tensor ce(const at::Tensor& out, const at::Tensor& y) { return nn::functional::cross_entropy(out, y); }

// The ordinary step of a classifier: zero_grad, forward, cross-entropy, backward, step.
std::vector<at::Tensor> ce_step(nn::Sequential& m, torch::optim::Optimizer& o, const std::vector<at::Tensor>& in) {
  o.zero_grad();
  auto loss = ce(m->forward(in[0]), in[1]);
  loss.backward();
  o.step();
  return {loss.detach()};
}

// The eager step, then kiln's, from the same state of LibTorch's CPU generator: both draw the same
// dropout masks when kiln computes what eager computes.
std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>> from_one_generator_state(
    const std::function<std::vector<at::Tensor>()>& eager, const std::function<std::vector<at::Tensor>()>& compiled) {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  const auto state = gen.get_state();
  auto want = eager();
  gen.set_state(state);
  return {compiled(), want};
}

void expect_equal(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_TRUE(at::equal(a[i], b[i])) << what << " " << i << " differs by "
                                       << (a[i] - b[i]).abs().max().item<double>();
}

int64_t adam_step(const torch::optim::Optimizer& opt) {
  int64_t s = -1;
  for (const auto& [k, st] : const_cast<torch::optim::Optimizer&>(opt).state())
    s = static_cast<torch::optim::AdamParamState&>(*st).step();
  return s;
}

// A generator and a discriminator, each with its own Adam: the discriminator steps after its
// backward, the generator after a second backward through the discriminator.
struct Gan {
  nn::Sequential g{nn::Linear(4, 16), nn::ReLU(), nn::Linear(16, 8)};
  nn::Sequential d{nn::Linear(8, 16), nn::LeakyReLU(nn::LeakyReLUOptions().negative_slope(0.2)), nn::Linear(16, 1)};
  torch::optim::Adam opt_g{g->parameters(), torch::optim::AdamOptions(2e-3).betas({0.5, 0.999})};
  torch::optim::Adam opt_d{d->parameters(), torch::optim::AdamOptions(2e-3).betas({0.5, 0.999})};

  std::vector<at::Tensor> step(const std::vector<at::Tensor>& in) {
    const auto& real = in[0];
    const auto& z = in[1];
    auto bce = [](const at::Tensor& logits, double label) {
      return nn::functional::binary_cross_entropy_with_logits(logits, at::full_like(logits, label));
    };
    opt_d.zero_grad();
    auto fake = g->forward(z);
    auto d_loss = bce(d->forward(real), 1.0) + bce(d->forward(fake.detach()), 0.0);
    d_loss.backward();
    opt_d.step();
    opt_g.zero_grad();
    auto g_loss = bce(d->forward(fake), 1.0);
    g_loss.backward();
    opt_g.step();
    return {d_loss.detach(), g_loss.detach()};
  }
  std::vector<at::Tensor> params() {
    auto p = g->parameters();
    for (auto& t : d->parameters()) p.push_back(t);
    return p;
  }
};

}  // namespace

TEST(StepGuards, TwoOptimizersTwoBackwardsCompileAndMatchEagerWithCountersExact) {
  const auto seed = fresh_seed();
  torch::manual_seed(seed);
  Gan ref;
  torch::manual_seed(seed);
  Gan s;
  auto step = kiln::compile_step([&](const std::vector<at::Tensor>& in) { return s.step(in); },
                                 {{s.g.ptr(), s.d.ptr()}, {&s.opt_d, &s.opt_g}}, eager_backend());
  for (int i = 0; i < 12; ++i) {
    auto real = at::randn({16, 8}), z = at::randn({16, 4});
    auto want = ref.step({real, z});
    auto got = step({real, z});
    expect_equal(got, want, "seed " + std::to_string(seed) + " step " + std::to_string(i) + " loss");
  }
  EXPECT_TRUE(step.stats().last_fallback.empty()) << step.stats().last_fallback;
  EXPECT_TRUE(step.last_step_compiled());
  EXPECT_EQ(step.stats().compiled_steps, 10);
  EXPECT_EQ(adam_step(s.opt_d), adam_step(ref.opt_d));
  EXPECT_EQ(adam_step(s.opt_g), 12);
  expect_equal(s.params(), ref.params(), "parameter");
}

// A hyper-parameter that changes the optimizer's calls (weight decay from 0 adds an op): the probe
// fails, the optimizers' counters are put back, the step is captured again. Before, the failed
// attempt had advanced Adam's counter and the re-run advanced it again.
TEST(StepGuards, OptimizerCallsChangingRecapturesAndLeavesNoPartialEffect) {
  const auto seed = fresh_seed();
  torch::manual_seed(seed);
  nn::Sequential ref(nn::Linear(6, 12), nn::Tanh(), nn::Linear(12, 3));
  torch::manual_seed(seed);
  nn::Sequential net(nn::Linear(6, 12), nn::Tanh(), nn::Linear(12, 3));
  torch::optim::Adam ref_opt(ref->parameters(), 1e-2), opt(net->parameters(), 1e-2);
  const auto body = ce_step;
  auto step = kiln::compile_step([&](const std::vector<at::Tensor>& in) { return body(net, opt, in); },
                                 {{net.ptr()}, {&opt}}, eager_backend());
  for (int i = 0; i < 10; ++i) {
    if (i == 5)
      for (auto* o : {&ref_opt, &opt})
        static_cast<torch::optim::AdamOptions&>(o->param_groups()[0].options()).weight_decay(0.1);
    auto x = at::randn({10, 6}), y = at::randint(0, 3, {10});
    auto want = body(ref, ref_opt, {x, y});
    auto got = step({x, y});
    expect_equal(got, want, "seed " + std::to_string(seed) + " step " + std::to_string(i) + " loss");
    EXPECT_EQ(adam_step(opt), adam_step(ref_opt)) << "step " << i;
  }
  EXPECT_EQ(step.stats().recaptures, 1);
  EXPECT_TRUE(step.last_step_compiled());
  expect_equal(net->parameters(), ref->parameters(), "parameter");
}

// torch::load of the optimizer into the very objects the compiled step uses: the step must follow
// the loaded state (before, it kept the Adam state it had captured).
TEST(StepGuards, CheckpointLoadedMidTrainingIsFollowed) {
  const auto seed = fresh_seed();
  // POSIX rather than std::filesystem: LibTorch's wheel exports its own copy of some
  // std::filesystem symbols, and a test binary built with a newer libstdc++ crashed calling them.
  std::string dir = ::testing::TempDir() + "kiln_ckpt_XXXXXX";
  ASSERT_NE(::mkdtemp(dir.data()), nullptr) << dir;
  torch::manual_seed(seed);
  nn::Sequential ref(nn::Linear(6, 12), nn::ReLU(), nn::Linear(12, 3));
  torch::manual_seed(seed);
  nn::Sequential net(nn::Linear(6, 12), nn::ReLU(), nn::Linear(12, 3));
  torch::optim::Adam ref_opt(ref->parameters(), 1e-2), opt(net->parameters(), 1e-2);
  const auto body = ce_step;
  auto step = kiln::compile_step([&](const std::vector<at::Tensor>& in) { return body(net, opt, in); },
                                 {{net.ptr()}, {&opt}}, eager_backend());
  const auto model_path = dir + "/model.pt", opt_path = dir + "/opt.pt";
  for (int i = 0; i < 14; ++i) {
    if (i == 4) {
      torch::save(ref, model_path);
      torch::save(ref_opt, opt_path);
    }
    if (i == 9)
      for (auto [m, o] : {std::pair{&ref, &ref_opt}, std::pair{&net, &opt}}) {
        torch::load(*m, model_path);
        torch::load(*o, opt_path);
      }
    auto x = at::randn({10, 6}), y = at::randint(0, 3, {10});
    auto want = body(ref, ref_opt, {x, y});
    auto got = step({x, y});
    expect_equal(got, want, "seed " + std::to_string(seed) + " step " + std::to_string(i) + " loss");
    EXPECT_EQ(adam_step(opt), adam_step(ref_opt)) << "step " << i;
  }
  EXPECT_GE(step.stats().recaptures, 1);
  EXPECT_TRUE(step.last_step_compiled());
  expect_equal(net->parameters(), ref->parameters(), "parameter");
  std::remove(model_path.c_str());
  std::remove(opt_path.c_str());
  ::rmdir(dir.c_str());
}

namespace {
struct MlpImpl : nn::Module {
  nn::Linear fc1{nullptr}, fc2{nullptr};
  MlpImpl() : fc1(register_module("fc1", nn::Linear(6, 12))), fc2(register_module("fc2", nn::Linear(12, 3))) {}
  at::Tensor forward(const at::Tensor& x) { return fc2->forward(at::relu(fc1->forward(x))); }
};
TORCH_MODULE(Mlp);

// Two copies of one Mlp made from one seed, each with its SGD (momentum 0.9): eager's and kiln's.
struct TwinMlps {
  static Mlp seeded(uint64_t seed) {
    torch::manual_seed(seed);
    return Mlp();
  }
  explicit TwinMlps(uint64_t seed)
      : ref(seeded(seed)),
        net(seeded(seed)),
        ref_opt(ref->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9)),
        opt(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9)) {}
  Mlp ref, net;
  torch::optim::SGD ref_opt, opt;
};
}  // namespace

// A layer replaced between steps (and given to the optimizer): the plans read the old parameters,
// so the step is captured again.
TEST(StepGuards, ReplacedLayerRecaptures) {
  const auto seed = fresh_seed();
  TwinMlps twins(seed);
  auto &ref = twins.ref, &net = twins.net;
  auto &ref_opt = twins.ref_opt, &opt = twins.opt;
  auto body = [](Mlp& m, torch::optim::Optimizer& o, const std::vector<at::Tensor>& in) {
    o.zero_grad();
    auto loss = ce(m->forward(in[0]), in[1]);
    loss.backward();
    o.step();
    return std::vector<at::Tensor>{loss.detach()};
  };
  auto step = kiln::compile_step([&](const std::vector<at::Tensor>& in) { return body(net, opt, in); },
                                 {{net.ptr()}, {&opt}}, eager_backend());
  for (int i = 0; i < 10; ++i) {
    if (i == 5) {
      const auto s2 = fresh_seed();
      for (auto [m, o] : {std::pair{&ref, &ref_opt}, std::pair{&net, &opt}}) {
        torch::manual_seed(s2);
        (*m)->fc2 = (*m)->replace_module("fc2", nn::Linear(12, 3));
        o->param_groups()[0].params() = (*m)->parameters();
      }
    }
    auto x = at::randn({10, 6}), y = at::randint(0, 3, {10});
    auto want = body(ref, ref_opt, {x, y});
    auto got = step({x, y});
    expect_equal(got, want, "seed " + std::to_string(seed) + " step " + std::to_string(i) + " loss");
  }
  EXPECT_GE(step.stats().recaptures, 1);
  EXPECT_TRUE(step.last_step_compiled());
  expect_equal(net->parameters(), ref->parameters(), "parameter");
}

// Dropout on the CPU draws with bernoulli_; the compiled step draws the same masks from the same
// generator state, so it matches eager bit for bit, step after step (the masks change).
TEST(StepGuards, DropoutOnCpuDrawsEagersMasks) {
  const auto seed = fresh_seed();
  auto make = [&] {
    torch::manual_seed(seed);
    return nn::Sequential(nn::Linear(8, 32), nn::ReLU(), nn::Dropout(0.3), nn::Linear(32, 4));
  };
  auto ref = make(), net = make();
  torch::optim::SGD ref_opt(ref->parameters(), 0.05), opt(net->parameters(), 0.05);
  // Returns the loss and the dropout mask (the elements dropout zeroed that ReLU had not).
  auto body = [](nn::Sequential& m, torch::optim::Optimizer& o, const std::vector<at::Tensor>& in) {
    o.zero_grad();
    auto h = m[1]->as<nn::ReLU>()->forward(m[0]->as<nn::Linear>()->forward(in[0]));
    auto dropped = m[2]->as<nn::Dropout>()->forward(h);
    auto loss = ce(m[3]->as<nn::Linear>()->forward(dropped), in[1]);
    loss.backward();
    o.step();
    return std::vector<at::Tensor>{loss.detach(), dropped.eq(0).logical_and(h.ne(0))};
  };
  auto step = kiln::compile_step([&](const std::vector<at::Tensor>& in) { return body(net, opt, in); },
                                 {{net.ptr()}, {&opt}}, eager_backend());
  auto x = at::randn({16, 8}), y = at::randint(0, 4, {16});
  at::Tensor previous;
  for (int i = 0; i < 8; ++i) {
    auto [got, want] = from_one_generator_state(
        [&] {
          return body(ref, ref_opt, {x, y});
        },
        [&] {
          return step({x, y});
        });
    expect_equal(got, want, "seed " + std::to_string(seed) + " step " + std::to_string(i) + " result");
    if (previous.defined()) {
      EXPECT_FALSE(at::equal(got[1], previous)) << "the same dropout mask twice, step " << i;
    }
    previous = got[1];
  }
  EXPECT_TRUE(step.stats().last_fallback.empty()) << step.stats().last_fallback;
  EXPECT_EQ(step.stats().compiled_steps, 6);
  expect_equal(net->parameters(), ref->parameters(), "parameter");
}

// Dropout of a transposed activation: bernoulli_ fills a non-contiguous tensor in memory order, and
// the compiled step must give every element the same draw.
TEST(StepGuards, DropoutOfATransposedTensorDrawsEagersMasks) {
  const auto seed = fresh_seed();
  auto make = [&] {
    torch::manual_seed(seed);
    return nn::Linear(6, 10);
  };
  auto ref = make(), lin = make();
  torch::optim::SGD ref_opt(ref->parameters(), 0.05), opt(lin->parameters(), 0.05);
  auto body = [](nn::Linear& m, torch::optim::Optimizer& o, const std::vector<at::Tensor>& in) {
    o.zero_grad();
    auto h = nn::functional::dropout(m->forward(in[0]).transpose(0, 1), nn::functional::DropoutFuncOptions().p(0.4));
    auto loss = (h * h).mean();
    loss.backward();
    o.step();
    return std::vector<at::Tensor>{loss.detach(), h.detach()};
  };
  auto step = kiln::compile_step([&](const std::vector<at::Tensor>& in) { return body(lin, opt, in); },
                                 {{lin.ptr()}, {&opt}}, eager_backend());
  for (int i = 0; i < 6; ++i) {
    auto x = at::randn({12, 6});
    auto [got, want] = from_one_generator_state([&] { return body(ref, ref_opt, {x}); }, [&] { return step({x}); });
    expect_equal(got, want, "seed " + std::to_string(seed) + " step " + std::to_string(i));
  }
  EXPECT_TRUE(step.last_step_compiled()) << step.stats().last_fallback;
}

// clip_grad_norm_ reads its total norm with .item() after scaling the gradients with it on the
// device: captured, the norm and the clip coefficient stay tensors. Trainer's max_grad_norm too.
TEST(StepGuards, ClipGradNormIsCaptured) {
  const auto seed = fresh_seed();
  auto make = [&] {
    torch::manual_seed(seed);
    return nn::Sequential(nn::Linear(8, 32), nn::Tanh(), nn::Linear(32, 4));
  };
  auto ref = make(), net = make(), tnet = make();
  torch::optim::SGD ref_opt(ref->parameters(), torch::optim::SGDOptions(0.5).momentum(0.9));
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.5).momentum(0.9));
  torch::optim::SGD topt(tnet->parameters(), torch::optim::SGDOptions(0.5).momentum(0.9));
  auto body = [](nn::Sequential& m, torch::optim::Optimizer& o, const std::vector<at::Tensor>& in) {
    o.zero_grad();
    auto loss = ce(m->forward(in[0]), in[1]);
    loss.backward();
    nn::utils::clip_grad_norm_(m->parameters(), 0.25);
    o.step();
    return std::vector<at::Tensor>{loss.detach()};
  };
  auto step = kiln::compile_step([&](const std::vector<at::Tensor>& in) { return body(net, opt, in); },
                                 {{net.ptr()}, {&opt}}, eager_backend());
  auto args = eager_backend();
  args.max_grad_norm = 0.25;
  kiln::Trainer trainer(tnet, topt, ce, args);
  for (int i = 0; i < 8; ++i) {
    auto x = at::randn({16, 8}) * 4, y = at::randint(0, 4, {16});
    auto want = body(ref, ref_opt, {x, y});
    expect_equal(step({x, y}), want, "seed " + std::to_string(seed) + " step " + std::to_string(i) + " loss");
    expect_equal({trainer.step(x, y)}, want, "Trainer step " + std::to_string(i) + " loss");
  }
  EXPECT_TRUE(step.stats().last_fallback.empty()) << step.stats().last_fallback;
  EXPECT_EQ(step.stats().compiled_steps, 6);
  EXPECT_EQ(trainer.stats().compiled_steps, 6);
  expect_equal(net->parameters(), ref->parameters(), "parameter");
  expect_equal(tnet->parameters(), ref->parameters(), "Trainer parameter");
}

// A host read of a value the step has not used on the device is host control flow: it is not
// captured, and a new shape with the same cause does not pay another capture.
TEST(StepGuards, FailedCaptureIsRememberedAcrossShapes) {
  torch::manual_seed(fresh_seed());
  nn::Sequential net(nn::Linear(6, 12), nn::ReLU(), nn::Linear(12, 3));
  torch::optim::SGD opt(net->parameters(), 0.1);
  LogCapture logs;
  auto step = kiln::compile_step(
      [&](const std::vector<at::Tensor>& in) {
        opt.zero_grad();
        auto out = net->forward(in[0]);
        const double scale = out.abs().max().item<double>() > 1e9 ? 0.5 : 1.0;
        auto loss = ce(out * scale, in[1]);
        loss.backward();
        opt.step();
        return std::vector<at::Tensor>{loss.detach()};
      },
      {{net.ptr()}, {&opt}}, eager_backend());
  for (int64_t batch : {8, 8, 8, 5, 5, 7}) step({at::randn({batch, 6}), at::randint(0, 3, {batch})});
  EXPECT_EQ(step.stats().failed_captures, 1) << "batch 5 and 7 did not capture again";
  EXPECT_EQ(step.stats().compiles, 0) << "a failed capture compiled nothing";
  EXPECT_EQ(step.stats().compiled_steps, 0);
  EXPECT_NE(step.stats().last_fallback.find("aten::_local_scalar_dense"), std::string::npos)
      << step.stats().last_fallback;
}

TEST(StepGuards, EnvironmentChoosesTheBackendOfCompileStep) {
  ::setenv("KILN_BACKEND", "eager", 1);
  torch::manual_seed(fresh_seed());
  nn::Sequential net(nn::Linear(6, 3));
  torch::optim::SGD opt(net->parameters(), 0.1);
  kiln::TrainingArguments args;
  args.torch_compile = true;
  args.torch_compile_backend = "inductor";
  auto step = kiln::compile_step([&](const std::vector<at::Tensor>& in) { return std::vector<at::Tensor>{in[0]}; },
                                 {{net.ptr()}, {&opt}}, args);
  ::unsetenv("KILN_BACKEND");
  EXPECT_EQ(step.backend(), "eager");
  EXPECT_EQ(step.args().torch_compile_backend, "eager");
}

namespace {
struct TwoInputImpl : nn::Module {
  nn::Linear a{nullptr}, b{nullptr};
  TwoInputImpl() : a(register_module("a", nn::Linear(5, 3))), b(register_module("b", nn::Linear(2, 3))) {}
  at::Tensor forward(const at::Tensor& x, at::Tensor extra) { return a->forward(x) + b->forward(extra); }
};
TORCH_MODULE(TwoInput);
}  // namespace

// Trainer takes a module holder (no .ptr()) and a forward with several tensors.
TEST(StepGuards, TrainerTakesAModuleHolderWithSeveralInputs) {
  const auto seed = fresh_seed();
  torch::manual_seed(seed);
  TwoInput ref;
  torch::manual_seed(seed);
  TwoInput model;
  torch::optim::SGD ref_opt(ref->parameters(), 0.1), opt(model->parameters(), 0.1);
  kiln::Trainer trainer(model, opt, ce, eager_backend());
  for (int i = 0; i < 6; ++i) {
    auto x = at::randn({7, 5}), e = at::randn({7, 2}), y = at::randint(0, 3, {7});
    ref_opt.zero_grad();
    auto want = ce(ref->forward(x, e), y);
    want.backward();
    ref_opt.step();
    expect_equal({trainer.step({x, e}, y)}, {want.detach()}, "step " + std::to_string(i) + " loss");
  }
  EXPECT_TRUE(trainer.compiled());
  expect_equal(model->parameters(), ref->parameters(), "parameter");
  EXPECT_THROW(trainer.step({at::randn({7, 5})}, at::randint(0, 3, {7})), std::invalid_argument);
}

// nn::MultiheadAttention asks torch::equal(query, key) on the host to pick its self-attention
// path; equal(x, x) is answered from identity, so the step is captured (with attention dropout).
class MultiheadSelfAttention : public ::testing::TestWithParam<double> {};

TEST_P(MultiheadSelfAttention, IsCapturedAndMatchesEager) {
  const double p = GetParam();
  const auto seed = fresh_seed();
  auto make = [&] {
    torch::manual_seed(seed);
    return nn::MultiheadAttention(nn::MultiheadAttentionOptions(16, 4).dropout(p).bias(false));
  };
  auto ref = make(), mha = make();
  torch::optim::SGD ref_opt(ref->parameters(), 0.1), opt(mha->parameters(), 0.1);
  auto body = [](nn::MultiheadAttention& m, torch::optim::Optimizer& o, const std::vector<at::Tensor>& in) {
    o.zero_grad();
    const auto& x = in[0];
    auto causal = at::full({x.size(0), x.size(0)}, -std::numeric_limits<float>::infinity()).triu(1);
    auto y = std::get<0>(m->forward(x, x, x, {}, /*need_weights=*/false, causal));
    auto loss = (y * y).mean();
    loss.backward();
    o.step();
    return std::vector<at::Tensor>{loss.detach(), y.detach()};
  };
  auto step = kiln::compile_step([&](const std::vector<at::Tensor>& in) { return body(mha, opt, in); },
                                 {{mha.ptr()}, {&opt}}, eager_backend());
  for (int i = 0; i < 6; ++i) {
    auto x = at::randn({5, 3, 16});
    auto [got, want] = from_one_generator_state([&] { return body(ref, ref_opt, {x}); }, [&] { return step({x}); });
    expect_equal(got, want, "seed " + std::to_string(seed) + " step " + std::to_string(i));
  }
  EXPECT_TRUE(step.last_step_compiled()) << step.stats().last_fallback;
  expect_equal(mha->parameters(), ref->parameters(), "parameter");
}

INSTANTIATE_TEST_SUITE_P(Dropout, MultiheadSelfAttention, ::testing::Values(0.0, 0.2));

// An optimizer the step uses but kiln was not given: its host state would not advance in compiled
// steps, and kiln says so, naming the parameter.
TEST(StepGuards, AnOptimizerNotGivenToKilnIsNamedInAWarning) {
  torch::manual_seed(fresh_seed());
  nn::Linear lin(4, 2);
  torch::optim::Adam opt(lin->parameters(), 1e-2);
  LogCapture logs;
  auto step = kiln::compile_step(
      [&](const std::vector<at::Tensor>& in) {
        opt.zero_grad();
        auto loss = lin->forward(in[0]).pow(2).mean();
        loss.backward();
        opt.step();
        return std::vector<at::Tensor>{loss.detach()};
      },
      {{lin.ptr()}, {}}, eager_backend());
  for (int i = 0; i < 4; ++i) step({at::randn({3, 4})});
  int mentions = 0;
  for (const auto& w : logs.warnings())
    mentions +=
        w.find("outside the optimizers given to kiln") != std::string::npos && w.find("weight") != std::string::npos;
  EXPECT_EQ(mentions, 1);
}

// A parameter the given optimizer updates and the step then writes again (a WGAN critic's weights
// clamped after the update) is no sign of another optimizer: no warning, and the compiled step
// equals eager.
TEST(StepGuards, AWriteAfterTheGivenOptimizersUpdateIsNotTakenForAnotherOptimizer) {
  const auto seed = fresh_seed();
  auto make = [&] {
    torch::manual_seed(seed);
    return nn::Linear(4, 2);
  };
  nn::Linear lin = make(), ref = make();
  torch::optim::RMSprop opt(lin->parameters(), 5e-2), ref_opt(ref->parameters(), 5e-2);
  auto body = [](nn::Linear& l, torch::optim::Optimizer& o, const std::vector<at::Tensor>& in) {
    o.zero_grad();
    auto loss = l->forward(in[0]).mean();
    loss.backward();
    o.step();
    torch::NoGradGuard no_grad;
    for (auto& p : l->parameters()) p.clamp_(-0.1, 0.1);
    return std::vector<at::Tensor>{loss.detach()};
  };
  LogCapture logs;
  auto step = kiln::compile_step([&](const std::vector<at::Tensor>& in) { return body(lin, opt, in); },
                                 {{lin.ptr()}, {&opt}}, eager_backend());
  for (int i = 0; i < 5; ++i) {
    auto x = at::randn({3, 4});
    expect_equal(step({x}), body(ref, ref_opt, {x}), "step " + std::to_string(i));
  }
  EXPECT_TRUE(step.last_step_compiled()) << step.stats().last_fallback;
  expect_equal(lin->parameters(), ref->parameters(), "parameter");
  for (const auto& w : logs.warnings()) EXPECT_EQ(w.find("outside the optimizers"), std::string::npos) << w;
}

// A batch and its targets as shifted views of one token tensor (a language model's manual loop):
// two inputs over the same memory, which the step only reads, are two inputs of the graph; the
// step runs compiled and equals eager bit for bit, with overlapping inputs and with separate ones
// of the same shapes. A step that writes into that memory is refused with the reason and runs
// eagerly, equal to eager too.
TEST(StepGuards, InputsThatShareMemoryAreReadAsTheyAre) {
  const auto seed = fresh_seed();
  auto make = [&] {
    torch::manual_seed(seed);
    return nn::Sequential(nn::Embedding(20, 8), nn::Linear(8, 20));
  };
  auto body = [](nn::Sequential& net, torch::optim::Optimizer& opt, const std::vector<at::Tensor>& in, bool write) {
    opt.zero_grad();
    if (write) in[0].add_(0);  // a write into the memory the targets share
    auto logits = net->forward(in[0]);
    auto loss = nn::functional::cross_entropy(logits.reshape({-1, 20}), in[1].reshape({-1}));
    loss.backward();
    opt.step();
    return std::vector<at::Tensor>{loss.detach()};
  };
  for (const bool write : {false, true}) {
    SCOPED_TRACE(write ? "the step writes an input" : "the step reads its inputs");
    auto net = make(), ref = make();
    torch::optim::Adam opt(net->parameters(), 1e-2), ref_opt(ref->parameters(), 1e-2);
    LogCapture logs;
    auto step = kiln::compile_step([&](const std::vector<at::Tensor>& in) { return body(net, opt, in, write); },
                                   {{net.ptr()}, {&opt}}, eager_backend());
    for (int i = 0; i < 6; ++i) {
      const at::Tensor tokens = at::randint(0, 20, {100});
      std::vector<at::Tensor> in = {tokens.slice(0, 0, 64).view({4, 16}), tokens.slice(0, 1, 65).view({4, 16})};
      if (i == 5) in = {in[0].clone(), in[1].clone()};  // the same shapes, memory of their own
      expect_equal(step(in), body(ref, ref_opt, in, write), "step " + std::to_string(i));
    }
    expect_equal(net->parameters(), ref->parameters(), "parameter");
    if (write) {
      EXPECT_FALSE(step.last_step_compiled());
      // Said by the capture ("an untracked alias of a tensor the step wrote") or by the passes.
      EXPECT_NE(step.stats().last_fallback.find("the step wr"), std::string::npos) << step.stats().last_fallback;
    } else {
      EXPECT_TRUE(step.last_step_compiled()) << step.stats().last_fallback;
      EXPECT_EQ(step.stats().compiles, 1);
    }
  }
}

// A run stopped after a checkpoint and resumed in new objects (a new process, in effect), both
// halves compiled, ends where one uninterrupted eager run ends, bit for bit.
TEST(StepGuards, ResumedRunMatchesAnUninterruptedEagerRun) {
  const auto seed = fresh_seed();
  std::string dir = ::testing::TempDir() + "kiln_resume_XXXXXX";
  ASSERT_NE(::mkdtemp(dir.data()), nullptr) << dir;
  const auto model_path = dir + "/model.pt", opt_path = dir + "/opt.pt";
  auto make = [&] {
    torch::manual_seed(seed);
    return nn::Sequential(nn::Linear(6, 16), nn::ReLU(), nn::Dropout(0.2), nn::Linear(16, 3));
  };
  const auto body = ce_step;
  torch::manual_seed(seed + 1);
  std::vector<std::vector<at::Tensor>> batches;
  for (int i = 0; i < 12; ++i) batches.push_back({at::randn({10, 6}), at::randint(0, 3, {10})});

  auto ref = make();
  torch::optim::Adam ref_opt(ref->parameters(), 1e-2);
  torch::manual_seed(seed + 2);
  std::vector<at::Tensor> want;
  for (const auto& b : batches) want.push_back(body(ref, ref_opt, b)[0]);

  std::vector<at::Tensor> got;
  {
    auto first = make();
    torch::optim::Adam opt(first->parameters(), 1e-2);
    auto step = kiln::compile_step([&](const std::vector<at::Tensor>& in) { return body(first, opt, in); },
                                   {{first.ptr()}, {&opt}}, eager_backend());
    torch::manual_seed(seed + 2);
    for (int i = 0; i < 6; ++i) got.push_back(step(batches[static_cast<size_t>(i)])[0]);
    EXPECT_TRUE(step.last_step_compiled());
    torch::save(first, model_path);
    torch::save(opt, opt_path);
  }
  // The generator goes on from where the first half left it, as in the uninterrupted run (making
  // the new layers draws their initial weights from it).
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  const auto rng = gen.get_state();
  nn::Sequential second(nn::Linear(6, 16), nn::ReLU(), nn::Dropout(0.2), nn::Linear(16, 3));
  torch::optim::Adam opt(second->parameters(), 1e-2);
  torch::load(second, model_path);
  torch::load(opt, opt_path);
  gen.set_state(rng);
  auto step = kiln::compile_step([&](const std::vector<at::Tensor>& in) { return body(second, opt, in); },
                                 {{second.ptr()}, {&opt}}, eager_backend());
  for (int i = 6; i < 12; ++i) got.push_back(step(batches[static_cast<size_t>(i)])[0]);
  EXPECT_TRUE(step.last_step_compiled()) << step.stats().last_fallback;
  expect_equal(got, want, "seed " + std::to_string(seed) + " loss");
  expect_equal(second->parameters(), ref->parameters(), "parameter");
  EXPECT_EQ(adam_step(opt), adam_step(ref_opt));
  std::remove(model_path.c_str());
  std::remove(opt_path.c_str());
  ::rmdir(dir.c_str());
}

// zero_grad outside the step function: the gradients are undefined when a step starts. When the
// probe fails (weight decay turned on), the eager step that follows must find them undefined too,
// not the placeholders the probe lent the optimizer.
TEST(StepGuards, AFailedProbeLeavesGradientsAsTheyWere) {
  const auto seed = fresh_seed();
  auto make = [&] {
    torch::manual_seed(seed);
    return nn::Sequential(nn::Linear(5, 8), nn::Tanh(), nn::Linear(8, 2));
  };
  auto ref = make(), net = make();
  torch::optim::Adam ref_opt(ref->parameters(), 1e-2), opt(net->parameters(), 1e-2);
  auto body = [](nn::Sequential& m, torch::optim::Optimizer& o, const std::vector<at::Tensor>& in) {
    auto loss = ce(m->forward(in[0]), in[1]);
    loss.backward();
    o.step();
    return std::vector<at::Tensor>{loss.detach()};
  };
  auto step = kiln::compile_step([&](const std::vector<at::Tensor>& in) { return body(net, opt, in); },
                                 {{net.ptr()}, {&opt}}, eager_backend());
  for (int i = 0; i < 8; ++i) {
    if (i == 4)
      for (auto* o : {&ref_opt, &opt})
        static_cast<torch::optim::AdamOptions&>(o->param_groups()[0].options()).weight_decay(0.05);
    ref_opt.zero_grad();
    opt.zero_grad();
    auto x = at::randn({6, 5}), y = at::randint(0, 2, {6});
    auto want = body(ref, ref_opt, {x, y});
    expect_equal(step({x, y}), want, "seed " + std::to_string(seed) + " step " + std::to_string(i) + " loss");
  }
  EXPECT_EQ(step.stats().recaptures, 1);
  expect_equal(net->parameters(), ref->parameters(), "parameter");
}

// A module option the forward reads on the host (a dropout probability) changed between steps: the
// capture baked it, so the step is captured again.
TEST(StepGuards, AModuleOptionChangedBetweenStepsRecaptures) {
  const auto seed = fresh_seed();
  auto make = [&] {
    torch::manual_seed(seed);
    return nn::Sequential(nn::Linear(8, 16), nn::ReLU(), nn::Dropout(0.1), nn::Linear(16, 4));
  };
  auto ref = make(), net = make();
  torch::optim::SGD ref_opt(ref->parameters(), 0.05), opt(net->parameters(), 0.05);
  const auto body = ce_step;
  auto step = kiln::compile_step([&](const std::vector<at::Tensor>& in) { return body(net, opt, in); },
                                 {{net.ptr()}, {&opt}}, eager_backend());
  for (int i = 0; i < 8; ++i) {
    if (i == 4)
      for (auto* m : {&ref, &net}) (*m)->ptr<nn::DropoutImpl>(2)->options.p(0.6);
    auto x = at::randn({16, 8}), y = at::randint(0, 4, {16});
    auto [got, want] = from_one_generator_state(
        [&] {
          return body(ref, ref_opt, {x, y});
        },
        [&] {
          return step({x, y});
        });
    expect_equal(got, want, "seed " + std::to_string(seed) + " step " + std::to_string(i) + " loss");
  }
  EXPECT_EQ(step.stats().recaptures, 1);
  EXPECT_TRUE(step.last_step_compiled());
  expect_equal(net->parameters(), ref->parameters(), "parameter");
}

// Gradient accumulation split in two compiled steps, as a loop of micro-batches does it: a step
// that only adds a micro-batch's gradients into .grad (no zero_grad), and an update that steps and
// zeroes the gradients in place. The micro-step's plan reads the gradients where they are, so when
// the loop sets them to none (zero_grad()), or a step of its own gives them new tensors, the
// micro-step must not read the old ones: every loss and parameter stays eager's, bit for bit. A
// gradient set to none gets the step captured again; a gradient that is another tensor of the same shape (made anew by
// the loop, or, `replacing`, by the update itself before it steps, as a gradient all_reduce that assigns its result
// may) is read where it is now, without a capture.
void accumulate_in_two_steps(bool replacing) {
  const auto seed = fresh_seed();
  TwinMlps twins(seed);
  auto &ref = twins.ref, &net = twins.net;
  auto &ref_opt = twins.ref_opt, &opt = twins.opt;
  auto micro_body = [](Mlp& m, const std::vector<at::Tensor>& in) {
    auto loss = ce(m->forward(in[0]), in[1]) / in[2];
    loss.backward();
    return std::vector<at::Tensor>{loss.detach()};
  };
  auto update_body = [replacing](Mlp& m, torch::optim::Optimizer& o) {
    if (replacing)
      for (auto& p : m->parameters()) p.mutable_grad() = (p.grad() * 0.5).clone();
    o.step();
    torch::NoGradGuard no_grad;
    for (auto& p : m->parameters()) p.grad().zero_();
    return std::vector<at::Tensor>{};
  };
  auto micro = kiln::compile_step([&](const std::vector<at::Tensor>& in) { return micro_body(net, in); },
                                  {{net.ptr()}, {}}, eager_backend());
  auto update = kiln::compile_step([&](const std::vector<at::Tensor>&) { return update_body(net, opt); },
                                   {{net.ptr()}, {&opt}}, eager_backend());
  for (auto* m : {&ref, &net})
    for (auto& p : (*m)->parameters()) p.mutable_grad() = at::zeros_like(p);
  for (int s = 0; s < 12; ++s) {
    if (s == 6 || s == 9) {
      // The loop's own zero_grad(): gradients set to none (at 6), or made anew (at 9).
      for (auto* m : {&ref, &net})
        for (auto& p : (*m)->parameters()) p.mutable_grad() = s == 6 ? at::Tensor() : at::zeros_like(p);
    }
    const int k = 1 + s % 3;
    const auto divisor = at::full({}, static_cast<double>(k));
    for (int i = 0; i < k; ++i) {
      auto x = at::randn({10, 6}), y = at::randint(0, 3, {10});
      auto want = micro_body(ref, {x, y, divisor});
      auto got = micro({x, y, divisor});
      expect_equal(got, want, "seed " + std::to_string(seed) + " step " + std::to_string(s) + " micro-batch loss");
    }
    update_body(ref, ref_opt);
    update({});
    expect_equal(net->parameters(), ref->parameters(), "step " + std::to_string(s) + " parameter");
  }
  // Set to none (at 6), the gradients make the micro-step capture again, and its next call, which
  // finds them again, once more; tensors of the same shape in their place are read where they are.
  EXPECT_EQ(micro.stats().recaptures, 2) << micro.stats().last_fallback;
  EXPECT_EQ(update.stats().recaptures, 0) << update.stats().last_fallback;
  EXPECT_TRUE(micro.last_step_compiled());
  EXPECT_TRUE(update.last_step_compiled());
  EXPECT_GE(micro.stats().compiled_steps, 10);
}

TEST(StepGuards, AGradientReplacedSinceTheCaptureIsNotReadStale) { accumulate_in_two_steps(false); }
TEST(StepGuards, AStepThatReplacesTheGradientsItReadsReadsTheNewOnes) { accumulate_in_two_steps(true); }
