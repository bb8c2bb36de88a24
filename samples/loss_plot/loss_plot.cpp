#include "loss_plot.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <stdexcept>

#include "png.h"

namespace loss_plot {
namespace {

struct Colour {
  uint8_t r, g, b;
};
constexpr Colour kWhite{255, 255, 255}, kInk{40, 40, 40}, kGrid{225, 225, 225};
constexpr Colour kTrain{31, 119, 180}, kEval{255, 127, 14};  // matplotlib's first two colours

// A 5x7 pixel font for what the plot writes: digits, '.', '-', the letters of "train loss",
// "eval loss" and "step", and space. One byte a row, top to bottom; bit 4 is the leftmost pixel.
const std::map<char, std::array<uint8_t, 7>>& font() {
  static const std::map<char, std::array<uint8_t, 7>> glyphs = {
      {'0', {0x0E, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0E}}, {'1', {0x04, 0x0C, 0x04, 0x04, 0x04, 0x04, 0x0E}},
      {'2', {0x0E, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1F}}, {'3', {0x1F, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0E}},
      {'4', {0x02, 0x06, 0x0A, 0x12, 0x1F, 0x02, 0x02}}, {'5', {0x1F, 0x10, 0x1E, 0x01, 0x01, 0x11, 0x0E}},
      {'6', {0x06, 0x08, 0x10, 0x1E, 0x11, 0x11, 0x0E}}, {'7', {0x1F, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08}},
      {'8', {0x0E, 0x11, 0x11, 0x0E, 0x11, 0x11, 0x0E}}, {'9', {0x0E, 0x11, 0x11, 0x0F, 0x01, 0x02, 0x0C}},
      {'.', {0x00, 0x00, 0x00, 0x00, 0x00, 0x0C, 0x0C}}, {'-', {0x00, 0x00, 0x00, 0x1F, 0x00, 0x00, 0x00}},
      {'a', {0x00, 0x00, 0x0E, 0x01, 0x0F, 0x11, 0x0F}}, {'e', {0x00, 0x00, 0x0E, 0x11, 0x1F, 0x10, 0x0E}},
      {'i', {0x04, 0x00, 0x0C, 0x04, 0x04, 0x04, 0x0E}}, {'l', {0x0C, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0E}},
      {'n', {0x00, 0x00, 0x16, 0x19, 0x11, 0x11, 0x11}}, {'o', {0x00, 0x00, 0x0E, 0x11, 0x11, 0x11, 0x0E}},
      {'p', {0x00, 0x00, 0x1E, 0x11, 0x1E, 0x10, 0x10}}, {'r', {0x00, 0x00, 0x16, 0x19, 0x10, 0x10, 0x10}},
      {'s', {0x00, 0x00, 0x0E, 0x10, 0x0E, 0x01, 0x1E}}, {'t', {0x08, 0x08, 0x1C, 0x08, 0x08, 0x09, 0x06}},
      {'v', {0x00, 0x00, 0x11, 0x11, 0x11, 0x0A, 0x04}}, {' ', {0, 0, 0, 0, 0, 0, 0}},
  };
  return glyphs;
}

constexpr int kScale = 2;             // font pixels are 2x2 image pixels
constexpr int kAdvance = 6 * kScale;  // a glyph and one column of space
constexpr int kTextHeight = 7 * kScale;

struct Canvas {
  int width, height;
  std::vector<uint8_t> rgb;

  Canvas(int w, int h) : width(w), height(h), rgb(static_cast<size_t>(w) * static_cast<size_t>(h) * 3, 255) {}
  void dot(int x, int y, Colour c, int size = 1) {  // a size x size square from (x, y)
    for (int yy = y; yy < y + size; ++yy)
      for (int xx = x; xx < x + size; ++xx) {
        if (xx < 0 || yy < 0 || xx >= width || yy >= height) continue;
        uint8_t* p = &rgb[(static_cast<size_t>(yy) * static_cast<size_t>(width) + static_cast<size_t>(xx)) * 3];
        p[0] = c.r, p[1] = c.g, p[2] = c.b;
      }
  }
  void line(int x0, int y0, int x1, int y1, Colour c, int thickness = 1) {  // Bresenham's
    const int dx = std::abs(x1 - x0), dy = -std::abs(y1 - y0), sx = x0 < x1 ? 1 : -1, sy = y0 < y1 ? 1 : -1;
    for (int err = dx + dy;;) {
      dot(x0, y0, c, thickness);
      if (x0 == x1 && y0 == y1) break;
      const int e2 = 2 * err;
      if (e2 >= dy) err += dy, x0 += sx;
      if (e2 <= dx) err += dx, y0 += sy;
    }
  }
  void text(int x, int y, const std::string& s, Colour c) {  // (x, y): the top left corner
    for (char ch : s) {
      const auto glyph = font().find(ch);
      if (glyph != font().end())
        for (int row = 0; row < 7; ++row)
          for (int col = 0; col < 5; ++col)
            if (glyph->second[static_cast<size_t>(row)] >> (4 - col) & 1)
              dot(x + col * kScale, y + row * kScale, c, kScale);
      x += kAdvance;
    }
  }
};

int text_width(const std::string& s) { return static_cast<int>(s.size()) * kAdvance - kScale; }

// An axis from lo to hi with ticks at multiples of 1, 2 or 5 times a power of ten, about five of
// them; lo and hi are widened to ticks.
struct Axis {
  double lo, hi, step;
  int decimals;  // enough for the step
};
Axis nice_axis(double lo, double hi) {
  if (!(hi > lo)) hi = lo + 1;
  const double rough = (hi - lo) / 5, magnitude = std::pow(10.0, std::floor(std::log10(rough)));
  const double r = rough / magnitude;
  const double step = (r < 1.5 ? 1 : r < 3.5 ? 2 : r < 7.5 ? 5 : 10) * magnitude;
  return {std::floor(lo / step + 1e-9) * step, std::ceil(hi / step - 1e-9) * step, step,
          std::max(0, -static_cast<int>(std::floor(std::log10(step) + 1e-9)))};
}
std::string label(double value, int decimals) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, std::abs(value) < 1e-12 ? 0.0 : value);
  return buf;
}

// The number after "key": on a line of JSON (kiln writes one flat object a line).
std::optional<double> number_after(const std::string& line, const std::string& key) {
  size_t at = line.find("\"" + key + "\"");
  if (at == std::string::npos) return std::nullopt;
  at = line.find_first_not_of(" :", at + key.size() + 2);
  if (at == std::string::npos) return std::nullopt;
  const char* start = line.c_str() + at;
  char* end = nullptr;
  const double value = std::strtod(start, &end);
  if (end == start) return std::nullopt;
  return value;
}

}  // namespace

LossCurves read_metrics(const std::string& metrics_jsonl) {
  std::ifstream in(metrics_jsonl);
  if (!in) throw std::runtime_error("cannot read the metrics file " + metrics_jsonl);
  LossCurves curves;
  for (std::string line; std::getline(in, line);) {
    const auto step = number_after(line, "step");
    if (!step) continue;
    if (const auto loss = number_after(line, "loss")) curves.train.emplace_back(*step, *loss);
    if (const auto loss = number_after(line, "eval_loss")) curves.eval.emplace_back(*step, *loss);
  }
  if (curves.train.empty() && curves.eval.empty())
    throw std::runtime_error(metrics_jsonl + ": no \"loss\" or \"eval_loss\" values to plot");
  return curves;
}

std::vector<uint8_t> draw(const LossCurves& curves, int width, int height) {
  double max_step = 1, lo = INFINITY, hi = -INFINITY;
  for (const auto* curve : {&curves.train, &curves.eval})
    for (const auto& [step, loss] : *curve) {
      max_step = std::max(max_step, step);
      lo = std::min(lo, loss);
      hi = std::max(hi, loss);
    }
  if (!(lo <= hi)) lo = 0, hi = 1;  // nothing to draw: empty axes
  const Axis xs = nice_axis(0, max_step), ys = nice_axis(lo, hi);

  // The plot area, inside margins for the tick labels, the axis title and the legend's width.
  Canvas canvas(width, height);
  const int left = 16 + text_width(label(ys.hi, ys.decimals)) + 16, right = width - 24, top = 20;
  const int bottom = height - (12 + kTextHeight + 12 + kTextHeight + 12);
  auto px = [&](double step) {
    return left + static_cast<int>(std::lround((step - xs.lo) / (xs.hi - xs.lo) * (right - left)));
  };
  auto py = [&](double loss) {
    return bottom - static_cast<int>(std::lround((loss - ys.lo) / (ys.hi - ys.lo) * (bottom - top)));
  };

  for (int i = 0; xs.lo + i * xs.step <= xs.hi + xs.step * 1e-6; ++i) {  // x ticks, grid, labels
    const double v = xs.lo + i * xs.step;
    const int x = px(v);
    canvas.line(x, top, x, bottom, kGrid);
    canvas.line(x, bottom, x, bottom + 5, kInk);
    const std::string text = label(v, xs.decimals);
    canvas.text(x - text_width(text) / 2, bottom + 12, text, kInk);
  }
  for (int i = 0; ys.lo + i * ys.step <= ys.hi + ys.step * 1e-6; ++i) {  // y ticks, grid, labels
    const double v = ys.lo + i * ys.step;
    const int y = py(v);
    canvas.line(left, y, right, y, kGrid);
    canvas.line(left - 5, y, left, y, kInk);
    const std::string text = label(v, ys.decimals);
    canvas.text(left - 10 - text_width(text), y - kTextHeight / 2, text, kInk);
  }
  canvas.line(left, top, left, bottom, kInk);
  canvas.line(left, bottom, right, bottom, kInk);
  canvas.text((left + right - text_width("step")) / 2, bottom + 12 + kTextHeight + 12, "step", kInk);

  // The curves: lines two pixels wide, the evaluations also marked, since they are few.
  for (const auto& [curve, colour] : {std::make_pair(&curves.train, kTrain), std::make_pair(&curves.eval, kEval)}) {
    for (size_t i = 1; i < curve->size(); ++i)
      canvas.line(px((*curve)[i - 1].first), py((*curve)[i - 1].second), px((*curve)[i].first), py((*curve)[i].second),
                  colour, 2);
    if (curve == &curves.eval)
      for (const auto& [step, loss] : *curve) canvas.dot(px(step) - 2, py(loss) - 2, colour, 5);
  }

  // The legend, top right.
  const int legend_x = right - 24 - 8 - text_width("train loss") - 8;
  int legend_y = top + 10;
  for (const auto& [name, colour] : {std::make_pair("train loss", kTrain), std::make_pair("eval loss", kEval)}) {
    canvas.line(legend_x, legend_y + kTextHeight / 2, legend_x + 24, legend_y + kTextHeight / 2, colour, 2);
    canvas.text(legend_x + 32, legend_y, name, kInk);
    legend_y += kTextHeight + 8;
  }
  return std::move(canvas.rgb);
}

void write_loss_plot(const std::string& metrics_jsonl, const std::string& png_path) {
  constexpr int kWidth = 800, kHeight = 500;
  const std::string png = encode_png(kWidth, kHeight, draw(read_metrics(metrics_jsonl), kWidth, kHeight));
  std::ofstream out(png_path, std::ios::binary);
  if (!out.write(png.data(), static_cast<std::streamsize>(png.size())))
    throw std::runtime_error("cannot write " + png_path);
}

}  // namespace loss_plot
