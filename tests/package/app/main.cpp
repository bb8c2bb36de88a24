// Trains a small model for a few steps through kiln::Trainer with the default backend, and the
// same model in plain LibTorch eager from the same seed, then checks that kiln compiled the step,
// that every loss matches eager and that the loss went down. Prints "package_app: ok" last.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <ATen/ATen.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <kiln/kiln.h>
#include <kiln/log.h>

namespace nn = torch::nn;

namespace {

nn::Sequential make_model() {
  torch::manual_seed(7);
  return nn::Sequential(nn::Linear(8, 16), nn::Tanh(), nn::Linear(16, 1));
}

at::Tensor mse(const at::Tensor& out, const at::Tensor& y) { return nn::functional::mse_loss(out, y); }

int fail(const std::string& why) {
  std::fprintf(stderr, "package_app: FAILED: %s\n", why.c_str());
  return 1;
}

}  // namespace

int main() {
  constexpr int kSteps = 8;
  torch::manual_seed(1);
  const at::Tensor x = at::randn({32, 8});
  const at::Tensor y = x.sum(1, true).sin();

  // Configuration parsing is public API too: it lives in libkiln.so.
  kiln::TrainingArguments args = kiln::TrainingArguments::from_toml_string("torch_compile = true\n", "app.toml");
  kiln::log_info("package_app: kiln " KILN_VERSION_STRING " built with LibTorch " KILN_TORCH_VERSION_STRING);

  nn::Sequential model = make_model();
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
  kiln::Trainer trainer(model, opt, mse, args);

  nn::Sequential eager_model = make_model();
  torch::optim::SGD eager_opt(eager_model->parameters(), torch::optim::SGDOptions(0.1));

  float first = 0, last = 0;
  for (int i = 0; i < kSteps; ++i) {
    const float got = trainer.step(x, y).item<float>();
    eager_opt.zero_grad();
    at::Tensor want_t = mse(eager_model->forward(x), y);
    want_t.backward();
    eager_opt.step();
    const float want = want_t.item<float>();
    std::printf("step %d: kiln %.6f eager %.6f\n", i, got, want);
    if (std::abs(got - want) > 1e-5f + 1e-4f * std::abs(want))
      return fail("step " + std::to_string(i) + ": kiln's loss " + std::to_string(got) + " differs from eager's " +
                  std::to_string(want));
    if (i == 0) first = got;
    last = got;
  }
  const kiln::StepStats& stats = trainer.stats();
  std::printf("backend %s, %d compiled steps of %d\n", trainer.backend().c_str(), stats.compiled_steps, kSteps);
  if (stats.compiled_steps == 0)
    return fail("no step ran compiled (backend " + trainer.backend() + "; last fallback: " + stats.last_fallback + ")");
  if (!(last < first))
    return fail("the loss did not go down: " + std::to_string(first) + " -> " + std::to_string(last));
  std::printf("package_app: ok\n");
  return 0;
}
