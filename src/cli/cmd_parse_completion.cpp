// `deepinfer parse-completion --thinking true|false`: completion text on stdin (what the model wrote
// after the generation header) → {"reasoning_content", "content", "tool_calls": [{"name",
// "arguments"}]} on stdout. Malformed DSML is an error (exit 1).
#include <cstdio>
#include <iostream>
#include <iterator>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/args.h"
#include "cli/commands.h"
#include "core/error.h"
#include "tokenizer/dsml_parser.h"

namespace di::cli {

int cmd_parse_completion(const Argv& argv) {
  Args args(argv, {"thinking"}, {});
  std::string mode = args.get("thinking");
  if (mode != "true" && mode != "false") throw Error("--thinking: expected true or false, got '" + mode + "'");

  std::string text((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  ParsedCompletion parsed = parse_completion(text, mode == "true");

  nlohmann::ordered_json out;
  out["reasoning_content"] = parsed.reasoning_content;
  out["content"] = parsed.content;
  out["tool_calls"] = nlohmann::ordered_json::array();
  for (const ParsedToolCall& call : parsed.tool_calls) {
    out["tool_calls"].push_back({{"name", call.name}, {"arguments", call.arguments}});
  }
  std::string json;
  try {
    json = out.dump();
  } catch (const nlohmann::ordered_json::exception&) {
    throw Error("the completion text on stdin is not valid UTF-8");
  }
  std::fwrite(json.data(), 1, json.size(), stdout);
  std::fputc('\n', stdout);
  return 0;
}

}  // namespace di::cli
