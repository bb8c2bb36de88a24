// What kiln needs to know about an ATen operator, asked of the dispatcher once and cached:
// whether it exists, mutates or aliases its arguments, or draws random numbers.
#pragma once

#include <string>

namespace c10 {
class OperatorHandle;
}

namespace kiln {

struct OpInfo {
  bool found = false;                           // registered with the dispatcher
  bool is_mutable = false;                      // writes to an argument (in-place or out=)
  bool is_view = false;                         // a result aliases an argument without writing
  bool nondeterministic = false;                // draws from a random generator: never merged or removed
  const c10::OperatorHandle* handle = nullptr;  // stable for the life of the process
};

// `op` is "aten::add.Tensor" (name and overload) or "aten::relu" (default overload).
const OpInfo& op_info(const std::string& op);

// True when a node of this op can be removed when unused, or merged with an identical one.
inline bool op_is_pure(const OpInfo& i) { return i.found && !i.is_mutable && !i.nondeterministic; }

namespace ir {
struct Node;
}

// Whether this node draws from a random generator when it runs: a nondeterministic_seeded op,
// unless its dropout probability is 0 (the attention kernels draw only when dropout_p > 0) or it
// is a dropout not in training. Such nodes run on ATen's kernels, in captured order, so that they
// draw what the eager step draws.
bool node_draws_random_numbers(const ir::Node& n);

// Whether this node issues one of c10d's functional collectives (data parallelism's all_reduce),
// as opposed to waiting for one (wait_tensor).
bool node_issues_collective(const ir::Node& n);

}  // namespace kiln
