#include "tokenizer/utf8.h"

namespace di::utf8 {

namespace {

// Valid range of the second byte for a lead byte (Unicode Table 3-7); {1,0} means the lead is
// never valid.
struct SecondRange {
  unsigned char lo, hi;
};

SecondRange second_range(unsigned char lead) {
  if (lead >= 0xC2 && lead <= 0xDF) return {0x80, 0xBF};
  if (lead == 0xE0) return {0xA0, 0xBF};
  if ((lead >= 0xE1 && lead <= 0xEC) || lead == 0xEE || lead == 0xEF) return {0x80, 0xBF};
  if (lead == 0xED) return {0x80, 0x9F};
  if (lead == 0xF0) return {0x90, 0xBF};
  if (lead >= 0xF1 && lead <= 0xF3) return {0x80, 0xBF};
  if (lead == 0xF4) return {0x80, 0x8F};
  return {1, 0};
}

// Length of the maximal subpart of an ill-formed sequence at s[i] (at least 1).
size_t maximal_subpart(std::string_view s, size_t i) {
  const auto lead = static_cast<unsigned char>(s[i]);
  SecondRange r = second_range(lead);
  if (r.lo > r.hi) return 1;
  const int need = lead_length(lead);
  size_t n = 1;
  if (i + n < s.size()) {
    auto c = static_cast<unsigned char>(s[i + n]);
    if (c < r.lo || c > r.hi) return n;
    ++n;
    while (n < static_cast<size_t>(need) && i + n < s.size()) {
      c = static_cast<unsigned char>(s[i + n]);
      if (c < 0x80 || c > 0xBF) return n;
      ++n;
    }
  }
  return n;
}

}  // namespace

int decode(std::string_view s, size_t i, char32_t* cp) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + i;
  const size_t left = s.size() - i;
  const unsigned lead = p[0];
  if (lead < 0x80) {
    *cp = lead;
    return 1;
  }
  SecondRange r = second_range(static_cast<unsigned char>(lead));
  if (r.lo > r.hi) return 0;
  const int need = lead_length(static_cast<unsigned char>(lead));
  if (left < static_cast<size_t>(need)) return 0;
  if (p[1] < r.lo || p[1] > r.hi) return 0;
  for (int k = 2; k < need; ++k)
    if (p[k] < 0x80 || p[k] > 0xBF) return 0;
  return decode_valid(p, cp);
}

size_t first_invalid(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    // ASCII fast path, 8 bytes at a time.
    while (i + 8 <= n) {
      uint64_t w;
      __builtin_memcpy(&w, p + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= n) break;
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    char32_t cp;
    int len = decode(s, i, &cp);
    if (len == 0) return i;
    i += static_cast<size_t>(len);
  }
  return kValid;
}

int scan(std::string_view s, size_t i, char32_t* cp) {
  int len = decode(s, i, cp);
  if (len > 0) return len;
  const size_t bad = maximal_subpart(s, i);
  const auto lead = static_cast<unsigned char>(s[i]);
  SecondRange r = second_range(lead);
  if (r.lo <= r.hi && i + bad == s.size() && bad < static_cast<size_t>(lead_length(lead))) return 0;
  return -static_cast<int>(bad);
}

void append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string to_valid_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    char32_t cp;
    int len = decode(s, i, &cp);
    if (len > 0) {
      out.append(s.substr(i, static_cast<size_t>(len)));
      i += static_cast<size_t>(len);
    } else {
      append(out, kReplacement);
      i += maximal_subpart(s, i);
    }
  }
  return out;
}

bool is_white_space(char32_t cp) {
  if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
  if (cp < 0x85) return false;
  switch (cp) {
    case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

}  // namespace di::utf8
