#include "model/config.h"

#include "core/error.h"

namespace di {

const char* attn_mode_name(AttnMode mode) {
  switch (mode) {
    case AttnMode::kWindowOnly: return "window";
    case AttnMode::kFull: return "full";
    case AttnMode::kReindex: return "reindex";
    case AttnMode::kReuse: return "reuse";
  }
  return "?";
}

}  // namespace di
