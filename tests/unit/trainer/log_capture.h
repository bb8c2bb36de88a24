// Collects what kiln logs while alive (a sink on the "kiln" logger). Kept out of LibTorch TUs.
#pragma once
#include <memory>
#include <string>
#include <vector>

class LogCapture {
 public:
  LogCapture();
  ~LogCapture();
  // Warnings logged so far.
  std::vector<std::string> warnings() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};
