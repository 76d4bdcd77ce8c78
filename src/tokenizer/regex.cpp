#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/regex.h"

#include <pcre2.h>
#include <unicode/uchar.h>
#include <unicode/uset.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>
#include <vector>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace di {

namespace {

// The Unicode White_Space property as class items (Oniguruma's and Rust's \s).
constexpr std::string_view kWhiteSpaceItems =
    "\\t-\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}"
    "\\x{3000}";
constexpr std::string_view kHexItems = "0-9a-fA-F";

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  int n = pcre2_get_error_message(code, buf, sizeof(buf));
  return n < 0 ? "PCRE2 error " + std::to_string(code) : std::string(reinterpret_cast<char*>(buf));
}

// "major.minor" of PCRE2's Unicode tables, e.g. "14.0".
std::string pcre2_unicode_version() {
  char buf[64] = {};
  pcre2_config(PCRE2_CONFIG_UNICODE_VERSION, buf);
  std::string v(buf);
  size_t dot = v.find('.');
  if (dot != std::string::npos) dot = v.find('.', dot + 1);
  return v.substr(0, dot);
}

bool version_less(const std::string& a, const std::string& b) {
  int a1 = 0, a2 = 0, b1 = 0, b2 = 0;
  std::sscanf(a.c_str(), "%d.%d", &a1, &a2);
  std::sscanf(b.c_str(), "%d.%d", &b1, &b2);
  return a1 != b1 ? a1 < b1 : a2 < b2;
}

using Ranges = std::vector<std::pair<char32_t, char32_t>>;

// The code points with property `name` (an ICU set expression such as "L" or "^Cn") that ICU
// knows but PCRE2's older tables do not (assigned after PCRE2's Unicode version). Empty when PCRE2
// is as new as ICU or ICU does not know the name.
const Ranges& newer_ranges(const std::string& name) {
  static std::mutex mu;
  static std::map<std::string, Ranges> cache;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = cache.find(name); it != cache.end()) return it->second;
  Ranges ranges;
  UVersionInfo icu{};
  u_getUnicodeVersion(icu);
  const std::string icu_version = std::to_string(icu[0]) + "." + std::to_string(icu[1]);
  const std::string pcre_version = pcre2_unicode_version();
  if (version_less(pcre_version, icu_version)) {
    const std::string pattern = "[[:" + name + ":]-[:Age=" + pcre_version + ":]]";
    std::u16string wide(pattern.begin(), pattern.end());
    UErrorCode status = U_ZERO_ERROR;
    USet* set = uset_openPattern(reinterpret_cast<const UChar*>(wide.data()), static_cast<int32_t>(wide.size()), &status);
    if (U_SUCCESS(status) && set != nullptr) {
      const int32_t n = uset_getItemCount(set);
      for (int32_t i = 0; i < n; ++i) {
        UChar32 lo = 0, hi = 0;
        UErrorCode st = U_ZERO_ERROR;
        if (uset_getItem(set, i, &lo, &hi, nullptr, 0, &st) != 0 || U_FAILURE(st)) continue;  // strings: none here
        ranges.emplace_back(static_cast<char32_t>(lo), static_cast<char32_t>(hi));
      }
    }
    if (set != nullptr) uset_close(set);
  }
  return cache.emplace(name, std::move(ranges)).first->second;  // std::map keeps references valid
}

// newer_ranges(name) as PCRE2 class items.
std::string newer_property_items(const std::string& name) {
  std::string items;
  char buf[48];
  for (const auto& [lo, hi] : newer_ranges(name)) {
    std::snprintf(buf, sizeof(buf), "\\x{%X}-\\x{%X}", static_cast<unsigned>(lo), static_cast<unsigned>(hi));
    items += buf;
  }
  return items;
}

}  // namespace

std::string translate_onig_pattern(std::string_view p, bool newer_unicode) {
  std::string out;
  out.reserve(p.size() + 64);
  bool in_class = false;
  bool class_start = false;  // just after '[' or '[^': a ']' here is literal
  std::string class_extra;   // newer-Unicode items for the open class
  for (size_t i = 0; i < p.size(); ++i) {
    char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      char e = p[i + 1];
      ++i;
      class_start = false;
      if (e == 's' || e == 'h') {
        std::string_view items = e == 's' ? kWhiteSpaceItems : kHexItems;
        if (in_class) {
          out += items;
        } else {
          out += '[';
          out += items;
          out += ']';
        }
        continue;
      }
      if ((e == 'p' || e == 'P') && i + 1 < p.size()) {
        // \p{Name} or \pL: add the characters newer than PCRE2's Unicode tables (from ICU).
        size_t name_begin = i + 1, name_end = i + 2;
        if (p[i + 1] == '{') {
          name_begin = i + 2;
          name_end = p.find('}', name_begin);
          if (name_end == std::string_view::npos) name_end = name_begin;  // malformed: PCRE2 reports it
        }
        const std::string name(p.substr(name_begin, name_end - name_begin));
        const std::string extra =
            !newer_unicode || name.empty() || name[0] == '^' ? std::string() : newer_property_items(name);
        const std::string_view original = p.substr(i - 1, (p[i + 1] == '{' ? name_end + 1 : name_end) - (i - 1));
        if (extra.empty() || (e == 'P' && in_class)) {
          out += original;
        } else if (in_class) {
          out += original;
          class_extra += extra;  // emitted at the class end, after the cheaper items
        } else {
          out += e == 'p' ? "[" : "[^";
          out += "\\p";
          out += original.substr(2);
          out += extra;
          out += ']';
        }
        i = (p[i + 1] == '{' ? name_end : name_end - 1);
        continue;
      }
      if ((e == 'S' || e == 'H') && !in_class) {
        out += "[^";
        out += e == 'S' ? kWhiteSpaceItems : kHexItems;
        out += ']';
        continue;
      }
      out += '\\';
      out += e;
      continue;
    }
    if (in_class) {
      if (c == ']' && !class_start) {
        in_class = false;
        out += class_extra;
        class_extra.clear();
      }
      class_start = class_start && c == '^' && out.back() == '[';
    } else if (c == '[') {
      in_class = true;
      class_start = true;
    }
    out += c;
  }
  return out;
}

namespace {

pcre2_code* compile(const std::string& translated, std::string_view pattern, const std::string& origin, bool* jit) {
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  auto* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                             PCRE2_UTF | PCRE2_UCP, &err, &err_offset, nullptr);
  if (code == nullptr) {
    throw Error(origin + ": regex " + std::string(pattern) + " does not compile (" + pcre2_message(err) +
                " at offset " + std::to_string(err_offset) + ")");
  }
  *jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  return code;
}

}  // namespace

bool Regex::has_newer_chars(std::string_view text) {
  // Newer BMP code points as a bitmap; astral ones by binary search over the ranges.
  struct Table {
    const Ranges& ranges = newer_ranges("^Cn");  // every assigned code point PCRE2 lacks
    std::vector<uint64_t> bmp = std::vector<uint64_t>(65536 / 64, 0);
    Table() {
      for (const auto& [lo, hi] : ranges)
        for (char32_t c = lo; c <= hi && c < 65536; ++c) bmp[c >> 6] |= uint64_t{1} << (c & 63);
    }
  };
  static const Table table;
  if (table.ranges.empty()) return false;
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  for (size_t i = 0; i < n;) {
    if (p[i] < 0xE0) {  // below U+0800: nothing there is newer than Unicode 14
      ++i;
      continue;
    }
    char32_t cp = 0;
    i += static_cast<size_t>(utf8::decode_valid(p + i, &cp));
    if (cp < 65536) {
      if ((table.bmp[cp >> 6] >> (cp & 63)) & 1) return true;
      continue;
    }
    const auto& r = table.ranges;
    auto it = std::upper_bound(r.begin(), r.end(), std::make_pair(cp, char32_t{0x10FFFF}));
    if (it != r.begin() && cp <= std::prev(it)->second) return true;
  }
  return false;
}

Regex::Regex(std::string_view pattern, const std::string& origin) : origin_(origin) {
  const std::string full = translate_onig_pattern(pattern, true);
  code_ = compile(full, pattern, origin, &jit_);
  const std::string plain = translate_onig_pattern(pattern, false);
  if (plain != full) plain_code_ = compile(plain, pattern, origin, &plain_jit_);
}

Regex::~Regex() {
  pcre2_code_free(static_cast<pcre2_code*>(code_));
  if (plain_code_) pcre2_code_free(static_cast<pcre2_code*>(plain_code_));
}

Regex::Matcher::Matcher(const Regex& re) : re_(re) {
  match_data_ = pcre2_match_data_create_from_pattern(static_cast<pcre2_code*>(re.code_), nullptr);
  DI_CHECK(match_data_ != nullptr);
}

Regex::Matcher::~Matcher() {
  if (jit_stack_) pcre2_jit_stack_free(static_cast<pcre2_jit_stack*>(jit_stack_));
  if (match_context_) pcre2_match_context_free(static_cast<pcre2_match_context*>(match_context_));
  pcre2_match_data_free(static_cast<pcre2_match_data*>(match_data_));
}

bool Regex::Matcher::find(std::string_view subject, size_t offset, size_t* begin, size_t* end, bool newer) {
  const bool use_plain = !newer && re_.plain_code_ != nullptr;
  auto* code = static_cast<pcre2_code*>(use_plain ? re_.plain_code_ : re_.code_);
  const bool jit = use_plain ? re_.plain_jit_ : re_.jit_;
  auto* md = static_cast<pcre2_match_data*>(match_data_);
  auto* mctx = static_cast<pcre2_match_context*>(match_context_);
  const auto* s = reinterpret_cast<PCRE2_SPTR>(subject.data());
  int rc = jit ? pcre2_jit_match(code, s, subject.size(), offset, 0, md, mctx)
               : pcre2_match(code, s, subject.size(), offset, PCRE2_NO_UTF_CHECK, md, mctx);
  if (rc == PCRE2_ERROR_JIT_STACKLIMIT && jit_stack_ == nullptr) {
    // The default 32 KiB JIT stack ran out: retry once with a large private one.
    mctx = pcre2_match_context_create(nullptr);
    DI_CHECK(mctx != nullptr);
    match_context_ = mctx;
    auto* stack = pcre2_jit_stack_create(256 * 1024, 256 * 1024 * 1024, nullptr);
    DI_CHECK(stack != nullptr);
    jit_stack_ = stack;
    pcre2_jit_stack_assign(mctx, nullptr, stack);
    rc = pcre2_jit_match(code, s, subject.size(), offset, 0, md, mctx);
  }
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) {
    throw Error(re_.origin_ + ": regex match failed on a " + std::to_string(subject.size()) +
                "-byte piece (" + pcre2_message(rc) + ")");
  }
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
  *begin = ov[0];
  *end = ov[1];
  return true;
}

}  // namespace di
