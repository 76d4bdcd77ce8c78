// DeepSeek-V4.1 chat encoding: an OpenAI-style chat-completions request → prompt text, following
// DeepSeek's reference encoder (encoding/encoding.py of the V4.1 release) character for character.
//
// Request fields read (everything else, e.g. model, sampling, stream, response_format, tool_choice,
// is ignored and never changes the prompt):
//   messages                 non-empty array; roles system, user, assistant, tool, developer,
//                            latest_reminder. content: a string or an array of {"type":"text"} parts
//                            (joined with "\n\n"); image parts are rejected for now. Assistant:
//                            reasoning_content, tool_calls [{id?, type?, function:{name, arguments}}]
//                            with arguments a JSON object given as an object or as JSON text; `prefix:
//                            true` on a final assistant message = continue_final_message. Tool:
//                            tool_call_id. `name` is accepted and ignored (as the reference does).
//                            Extension: `tools` on a system or developer message renders there (the
//                            reference's message-level tools).
//   tools                    OpenAI function tools; attached to messages[0], an empty system message
//                            being inserted first when messages[0] is not a system message. Each
//                            function's keys are written name, description, parameters, then the rest.
//   thinking                 bool, or {"type": "enabled"|"disabled"}; also chat_template_kwargs.thinking.
//                            Default off (chat mode).
//   reasoning_effort         int 1..100 or low/high/xhigh/max (25/50/75/100); default high. Rendered in
//                            thinking mode only, validated always.
//   continue_final_message   bool: the final (assistant) message is continued: no EOS, no header.
//
// Rendering summary: BOS; <｜System｜> + (effort line) + system text + tools block; <｜User｜> turns
// (tool results merged in as <tool_result> blocks, sorted into the preceding assistant's call order);
// <｜Assistant｜> + <think> / </think> after the last user-like turn; assistant turns as
// reasoning</think> (thinking mode, only after the last user turn unless tools are present) + content
// + DSML tool calls + EOS.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace di {

struct ChatPrompt {
  std::string text;             // the prompt, BOS first; tokenize with special tokens allowed
  bool thinking = false;        // thinking mode: the header opened <think>, the reply starts in reasoning
  bool continue_final = false;  // the final assistant message is continued: the reply goes on with its
                                // content (parse it in chat mode)
};

// Throws di::Error naming the offending field, e.g.
// "messages[2].role: expected one of system, user, assistant, tool, developer, latest_reminder, got 'foo'".
ChatPrompt encode_chat_request(const nlohmann::ordered_json& request);
// Parses `json_text` first; `origin` (a file name) prefixes JSON syntax errors.
ChatPrompt encode_chat_request_text(std::string_view json_text, const std::string& origin);

}  // namespace di
