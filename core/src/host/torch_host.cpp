// The full plugin host: device memory from LibTorch's allocators and call_eager through the c10
// dispatcher, on top of the LibTorch-free basics (logging, options, cache dir) from kiln_support.
//
// ATen's DLPack header comes first on purpose: it and Debian's dlpack.h share an include guard, and
// DLTensor's layout is the same in both, so the ABI header then uses ATen's definitions.
#include <ATen/DLConvertor.h>
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>

#include <mutex>
#include <optional>
#include <set>
#include <unordered_map>

#include "kiln/internal/host_services.h"
#include "kiln/plugin_api.h"
#include "../runtime/cpu_block_cache.h"

namespace kiln {

namespace {

c10::Device to_device(DLDevice d) {
  return at::dlDeviceToTorchDevice(static_cast<DLDeviceType>(d.device_type),
                                   static_cast<c10::DeviceIndex>(d.device_id));
}

// A DLTensor as an at::Tensor over the same memory, without copying. The DLTensor is borrowed:
// the tensor must not outlive the call.
at::Tensor wrap(const DLTensor* t) {
  auto* managed = new DLManagedTensor{};
  managed->dl_tensor = *t;
  managed->manager_ctx = nullptr;
  managed->deleter = [](DLManagedTensor* self) { delete self; };
  return at::fromDLPack(managed);
}

class TorchHost : public HostServices {
 public:
  TorchHost(std::string cache_dir, Options options) : HostServices(std::move(cache_dir), std::move(options)) {
    api_.device_alloc = [](KilnHostDeviceAllocArgs* a) -> KilnError* {
      if (!a) return make_host_error(KILN_ERROR_INVALID_ARGUMENT, "device_alloc: args is NULL");
      return device_alloc(a->host_ctx, a->device, a->nbytes, a->stream, &a->ptr);
    };
    api_.device_free = [](KilnHostDeviceFreeArgs* a) {
      if (a) device_free(a->host_ctx, a->device, a->ptr);
    };
    api_.call_eager = [](KilnHostCallEagerArgs* a) -> KilnError* {
      if (!a) return make_host_error(KILN_ERROR_INVALID_ARGUMENT, "call_eager: args is NULL");
      return call_eager(a->host_ctx, a->op, a->args, a->num_args, a->outputs, a->num_outputs);
    };
  }

 private:
  static TorchHost* self(void* ctx) { return static_cast<TorchHost*>(static_cast<HostServices*>(ctx)); }

  // A byte tensor holds each block: on CUDA from LibTorch's caching allocator (on the current
  // stream), on the CPU from kiln's CpuBlockCache (runtime/cpu_block_cache.h).
  static KilnError* device_alloc(void* ctx, DLDevice device, size_t nbytes, void*, void** out) {
    if (!out) return make_host_error(KILN_ERROR_INVALID_ARGUMENT, "device_alloc: out is NULL");
    *out = nullptr;
    try {
      const int64_t n = static_cast<int64_t>(nbytes == 0 ? 1 : nbytes);
      at::Tensor block = empty_strided_step({n}, {1}, at::TensorOptions().dtype(at::kByte).device(to_device(device)));
      void* p = block.data_ptr();
      TorchHost* h = self(ctx);
      std::lock_guard<std::mutex> lock(h->mu_);
      h->blocks_.emplace(p, std::move(block));
      *out = p;
      return nullptr;
    } catch (const c10::OutOfMemoryError& e) {
      return make_host_error(KILN_ERROR_OUT_OF_MEMORY, e.what_without_backtrace());
    } catch (const c10::Error& e) {
      return make_host_error(KILN_ERROR_UNAVAILABLE, e.what_without_backtrace());
    } catch (const std::exception& e) {
      return make_host_error(KILN_ERROR_INTERNAL, e.what());
    }
  }

  static void device_free(void* ctx, DLDevice, void* ptr) {
    TorchHost* h = self(ctx);
    at::Tensor block;
    {
      std::lock_guard<std::mutex> lock(h->mu_);
      auto it = h->blocks_.find(ptr);
      if (it == h->blocks_.end()) return;
      block = std::move(it->second);
      h->blocks_.erase(it);
    }
  }

  static c10::IValue to_ivalue(const KilnArg& a, const c10::Argument& formal) {
    switch (a.tag) {
      case KILN_ARG_NONE: return c10::IValue();
      case KILN_ARG_TENSOR:
        if (!a.tensor) throw std::invalid_argument("argument '" + formal.name() + "': tensor is NULL");
        return wrap(a.tensor);
      case KILN_ARG_TENSOR_LIST: {
        bool optional_elements = false;
        if (auto list = formal.type()->castRaw<c10::ListType>())
          optional_elements = list->getElementType()->kind() == c10::TypeKind::OptionalType;
        if (optional_elements) {
          c10::List<std::optional<at::Tensor>> l;
          for (size_t i = 0; i < a.len; ++i)
            l.push_back(a.tensors[i] ? std::optional<at::Tensor>(wrap(a.tensors[i])) : std::nullopt);
          return l;
        }
        c10::List<at::Tensor> l;
        for (size_t i = 0; i < a.len; ++i) {
          if (!a.tensors[i]) throw std::invalid_argument("argument '" + formal.name() + "': NULL tensor in list");
          l.push_back(wrap(a.tensors[i]));
        }
        return l;
      }
      case KILN_ARG_BOOL: return c10::IValue(a.i != 0);
      case KILN_ARG_INT:
      case KILN_ARG_LAYOUT:
      case KILN_ARG_MEMORY_FORMAT: return c10::IValue(a.i);
      case KILN_ARG_DOUBLE: return c10::IValue(a.d);
      case KILN_ARG_INT_LIST: return c10::IValue(std::vector<int64_t>(a.ints, a.ints + a.len));
      case KILN_ARG_DOUBLE_LIST: return c10::IValue(std::vector<double>(a.doubles, a.doubles + a.len));
      case KILN_ARG_BOOL_LIST: {
        c10::List<bool> l;
        for (size_t i = 0; i < a.len; ++i) l.push_back(a.ints[i] != 0);
        return l;
      }
      case KILN_ARG_STRING: return c10::IValue(std::string(a.s ? a.s : ""));
      case KILN_ARG_SCALAR_TYPE: return c10::IValue(static_cast<int64_t>(at::toScalarType(a.dtype)));
      case KILN_ARG_DEVICE: return c10::IValue(to_device(a.device));
      default: throw std::invalid_argument("argument '" + formal.name() + "': unknown tag " + std::to_string(a.tag));
    }
  }

  // The out= overload of `op` when it is one of the ops whose out kernel writes the given buffer
  // directly (and checks its shape), with the functional op's arguments followed by exactly
  // `num_outputs` out tensors. Cached per op name.
  static const c10::OperatorHandle* out_variant(const std::string& full, const c10::OperatorHandle& functional,
                                                size_t num_outputs) {
    static const std::set<std::string> allowed = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"};
    if (!allowed.count(full) || num_outputs != 1) return nullptr;
    static std::mutex mu;
    static std::unordered_map<std::string, std::optional<c10::OperatorHandle>> cache;
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find(full);
    if (it == cache.end()) {
      std::optional<c10::OperatorHandle> h = c10::Dispatcher::singleton().findSchema({full, "out"});
      if (h) {
        const auto& fa = functional.schema().arguments();
        const auto& oa = h->schema().arguments();
        bool same = oa.size() == fa.size() + 1;
        for (size_t i = 0; same && i < fa.size(); ++i) same = oa[i].name() == fa[i].name();
        if (!same) h.reset();
      }
      it = cache.emplace(full, h).first;
    }
    return it->second ? &*it->second : nullptr;
  }

  // The result shape of mm/addmm/bmm/baddbmm from their matrix arguments, against the caller's
  // buffer: an out= kernel would otherwise resize (reallocate) a buffer it does not own.
  static bool out_shape_matches(const std::string& op, const torch::jit::Stack& stack, const DLTensor& out) {
    auto dims = [&](size_t i) {
      return stack[i].isTensor() ? stack[i].toTensor().sizes().vec() : std::vector<int64_t>{};
    };
    std::vector<int64_t> want;
    if (op == "aten::mm") {
      auto a = dims(0), b = dims(1);
      if (a.size() == 2 && b.size() == 2) want = {a[0], b[1]};
    } else if (op == "aten::addmm") {
      auto a = dims(1), b = dims(2);
      if (a.size() == 2 && b.size() == 2) want = {a[0], b[1]};
    } else if (op == "aten::bmm") {
      auto a = dims(0), b = dims(1);
      if (a.size() == 3 && b.size() == 3) want = {a[0], a[1], b[2]};
    } else if (op == "aten::baddbmm") {
      auto a = dims(1), b = dims(2);
      if (a.size() == 3 && b.size() == 3) want = {a[0], a[1], b[2]};
    }
    if (want.empty() || static_cast<size_t>(out.ndim) != want.size()) return false;
    for (size_t d = 0; d < want.size(); ++d)
      if (out.shape[d] != want[d]) return false;
    return true;
  }

  // Whether two CPU/device buffers may share bytes (by their address ranges).
  static bool overlaps(const DLTensor& a, const DLTensor& b) {
    auto range = [](const DLTensor& t) {
      const size_t es = (t.dtype.bits * t.dtype.lanes + 7) / 8;
      int64_t lo = 0, hi = 0, acc = 1;
      for (int d = t.ndim - 1; d >= 0; --d) {
        const int64_t st = t.strides ? t.strides[d] : acc;
        if (t.shape[d] == 0) return std::make_pair<uintptr_t, uintptr_t>(0, 0);
        if (st >= 0) hi += (t.shape[d] - 1) * st;
        else lo += (t.shape[d] - 1) * st;
        acc *= t.shape[d];
      }
      const uintptr_t base = reinterpret_cast<uintptr_t>(t.data) + t.byte_offset;
      return std::make_pair(base + static_cast<uintptr_t>(lo * static_cast<int64_t>(es)),
                            base + static_cast<uintptr_t>((hi + 1) * static_cast<int64_t>(es)));
    };
    const auto ra = range(a), rb = range(b);
    return ra.first < rb.second && rb.first < ra.second;
  }

  static KilnError* call_eager(void*, const char* op, const KilnArg* const* args, size_t num_args, DLTensor* outputs,
                               size_t num_outputs) {
    try {
      if (!op) return make_host_error(KILN_ERROR_INVALID_ARGUMENT, "call_eager: op is NULL");
      std::string full = op;
      std::string name = full, overload;
      if (auto dot = full.find('.'); dot != std::string::npos) {
        name = full.substr(0, dot);
        overload = full.substr(dot + 1);
      }
      auto handle = c10::Dispatcher::singleton().findSchema({name, overload});
      if (!handle) return make_host_error(KILN_ERROR_INVALID_ARGUMENT, "call_eager: no ATen operator '" + full + "'");
      const c10::FunctionSchema& schema = handle->schema();
      const auto& formals = schema.arguments();
      if (num_args != formals.size())
        return make_host_error(KILN_ERROR_INVALID_ARGUMENT, "call_eager: " + full + " takes " +
                                                                std::to_string(formals.size()) + " arguments, got " +
                                                                std::to_string(num_args));
      torch::jit::Stack stack;
      stack.reserve(num_args + num_outputs);
      for (size_t i = 0; i < num_args; ++i) {
        if (!args[i])
          return make_host_error(KILN_ERROR_INVALID_ARGUMENT, "call_eager: argument " + std::to_string(i) + " is NULL");
        stack.push_back(to_ivalue(*args[i], formals[i]));
      }
      // Where the op has a hand-written out= kernel (matmuls), compute straight into the caller's
      // buffers: no result tensor to allocate and no copy.
      if (const auto* out_op = out_variant(full, *handle, num_outputs)) {
        bool ok = outputs[0].data != nullptr && out_shape_matches(full, stack, outputs[0]);
        for (size_t i = 0; i < num_args && ok; ++i)
          if (args[i]->tag == KILN_ARG_TENSOR && args[i]->tensor)
            for (size_t j = 0; j < num_outputs && ok; ++j) ok = !overlaps(*args[i]->tensor, outputs[j]);
        if (ok) {
          for (size_t i = 0; i < num_outputs; ++i) stack.push_back(wrap(&outputs[i]));
          out_op->callBoxed(stack);
          return nullptr;
        }
      }
      handle->callBoxed(stack);

      std::vector<at::Tensor> results;
      for (const auto& v : stack) {
        if (v.isTensor()) {
          results.push_back(v.toTensor());
        } else if (v.isTensorList()) {
          for (const auto& t : v.toTensorList()) results.push_back(t);
        }
      }
      if (results.size() != num_outputs)
        return make_host_error(KILN_ERROR_INVALID_ARGUMENT,
                               "call_eager: " + full + " produced " + std::to_string(results.size()) +
                                   " tensors, the caller gave " + std::to_string(num_outputs) + " outputs");
      for (size_t i = 0; i < num_outputs; ++i) {
        at::Tensor out = wrap(&outputs[i]);
        if (out.sizes() != results[i].sizes() || out.scalar_type() != results[i].scalar_type())
          return make_host_error(
              KILN_ERROR_INVALID_ARGUMENT,
              c10::str("call_eager: ", full, " output ", i, " is ", results[i].scalar_type(), results[i].sizes(),
                       ", the caller's buffer is ", out.scalar_type(), out.sizes()));
        out.copy_(results[i]);
      }
      return nullptr;
    } catch (const c10::Error& e) {
      return make_host_error(KILN_ERROR_INVALID_ARGUMENT,
                             std::string("call_eager: ") + op + ": " + e.what_without_backtrace());
    } catch (const std::exception& e) {
      return make_host_error(KILN_ERROR_INVALID_ARGUMENT, std::string("call_eager: ") + op + ": " + e.what());
    }
  }

  std::mutex mu_;
  std::unordered_map<void*, at::Tensor> blocks_;
};

}  // namespace

std::shared_ptr<HostServices> torch_host_services(const TrainingArguments& args) {
  return std::make_shared<TorchHost>(args.runtime.cache_dir, args.plugin_options);
}

}  // namespace kiln
