// kiln's C++ dispatch mode: a c10::impl::PyInterpreterVTable whose `dispatch` hands every ATen
// call below autograd to a ModeHandler. Private to core/src/capture.
#pragma once

#include <memory>

#include <ATen/core/dispatch/Dispatcher.h>

namespace kiln::capture_detail {

class ModeHandler {
 public:
  virtual ~ModeHandler() = default;
  // Called with the mode popped: the handler may run the op with op.callBoxed(stack) without
  // seeing it again. Nested calls made by kernels never reach the handler.
  virtual void on_dispatch(const c10::OperatorHandle& op, torch::jit::Stack* stack) = 0;
};

// Pushes `handler` on this thread's dispatch-mode stack for its lifetime; autograd's engine
// copies the stack to the threads it runs a backward on.
class ModeGuard {
 public:
  explicit ModeGuard(ModeHandler* handler);
  ~ModeGuard();
  ModeGuard(const ModeGuard&) = delete;
  ModeGuard& operator=(const ModeGuard&) = delete;

 private:
  bool pushed_ = false;
};

}  // namespace kiln::capture_detail
