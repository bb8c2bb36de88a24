// The character-GPT sample (the gpt reference workload of docs/workloads.md, at its CPU size): a
// LibTorch training loop that runs through kiln::Trainer with the default backend, next to the same
// loop in plain LibTorch eager.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "kiln/kiln.h"
#include "kiln/workloads.h"

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 40;
  std::string device = "cpu";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--steps" && i + 1 < argc) steps = std::max(2, std::atoi(argv[++i]));
    else if (a == "--device" && i + 1 < argc) device = argv[++i];
    else {
      std::fprintf(stderr, "usage: kiln_char_gpt [--steps N] [--device cpu|cuda]\n");
      return 2;
    }
  }
  using clock = std::chrono::steady_clock;
  auto ms_since = [](clock::time_point t) {
    return std::chrono::duration<double, std::milli>(clock::now() - t).count();
  };

  // Plain LibTorch eager, the reference.
  std::vector<double> eager_ms;
  {
    auto w = kiln::make_workload("gpt", {device, 1});
    for (int s = 0; s < steps; ++s) {
      auto t = clock::now();
      w.optimizer->zero_grad();
      auto loss = w.loss_fn(w.forward(w.input), w.target);
      loss.backward();
      w.optimizer->step();
      (void)loss.item<float>();
      eager_ms.push_back(ms_since(t));
    }
  }

  // The same training through kiln.
  auto w = kiln::make_workload("gpt", {device, 1});
  kiln::TrainingArguments args;
  args.torch_compile = true;
  kiln::Trainer trainer(w.model, w.forward, *w.optimizer, w.loss_fn, args);
  std::printf("backend: %s\n", trainer.backend().c_str());
  for (const auto& r : trainer.backend_reasons()) std::printf("  why: %s\n", r.c_str());

  std::vector<double> kiln_ms;
  double first_ms = 0;
  for (int s = 0; s < steps; ++s) {
    auto t = clock::now();
    float loss = trainer.step(w.input, w.target).item<float>();
    double ms = ms_since(t);
    if (s == 0) first_ms = ms;
    else kiln_ms.push_back(ms);
    if (s % 5 == 0 || s == steps - 1) std::printf("step %3d  loss %.4f  %.1f ms\n", s, loss, ms);
  }
  const double e = median(std::vector<double>(eager_ms.begin() + 1, eager_ms.end()));
  const double k = median(kiln_ms);
  std::printf(
      "\ngpt (B=8, T=64, %s): eager %.2f ms/step, kiln %.2f ms/step (%s), ratio %.2fx, "
      "kiln first step %.2f s\n",
      device.c_str(), e, k, trainer.compiled() ? "compiled" : "eager fallback", e / k, first_ms / 1000.0);
  return 0;
}
