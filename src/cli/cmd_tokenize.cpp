// `deepinfer tokenize --model DIR --jsonl`: one {"text": "..."} per stdin line -> one {"ids": [...]}
// per stdout line, no BOS. `--text STR` tokenizes one string instead. Added tokens in the text are
// matched as single tokens unless --no-special. Blank lines are skipped; any other line that is
// not such an object is an error naming the line.
#include <cstdio>
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/args.h"
#include "cli/commands.h"
#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace di::cli {

namespace {

void append_ids_json(const std::vector<int32_t>& ids, std::string& out) {
  out += "{\"ids\": [";
  char buf[16];
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out += ", ";
    const int n = std::snprintf(buf, sizeof(buf), "%d", ids[i]);
    out.append(buf, static_cast<size_t>(n));
  }
  out += "]}\n";
}

bool blank(const std::string& line) {
  for (char c : line)
    if (c != ' ' && c != '\t' && c != '\r') return false;
  return true;
}

}  // namespace

int cmd_tokenize(const Argv& argv) {
  Args args(argv, {"model", "text"}, {"jsonl", "no-special"});
  const std::string model_dir = args.get("model");
  const bool jsonl = args.flag("jsonl");
  const auto text = args.get_opt("text");
  if (jsonl == text.has_value()) throw Error("tokenize: give exactly one of --jsonl (stdin) or --text STR");
  const bool allow_special = !args.flag("no-special");
  auto tok = Tokenizer::load(model_dir);

  std::string out;
  if (text) {
    append_ids_json(tok->encode(*text, allow_special), out);
    std::fwrite(out.data(), 1, out.size(), stdout);
    return 0;
  }

  std::ios::sync_with_stdio(false);
  std::string line;
  size_t line_no = 0;
  while (std::getline(std::cin, line)) {
    ++line_no;
    if (blank(line)) continue;
    const std::string where = "stdin line " + std::to_string(line_no);
    auto fail = [&](const std::string& msg) {
      std::fwrite(out.data(), 1, out.size(), stdout);  // the lines before the bad one still count
      std::fflush(stdout);
      throw Error(where + ": " + msg);
    };
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      fail(std::string("invalid JSON (") + e.what() + ")");
    }
    if (!j.is_object() || !j.contains("text") || !j["text"].is_string())
      fail("expected an object {\"text\": \"...\"}");
    try {
      append_ids_json(tok->encode(j["text"].get_ref<const std::string&>(), allow_special), out);
    } catch (const Error& e) {
      fail(e.what());
    }
    if (out.size() > (1u << 16)) {
      std::fwrite(out.data(), 1, out.size(), stdout);
      out.clear();
    }
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  std::fflush(stdout);
  return 0;
}

}  // namespace di::cli
