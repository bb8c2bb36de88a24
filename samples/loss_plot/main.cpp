// kiln_loss_plot: the training and evaluation loss of a kiln::Trainer run, drawn from its
// metrics.jsonl into a PNG (by default loss.png next to the metrics file).
//   kiln_loss_plot RUN_DIR/metrics.jsonl [OUT.png]
#include <cstdio>
#include <exception>
#include <string>

#include "loss_plot.h"

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::fprintf(stderr, "usage: kiln_loss_plot METRICS_JSONL [OUT_PNG]\n");
    return 2;
  }
  const std::string metrics = argv[1];
  const size_t slash = metrics.find_last_of('/');
  const std::string png =
      argc == 3 ? argv[2] : (slash == std::string::npos ? "" : metrics.substr(0, slash + 1)) + "loss.png";
  try {
    loss_plot::write_loss_plot(metrics, png);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kiln_loss_plot: %s\n", e.what());
    return 1;
  }
  std::printf("%s\n", png.c_str());
  return 0;
}
