// Whether a device computes bfloat16 in hardware, for choosing TrainingArguments::bf16 (Hugging
// Face's is_torch_bf16_gpu_available and is_torch_bf16_cpu_available, answered by kiln's hardware
// probe). Autocast to bfloat16 runs anywhere; where the hardware has no bfloat16 arithmetic it is
// converted in software and is usually slower than float32.
#pragma once

#include <string>

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include "kiln/config.h"

namespace kiln {

// A CUDA GPU of compute capability 8.0 or later (Ampere and on); a CPU with AVX512-BF16 or AMX-BF16
// that the operating system enabled. `why`, when given, gets the reason in words ("CUDA device 0 has
// compute capability 9.0", "the CPU has AVX512-BF16", "the CPU has neither AVX512-BF16 nor AMX-BF16").
bool bf16_is_native(const c10::Device& device, std::string* why = nullptr);

// A program's precision setting ("auto", "fp32" or "bf16", as kiln's samples take it with
// --precision) applied to `args`: "auto" sets bf16 where `device` computes bfloat16 in hardware,
// unless args already asks for bf16 or fp16; "fp32" clears both; "bf16" sets bf16 (and clears
// fp16). Returns the choice and why, in words ("bfloat16 autocast (the CPU has AVX512-BF16)").
// Anything else is std::invalid_argument.
std::string choose_precision(TrainingArguments& args, const std::string& precision, const c10::Device& device);

// Autocast to `dtype` (bfloat16 or float16) on `device` for as long as it lives, as a
// torch.autocast region: what the Trainer wraps the forward and the loss in for bf16 and fp16, for a
// step of your own (compile_step). Leave it before the backward, as Hugging Face does. The state
// before is restored and the casts autocast cached in the region are dropped at the end (the next
// step's weights are not this one's). at::kFloat: no region at all.
class AutocastGuard {
 public:
  AutocastGuard(c10::ScalarType dtype, c10::DeviceType device);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  bool on_;
  c10::DeviceType device_;
  bool was_on_ = false;
  c10::ScalarType was_dtype_ = c10::ScalarType::Float;
};

}  // namespace kiln
