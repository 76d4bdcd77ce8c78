#include "cli/commands.h"
#include "core/error.h"

namespace di::cli {

int cmd_encode_chat(const Argv&) { throw Error("'encode_chat' is not implemented yet"); }

}  // namespace di::cli
