// JSON string literals for kiln's command line, reports and the conformance runner (one escaping
// rule everywhere: quotes, backslashes and every control character escaped; other bytes pass
// through, so callers that may hold invalid UTF-8 clean it first). No LibTorch.
#pragma once

#include <string>

namespace kiln {

std::string json_escape(const std::string& s);  // the characters between the quotes
std::string json_quote(const std::string& s);   // a whole string literal, quotes included

}  // namespace kiln
