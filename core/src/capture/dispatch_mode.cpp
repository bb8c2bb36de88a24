// The PyInterpreter that is not Python: LibTorch's Python-key fallback calls
// `pyinterpreter()->dispatch(op, stack)` on the top mode of TorchDispatchModeTLS. The mode's
// PyObject* is never dereferenced by LibTorch (incref/decref are ours), so it carries a pointer to
// the ModeHandler instead.
#include "dispatch_mode.h"

#include <stdexcept>
#include <string>

#include <c10/core/SafePyObject.h>
#include <c10/core/impl/PyInterpreter.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <c10/util/Exception.h>

namespace kiln::capture_detail {
namespace {

using c10::impl::PyInterpreter;
using c10::impl::TorchDispatchModeTLS;

[[noreturn]] void not_python(const char* what) {
  TORCH_INTERNAL_ASSERT(false, "kiln's dispatch mode is not a Python interpreter: ", what,
                        " was called (a Python tensor subclass reached kiln's capture?)");
}

PyInterpreter& interpreter();

// Re-pushes the popped mode when the kernel returns or throws.
struct Repush {
  std::shared_ptr<c10::impl::PyObject_TorchDispatchMode> mode;
  ~Repush() { TorchDispatchModeTLS::push_non_infra_mode_onto_stack(std::move(mode)); }
};

struct KilnVTable final : c10::impl::PyInterpreterVTable {
  std::string name() const override { return "kiln-dispatch-mode"; }
  void incref(PyObject*) const override {}
  void decref(PyObject*) const override {}
  bool try_incref(const c10::impl::PyObjectSlot&) const override { return false; }
  size_t refcnt(PyObject*) const override { return 1; }
  // TensorImpl::shallow_copy_and_detach asks the top mode first; null means "do the usual copy".
  c10::intrusive_ptr<c10::TensorImpl> detach(const c10::TensorImpl*) const override { return {}; }

  void dispatch(const c10::OperatorHandle& op, torch::jit::Stack* stack) const override {
    auto mode = TorchDispatchModeTLS::pop_stack();
    Repush repush{mode};
    auto* handler = reinterpret_cast<ModeHandler*>(mode->ptr(&interpreter()));
    handler->on_dispatch(op, stack);
  }

  void reportErrorCallback(PyObject*, c10::DispatchKey) const override { not_python("reportErrorCallback"); }
  void python_op_registration_trampoline(const c10::OperatorHandle&, c10::DispatchKey, c10::DispatchKeySet,
                                         torch::jit::Stack*, bool, bool) const override {
    not_python("python_op_registration_trampoline");
  }
  void throw_abstract_impl_not_imported_error(std::string opname, const char*, const char*) const override {
    not_python("throw_abstract_impl_not_imported_error");
  }
  void python_dispatcher(const c10::OperatorHandle&, c10::DispatchKeySet, torch::jit::Stack*) const override {
    not_python("python_dispatcher");
  }
  bool is_contiguous(const c10::TensorImpl*, at::MemoryFormat) const override { not_python("is_contiguous"); }
  c10::SymBool sym_is_contiguous(const c10::TensorImpl*, at::MemoryFormat) const override {
    not_python("sym_is_contiguous");
  }
  bool is_strides_like(const c10::TensorImpl*, at::MemoryFormat) const override { not_python("is_strides_like"); }
  bool is_non_overlapping_and_dense(const c10::TensorImpl*) const override {
    not_python("is_non_overlapping_and_dense");
  }
  c10::Device device(const c10::TensorImpl*) const override { not_python("device"); }
  int64_t dim(const c10::TensorImpl*) const override { not_python("dim"); }
  c10::IntArrayRef strides(const c10::TensorImpl*) const override { not_python("strides"); }
  c10::IntArrayRef sizes(const c10::TensorImpl*) const override { not_python("sizes"); }
  c10::SymIntArrayRef sym_sizes(const c10::TensorImpl*) const override { not_python("sym_sizes"); }
  c10::Layout layout(const c10::TensorImpl*) const override { not_python("layout"); }
  int64_t numel(const c10::TensorImpl*) const override { not_python("numel"); }
  c10::SymInt sym_numel(const c10::TensorImpl*) const override { not_python("sym_numel"); }
  c10::SymIntArrayRef sym_strides(const c10::TensorImpl*) const override { not_python("sym_strides"); }
  c10::SymInt sym_storage_offset(const c10::TensorImpl*) const override { not_python("sym_storage_offset"); }

  void trace_gpu_event_creation(c10::DeviceType, uintptr_t) const override {}
  void trace_gpu_event_deletion(c10::DeviceType, uintptr_t) const override {}
  void trace_gpu_event_record(c10::DeviceType, uintptr_t, uintptr_t) const override {}
  void trace_gpu_event_wait(c10::DeviceType, uintptr_t, uintptr_t) const override {}
  void trace_gpu_memory_allocation(c10::DeviceType, uintptr_t) const override {}
  void trace_gpu_memory_deallocation(c10::DeviceType, uintptr_t) const override {}
  void trace_gpu_stream_creation(c10::DeviceType, uintptr_t) const override {}
  void trace_gpu_device_synchronization(c10::DeviceType) const override {}
  void trace_gpu_stream_synchronization(c10::DeviceType, uintptr_t) const override {}
  void trace_gpu_event_synchronization(c10::DeviceType, uintptr_t) const override {}
  void reset_backward_hooks(const c10::TensorImpl*) const override {}
};

// Leaked on purpose, as LibTorch's own interpreters are: tensors and modes may point at it until
// the process ends.
PyInterpreter& interpreter() {
  static auto* vtable = new KilnVTable();
  static auto* interp = new PyInterpreter(vtable);
  return *interp;
}

}  // namespace

ModeGuard::ModeGuard(ModeHandler* handler) {
  auto mode =
      std::make_shared<c10::impl::PyObject_TorchDispatchMode>(reinterpret_cast<PyObject*>(handler), &interpreter());
  TorchDispatchModeTLS::push_non_infra_mode_onto_stack(std::move(mode));
  pushed_ = true;
}

ModeGuard::~ModeGuard() {
  if (pushed_) TorchDispatchModeTLS::pop_stack();
}

}  // namespace kiln::capture_detail
