#include "cli/default_model.h"

namespace di::cli {

// The model that ships in the repository (a tiny V4.1-architecture checkpoint in the released format).
std::filesystem::path default_model_dir() {
  return std::filesystem::path(DEEPINFER_SOURCE_DIR) / "tests" / "data" / "golden_dev" / "model";
}

}  // namespace di::cli
