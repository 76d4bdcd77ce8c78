#include "cli/commands.h"
#include "core/error.h"

namespace di::cli {

int cmd_write_checkpoint(const Argv&) { throw Error("'write_checkpoint' is not implemented yet"); }

}  // namespace di::cli
