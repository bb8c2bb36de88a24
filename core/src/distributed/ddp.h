// Data-parallel training, inside kiln: the group (a c10d process group registered for the
// functional collectives, the store, the timeout) and the gradient reducer the Trainer's step
// calls after the backward. Internal to the core; docs/distributed.md describes the behaviour.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>

#include "kiln/distributed.h"

namespace kiln::distributed {

class Group {
 public:
  c10::intrusive_ptr<c10d::ProcessGroup> pg;
  c10::intrusive_ptr<c10d::Store> store;  // null for a process group handed in without one
  std::string name;                       // the name the functional collectives find the group by
  std::string backend;                    // "gloo" or "nccl"
  int rank = 0;
  int size = 1;
  std::chrono::milliseconds timeout{0};
  int64_t exchanges = 0;  // made so far

  ~Group();

  // Every rank posts `value` under `topic` through the store and gets every rank's, by rank; waits
  // at most `timeout`, then throws DistributedError naming the ranks that did not post. The ranks
  // make the same exchanges in the same order, so each gets a key of its own (the topic and its
  // number). Never goes through the dispatcher, so it may run while a step is captured.
  std::vector<std::string> exchange(const std::string& topic, const std::string& value);

  // After a step failed on this rank: which other ranks are still answering (each survivor posts
  // under `topic` and waits a few seconds for the others). A sentence for the error message.
  std::string diagnose(const std::string& topic) const;

  // The mean of `v` over the ranks, through the process group (outside any step).
  double mean(double v, const std::string& what) const;
};

// group_from() without a store.
std::shared_ptr<Group> group_without_store(const c10::intrusive_ptr<c10d::ProcessGroup>& process_group,
                                           const TrainingArguments& args);

// The parameters, their order and their buckets: c10d's reducer's assignment (reverse parameter
// order, per dtype and device, the first bucket of each at most 1 MiB, the others at most
// `cap_bytes`).
struct Bucket {
  std::vector<size_t> params;  // indices into the parameter list
  int64_t numel = 0;
};
std::vector<Bucket> assign_buckets(const std::vector<at::Tensor>& params, int64_t cap_bytes);

class GradientReducer {
 public:
  GradientReducer(std::shared_ptr<Group> group, int64_t bucket_cap_mb, bool find_unused_parameters);

  // Rank 0's values into every rank's tensors (parameters and buffers, at the start). First every
  // rank's names, shapes and dtypes are compared through the store: a rank with another model is
  // named before any collective runs.
  void broadcast(const std::vector<std::pair<std::string, at::Tensor>>& named) const;

  // After the backward, inside the step: every parameter's gradient becomes the average over the
  // ranks (each bucket flattened, divided by the world size, all-reduced with
  // _c10d_functional::all_reduce and wait_tensor; each gradient copied out of the reduced bucket).
  // The first call with a set of parameters checks, through the store, that every rank reduces
  // the same parameters in the same buckets.
  void reduce(const std::vector<std::pair<std::string, at::Tensor>>& params);

  const Group& group() const { return *group_; }
  size_t num_buckets() const { return buckets_.size(); }

 private:
  std::shared_ptr<Group> group_;
  int64_t cap_bytes_;
  bool find_unused_;
  std::string layout_;  // the parameters' names and shapes the buckets were made for
  std::vector<Bucket> buckets_;
  int checks_ = 0;
};

}  // namespace kiln::distributed
