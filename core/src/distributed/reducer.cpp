// The gradient reducer: after the backward, inside the step, every gradient becomes the average over
// the ranks, bucket by bucket, through c10d's functional collectives. Called from the step function,
// so the eager step runs these ops and a capture records them: cat, div, the all_reduce and its
// wait_tensor, then the views that become the gradients.
#include <functional>
#include <map>
#include <mutex>
#include <sstream>
#include <tuple>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/zeros_like.h>
#include <c10/util/StringUtil.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "ddp.h"
#include "kiln/log.h"

namespace kiln::distributed {

namespace {

const c10::OperatorHandle& functional_op(const char* name) {
  static std::map<std::string, c10::OperatorHandle> ops;
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  auto it = ops.find(name);
  if (it == ops.end()) it = ops.emplace(name, c10::Dispatcher::singleton().findSchemaOrThrow(name, "")).first;
  return it->second;
}

at::Tensor all_reduce_sum(const at::Tensor& t, const std::string& group) {
  std::vector<c10::IValue> stack{t, std::string("sum"), group};
  functional_op("_c10d_functional::all_reduce").callBoxed(stack);
  std::vector<c10::IValue> wait{stack.at(0)};
  functional_op("_c10d_functional::wait_tensor").callBoxed(wait);
  return wait.at(0).toTensor();
}

std::string shape_text(const at::Tensor& t) {
  std::ostringstream os;
  os << t.sizes() << " " << t.scalar_type() << " " << t.device();
  return os.str();
}

}  // namespace

std::vector<Bucket> assign_buckets(const std::vector<at::Tensor>& params, int64_t cap_bytes) {
  constexpr int64_t kFirstBucketBytes = 1 << 20;
  // Per dtype and device, in reverse parameter order (the order the backward makes gradients, about).
  std::vector<Bucket> done;
  std::map<std::tuple<int, int, int>, std::pair<Bucket, int64_t>> open;  // key -> (bucket, bytes)
  std::map<std::tuple<int, int, int>, int> made;
  for (size_t k = params.size(); k-- > 0;) {
    const auto& p = params[k];
    const auto key = std::make_tuple(static_cast<int>(p.scalar_type()), static_cast<int>(p.device().type()),
                                     static_cast<int>(p.device().index()));
    auto& [bucket, bytes] = open[key];
    bucket.params.push_back(k);
    bucket.numel += p.numel();
    bytes += p.numel() * static_cast<int64_t>(p.element_size());
    const int64_t cap = made[key] == 0 ? std::min(kFirstBucketBytes, cap_bytes) : cap_bytes;
    if (bytes >= cap) {
      done.push_back(std::move(bucket));
      open.erase(key);
      ++made[key];
    }
  }
  for (auto& [key, b] : open)
    if (!b.first.params.empty()) done.push_back(std::move(b.first));
  return done;
}

GradientReducer::GradientReducer(std::shared_ptr<Group> group, int64_t bucket_cap_mb, bool find_unused_parameters)
    : group_(std::move(group)), cap_bytes_(bucket_cap_mb << 20), find_unused_(find_unused_parameters) {}

void GradientReducer::broadcast(const std::vector<std::pair<std::string, at::Tensor>>& named) const {
  std::string text;
  for (const auto& [name, t] : named) text += name + " " + shape_text(t) + "\n";
  if (group_->store) {
    const auto all = group_->exchange("model", text);
    std::string differ;
    for (size_t r = 0; r < all.size(); ++r)
      if (all[r] != all[0]) differ += (differ.empty() ? "" : ", ") + std::to_string(r);
    if (!differ.empty())
      throw DistributedError(c10::str("kiln: rank ", group_->rank, ": the ranks' models differ (rank ", differ,
                                      " against rank 0): every rank must train the same parameters and buffers, "
                                      "with the same names, shapes and dtypes. Rank 0 has:\n",
                                      all[0], "this rank:\n", text));
  }
  c10d::BroadcastOptions opts;
  opts.rootRank = 0;
  opts.timeout = group_->timeout;
  std::vector<at::Tensor> ts;
  for (const auto& [name, t] : named) ts.push_back(t.detach());
  try {
    for (auto& t : ts) {
      std::vector<at::Tensor> one{t};
      group_->pg->broadcast(one, opts)->wait();
    }
  } catch (const std::exception& e) {
    throw DistributedError(c10::str("kiln: rank ", group_->rank, ": broadcasting the parameters from rank 0 (",
                                    group_->backend, ") failed: ", e.what(), "; ", group_->diagnose("broadcast")));
  }
}

void GradientReducer::reduce(const std::vector<std::pair<std::string, at::Tensor>>& named) {
  std::vector<at::Tensor> params;
  std::vector<std::string> names;
  std::string layout;
  for (const auto& [name, p] : named) {
    if (!p.requires_grad()) continue;
    params.push_back(p);
    names.push_back(name);
    layout += name + " " + shape_text(p) + "\n";
  }
  if (layout != layout_) {
    buckets_ = assign_buckets(params, cap_bytes_);
    std::string text = layout;
    for (size_t b = 0; b < buckets_.size(); ++b) text += c10::str("bucket ", b, ": ", buckets_[b].numel, "\n");
    // Every rank must reduce the same buckets: checked through the store before the first collective.
    if (group_->store) {
      const auto all = group_->exchange(c10::str("layout.", checks_++), text);
      std::string differ;
      for (size_t r = 0; r < all.size(); ++r)
        if (all[r] != all[0]) differ += (differ.empty() ? "" : ", ") + std::to_string(r);
      if (!differ.empty())
        throw DistributedError(c10::str("kiln: rank ", group_->rank, ": the ranks' gradients differ (rank ", differ,
                                        " against rank 0): every rank must train the same parameters, with the same "
                                        "names, shapes and dtypes. Rank 0 reduces:\n",
                                        all[0], "this rank:\n", text));
    }
    layout_ = layout;
    log_debug(c10::str("kiln: ", params.size(), " parameters' gradients averaged over ", group_->size, " ranks in ",
                       buckets_.size(), " buckets"));
  }
  const double world = static_cast<double>(group_->size);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const auto& bucket = buckets_[b];
    std::vector<at::Tensor> flat;
    for (size_t k : bucket.params) {
      const auto& p = params[k];
      at::Tensor g = p.grad();
      if (!g.defined()) {
        if (!find_unused_)
          throw DistributedError(
              c10::str("kiln: rank ", group_->rank, ": the parameter '", names[k],
                       "' got no gradient in this step; set ddp_find_unused_parameters = true to average it as zero"));
        g = at::zeros_like(p, at::TensorOptions(), at::MemoryFormat::Contiguous);
      }
      flat.push_back(g.reshape({-1}));
    }
    at::Tensor reduced;
    try {
      reduced = all_reduce_sum(at::cat(flat).div(world), group_->name);
    } catch (const std::exception& e) {
      throw DistributedError(c10::str("kiln: rank ", group_->rank, ": all_reduce of gradient bucket ", b, " of ",
                                      buckets_.size(), " (", bucket.numel, " elements, ", group_->backend,
                                      ") failed: ", e.what(), "; ", group_->diagnose("failed")));
    }
    int64_t offset = 0;
    for (size_t k : bucket.params) {
      auto p = params[k];
      const int64_t n = p.numel();
      // Into the gradient where it is, so that a compiled step that adds into it keeps reading
      // the same tensor (gradient accumulation's micro-step); a tensor of its own otherwise, not a
      // view of the bucket: LibTorch's Optimizer::zero_grad detaches every gradient in place,
      // which a view refuses.
      const at::Tensor mean = reduced.narrow(0, offset, n).view(p.sizes());
      if (p.grad().defined()) {
        at::NoGradGuard no_grad;
        p.mutable_grad().copy_(mean);
      } else {
        p.mutable_grad() = mean.clone();
      }
      offset += n;
    }
  }
}

}  // namespace kiln::distributed
