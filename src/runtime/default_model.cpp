#include "runtime/default_model.h"

namespace di {

// The model that ships in the repository: brown-small, a 17 M-parameter V4.1-architecture model
// trained on the Brown corpus (tools/train_small), in the released checkpoint format.
std::filesystem::path default_model_dir() {
  return std::filesystem::path(DEEPINFER_SOURCE_DIR) / "models" / "brown-small";
}

}  // namespace di
