// Draws a run's metrics.jsonl (loss with the validation loss, tokens/s, peak memory, learning rate over the
// steps) as one self-contained SVG.
//
//   memtrain_plot runs/gpt/metrics.jsonl loss.svg
#include <memtrain/memtrain.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cstdio>
#include <string>

int main(int argc, char** argv) {
  CLI::App app{"Draw a memtrain metrics.jsonl as an SVG"};
  std::string metrics, out, title;
  app.add_option("metrics", metrics, "the run's metrics.jsonl")->required();
  app.add_option("out", out, "the SVG to write")->required();
  app.add_option("--title", title, "the chart's title (default: the metrics file's path)");
  CLI11_PARSE(app, argc, argv);
  try {
    const auto lines = memtrain::train::read_metrics_jsonl(metrics);
    memtrain::train::write_metrics_svg(lines, title.empty() ? metrics : title, out);
    fmt::print("{} steps drawn to {}\n", lines.size(), out);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "memtrain_plot: %s\n", e.what());
    return 1;
  }
  return 0;
}
