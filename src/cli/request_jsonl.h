// One line of `deepinfer generate --prompts FILE`: a request as JSON, and its result as JSON.
//
// Input:  {"prompt": "..."} or {"messages": [...]} (+ the chat fields tools, thinking,
//         reasoning_effort, chat_template_kwargs, continue_final_message), optional "id" (echoed), and
//         optional sampling fields: max_tokens, temperature, top_p, top_k, min_p, seed, stop (a string
//         or a list), stop_token_ids, ignore_eos, repetition_penalty, presence_penalty,
//         frequency_penalty. Fields left out take the command-line defaults. Any other key is an error.
// Output: {"index", ("id"), "text", "token_ids", "finish_reason", ("error"), "usage": {prompt_tokens,
//         completion_tokens, total_tokens, cached_tokens}}.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "deepinfer/engine.h"

namespace di::cli {

struct LineRequest {
  Request request;
  nlohmann::ordered_json id;  // the line's "id", null when absent
};

// Throws di::Error "<origin>:<line_no>: <what is wrong>".
LineRequest parse_request_line(const std::string& line, const std::string& origin, int64_t line_no,
                               const SamplingParams& defaults);

nlohmann::ordered_json result_json(int64_t index, const nlohmann::ordered_json& id, const RequestResult& r);

}  // namespace di::cli
