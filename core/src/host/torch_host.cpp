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
#include <unordered_map>

#include "kiln/host_services.h"
#include "kiln/plugin_api.h"

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
    api_.device_alloc = &TorchHost::device_alloc;
    api_.device_free = &TorchHost::device_free;
    api_.call_eager = &TorchHost::call_eager;
  }

 private:
  static TorchHost* self(void* ctx) { return static_cast<TorchHost*>(static_cast<HostServices*>(ctx)); }

  // A byte tensor holds each block, so CPU and CUDA (the caching allocator, on the current stream)
  // go through the same allocator path that LibTorch itself uses.
  static KilnError* device_alloc(void* ctx, DLDevice device, size_t nbytes, void*, void** out) {
    if (!out) return make_host_error(KILN_ERROR_INVALID_ARGUMENT, "device_alloc: out is NULL");
    *out = nullptr;
    try {
      at::Tensor block = at::empty({static_cast<int64_t>(nbytes == 0 ? 1 : nbytes)},
                                   at::TensorOptions().dtype(at::kByte).device(to_device(device)));
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
      default:
        throw std::invalid_argument("argument '" + formal.name() + "': unknown tag " + std::to_string(a.tag));
    }
  }

  static KilnError* call_eager(void*, const char* op, const KilnArg* const* args, size_t num_args,
                               DLTensor* outputs, size_t num_outputs) {
    try {
      if (!op) return make_host_error(KILN_ERROR_INVALID_ARGUMENT, "call_eager: op is NULL");
      std::string full = op;
      std::string name = full, overload;
      if (auto dot = full.find('.'); dot != std::string::npos) {
        name = full.substr(0, dot);
        overload = full.substr(dot + 1);
      }
      auto handle = c10::Dispatcher::singleton().findSchema({name, overload});
      if (!handle)
        return make_host_error(KILN_ERROR_INVALID_ARGUMENT, "call_eager: no ATen operator '" + full + "'");
      const c10::FunctionSchema& schema = handle->schema();
      const auto& formals = schema.arguments();
      if (num_args != formals.size())
        return make_host_error(KILN_ERROR_INVALID_ARGUMENT,
                               "call_eager: " + full + " takes " + std::to_string(formals.size()) +
                                   " arguments, got " + std::to_string(num_args));
      torch::jit::Stack stack;
      stack.reserve(num_args);
      for (size_t i = 0; i < num_args; ++i) {
        if (!args[i]) return make_host_error(KILN_ERROR_INVALID_ARGUMENT, "call_eager: argument " + std::to_string(i) + " is NULL");
        stack.push_back(to_ivalue(*args[i], formals[i]));
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
          return make_host_error(KILN_ERROR_INVALID_ARGUMENT,
                                 c10::str("call_eager: ", full, " output ", i, " is ", results[i].scalar_type(),
                                          results[i].sizes(), ", the caller's buffer is ", out.scalar_type(),
                                          out.sizes()));
        out.copy_(results[i]);
      }
      return nullptr;
    } catch (const c10::Error& e) {
      return make_host_error(KILN_ERROR_INVALID_ARGUMENT, std::string("call_eager: ") + op + ": " + e.what_without_backtrace());
    } catch (const std::exception& e) {
      return make_host_error(KILN_ERROR_INVALID_ARGUMENT, std::string("call_eager: ") + op + ": " + e.what());
    }
  }

  std::mutex mu_;
  std::unordered_map<void*, at::Tensor> blocks_;
};

}  // namespace

std::shared_ptr<HostServices> torch_host_services(const TrainingArguments& args) {
  return std::make_shared<TorchHost>(args.cache_dir, args.plugin_options);
}

}  // namespace kiln
