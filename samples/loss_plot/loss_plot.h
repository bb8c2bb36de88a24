// The loss curves of a kiln::Trainer run as a picture: the training loss (the "loss" lines of
// <output_dir>/metrics.jsonl) and the evaluation loss (its "eval_loss" lines) over the steps, on
// axes with tick labels and a legend, written as a PNG (png.h). No plotting library: lines are
// rasterised here and the labels drawn with a built-in 5x7 pixel font.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace loss_plot {

struct LossCurves {
  std::vector<std::pair<double, double>> train, eval;  // (step, loss), in the file's order
};

// The curves of a metrics.jsonl; throws std::runtime_error naming the file when it cannot be read
// or holds no loss at all.
LossCurves read_metrics(const std::string& metrics_jsonl);

// The plot as width * height RGB pixels, rows from the top.
std::vector<uint8_t> draw(const LossCurves& curves, int width, int height);

// read_metrics, draw (800x500) and encode_png, written to `png_path`; throws std::runtime_error.
void write_loss_plot(const std::string& metrics_jsonl, const std::string& png_path);

}  // namespace loss_plot
