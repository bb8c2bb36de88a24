// The neuron backend's compile cache entries on disk: one file per module, holding the StableHLO
// module's text (to tell two modules with the same key apart) and the PJRT executable's serialized
// bytes with their size and hash. Read back only when every part is there and matches; no PJRT or
// LibTorch here, so that the fuzz target and the tests read entries on their own.
#pragma once

#include <optional>
#include <string>

namespace kiln::neuron {

// The entry's executable; nullopt when there is none for `module`. `damaged` gets why an entry that
// was there is not used (cut short, its bytes changed, another format); it stays empty for a miss
// (no file, or another module under the same key). Reads no more than the file holds: sizes in a
// header are checked against the file's size before anything is allocated for them.
std::optional<std::string> read_cache_entry(const std::string& file, const std::string& module, std::string* damaged);

// Written to a temporary name and renamed, so that a concurrent reader sees all of it or nothing.
// False when it could not be written (the temporary file is removed).
bool write_cache_entry(const std::string& file, const std::string& module, const std::string& bytes);

}  // namespace kiln::neuron
