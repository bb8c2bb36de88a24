#include "progress.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include <sys/ioctl.h>
#include <unistd.h>

#include "kiln/log.h"

namespace kiln {
namespace {

using Clock = std::chrono::steady_clock;

int terminal_width() {
  struct winsize w {};
  if (::ioctl(STDERR_FILENO, TIOCGWINSZ, &w) == 0 && w.ws_col > 20) return w.ws_col;
  return 80;
}

std::string duration_text(double seconds) {
  const auto s = static_cast<int64_t>(std::llround(std::max(0.0, seconds)));
  char buf[32];
  std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", static_cast<long long>(s / 3600),
                static_cast<long long>(s / 60 % 60), static_cast<long long>(s % 60));
  return buf;
}

std::string number_text(double d, int precision) {
  std::ostringstream os;
  os.precision(precision);
  os << d;
  return os.str();
}

}  // namespace

Progress::Progress(bool disable_bar, int64_t total_steps, int64_t start_step)
    : total_(total_steps), step_(start_step), rate_from_step_(start_step), rate_from_(Clock::now()) {
  bar_ = !disable_bar && ::isatty(STDERR_FILENO) && log_enabled(LogLevel::info);
  // The bar stands in for kiln's own info lines while it is up: they would break into it.
  if (bar_ && !log_enabled(LogLevel::debug)) {
    restore_level_ = "info";
    set_log_level("warn");
  }
  last_draw_ = Clock::now() - std::chrono::seconds(1);
  draw(true);
}

Progress::~Progress() {
  if (bar_ && drawn_) {
    draw(true);
    std::fputs("\n", stderr);
    std::fflush(stderr);
  }
  if (!restore_level_.empty()) set_log_level(restore_level_);
}

void Progress::compiling(const std::string& what) {
  status_ = "compiling " + what + "\xe2\x80\xa6";
  draw(true);
}

void Progress::compiled(double seconds, const std::string& what) {
  status_.clear();
  char buf[32];
  std::snprintf(buf, sizeof buf, seconds < 10 ? "%.2f" : "%.1f", seconds);
  line("compiling " + what + "\xe2\x80\xa6 " + std::string(buf) + " s");
  // Steps per second from here on: the compile is not what the next steps cost.
  rate_from_ = Clock::now();
  rate_from_step_ = step_;
}

void Progress::not_compiled(const std::string& what) {
  if (status_.empty()) return;
  status_.clear();
  line("compiling " + what + "\xe2\x80\xa6 not compiled: it runs eagerly");
}

void Progress::step(int64_t global_step, std::optional<double> loss) {
  step_ = global_step;
  if (loss) loss_ = loss;
  draw(step_ == total_);
}

std::string Progress::speed() const {
  const int64_t done = step_ - rate_from_step_;
  const double secs = std::chrono::duration<double>(Clock::now() - rate_from_).count();
  if (done <= 0 || secs <= 0) return "";
  const double rate = static_cast<double>(done) / secs;
  char buf[32];
  std::snprintf(buf, sizeof buf, rate < 10 ? "%.2f" : rate < 100 ? "%.1f" : "%.0f", rate);
  return std::string(buf) + " steps/s, ETA " + duration_text(static_cast<double>(total_ - step_) / rate);
}

std::string Progress::eta() const {
  const int64_t done = step_ - rate_from_step_;
  const double secs = std::chrono::duration<double>(Clock::now() - rate_from_).count();
  if (done <= 0 || secs <= 0) return "";
  return "ETA " + duration_text(static_cast<double>(total_ - step_) * secs / static_cast<double>(done));
}

void Progress::line(const std::string& text) {
  if (!bar_) {
    log_info(text);
    return;
  }
  clear();
  std::fputs((text + "\n").c_str(), stderr);
  draw(true);
}

void Progress::clear() {
  if (!drawn_) return;
  std::fputs("\r\x1b[K", stderr);
  drawn_ = false;
}

void Progress::draw(bool force) {
  if (!bar_) return;
  const auto now = Clock::now();
  if (!force && now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  const int width = terminal_width() - 1;
  const std::string count = std::to_string(step_) + "/" + std::to_string(total_);
  std::string tail;
  if (!status_.empty()) {
    tail = "  " + status_;
  } else {
    if (loss_) tail += "  loss " + number_text(*loss_, 4);
    if (auto s = speed(); !s.empty()) tail += "  " + s;
  }
  const int bar_width = std::clamp(width - static_cast<int>(count.size() + tail.size()) - 4, 0, 40);
  std::string bar;
  if (bar_width >= 5) {
    const auto filled = static_cast<int>(static_cast<double>(bar_width) * static_cast<double>(step_) /
                                         static_cast<double>(std::max<int64_t>(1, total_)));
    bar = " [" + std::string(static_cast<size_t>(filled), '#') +
          std::string(static_cast<size_t>(bar_width - filled), '-') + "]";
  }
  std::string text = count + bar + tail;
  if (static_cast<int>(text.size()) > width) text.resize(static_cast<size_t>(std::max(0, width)));
  std::fputs(("\r" + text + "\x1b[K").c_str(), stderr);
  std::fflush(stderr);
  drawn_ = true;
}

}  // namespace kiln
