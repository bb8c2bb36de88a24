// libFuzzer target: kiln IR's text parser (ir::parse), which reads `.kir` files, golden tests and
// debug dumps. Any input must either parse or throw ParseError (or std::invalid_argument from the
// graph's own checks) - never crash, overrun or hang - and what parses must round-trip: printing it,
// parsing the print and printing again gives the same text (the contract in ir_text.h).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <stdexcept>
#include <string>

#include "kiln/internal/ir_text.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 1 << 16) return 0;  // the parser is linear; long inputs only slow the search
  const std::string text(reinterpret_cast<const char*>(data), size);
  kiln::ir::Graph g;
  try {
    g = kiln::ir::parse(text);
  } catch (const kiln::ir::ParseError&) {
    return 0;
  } catch (const std::invalid_argument&) {
    return 0;
  } catch (const std::out_of_range&) {
    return 0;
  }
  const std::string once = kiln::ir::print(g);
  std::string twice;
  try {
    twice = kiln::ir::print(kiln::ir::parse(once));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "printed graph does not parse back: %s\n%s\n", e.what(), once.c_str());
    std::abort();
  }
  if (twice != once) {
    std::fprintf(stderr, "round trip changed the text:\n%s\n---\n%s\n", once.c_str(), twice.c_str());
    std::abort();
  }
  return 0;
}
