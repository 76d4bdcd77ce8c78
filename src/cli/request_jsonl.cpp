#include "cli/request_jsonl.h"

#include <cmath>
#include <limits>
#include <set>

#include "core/error.h"

namespace di::cli {

namespace {

using Json = nlohmann::ordered_json;

// Keys passed on to the chat encoder with "messages".
const std::set<std::string> kChatKeys = {"messages", "tools", "thinking", "reasoning_effort", "chat_template_kwargs",
                                         "continue_final_message"};

std::string where(const std::string& key) { return "field '" + key + "'"; }

double number(const Json& v, const std::string& key) {
  if (!v.is_number()) throw Error(where(key) + ": expected a number, got " + v.dump());
  return v.get<double>();
}

int64_t integer(const Json& v, const std::string& key, int64_t lo, int64_t hi) {
  if (!v.is_number_integer()) throw Error(where(key) + ": expected an integer, got " + v.dump());
  const bool out_of_range = v.is_number_unsigned() ? v.get<uint64_t>() > static_cast<uint64_t>(hi)
                                                   : (v.get<int64_t>() < lo || v.get<int64_t>() > hi);
  if (out_of_range)
    throw Error(where(key) + ": expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " +
                v.dump());
  return v.get<int64_t>();
}

bool boolean(const Json& v, const std::string& key) {
  if (!v.is_boolean()) throw Error(where(key) + ": expected true or false, got " + v.dump());
  return v.get<bool>();
}

std::string text(const Json& v, const std::string& key) {
  if (!v.is_string()) throw Error(where(key) + ": expected a string, got " + v.dump());
  return v.get<std::string>();
}

// Returns false when key is not a sampling field.
bool apply_sampling(const std::string& key, const Json& v, SamplingParams& sp) {
  constexpr int64_t kI32 = std::numeric_limits<int32_t>::max();
  if (key == "max_tokens") {
    sp.max_tokens = static_cast<int32_t>(integer(v, key, 1, kI32));
  } else if (key == "temperature") {
    sp.temperature = static_cast<float>(number(v, key));
  } else if (key == "top_p") {
    sp.top_p = static_cast<float>(number(v, key));
  } else if (key == "top_k") {
    sp.top_k = static_cast<int32_t>(integer(v, key, 0, kI32));
  } else if (key == "min_p") {
    sp.min_p = static_cast<float>(number(v, key));
  } else if (key == "repetition_penalty") {
    sp.repetition_penalty = static_cast<float>(number(v, key));
  } else if (key == "presence_penalty") {
    sp.presence_penalty = static_cast<float>(number(v, key));
  } else if (key == "frequency_penalty") {
    sp.frequency_penalty = static_cast<float>(number(v, key));
  } else if (key == "seed") {
    if (v.is_null()) {
      sp.seed.reset();
    } else {
      if (!v.is_number_unsigned()) throw Error(where(key) + ": expected an integer >= 0, got " + v.dump());
      sp.seed = v.get<uint64_t>();
    }
  } else if (key == "stop") {
    sp.stop.clear();
    if (v.is_string()) {
      sp.stop.push_back(v.get<std::string>());
    } else if (v.is_array()) {
      for (const Json& s : v) sp.stop.push_back(text(s, key));
    } else if (!v.is_null()) {
      throw Error(where(key) + ": expected a string or a list of strings, got " + v.dump());
    }
  } else if (key == "stop_token_ids") {
    if (!v.is_array()) throw Error(where(key) + ": expected a list of token ids, got " + v.dump());
    sp.stop_token_ids.clear();
    for (const Json& id : v) sp.stop_token_ids.push_back(static_cast<int32_t>(integer(id, key, 0, kI32)));
  } else if (key == "ignore_eos") {
    sp.ignore_eos = boolean(v, key);
  } else {
    return false;
  }
  return true;
}

}  // namespace

LineRequest parse_request_line(const std::string& line, const std::string& origin, int64_t line_no,
                               const SamplingParams& defaults) {
  const std::string at = origin + ":" + std::to_string(line_no) + ": ";
  Json j;
  try {
    j = Json::parse(line);
  } catch (const Json::parse_error& e) {
    throw Error(at + "invalid JSON (" + e.what() + ")");
  }
  if (!j.is_object()) throw Error(at + "expected a JSON object, got " + j.dump());
  LineRequest out;
  out.request.sampling = defaults;
  Json chat = Json::object();
  bool has_chat_field = false;
  try {
    for (const auto& [key, v] : j.items()) {
      if (key == "prompt") {
        out.request.prompt = text(v, key);
      } else if (key == "id") {
        out.id = v;
      } else if (kChatKeys.count(key)) {
        chat[key] = v;
        has_chat_field = true;
      } else if (!apply_sampling(key, v, out.request.sampling)) {
        throw Error("unknown field '" + key +
                    "' (expected prompt or messages, id, chat fields or sampling fields such as max_tokens)");
      }
    }
  } catch (const Error& e) {
    throw Error(at + e.what());
  }
  const bool has_messages = chat.contains("messages");
  if (out.request.prompt.has_value() == has_messages)
    throw Error(at + "expected exactly one of \"prompt\" or \"messages\"");
  if (has_chat_field && !has_messages)
    throw Error(at + "chat fields (tools, thinking, ...) need \"messages\", not \"prompt\"");
  if (has_messages) out.request.chat_json = chat.dump();
  return out;
}

nlohmann::ordered_json result_json(int64_t index, const nlohmann::ordered_json& id, const RequestResult& r) {
  nlohmann::ordered_json j;
  j["index"] = index;
  if (!id.is_null()) j["id"] = id;
  j["text"] = r.text;
  j["token_ids"] = r.token_ids;
  j["finish_reason"] = r.finish_reason;
  if (r.finish_reason == "error") j["error"] = r.error;
  j["usage"] = {{"prompt_tokens", r.prompt_tokens},
                {"completion_tokens", r.completion_tokens},
                {"total_tokens", r.prompt_tokens + r.completion_tokens},
                {"cached_tokens", r.cached_tokens}};
  return j;
}

}  // namespace di::cli
