#include "kiln/precision.h"

#include <stdexcept>

#include <ATen/autocast_mode.h>
#include <c10/util/StringUtil.h>

#include "kiln/hardware_probe.h"

namespace kiln {

bool bf16_is_native(const c10::Device& device, std::string* why) {
  const hw::ProbeResult found = hw::probe();
  auto say = [&](std::string text, bool answer) {
    if (why) *why = std::move(text);
    return answer;
  };
  if (device.is_cuda()) {
    const int index = device.has_index() ? device.index() : 0;
    for (const auto& d : found.devices)
      if (d.kind == hw::DeviceKind::cuda && d.index == index) {
        const bool native = d.cuda.cc_major >= 8;
        return say(c10::str("CUDA device ", index, " (", d.name, ") has compute capability ", d.cuda.cc_major, ".",
                            d.cuda.cc_minor, native ? "" : ", below 8.0"),
                   native);
      }
    return say(c10::str("no CUDA device ", index, " was found (", found.cuda_status, ")"), false);
  }
  if (device.is_cpu()) {
    const hw::Device* cpu = found.first(hw::DeviceKind::cpu);
    if (!cpu) return say("the CPU could not be probed", false);
    if (cpu->cpu.isa.amx_bf16) return say("the CPU has AMX-BF16", true);
    if (cpu->cpu.isa.avx512_bf16) return say("the CPU has AVX512-BF16", true);
    return say("the CPU has neither AVX512-BF16 nor AMX-BF16", false);
  }
  return say(c10::str("kiln does not know whether ", device.str(), " computes bfloat16"), false);
}

std::string choose_precision(TrainingArguments& args, const std::string& precision, const c10::Device& device) {
  std::string why;
  if (precision == "bf16") {
    args.bf16 = true, args.fp16 = false;
    why = "asked for";
  } else if (precision == "fp32") {
    args.bf16 = args.fp16 = false;
    why = "asked for";
  } else if (precision == "auto") {
    if (args.bf16 || args.fp16) why = "the configuration's setting";
    else args.bf16 = bf16_is_native(device, &why);
  } else {
    throw std::invalid_argument("precision '" + precision + "': use auto, fp32 or bf16");
  }
  const char* what = args.fp16 ? "float16 autocast with loss scaling" : args.bf16 ? "bfloat16 autocast" : "float32";
  return std::string(what) + " (" + why + ")";
}

AutocastGuard::AutocastGuard(c10::ScalarType dtype, c10::DeviceType device)
    : on_(dtype != c10::ScalarType::Float), device_(device) {
  if (!on_) return;
  was_on_ = at::autocast::is_autocast_enabled(device_);
  was_dtype_ = at::autocast::get_autocast_dtype(device_);
  at::autocast::set_autocast_enabled(device_, true);
  at::autocast::set_autocast_dtype(device_, dtype);
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  if (!on_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_dtype(device_, was_dtype_);
  at::autocast::set_autocast_enabled(device_, was_on_);
}

}  // namespace kiln
