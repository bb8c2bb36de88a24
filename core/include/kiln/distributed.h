// Data-parallel training on c10d (docs/distributed.md). A Trainer finds its world in the torchrun
// environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) or is handed a c10d process
// group; then every step averages the gradients across the ranks, in buckets, with c10d's
// functional collectives, inside the step (so they are nodes of the compiled graph).
//
// This header is only needed to hand kiln a process group of your own or to read the world; a
// program run by torchrun needs nothing but kiln/trainer.h.
#pragma once

#include <memory>
#include <stdexcept>
#include <string>

#include <c10/util/intrusive_ptr.h>

#include "kiln/config.h"

namespace c10d {
class ProcessGroup;
class Store;
}  // namespace c10d

namespace kiln {

// A collective that failed or timed out (a rank died or hangs), ranks that disagree on what the
// step reduces, or a world that cannot be set up. what() names this rank, the collective and,
// where it is known, the rank at fault.
class DistributedError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace distributed {

// This process's place in the world, from the torchrun environment.
struct WorldInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr;
  int master_port = 0;
};

// RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT. WORLD_SIZE unset (or 1): a world of one.
// A value that is not a number or is out of range throws ConfigError naming the variable.
WorldInfo world_from_env();

// kiln's data-parallel group: a c10d process group registered for the functional collectives,
// the store (when kiln made the group or was given one) and the timeout.
class Group;

// The process-wide group of the torchrun environment, made at the first call (TCPStore rendezvous
// at MASTER_ADDR:MASTER_PORT, then a Gloo or NCCL process group; `args` gives ddp_backend and
// ddp_timeout); null when WORLD_SIZE is unset or 1. Later calls return the same group.
std::shared_ptr<Group> group_from_env(const TrainingArguments& args, const std::string& device_type = "cpu");

// A group over a process group the program made itself. `store` (may be null) lets kiln compare the
// ranks' compiled steps through it; without one that check is skipped.
std::shared_ptr<Group> group_from(const c10::intrusive_ptr<c10d::ProcessGroup>& process_group,
                                  const TrainingArguments& args, const c10::intrusive_ptr<c10d::Store>& store);

int rank(const Group& group);
int world_size(const Group& group);

}  // namespace distributed
}  // namespace kiln
