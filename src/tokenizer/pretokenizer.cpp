#include "tokenizer/pretokenizer.h"

#include <cctype>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace di {

namespace {

// ByteLevel's own split when use_regex is true (the GPT-2 pattern).
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

std::string escape_literal(std::string_view s) {
  std::string out;
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x80 && !std::isalnum(u)) out += '\\';
    out += c;
  }
  return out;
}

SplitBehavior parse_behavior(const nlohmann::json& v, const std::string& where) {
  if (!v.is_string()) throw Error(where + ".behavior: expected a string");
  const std::string s = v.get<std::string>();
  if (s == "Removed") return SplitBehavior::kRemoved;
  if (s == "Isolated") return SplitBehavior::kIsolated;
  if (s == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (s == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (s == "Contiguous") return SplitBehavior::kContiguous;
  throw Error(where + ".behavior: unknown value '" + s +
              "' (expected Removed, Isolated, MergedWithPrevious, MergedWithNext or Contiguous)");
}

bool get_bool(const nlohmann::json& obj, const char* key, bool fallback, const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) throw Error(where + "." + key + ": expected true or false");
  return it->get<bool>();
}

}  // namespace

PreTokenizer::PreTokenizer(const nlohmann::json& pre, const std::string& origin) : origin_(origin) {
  const std::string where = origin + ": pre_tokenizer";
  if (!pre.is_object()) throw Error(where + ": expected an object (byte-level BPE needs ByteLevel)");
  const std::string type = pre.value("type", "");
  if (type == "Sequence") {
    auto it = pre.find("pretokenizers");
    if (it == pre.end() || !it->is_array()) throw Error(where + ".pretokenizers: expected an array");
    for (size_t i = 0; i < it->size(); ++i)
      add_step((*it)[i], where + ".pretokenizers[" + std::to_string(i) + "]", i + 1 == it->size());
  } else {
    add_step(pre, where, true);
  }
}

PreTokenizer::~PreTokenizer() = default;

void PreTokenizer::add_step(const nlohmann::json& step, const std::string& where, bool last) {
  if (!step.is_object()) throw Error(where + ": expected an object");
  const std::string type = step.value("type", "");
  if (type == "Split") {
    auto pat = step.find("pattern");
    if (pat == step.end() || !pat->is_object()) throw Error(where + ".pattern: expected an object");
    std::string regex;
    if (auto r = pat->find("Regex"); r != pat->end() && r->is_string()) {
      regex = r->get<std::string>();
    } else if (auto s = pat->find("String"); s != pat->end() && s->is_string()) {
      regex = escape_literal(s->get<std::string>());
    } else {
      throw Error(where + ".pattern: expected {\"Regex\": ...} or {\"String\": ...}");
    }
    Step st;
    st.regex = static_cast<int>(regexes_.size());
    regexes_.push_back(std::make_unique<Regex>(regex, where + ".pattern"));
    st.behavior = parse_behavior(step.contains("behavior") ? step["behavior"] : nlohmann::json(), where);
    st.invert = get_bool(step, "invert", false, where);
    if (last) throw Error(where + ": the last pre-tokenizer must be ByteLevel (byte-level BPE)");
    steps_.push_back(st);
  } else if (type == "ByteLevel") {
    if (!last) throw Error(where + ": ByteLevel must be the last pre-tokenizer");
    if (get_bool(step, "add_prefix_space", true, where)) {
      Step st;
      st.prefix_space = true;
      steps_.push_back(st);
    }
    if (get_bool(step, "use_regex", true, where)) {
      Step st;
      st.regex = static_cast<int>(regexes_.size());
      regexes_.push_back(std::make_unique<Regex>(kGpt2Pattern, where + " (GPT-2 regex)"));
      steps_.push_back(st);
    }
  } else {
    throw Error(where + ".type: unsupported pre-tokenizer '" + type +
                "' (supported: Sequence, Split, ByteLevel)");
  }
}

PreTokenizer::Scratch::Scratch(const PreTokenizer& pre) {
  for (const auto& re : pre.regexes_) matchers.push_back(std::make_unique<Regex::Matcher>(*re));
}

PreTokenizer::Scratch::~Scratch() = default;

void PreTokenizer::split(std::string_view text, Scratch& s, std::vector<Word>& out) const {
  DI_CHECK(s.matchers.size() == regexes_.size());
  DI_CHECK(text.size() < 0xFFFFFFFFu);
  out.clear();
  if (text.empty()) return;
  out.push_back(Word{0, static_cast<uint32_t>(text.size()), false});
  const bool newer = !regexes_.empty() && Regex::has_newer_chars(text);
  for (const Step& step : steps_) {
    if (step.prefix_space) {
      for (Word& w : out)
        if (!w.prefix_space && text[w.begin] != ' ') w.prefix_space = true;
      continue;
    }
    s.next.clear();
    for (const Word& w : out) apply_split(step, text, w, newer, s, s.next);
    out.swap(s.next);
  }
}

void PreTokenizer::apply_split(const Step& step, std::string_view text, const Word& w, bool newer,
                               Scratch& s, std::vector<Word>& out) const {
  // The subject is the word alone: look-arounds must not see the neighbouring words.
  std::string_view subject = text.substr(w.begin, w.end - w.begin);
  if (w.prefix_space) {
    s.prefixed.assign(1, ' ');
    s.prefixed.append(subject);
    subject = s.prefixed;
  }
  const auto len = static_cast<uint32_t>(subject.size());
  Regex::Matcher& m = *s.matchers[static_cast<size_t>(step.regex)];

  // Matches and the gaps between them, covering the subject.
  auto& segs = s.segs;
  segs.clear();
  size_t pos = 0, prev = 0, b = 0, e = 0;
  while (pos <= len && m.find(subject, pos, &b, &e, newer)) {
    if (e == b) {  // empty match: step over one character
      if (b >= len) break;
      pos = b + static_cast<size_t>(utf8::lead_length(static_cast<unsigned char>(subject[b])));
      continue;
    }
    if (b > prev) segs.push_back({static_cast<uint32_t>(prev), static_cast<uint32_t>(b), false});
    segs.push_back({static_cast<uint32_t>(b), static_cast<uint32_t>(e), true});
    prev = pos = e;
  }
  if (prev < len) segs.push_back({static_cast<uint32_t>(prev), len, false});
  if (step.invert)
    for (auto& g : segs) g.is_match = !g.is_match;

  // Fold by behaviour (as Hugging Face's NormalizedString::split); `keep` false means removed.
  auto emit = [&](uint32_t sb, uint32_t se) {
    if (se <= sb) return;
    if (!w.prefix_space) {
      out.push_back(Word{w.begin + sb, w.begin + se, false});
    } else if (sb == 0) {
      out.push_back(Word{w.begin, w.begin + se - 1, true});
    } else {
      out.push_back(Word{w.begin + sb - 1, w.begin + se - 1, false});
    }
  };
  switch (step.behavior) {
    case SplitBehavior::kIsolated:
      for (const auto& g : segs) emit(g.begin, g.end);
      break;
    case SplitBehavior::kRemoved:
      for (const auto& g : segs)
        if (!g.is_match) emit(g.begin, g.end);
      break;
    case SplitBehavior::kMergedWithPrevious:
    case SplitBehavior::kContiguous: {
      // Merge a segment into the one before it (MergedWithPrevious: a match after a non-match;
      // Contiguous: same kind as the previous).
      size_t n_out = 0;
      bool previous_match = false;
      for (size_t i = 0; i < segs.size(); ++i) {
        const auto g = segs[i];  // a copy: segs[n_out] may be this slot
        bool merge = step.behavior == SplitBehavior::kContiguous ? g.is_match == previous_match
                                                                 : g.is_match && !previous_match;
        if (merge && n_out > 0) {
          segs[n_out - 1].end = g.end;
        } else {
          segs[n_out++] = {g.begin, g.end, false};
        }
        previous_match = g.is_match;
      }
      for (size_t i = 0; i < n_out; ++i) emit(segs[i].begin, segs[i].end);
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      // Mirror image: walk backwards, merging a match into the segment after it.
      size_t n = segs.size();
      size_t n_out = 0;  // results stored from the back
      bool previous_match = false;
      for (size_t k = n; k-- > 0;) {
        const auto g = segs[k];
        if (g.is_match && !previous_match && n_out > 0) {
          segs[n - n_out].begin = g.begin;
        } else {
          ++n_out;
          segs[n - n_out] = {g.begin, g.end, false};
        }
        previous_match = g.is_match;
      }
      for (size_t i = n - n_out; i < n; ++i) emit(segs[i].begin, segs[i].end);
      break;
    }
  }
}

}  // namespace di
