#include "cli/commands.h"
#include "core/error.h"

namespace di::cli {

int cmd_generate(const Argv&) { throw Error("'generate' is not implemented yet"); }

}  // namespace di::cli
