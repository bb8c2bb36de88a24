// The text form of kiln IR. print() and parse() round-trip: parse(print(g)) prints the same text.
// It is what KILN_DEBUG_DIR dumps and what golden tests compare.
//
//   graph {
//     input %0 : f32[512,784]{784,1} param "model.0.weight"
//     input %1 : i64[256]{1} input "target"
//     %2 : f32[784,512]{1,784} = aten::t(%0) forward
//     %3 : f32[]{} = aten::sum(%2, None) backward
//     %4 : f32[2]{1}, %5 : f32[2]{1} = aten::split.Tensor(%3, 2, 0) list forward
//     () = aten::_foreach_add_.Scalar(t[%4, %5], scalar(1.5))
//     %7 : f32[4]{1} &2, _ = aten::some_op($0:scalar(0.5)) optimizer
//     output %3 result "loss"
//     output %9 writeback 0 "model.0.weight"
//   }
//
// Types: dtype[shape]{strides}, then "+offset" when the storage offset is not 0, then
// " on DEVICE" when the device is not the CPU. Constants: None, true/false, integers, reals
// (always with '.', 'e', inf or nan), "strings", i[...], f[...], b[...] and t[...] lists (t for
// tensors, None inside for absent elements), scalar(x) for Scalar parameters, dtype(f32),
// device("cuda:0"), layout(N), memory_format(N). "$N:" before a scalar makes it run-time scalar N
// (declared first as `scalar $N float "name"`), bound on every call; "&N" after a type gives the
// value's storage id (values with one id share memory; only before functionalization); "_" is an
// undefined tensor result.
#pragma once

#include <stdexcept>
#include <string>

#include "kiln/ir.h"

namespace kiln::ir {

std::string print(const Graph& g);
std::string print_type(const TensorMeta& m);
std::string print_arg(const Arg& a);
const char* dtype_short_name(c10::ScalarType t);

// Throws ParseError with "line:column: message".
Graph parse(const std::string& text);

class ParseError : public std::runtime_error {
 public:
  ParseError(int line, int column, const std::string& message);
  int line() const { return line_; }
  int column() const { return column_; }

 private:
  int line_, column_;
};

}  // namespace kiln::ir
