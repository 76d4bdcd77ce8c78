#include "cli/commands.h"
#include "core/error.h"

namespace di::cli {

int cmd_parse_completion(const Argv&) { throw Error("'parse_completion' is not implemented yet"); }

}  // namespace di::cli
