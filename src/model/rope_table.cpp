#include "model/rope_table.h"

#include <algorithm>
#include <cmath>

namespace di {

RopeTable make_rope_table(int rope_dim, double base, bool yarn, const ModelConfig& cfg) {
  RopeTable t;
  int half = rope_dim / 2;
  t.freqs.resize(half);
  for (int i = 0; i < half; ++i) {
    float e = static_cast<float>(2 * i) / static_cast<float>(rope_dim);
    t.freqs[i] = 1.0f / std::pow(static_cast<float>(base), e);
  }
  if (yarn && cfg.yarn_original_max_position > 0) {
    // the dim whose wavelength completes `rotations` turns over the original context
    auto corrected = [&](double rotations) {
      return rope_dim * std::log(static_cast<double>(cfg.yarn_original_max_position) / (rotations * 2 * M_PI)) /
             (2 * std::log(base));
    };
    double low = std::max(std::floor(corrected(cfg.yarn_beta_fast)), 0.0);
    double high = std::min(std::ceil(corrected(cfg.yarn_beta_slow)), static_cast<double>(rope_dim - 1));
    float span = static_cast<float>(std::max(high - low, 1e-3));
    float factor = static_cast<float>(cfg.yarn_factor);
    for (int i = 0; i < half; ++i) {
      float ramp = std::clamp((static_cast<float>(i) - static_cast<float>(low)) / span, 0.0f, 1.0f);
      float smooth = 1.0f - ramp;
      t.freqs[i] = t.freqs[i] / factor * (1.0f - smooth) + t.freqs[i] * smooth;
    }
  }
  return t;
}

}  // namespace di
