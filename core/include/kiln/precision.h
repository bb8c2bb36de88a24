// Whether a device computes bfloat16 in hardware, for choosing TrainingArguments::bf16 (Hugging
// Face's is_torch_bf16_gpu_available and is_torch_bf16_cpu_available, answered by kiln's hardware
// probe). Autocast to bfloat16 runs anywhere; where the hardware has no bfloat16 arithmetic it is
// converted in software and is usually slower than float32.
#pragma once

#include <string>

#include <c10/core/Device.h>

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

}  // namespace kiln
