// Every `deepinfer` subcommand: one function per command, one file per command (cmd_<name>.cpp).
// Each returns the process exit status; di::Error thrown inside is reported by main as "error: ..."
// with exit status 1.
#pragma once

#include <string>
#include <vector>

namespace di::cli {

using Argv = std::vector<std::string>;

int cmd_generate(const Argv& args);         // cmd_generate.cpp
int cmd_chat(const Argv& args);             // cmd_chat.cpp
int cmd_score(const Argv& args);            // cmd_score.cpp
int cmd_inspect(const Argv& args);          // cmd_inspect.cpp
int cmd_tokenize(const Argv& args);         // cmd_tokenize.cpp
int cmd_encode_chat(const Argv& args);      // cmd_encode_chat.cpp
int cmd_parse_completion(const Argv& args); // cmd_parse_completion.cpp
int cmd_write_checkpoint(const Argv& args); // cmd_write_checkpoint.cpp
int cmd_bench(const Argv& args);            // cmd_bench.cpp

}  // namespace di::cli
