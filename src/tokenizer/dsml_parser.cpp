#include "tokenizer/dsml_parser.h"

#include <algorithm>
#include <initializer_list>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/python_json.h"
#include "tokenizer/v41_tokens.h"

namespace di {
namespace {

// The parameter tag is closed by "</｜DSML｜ parameter>"; the reference searches without the '<' and
// expects the value to end with it.
constexpr std::string_view kParamEndMark = "/｜DSML｜ parameter";
constexpr std::string_view kLineEnd = ">\n";

struct Found {
  size_t pos = std::string::npos;
  std::string_view stop;
  bool ok() const { return pos != std::string::npos; }
};

// The earliest occurrence of any stop string in `text`.
Found find_first(std::string_view text, std::initializer_list<std::string_view> stops) {
  Found best;
  for (std::string_view s : stops) {
    size_t p = text.find(s);
    if (p != std::string_view::npos && p < best.pos) best = Found{p, s};
  }
  return best;
}

// Length of the longest proper prefix of a stop string that `text` ends with: text that must wait.
size_t held_suffix(std::string_view text, std::initializer_list<std::string_view> stops) {
  size_t held = 0;
  for (std::string_view s : stops) {
    for (size_t k = std::min(s.size() - 1, text.size()); k > held; --k) {
      if (text.substr(text.size() - k) == s.substr(0, k)) {
        held = k;
        break;
      }
    }
  }
  return held;
}

// Bytes at the end of `text` that form an incomplete UTF-8 character.
size_t incomplete_utf8_tail(std::string_view text) {
  for (size_t back = 1; back <= std::min<size_t>(3, text.size()); ++back) {
    auto c = static_cast<unsigned char>(text[text.size() - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return need > back ? back : 0;
  }
  return 0;
}

bool is_prefix_of_any(std::string_view text, std::initializer_list<std::string> candidates) {
  for (const std::string& c : candidates) {
    if (c.size() >= text.size() && c.compare(0, text.size(), text) == 0) return true;
  }
  return false;
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

std::string shown(std::string_view s) {
  std::string shown(s.substr(0, 80));
  if (s.size() > 80) shown += "...";
  return "'" + shown + "'";
}

}  // namespace

CompletionParser::CompletionParser(bool thinking)
    : thinking_(thinking), state_(thinking ? State::kReasoning : State::kContent) {}

void CompletionParser::fail(const std::string& message) {
  error_ = "malformed completion: " + message;
  throw Error(error_);
}

void CompletionParser::check_alive() const {
  if (!error_.empty()) throw Error(error_);
}

void CompletionParser::emit_text(CompletionDelta& out, std::string_view text) {
  if (text.empty()) return;
  bool reasoning = state_ == State::kReasoning;
  std::string& total = reasoning ? reasoning_ : content_;
  size_t old_size = total.size();
  total += text;
  (reasoning ? out.reasoning_content : out.content) += text;
  // Special tokens may not appear inside reasoning or content; look where the new text can reach.
  for (std::string_view tok : {v41::kBos, v41::kEos, v41::kThinkStart, v41::kThinkEnd, v41::kDsml}) {
    size_t from = old_size >= tok.size() ? old_size - tok.size() + 1 : 0;
    if (total.find(tok, from) != std::string::npos) {
      fail(std::string("unexpected special token '") + std::string(tok) + "' in the " +
           (reasoning ? "reasoning" : "content"));
    }
  }
}

bool CompletionParser::step_text(CompletionDelta& out) {
  bool reasoning = state_ == State::kReasoning;
  std::string_view end_stop = reasoning ? v41::kThinkEnd : v41::kEos;
  Found f = find_first(buf_, {end_stop, v41::kCallsStart});
  if (f.ok()) {
    emit_text(out, std::string_view(buf_).substr(0, f.pos));
    buf_.erase(0, f.pos + f.stop.size());
    if (f.stop == v41::kCallsStart) {
      if (reasoning) fail("a tool-call block inside the reasoning (missing </think>)");
      state_ = State::kCalls;
      call_state_ = CallState::kBetween;
    } else {
      state_ = reasoning ? State::kContent : State::kDone;
    }
    return true;
  }
  // Release what can no longer start a stop string, whole UTF-8 characters only.
  size_t safe = buf_.size() - held_suffix(buf_, {end_stop, v41::kCallsStart});
  safe -= incomplete_utf8_tail(std::string_view(buf_).substr(0, safe));
  emit_text(out, std::string_view(buf_).substr(0, safe));
  buf_.erase(0, safe);
  return false;
}

void CompletionParser::finish_call(CompletionDelta& out) {
  std::string args = "{";
  for (size_t i = 0; i < call_params_.size(); ++i) {
    const auto& [key, value] = call_params_[i];
    if (i) args += ", ";
    append_python_json_string(args, key);
    args += ": ";
    if (value.second) {
      append_python_json_string(args, value.first);
    } else {
      args += value.first;  // verbatim, as the model wrote it (checked to be JSON)
    }
  }
  args += "}";
  out.tool_calls.push_back(ParsedToolCall{std::move(call_name_), std::move(args)});
  call_name_.clear();
  call_params_.clear();
  call_state_ = CallState::kBetween;
}

bool CompletionParser::step_calls(CompletionDelta& out) {
  std::string_view buf = buf_;
  switch (call_state_) {
    case CallState::kBetween:
    case CallState::kAfterParam: {
      // ">\n", then the next tag: between invokes an invoke or the end of the block; after a
      // parameter another parameter or the end of the invoke.
      bool between = call_state_ == CallState::kBetween;
      std::string_view a = between ? v41::kInvokeOpenPrefix : v41::kParamOpenPrefix;
      std::string_view b = between ? v41::kCallsClose : v41::kInvokeClosePrefix;
      Found f = find_first(buf, {a, b});
      if (!f.ok()) {
        if (!is_prefix_of_any(buf, {std::string(kLineEnd) + std::string(a), std::string(kLineEnd) + std::string(b)})) {
          fail("expected '>\\n' and a DSML tag, got " + shown(buf));
        }
        return false;
      }
      if (buf.substr(0, f.pos) != kLineEnd) fail("expected '>\\n' before a DSML tag, got " + shown(buf.substr(0, f.pos)));
      buf_.erase(0, f.pos + f.stop.size());
      if (f.stop == v41::kCallsClose) {
        state_ = State::kAfterCalls;
      } else if (f.stop == v41::kInvokeOpenPrefix) {
        call_state_ = CallState::kHeader;
      } else if (f.stop == v41::kParamOpenPrefix) {
        call_state_ = CallState::kParam;
      } else {
        finish_call(out);  // the invoke closed
      }
      return true;
    }
    case CallState::kHeader: {
      Found f = find_first(buf, {v41::kParamOpenPrefix, v41::kInvokeClosePrefix});
      if (!f.ok()) return false;
      // `\s*name="NAME">\n` (the reference's pattern also lets one more "\n" follow).
      std::string_view header = buf.substr(0, f.pos);
      size_t i = 0;
      while (i < header.size() && is_space(header[i])) ++i;
      std::string_view rest = header.substr(i);
      size_t tail = ends_with(rest, "\">\n") ? 3 : ends_with(rest, "\">\n\n") ? 4 : 0;
      if (rest.substr(0, 6) != "name=\"" || tail == 0 || rest.size() < 6 + tail) {
        fail("bad invoke tag, expected ' name=\"NAME\">\\n', got " + shown(header));
      }
      call_name_ = std::string(rest.substr(6, rest.size() - 6 - tail));
      buf_.erase(0, f.pos + f.stop.size());
      if (f.stop == v41::kParamOpenPrefix) {
        call_state_ = CallState::kParam;
      } else {
        finish_call(out);  // an invoke without parameters
      }
      return true;
    }
    case CallState::kParam: {
      size_t p = buf.find(kParamEndMark);
      if (p == std::string_view::npos) return false;
      // ` name="KEY" string="true|false">VALUE<` (the reference's pattern also lets "\n" follow '<').
      std::string_view tag = buf.substr(0, p);
      size_t value_end = ends_with(tag, "<") ? tag.size() - 1 : ends_with(tag, "<\n") ? tag.size() - 2 : std::string::npos;
      if (tag.substr(0, 7) != " name=\"" || value_end == std::string::npos) {
        fail("bad parameter tag, expected ' name=\"KEY\" string=\"true|false\">VALUE</｜DSML｜ parameter>', got " +
             shown(tag));
      }
      // The key ends at the first `" string="true">` or `" string="false">`.
      size_t key_end = std::string::npos;
      bool is_string = false;
      size_t value_begin = 0;
      for (size_t q = tag.find("\" string=\"", 7); q != std::string::npos; q = tag.find("\" string=\"", q + 1)) {
        std::string_view after = tag.substr(q + 10);
        if (after.substr(0, 6) == "true\">") {
          key_end = q, is_string = true, value_begin = q + 16;
        } else if (after.substr(0, 7) == "false\">") {
          key_end = q, is_string = false, value_begin = q + 17;
        } else {
          continue;
        }
        break;
      }
      if (key_end == std::string::npos || value_begin > value_end) {
        fail("bad parameter tag, expected ' name=\"KEY\" string=\"true|false\">VALUE<', got " + shown(tag));
      }
      std::string key(tag.substr(7, key_end - 7));
      std::string value(tag.substr(value_begin, value_end - value_begin));
      for (const auto& kv : call_params_) {
        if (kv.first == key) fail("duplicate parameter '" + key + "' in the call to '" + call_name_ + "'");
      }
      if (!is_string && !nlohmann::json::accept(value)) {
        fail("parameter '" + key + "' of the call to '" + call_name_ + "' is marked string=\"false\" but " +
             shown(value) + " is not JSON");
      }
      call_params_.emplace_back(std::move(key), std::make_pair(std::move(value), is_string));
      buf_.erase(0, p + kParamEndMark.size());
      call_state_ = CallState::kAfterParam;
      return true;
    }
  }
  return false;
}

bool CompletionParser::step(CompletionDelta& out) {
  switch (state_) {
    case State::kReasoning:
    case State::kContent:
      return step_text(out);
    case State::kCalls:
      return step_calls(out);
    case State::kAfterCalls:
      if (buf_.empty()) return false;
      if (buf_.compare(0, v41::kEos.size(), v41::kEos) == 0) {
        buf_.erase(0, v41::kEos.size());
        state_ = State::kDone;
        return true;
      }
      if (v41::kEos.substr(0, buf_.size()) == buf_) return false;
      fail("unexpected text after the tool calls: " + shown(buf_));
    case State::kDone:
      if (!buf_.empty()) fail("unexpected text after the end-of-sentence token: " + shown(buf_));
      return false;
  }
  return false;
}

CompletionDelta CompletionParser::feed(std::string_view chunk) {
  check_alive();
  CompletionDelta out;
  buf_ += chunk;
  while (step(out)) {
  }
  return out;
}

CompletionDelta CompletionParser::finish() {
  check_alive();
  CompletionDelta out;
  while (step(out)) {
  }
  switch (state_) {
    case State::kReasoning:
    case State::kContent:
      emit_text(out, buf_);  // a held-back partial tag was plain text after all
      buf_.clear();
      break;
    case State::kCalls:
      fail("the completion ended inside a tool-call block");
    case State::kAfterCalls:
      if (!buf_.empty()) fail("unexpected text after the tool calls: " + shown(buf_));
      break;
    case State::kDone:
      break;
  }
  return out;
}

ParsedCompletion parse_completion(std::string_view text, bool thinking) {
  CompletionParser parser(thinking);
  ParsedCompletion result;
  for (CompletionDelta d : {parser.feed(text), parser.finish()}) {
    result.reasoning_content += d.reasoning_content;
    result.content += d.content;
    for (ParsedToolCall& c : d.tool_calls) result.tool_calls.push_back(std::move(c));
  }
  result.saw_eos = parser.saw_eos();
  return result;
}

}  // namespace di
