// Tokenizer encode throughput: encodes a few MB of mixed documents (prose, code, CJK, numbers,
// emoji, special tokens) and prints MB/s for a cold pass (empty word cache) and the best warm pass,
// by thread CPU time (steady on a shared machine) and by wall time.
//   tokenizer_bench --model DIR [--docs FILE.jsonl] [--write-docs FILE.jsonl] [--mb 4] [--passes 4]
// Without --docs the documents are tests/peers/corpus.jsonl plus deterministic synthetic text;
// --write-docs saves them (one {"text": ...} per line) so bench/tokenizer_bench.js can time the
// JavaScript tokenizer on the very same input. The id checksum must match the JS one.
#include <chrono>
#include <ctime>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace {

struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  size_t below(size_t n) { return static_cast<size_t>(next() % n); }
  double unit() { return static_cast<double>(next() >> 11) / 9007199254740992.0; }
  // Zipf-like: small indices much more likely.
  size_t zipf(size_t n) { return static_cast<size_t>(static_cast<double>(n) * unit() * unit() * unit()); }
};

const char* kCommon[] = {"the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with",
                         "be", "by", "on", "not", "he", "I", "this", "are", "or", "his", "from", "at",
                         "which", "but", "have", "an", "had", "they", "you", "were", "their", "one",
                         "all", "we", "can", "her", "has", "there", "been", "if", "more", "when",
                         "will", "would", "who", "so", "no", "model", "token", "inference", "memory"};
const char* kSyllables[] = {"pro", "con", "al", "re", "de", "ex", "com", "at", "en", "or", "ly", "ment",
                            "ous", "st", "ch", "sh", "th", "a", "e", "i", "o", "u", "tion", "ing", "er",
                            "ab", "im", "per", "ver", "na", "ti", "ka", "lo", "mi", "zu", "ble", "ist"};
const char* kCjk[] = {"的", "一", "是", "在", "不", "了", "有", "和", "人", "这", "中", "大", "为", "上",
                      "个", "国", "我", "以", "要", "他", "时", "来", "用", "们", "生", "到", "作", "地",
                      "于", "出", "就", "分", "对", "成", "会", "可", "主", "发", "年", "动", "同", "工",
                      "也", "能", "下", "过", "子", "说", "产", "种", "面", "而", "方", "后", "多", "定",
                      "の", "に", "は", "を", "た", "が", "で", "て", "と", "し", "れ", "さ", "ア", "イ",
                      "ス", "ト", "ル", "한", "국", "어", "다", "는", "이", "가"};
const char* kPunct[] = {",", ".", ";", ":", "!", "?", " -", " (", ")", "\"", "'s", "'t", "..."};
const char* kCode[] = {"if", "for", "while", "return", "int", "auto", "const", "def", "self", "let",
                       "fn", "std::vector", "size_t", "nullptr", "true", "false", "import", "class"};
const char* kOps[] = {" = ", " == ", " + ", " - ", " * ", " / ", " += ", "(", ")", "[", "]", "{", "}",
                      "->", "::", ", ", "; ", " < ", " && ", " || "};
const char* kMisc[] = {"😀", "👍🏽", "👨‍👩‍👧‍👦", "🇯🇵", "https://example.com/a/b?c=1", "user@example.org",
                       "<｜User｜>", "<｜Assistant｜>", "<think>", "</think>", "\t", "   ", "\r\n", "→", "≤"};

std::string make_word(Rng& r) {
  std::string w;
  size_t n = 1 + r.below(4);
  for (size_t i = 0; i < n; ++i) w += kSyllables[r.below(std::size(kSyllables))];
  return w;
}

std::string prose(Rng& r, const std::vector<std::string>& lexicon) {
  std::string s;
  size_t sentences = 3 + r.below(12);
  for (size_t k = 0; k < sentences; ++k) {
    size_t words = 5 + r.below(20);
    for (size_t i = 0; i < words; ++i) {
      if (i) s += ' ';
      double u = r.unit();
      std::string w = u < 0.55 ? kCommon[r.zipf(std::size(kCommon))] : lexicon[r.zipf(lexicon.size())];
      if (i == 0) w[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(w[0])));
      s += w;
      if (r.unit() < 0.08) s += kPunct[r.below(std::size(kPunct))];
      if (r.unit() < 0.03) {
        s += ' ';
        s += std::to_string(r.next() % 100000);
      }
    }
    s += r.unit() < 0.8 ? ". " : "? ";
    if (r.unit() < 0.15) s += "\n\n";
  }
  return s;
}

std::string code(Rng& r, const std::vector<std::string>& lexicon) {
  std::string s;
  size_t lines = 5 + r.below(30);
  for (size_t k = 0; k < lines; ++k) {
    s.append(4 * r.below(4), ' ');
    size_t items = 2 + r.below(8);
    for (size_t i = 0; i < items; ++i) {
      s += r.unit() < 0.4 ? kCode[r.below(std::size(kCode))] : lexicon[r.zipf(lexicon.size())];
      if (r.unit() < 0.3) {
        s += '_';
        s += lexicon[r.zipf(lexicon.size())];
      }
      s += kOps[r.below(std::size(kOps))];
      if (r.unit() < 0.2) s += std::to_string(r.below(4096));
    }
    s += r.unit() < 0.5 ? ";\n" : "\n";
  }
  return s;
}

std::string cjk(Rng& r) {
  std::string s;
  size_t n = 50 + r.below(400);
  for (size_t i = 0; i < n; ++i) {
    s += kCjk[r.zipf(std::size(kCjk))];
    if (r.unit() < 0.06) s += r.unit() < 0.5 ? "，" : "。";
    if (r.unit() < 0.01) s += "DeepSeek";
  }
  return s;
}

std::string misc(Rng& r, const std::vector<std::string>& lexicon) {
  std::string s;
  size_t n = 20 + r.below(100);
  for (size_t i = 0; i < n; ++i) {
    double u = r.unit();
    if (u < 0.3) s += kMisc[r.below(std::size(kMisc))];
    else if (u < 0.6) s += std::to_string(r.next() % 10000000000ull);
    else s += lexicon[r.zipf(lexicon.size())];
    s += r.unit() < 0.7 ? " " : "\n";
  }
  return s;
}

std::vector<std::string> make_docs(double megabytes) {
  std::vector<std::string> docs;
  std::ifstream corpus(std::string(DEEPINFER_SOURCE_DIR) + "/tests/peers/corpus.jsonl");
  std::string line;
  while (std::getline(corpus, line))
    if (!line.empty()) docs.push_back(nlohmann::json::parse(line).at("text").get<std::string>());
  Rng r{20250101};
  std::vector<std::string> lexicon;
  for (int i = 0; i < 20000; ++i) lexicon.push_back(make_word(r));
  size_t bytes = 0;
  for (const auto& d : docs) bytes += d.size();
  const auto target = static_cast<size_t>(megabytes * 1e6);
  while (bytes < target) {
    double u = r.unit();
    std::string d = u < 0.65 ? prose(r, lexicon) : u < 0.85 ? code(r, lexicon) : u < 0.95 ? cjk(r) : misc(r, lexicon);
    bytes += d.size();
    docs.push_back(std::move(d));
  }
  return docs;
}

// CPU time of this thread: steadier than wall time on a shared machine.
double thread_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model, docs_path, write_path;
  double mb = 4;
  int passes = 4;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--model") model = argv[i + 1];
    else if (a == "--docs") docs_path = argv[i + 1];
    else if (a == "--write-docs") write_path = argv[i + 1];
    else if (a == "--mb") mb = std::stod(argv[i + 1]);
    else if (a == "--passes") passes = std::max(2, std::stoi(argv[i + 1]));
    else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  if (model.empty()) {
    std::fprintf(stderr, "usage: tokenizer_bench --model DIR [--docs F] [--write-docs F] [--mb 4] [--passes 4]\n");
    return 2;
  }
  try {
    std::vector<std::string> docs;
    if (!docs_path.empty()) {
      std::ifstream in(docs_path);
      std::string line;
      while (std::getline(in, line))
        if (!line.empty()) docs.push_back(nlohmann::json::parse(line).at("text").get<std::string>());
    } else {
      docs = make_docs(mb);
    }
    if (!write_path.empty()) {
      std::ofstream out(write_path);
      for (const auto& d : docs) out << nlohmann::json{{"text", d}}.dump() << '\n';
    }
    size_t bytes = 0;
    for (const auto& d : docs) bytes += d.size();

    auto t0 = std::chrono::steady_clock::now();
    auto tok = di::Tokenizer::load(model);
    auto t1 = std::chrono::steady_clock::now();
    std::printf("load: %.3f s; %zu documents, %.2f MB\n", std::chrono::duration<double>(t1 - t0).count(),
                docs.size(), static_cast<double>(bytes) / 1e6);

    double cold = 0, best_warm = 1e30, cold_wall = 0, best_warm_wall = 1e30;
    uint64_t checksum = 0;
    size_t n_tokens = 0;
    for (int p = 0; p < passes; ++p) {
      uint64_t h = 1469598103934665603ull;  // FNV-1a over the ids
      size_t n = 0;
      auto a = std::chrono::steady_clock::now();
      const double c0 = thread_seconds();
      for (const auto& d : docs) {
        for (int32_t id : tok->encode(d)) {
          h = (h ^ static_cast<uint32_t>(id)) * 1099511628211ull;
          ++n;
        }
      }
      const double s = thread_seconds() - c0;
      const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
      if (p == 0) {
        cold = s;
        cold_wall = wall;
        checksum = h;
        n_tokens = n;
      } else {
        best_warm = std::min(best_warm, s);
        best_warm_wall = std::min(best_warm_wall, wall);
      }
    }
    const double mbytes = static_cast<double>(bytes) / 1e6;
    std::printf("tokens: %zu  checksum: %016llx\n", n_tokens, static_cast<unsigned long long>(checksum));
    std::printf("C++ encode (CPU time): cold %.1f MB/s, warm %.1f MB/s (%.2f bytes/token)\n", mbytes / cold,
                mbytes / best_warm, static_cast<double>(bytes) / static_cast<double>(n_tokens));
    std::printf("C++ encode (wall time): cold %.1f MB/s, warm %.1f MB/s\n", mbytes / cold_wall,
                mbytes / best_warm_wall);
  } catch (const di::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
