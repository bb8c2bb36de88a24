// What kiln logs at warning level or above while alive, the plugins' loggers included. Kept out of
// LibTorch translation units: it sees spdlog, which LibTorch's bundled fmt clashes with.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace programs {

class KilnLog {
 public:
  KilnLog();
  ~KilnLog();
  KilnLog(const KilnLog&) = delete;
  KilnLog& operator=(const KilnLog&) = delete;

  // "warning kiln: ..." lines (and errors), oldest first.
  std::vector<std::string> warnings() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace programs
