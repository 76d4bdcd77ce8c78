#include "tokenizer/bpe_tokenizer.h"

#include <atomic>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/utf8.h"
#include "tokenizer/word_cache.h"

namespace di {

namespace {

std::atomic<uint64_t> g_next_serial{1};

bool flag(const nlohmann::json& obj, const char* key, const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return false;
  if (!it->is_boolean()) throw Error(where + "." + key + ": expected true or false");
  return it->get<bool>();
}

void check_normalizer(const nlohmann::json& j, const std::string& where) {
  if (j.is_null()) return;
  if (j.is_object() && j.value("type", "") == "Sequence") {
    auto it = j.find("normalizers");
    if (it != j.end() && it->is_array()) {
      for (size_t i = 0; i < it->size(); ++i)
        check_normalizer((*it)[i], where + ".normalizers[" + std::to_string(i) + "]");
      return;
    }
  }
  throw Error(where + ": unsupported normalizer " + j.dump().substr(0, 80) +
              " (supported: null or an empty Sequence)");
}

}  // namespace

// One per thread and tokenizer in use on it (a single slot: switching tokenizers on a thread
// clears it).
struct BpeTokenizer::ThreadState {
  uint64_t owner = 0;
  WordCache cache;
  std::unique_ptr<PreTokenizer::Scratch> scratch;
  std::vector<Word> words;
  std::vector<Segment> segments;
  std::string word_buf;
};

BpeTokenizer::BpeTokenizer(const nlohmann::json& tok, const nlohmann::json& config, const std::string& origin)
    : serial_(g_next_serial.fetch_add(1)), origin_(origin) {
  if (!tok.is_object()) throw Error(origin + ": expected a JSON object");
  check_normalizer(tok.contains("normalizer") ? tok["normalizer"] : nlohmann::json(), origin + ": normalizer");
  if (auto d = tok.find("decoder"); d != tok.end() && !d->is_null() && d->value("type", "") != "ByteLevel")
    throw Error(origin + ": decoder: expected ByteLevel or null, got " + d->dump().substr(0, 80));
  if (!tok.contains("model")) throw Error(origin + ": model: missing");
  model_ = std::make_unique<BpeModel>(tok["model"], origin);
  if (!tok.contains("pre_tokenizer")) throw Error(origin + ": pre_tokenizer: missing");
  pre_ = std::make_unique<PreTokenizer>(tok["pre_tokenizer"], origin);

  int64_t max_id = model_->max_id();
  if (auto at = tok.find("added_tokens"); at != tok.end() && !at->is_null()) {
    if (!at->is_array()) throw Error(origin + ": added_tokens: expected an array");
    for (size_t i = 0; i < at->size(); ++i) {
      const auto& a = (*at)[i];
      const std::string where = origin + ": added_tokens[" + std::to_string(i) + "]";
      if (!a.is_object()) throw Error(where + ": expected an object");
      auto id = a.find("id");
      auto content = a.find("content");
      if (id == a.end() || !id->is_number_integer() || id->get<int64_t>() < 0 || id->get<int64_t>() >= INT32_MAX)
        throw Error(where + ".id: expected a non-negative integer");
      if (content == a.end() || !content->is_string()) throw Error(where + ".content: expected a string");
      AddedToken t;
      t.content = content->get<std::string>();
      if (utf8::first_invalid(t.content) != utf8::kValid) throw Error(where + ".content: not valid UTF-8");
      t.id = static_cast<int32_t>(id->get<int64_t>());
      t.special = flag(a, "special", where);
      t.lstrip = flag(a, "lstrip", where);
      t.rstrip = flag(a, "rstrip", where);
      t.single_word = flag(a, "single_word", where);
      t.normalized = flag(a, "normalized", where);
      added_ids_.emplace(t.content, t.id);
      added_.push_back(t);
      max_id = std::max<int64_t>(max_id, t.id);
    }
  }
  splitter_ = std::make_unique<AddedTokenSplitter>(added_);

  const auto n = static_cast<size_t>(max_id + 1);
  token_bytes_.assign(n, std::string());
  special_.assign(n, 0);
  std::string bytes;
  for (size_t id = 0; id < n; ++id) {
    const std::string* text = model_->token_text(static_cast<int32_t>(id));
    if (text == nullptr) continue;
    // As HF's ByteLevel decoder: a token with characters outside the alphabet stays as it is.
    token_bytes_[id] = byte_level::decode(*text, bytes) ? bytes : *text;
  }
  for (const AddedToken& t : added_) {
    const auto id = static_cast<size_t>(t.id);
    token_bytes_[id] = t.content;
    special_[id] = t.special ? 1 : 0;
  }
  bos_id_ = resolve_token_name(config, "bos_token", "<｜begin▁of▁sentence｜>");
  eos_id_ = resolve_token_name(config, "eos_token", "<｜end▁of▁sentence｜>");
}

BpeTokenizer::~BpeTokenizer() = default;

int32_t BpeTokenizer::resolve_token_name(const nlohmann::json& config, const char* key, const char* fallback) const {
  std::string name = fallback;
  if (config.is_object()) {
    auto it = config.find(key);
    if (it != config.end()) {
      if (it->is_string()) {
        name = it->get<std::string>();
      } else if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
        name = (*it)["content"].get<std::string>();
      } else if (!it->is_null()) {
        throw Error(origin_ + ": tokenizer_config.json " + key + ": expected a string or {\"content\": ...}");
      }
    }
  }
  auto id = token_to_id(name);
  if (!id && name != fallback && config.is_object() && config.contains(key))
    throw Error(origin_ + ": tokenizer_config.json " + key + ": '" + name + "' is not a token");
  return id ? *id : -1;
}

BpeTokenizer::ThreadState& BpeTokenizer::thread_state() const {
  thread_local std::unique_ptr<ThreadState> state;
  if (!state) state = std::make_unique<ThreadState>();
  if (state->owner != serial_) {
    state->cache.clear();
    state->scratch = std::make_unique<PreTokenizer::Scratch>(*pre_);
    state->owner = serial_;
  }
  return *state;
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text, bool allow_special) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  encode_into(text, allow_special, out);
  return out;
}

void BpeTokenizer::encode_into(std::string_view text, bool allow_special, std::vector<int32_t>& out) const {
  if (text.size() >= 0xFFFFFFFFu) throw Error("encode: text of " + std::to_string(text.size()) + " bytes is too long");
  if (size_t bad = utf8::first_invalid(text); bad != utf8::kValid) {
    char hex[8];
    std::snprintf(hex, sizeof(hex), "0x%02X", static_cast<unsigned char>(text[bad]));
    throw Error("encode: text is not valid UTF-8 (byte " + std::string(hex) + " at offset " + std::to_string(bad) + ")");
  }
  ThreadState& st = thread_state();
  if (!allow_special || splitter_->empty()) {
    encode_plain(text, st, out);
    return;
  }
  splitter_->split(text, st.segments);
  for (const Segment& s : st.segments) {
    if (s.id >= 0) {
      out.push_back(s.id);
    } else {
      encode_plain(text.substr(s.begin, s.end - s.begin), st, out);
    }
  }
}

void BpeTokenizer::encode_plain(std::string_view text, ThreadState& st, std::vector<int32_t>& out) const {
  pre_->split(text, *st.scratch, st.words);
  for (const Word& w : st.words) {
    std::string_view word = text.substr(w.begin, w.end - w.begin);
    if (w.prefix_space) {
      st.word_buf.assign(1, ' ');
      st.word_buf.append(word);
      word = st.word_buf;
    }
    const uint64_t h = WordCache::hash(word);
    uint32_t n = 0;
    if (const int32_t* ids = st.cache.find(word, h, &n)) {
      out.insert(out.end(), ids, ids + n);
      continue;
    }
    const size_t before = out.size();
    model_->encode_word(word, out);
    st.cache.insert(word, h, out.data() + before, static_cast<uint32_t>(out.size() - before));
  }
}

std::string BpeTokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string out;
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size())
      throw Error("decode: token id " + std::to_string(id) + " is outside [0, " + std::to_string(vocab_size()) + ")");
    if (skip_special && special_[static_cast<size_t>(id)]) continue;
    out += token_bytes_[static_cast<size_t>(id)];
  }
  return out;
}

std::string BpeTokenizer::token_bytes(int32_t id) const {
  if (id < 0 || id >= vocab_size())
    throw Error("token_bytes: token id " + std::to_string(id) + " is outside [0, " + std::to_string(vocab_size()) + ")");
  return token_bytes_[static_cast<size_t>(id)];
}

std::optional<int32_t> BpeTokenizer::token_to_id(std::string_view token) const {
  const std::string key(token);
  if (auto a = added_ids_.find(key); a != added_ids_.end()) return a->second;
  auto it = model_->vocab().find(key);
  if (it != model_->vocab().end()) return it->second;
  return std::nullopt;
}

bool BpeTokenizer::is_special(int32_t id) const {
  return id >= 0 && id < vocab_size() && special_[static_cast<size_t>(id)] != 0;
}

}  // namespace di
