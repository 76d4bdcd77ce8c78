#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/regex.h"

#include <pcre2.h>

#include "core/error.h"

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

}  // namespace

std::string translate_onig_pattern(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 64);
  bool in_class = false;
  bool class_start = false;  // just after '[' or '[^': a ']' here is literal
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
      if (c == ']' && !class_start) in_class = false;
      class_start = class_start && c == '^' && out.back() == '[';
    } else if (c == '[') {
      in_class = true;
      class_start = true;
    }
    out += c;
  }
  return out;
}

Regex::Regex(std::string_view pattern, const std::string& origin) : origin_(origin) {
  std::string translated = translate_onig_pattern(pattern);
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  auto* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                             PCRE2_UTF | PCRE2_UCP, &err, &err_offset, nullptr);
  if (code == nullptr) {
    throw Error(origin + ": regex " + std::string(pattern) + " does not compile (" + pcre2_message(err) +
                " at offset " + std::to_string(err_offset) + ")");
  }
  code_ = code;
  jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

Regex::Matcher::Matcher(const Regex& re) : re_(re) {
  match_data_ = pcre2_match_data_create_from_pattern(static_cast<pcre2_code*>(re.code_), nullptr);
  DI_CHECK(match_data_ != nullptr);
}

Regex::Matcher::~Matcher() {
  if (jit_stack_) pcre2_jit_stack_free(static_cast<pcre2_jit_stack*>(jit_stack_));
  if (match_context_) pcre2_match_context_free(static_cast<pcre2_match_context*>(match_context_));
  pcre2_match_data_free(static_cast<pcre2_match_data*>(match_data_));
}

bool Regex::Matcher::find(std::string_view subject, size_t offset, size_t* begin, size_t* end) {
  auto* code = static_cast<pcre2_code*>(re_.code_);
  auto* md = static_cast<pcre2_match_data*>(match_data_);
  auto* mctx = static_cast<pcre2_match_context*>(match_context_);
  const auto* s = reinterpret_cast<PCRE2_SPTR>(subject.data());
  int rc = re_.jit_ ? pcre2_jit_match(code, s, subject.size(), offset, 0, md, mctx)
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
