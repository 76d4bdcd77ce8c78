// DeepSeek-V4.1 completion parsing: the text the model writes after the generation header →
// reasoning_content, content and DSML tool calls; the inverse of the chat encoder's assistant turn.
//
//   thinking mode:  REASONING </think> CONTENT [\n\n<｜DSML｜ calls>…</｜DSML｜ calls>] [EOS]
//   chat mode:                         CONTENT [\n\n<｜DSML｜ calls>…</｜DSML｜ calls>] [EOS]
//
// The DSML block is read exactly as the reference parser reads it:
//   <｜DSML｜ calls>\n
//   <｜DSML｜ invoke name="NAME">\n
//   <｜DSML｜ parameter name="K" string="true|false">VALUE</｜DSML｜ parameter>\n   (zero or more)
//   </｜DSML｜ invoke>\n                                                          (one or more invokes)
//   </｜DSML｜ calls>
// Each call's arguments come out as JSON object text, `{"K": V, ...}` in parameter order, with
// string="true" values JSON-quoted and string="false" values kept verbatim (they must be valid JSON).
//
// Errors (di::Error): malformed or duplicated DSML, a calls block inside the reasoning, text after the
// calls block or after EOS, special tokens (BOS, EOS, <think>, </think>, ｜DSML｜) inside reasoning or
// content, and a completion that ends inside a calls block. A completion may otherwise end anywhere
// (e.g. cut by max_tokens): what was read so far is the result.
//
// Streaming: feed() chunks split anywhere (even inside a UTF-8 character or a tag) and get deltas;
// the concatenated deltas equal the one-shot parse. Text that may start a tag is held back until it
// is decided; a tool call is delivered whole when its invoke closes.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace di {

struct ParsedToolCall {
  std::string name;
  std::string arguments;  // JSON object text
  bool operator==(const ParsedToolCall&) const = default;
};

struct CompletionDelta {
  std::string reasoning_content;
  std::string content;
  std::vector<ParsedToolCall> tool_calls;
  bool empty() const { return reasoning_content.empty() && content.empty() && tool_calls.empty(); }
};

struct ParsedCompletion {
  std::string reasoning_content;
  std::string content;
  std::vector<ParsedToolCall> tool_calls;
  bool saw_eos = false;
};

class CompletionParser {
 public:
  explicit CompletionParser(bool thinking);

  // Throws di::Error on malformed text; after an error every call throws the same error.
  CompletionDelta feed(std::string_view chunk);
  // End of the completion: releases held-back text; throws if it ended inside a calls block.
  CompletionDelta finish();

  bool saw_eos() const { return state_ == State::kDone; }

 private:
  enum class State { kReasoning, kContent, kCalls, kAfterCalls, kDone };
  enum class CallState { kBetween, kHeader, kParam, kAfterParam };

  bool step(CompletionDelta& out);  // one move on buf_; false when it needs more text
  bool step_text(CompletionDelta& out);
  bool step_calls(CompletionDelta& out);
  void finish_call(CompletionDelta& out);
  void emit_text(CompletionDelta& out, std::string_view text);
  [[noreturn]] void fail(const std::string& message);
  void check_alive() const;

  bool thinking_;
  State state_;
  CallState call_state_ = CallState::kBetween;
  std::string buf_;  // text not consumed yet
  std::string reasoning_, content_;  // everything emitted so far (checked for special tokens)
  std::string call_name_;
  std::vector<std::pair<std::string, std::pair<std::string, bool>>> call_params_;  // key, (value, is_string)
  std::string error_;
};

// One-shot parse of a whole completion.
ParsedCompletion parse_completion(std::string_view text, bool thinking);

}  // namespace di
