// The JSON kiln writes and reads (the command line's --json, metrics.jsonl, trainer_state.json, the
// conformance report), through nlohmann/json: one escaping and one number format everywhere. Internal:
// the public headers stay free of it, a program that includes kiln.h never compiles it. No LibTorch.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace kiln {

// Objects keep their keys in the order they were set: the order the docs list them in.
using Json = nlohmann::ordered_json;

// The text of `value`: on one line when `indent` < 0 (JSON Lines, `--json` on stdout), else
// indented by that many spaces. Non-ASCII UTF-8 is written as it is; bytes that are not UTF-8 (a
// device name from a broken sysfs tree, a path) become U+FFFD, where nlohmann would throw, so the
// document is always valid JSON.
inline std::string json_text(const Json& value, int indent = -1) {
  return value.dump(indent, ' ', /*ensure_ascii=*/false, Json::error_handler_t::replace);
}

}  // namespace kiln
