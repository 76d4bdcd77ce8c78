#include "cli/commands.h"
#include "core/error.h"

namespace di::cli {

int cmd_score(const Argv&) { throw Error("'score' is not implemented yet"); }

}  // namespace di::cli
