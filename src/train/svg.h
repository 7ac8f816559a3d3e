// Small pieces the SVG writers share (timeline.cpp, metrics_plot.cpp): text escaping and axis ticks.
#pragma once

#include <cmath>
#include <string>

namespace memtrain::train::detail {

// `text` with &, <, > and " escaped for XML.
inline std::string xml_escape(const std::string& text) {
  std::string out;
  for (const char c : text) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

// A tick step of 1, 2 or 5 times a power of ten that gives 4 to 10 ticks from 0 up to `top` (> 0).
inline double tick_step(double top) {
  const double raw = top / 6.0;
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  for (const double m : {1.0, 2.0, 5.0, 10.0})
    if (m * p >= raw) return m * p;
  return 10.0 * p;
}

}  // namespace memtrain::train::detail
