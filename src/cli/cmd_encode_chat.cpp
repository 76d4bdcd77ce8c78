// `deepinfer encode-chat --model DIR --request FILE`: an OpenAI-style chat-completions request
// (JSON; FILE "-" = stdin) → {"text": prompt, "ids": token ids} on stdout, rendered with the V4.1
// chat encoding and tokenized with DIR/tokenizer.json (special tokens matched; the text starts with
// BOS). Without --model only "text" is printed. Invalid request: a message naming the field, exit 1.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/args.h"
#include "cli/commands.h"
#include "core/error.h"
#include "tokenizer/chat_encoding.h"
#include "tokenizer/tokenizer.h"

namespace di::cli {

namespace {

std::string read_request(const std::string& path) {
  if (path == "-") return std::string((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot open the request file");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

int cmd_encode_chat(const Argv& argv) {
  Args args(argv, {"model", "request"}, {});
  std::string path = args.get("request");
  ChatPrompt prompt = encode_chat_request_text(read_request(path), path);

  nlohmann::ordered_json out;
  out["text"] = prompt.text;
  if (auto model = args.get_opt("model")) {
    out["ids"] = Tokenizer::load(*model)->encode(prompt.text, /*allow_special=*/true);
  }
  std::string json = out.dump();
  std::fwrite(json.data(), 1, json.size(), stdout);
  std::fputc('\n', stdout);
  return 0;
}

}  // namespace di::cli
