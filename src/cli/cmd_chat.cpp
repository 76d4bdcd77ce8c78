// deepinfer chat [--model DIR] [--thinking] [--system TEXT] [--show-request] [sampling and engine flags]
// An interactive multi-turn chat: each line on stdin is a user turn; the reply streams to stdout and
// goes back into the history, which the engine renders with the V4.1 chat encoding. /exit or EOF
// ends the session, /reset clears the history. Works with stdin on a pipe (no prompt is printed then).
// Thinking mode (--thinking) shows the reasoning, then "</think>", then the answer; only the answer
// and the reasoning of the last turn are kept, as the encoding drops older reasoning anyway.
// --show-request prints each turn's request body and usage on stderr (what the engine was given).
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/engine_flags.h"
#include "core/error.h"
#include "deepinfer/engine.h"

namespace di::cli {

namespace {

using Json = nlohmann::ordered_json;

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

// The id of "</think>", or -1 when the tokenizer has no such single token.
int32_t end_think_id(const Engine& engine) {
  std::vector<int32_t> ids = engine.tokenize("</think>", false);
  return ids.size() == 1 ? ids[0] : -1;
}

// Streams one reply to stdout; returns its result (error included).
RequestResult stream_reply(Engine& engine, Request req, int32_t end_think) {
  req.stream = true;
  const RequestId id = engine.submit(std::move(req));
  for (;;) {
    std::optional<TokenEvent> ev = engine.next_event(id, std::chrono::milliseconds(100));
    if (!ev) continue;
    std::fwrite(ev->text.data(), 1, ev->text.size(), stdout);  // the text may hold NUL bytes
    for (int32_t t : ev->token_ids)
      if (t == end_think) std::fputs("\n</think>\n", stdout);
    std::fflush(stdout);
    if (ev->finished) break;
  }
  std::fputc('\n', stdout);
  std::fflush(stdout);
  return engine.wait(id);
}

// The assistant message for the history: in thinking mode the reply is reasoning, </think>, answer.
Json assistant_message(const Engine& engine, const RequestResult& r, bool thinking, int32_t end_think) {
  Json msg = {{"role", "assistant"}, {"content", r.text}};
  if (!thinking) return msg;
  for (size_t i = 0; i < r.token_ids.size(); ++i) {
    if (r.token_ids[i] != end_think) continue;
    std::vector<int32_t> reasoning(r.token_ids.begin(), r.token_ids.begin() + static_cast<std::ptrdiff_t>(i));
    std::vector<int32_t> answer(r.token_ids.begin() + static_cast<std::ptrdiff_t>(i) + 1, r.token_ids.end());
    msg["content"] = engine.detokenize(answer);
    msg["reasoning_content"] = engine.detokenize(reasoning);
    return msg;
  }
  // No </think>: the reply ran out inside its reasoning.
  msg["content"] = "";
  msg["reasoning_content"] = r.text;
  return msg;
}

}  // namespace

int cmd_chat(const Argv& argv) {
  Args args(argv, with_options(with_options({"system"}, kEngineValueOptions), kSamplingValueOptions),
            with_options({"thinking", "show-request"}, kEngineFlagOptions));
  const SamplingParams sampling = sampling_options(args, /*default_max_tokens=*/1024);
  const bool thinking = args.flag("thinking");
  const bool show = args.flag("show-request");
  const bool interactive = isatty(STDIN_FILENO) != 0;
  std::unique_ptr<Engine> engine = Engine::create(engine_options(args));
  const int32_t end_think = end_think_id(*engine);

  Json messages = Json::array();
  if (auto system = args.get_opt("system")) messages.push_back({{"role", "system"}, {"content", *system}});
  const size_t n_fixed = messages.size();
  if (interactive) std::fprintf(stderr, "deepinfer chat: /exit or Ctrl-D ends, /reset clears the history\n");
  std::string line;
  for (;;) {
    if (interactive) {
      std::fputs("> ", stdout);
      std::fflush(stdout);
    }
    if (!std::getline(std::cin, line)) break;
    const std::string text = trim(line);
    if (text.empty()) continue;
    if (text == "/exit") break;
    if (text == "/reset") {
      messages.erase(messages.begin() + static_cast<std::ptrdiff_t>(n_fixed), messages.end());
      continue;
    }
    messages.push_back({{"role", "user"}, {"content", text}});
    const Json body = {{"messages", messages}, {"thinking", thinking}};
    if (show) std::fprintf(stderr, "request: %s\n", body.dump().c_str());
    Request req;
    req.chat_json = body.dump();
    req.sampling = sampling;
    RequestResult r = stream_reply(*engine, std::move(req), end_think);
    if (show)
      std::fprintf(stderr, "usage: %s\n",
                   Json({{"prompt_tokens", r.prompt_tokens}, {"completion_tokens", r.completion_tokens},
                         {"cached_tokens", r.cached_tokens}, {"finish_reason", r.finish_reason}})
                       .dump()
                       .c_str());
    if (r.finish_reason == "error") {
      std::fprintf(stderr, "error: %s\n", r.error.c_str());
      messages.erase(messages.end() - 1);  // the turn did not happen
      continue;
    }
    messages.push_back(assistant_message(*engine, r, thinking, end_think));
  }
  return 0;
}

}  // namespace di::cli
