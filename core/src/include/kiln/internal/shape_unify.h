// Shape-generic steps from two captures: the first building block of dynamic shapes.
//
// A step captured at two input shapes records the same ops in the same order whenever its code does
// not branch on sizes; what differs between the two graphs is exactly the integers derived from the
// sizes that changed: value shapes and strides, view/reshape/expand sizes, split sections, the
// numel a mean divides by. unify_captures() lines the two graphs up node by node and writes each
// differing integer as an expression over size symbols (the input dimensions that changed), and
// specialise() makes the graph for any other sizes from those expressions, without running the
// step again. How a differing integer is fitted, in order of preference:
//   c * m          (m a symbol or a product of two; c a small rational)
//   c * m + k      (k an integer)
// where an expression of a lower class that fits both captures wins; within a class the simplest
// (smallest |c| + denominator + |k|: T - 1 over 127 - 8*B when both changed from (8, 64) to
// (4, 96)), and a tie makes the unification fail as ambiguous. A floating-point argument is fitted the same way, as
// an integer or as the reciprocal of one (a mean's 1/numel).
//
// What two captures cannot show: an integer that depends on a size but is equal in both (B // 16
// at B = 8 and 12); a branch on a size that the second capture happens not to take. A caller that
// trusts a specialisation checks it against the step once (the eager executor's meta check), as
// the tests check it against a real capture at a third shape neither capture saw. Sizes 0 and 1
// stay specialised, as in PyTorch: specialise() refuses a symbol below 2.
//
// No LibTorch beyond the IR's c10 types; internal to kiln.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kiln/ir.h"

namespace kiln::ir {

// Dimension `dim` of the graph input named `input` (a user input: "input.0").
struct SizeSymbol {
  std::string input;
  int32_t dim = 0;
};

// num / den * (product of the symbols in `monomial`) + constant; or, for a floating-point argument
// with `reciprocal`, 1 over that.
struct SizeExpr {
  std::vector<int32_t> monomial;  // symbol indices, sorted; empty: constant only
  int64_t num = 0, den = 1;
  int64_t constant = 0;
  bool reciprocal = false;

  // The value at `sizes` (one per symbol); nullopt when it is not an integer there.
  std::optional<int64_t> eval(const std::vector<int64_t>& sizes) const;
  // "s0*s1", "64*s0 + 3", "1/(s0*s1)"
  std::string str() const;
};

// Where in the graph a size-derived number sits.
struct SizeSite {
  enum class Kind : uint8_t {
    Shape,   // values[at].meta.shape[elem]
    Stride,  // values[at].meta.strides[elem]
    Offset,  // values[at].meta.storage_offset
    Int,     // nodes[at].args[arg].i
    Ints,    // nodes[at].args[arg].ints[elem]
    Double,  // nodes[at].args[arg].d
  };
  Kind kind = Kind::Shape;
  int32_t at = 0;
  int32_t arg = -1;
  int32_t elem = -1;
  SizeExpr expr;
};

struct SymbolicStep {
  Graph graph;                       // the first capture, whose numbers are the hints
  std::vector<SizeSymbol> symbols;   // s0, s1, ...
  std::vector<int64_t> first_sizes;  // the symbols' values in `graph`
  std::vector<SizeSite> sites;

  // The symbols' values for a graph whose user inputs have these shapes (read by input name),
  // nullopt when an input or dimension is missing.
  std::optional<std::vector<int64_t>> sizes_of(const Graph& g) const;
  // "s0 = input.0 dim 0, s1 = input.0 dim 1"
  std::string symbols_text() const;
};

struct UnifyResult {
  std::optional<SymbolicStep> step;
  std::string failure;  // why not, naming the node, argument or value; "" on success
};

// The shape-generic form of two captures of one step at different input sizes.
UnifyResult unify_captures(const Graph& a, const Graph& b);

// The graph at `sizes` (one per symbol). Throws std::invalid_argument naming the symbol or the site
// when a symbol is below 2 or a site's expression is not an integer there.
Graph specialise(const SymbolicStep& step, const std::vector<int64_t>& sizes);

}  // namespace kiln::ir
