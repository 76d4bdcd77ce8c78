#include "cli/commands.h"
#include "core/error.h"

namespace di::cli {

int cmd_tokenize(const Argv&) { throw Error("'tokenize' is not implemented yet"); }

}  // namespace di::cli
