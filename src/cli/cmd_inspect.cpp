#include "cli/commands.h"
#include "core/error.h"

namespace di::cli {

int cmd_inspect(const Argv&) { throw Error("'inspect' is not implemented yet"); }

}  // namespace di::cli
