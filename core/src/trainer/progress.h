// What Trainer::train shows while it runs. On a terminal (stderr is one, disable_tqdm is off and
// the log level shows info): one line redrawn in place — step/total, a bar, the last logged loss,
// steps per second, the time left — with the metrics, evaluations and checkpoints printed above it.
// Otherwise: the same events as plain log lines (kiln's logger, level info).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

namespace kiln {

class Progress {
 public:
  // `disable_bar`: TrainingArguments::disable_tqdm. `start_step`: the step a resumed run starts at.
  Progress(bool disable_bar, int64_t total_steps, int64_t start_step);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  bool on_terminal() const { return bar_; }

  // Before a step that will be captured and compiled, and after a step that compiled (its capture
  // step and compile took `seconds`).
  // `what`: "the step", or with gradient accumulation "the micro-step" and "the update".
  void compiling(const std::string& what = "the step");
  void compiled(double seconds, const std::string& what = "the step");
  // A step that was expected to compile but runs eagerly (the reason is logged as a warning).
  void not_compiled(const std::string& what = "the step");
  // After every optimizer step; `loss` when a metrics line was just made.
  void step(int64_t global_step, std::optional<double> loss);
  // A line above the bar (or a log line): metrics, evaluation, checkpoint.
  void line(const std::string& text);
  // Speed and time left as the lines show them ("12.3 steps/s, ETA 0:00:07"), "" before any.
  std::string speed() const;
  // The time left alone ("ETA 0:00:07"), from the same rate; "" before any.
  std::string eta() const;

 private:
  void draw(bool force);
  void clear();

  bool bar_ = false;
  bool drawn_ = false;
  std::string restore_level_;  // the log level to put back when the bar is gone ("" none)
  int64_t total_, step_;
  int64_t rate_from_step_;
  std::chrono::steady_clock::time_point rate_from_, last_draw_;
  std::optional<double> loss_;
  std::string status_;  // instead of the bar's numbers while a step compiles
};

}  // namespace kiln
