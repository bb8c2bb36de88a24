// Padding a symbolic group to a bucket of sizes. XLA compiles for static shapes, and on Trainium a
// compile takes minutes, so a group whose sizes change is compiled once per bucket (each size symbol
// rounded up, to a power of two by default) instead of once per size: the module computes at the
// bucket's sizes, on inputs padded with zeros, and is told the real sizes as parameters. Padding
// must not reach a real result, so every element a real result depends on across a padded dim is
// kept from it: before a reduction or contraction over a padded dim, its operand's padded elements
// are replaced by a value that does not change the result (0 for a sum or a product's sum, -inf
// before a softmax's max, ignore_index for a loss's targets); a mean divides by the real count; a
// number that follows the sizes (a mean's 1/n spelt as a scalar) is computed from the real sizes.
// Everything else computes per element, so the padded elements of its result are garbage that stays
// where it is, and the outputs' real parts are copied out.
//
// The plan follows each dim of every value through the group as a list of factors (a view that
// merges [B, T] into [B*T] keeps both: row b*T_bucket + t is real when b < B and t < T). A group
// with an op whose result would mix padded elements into real ones in a way the plan does not know
// (a cat or a split along a padded dim, a convolution or a pooling window over one, a slice that
// cuts one short) gets no plan, and is compiled for each size it meets instead.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <kiln/plugin_api.hpp>

namespace kiln::neuron {

// A number that follows a symbolic group's sizes, in a size site's form: num * (the product of the
// factors' symbols) / den + constant. A constant has no factors.
struct SizeExpr {
  int64_t num = 0, den = 1, constant = 0;
  std::vector<int32_t> factors;  // sorted

  static SizeExpr fixed(int64_t n);
  static SizeExpr of(const KilnSizeSite& s);
  bool symbolic() const { return num != 0 && !factors.empty(); }
  int64_t at(const std::vector<int64_t>& sizes) const;
  std::string text() const;  // "2*s0*s1/3+1", for messages and keys
  bool operator==(const SizeExpr& o) const {
    return num == o.num && den == o.den && constant == o.constant && factors == o.factors;
  }
};

// One factor of a dim: `bucket` elements in the padded module, of which the first real.at(sizes)
// are real.
struct SubDim {
  int64_t bucket = 1;
  SizeExpr real;
};
// A dim's factors, outermost first; the product of their buckets is the dim's size in the module.
using PaddedDim = std::vector<SubDim>;

bool same_padding(const PaddedDim& a, const PaddedDim& b);
bool is_padded(const PaddedDim& d);            // some factor follows the sizes
std::string padding_text(const PaddedDim& d);  // "[8 x s0 of 32]", for messages

struct PaddingPlan {
  // Every value's dims, by value index (empty for a value the group does not compute).
  std::vector<std::vector<PaddedDim>> values;
  // What a node reads in place of one of its operands: the operand with its padded elements along
  // `dims` replaced by `fill` (or `int_fill`, for int64 targets).
  struct Mask {
    int64_t value = -1;
    std::vector<int64_t> dims;
    double fill = 0;
    bool integer = false;
    int64_t int_fill = 0;
  };
  std::map<int64_t, std::vector<Mask>> masks;  // by node index
  // A Scalar argument that follows the sizes (node index, argument index), read from the real sizes.
  std::map<std::pair<int64_t, int64_t>, KilnSizeSite> scalar_sites;
  size_t num_symbols = 0;
};

// The plan for `bucketed`, the symbolic view `symbolic` made concrete at a bucket of sizes
// (kiln::plugin::ConcreteGraph), or nullopt and why not.
std::optional<PaddingPlan> plan_padding(const kiln::plugin::Graph& symbolic, const kiln::plugin::Graph& bucketed,
                                        std::string* why);

// The size symbols' bucket under `policy`: "pow2" (each rounded up to a power of two), a positive
// integer N (each rounded up to a multiple of N), or "exact" (no padding). Throws
// kiln::plugin::Error for another text.
std::vector<int64_t> bucket_sizes(const std::string& policy, const std::vector<int64_t>& sizes);
void check_bucket_policy(const std::string& policy);

}  // namespace kiln::neuron
