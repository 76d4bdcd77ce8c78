// V4.1 completion parsing: fixed cases, round trips through the chat encoder, streaming in random
// chunk splits (fresh seed each run) against the one-shot parse, malformed DSML.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/chat_encoding.h"
#include "tokenizer/dsml_parser.h"
#include "tokenizer/python_json.h"

namespace di {
namespace {

using Json = nlohmann::ordered_json;

const std::string EOS = "<｜end▁of▁sentence｜>";
const std::string AST = "<｜Assistant｜>";

std::string Param(const std::string& key, const char* is_string, const std::string& value) {
  return "<｜DSML｜ parameter name=\"" + key + "\" string=\"" + is_string + "\">" + value + "</｜DSML｜ parameter>";
}
std::string Invoke(const std::string& name, const std::string& params) {
  return "<｜DSML｜ invoke name=\"" + name + "\">\n" + params + "\n</｜DSML｜ invoke>";
}
std::string Calls(const std::string& invokes) { return "\n\n<｜DSML｜ calls>\n" + invokes + "\n</｜DSML｜ calls>"; }

struct Outcome {
  bool ok = false;
  std::string error;
  ParsedCompletion value;
};

Outcome OneShot(const std::string& text, bool thinking) {
  Outcome o;
  try {
    o.value = parse_completion(text, thinking);
    o.ok = true;
  } catch (const Error& e) {
    o.error = e.what();
  }
  return o;
}

// Feeds `text` in random chunks (sizes 0..max_chunk bytes, cutting UTF-8 characters and tags).
Outcome Streamed(const std::string& text, bool thinking, std::mt19937& rng, size_t max_chunk) {
  Outcome o;
  CompletionParser parser(thinking);
  auto add = [&](const CompletionDelta& d) {
    o.value.reasoning_content += d.reasoning_content;
    o.value.content += d.content;
    o.value.tool_calls.insert(o.value.tool_calls.end(), d.tool_calls.begin(), d.tool_calls.end());
  };
  try {
    size_t pos = 0;
    while (pos < text.size()) {
      size_t n = std::min(text.size() - pos, static_cast<size_t>(rng() % (max_chunk + 1)));
      add(parser.feed(std::string_view(text).substr(pos, n)));
      pos += n;
    }
    add(parser.finish());
    o.value.saw_eos = parser.saw_eos();
    o.ok = true;
  } catch (const Error& e) {
    o.error = e.what();
  }
  return o;
}

void ExpectSame(const Outcome& a, const Outcome& b, const std::string& text) {
  ASSERT_EQ(a.ok, b.ok) << "text: " << text << "\n errors: '" << a.error << "' vs '" << b.error << "'";
  if (!a.ok) return;
  EXPECT_EQ(a.value.reasoning_content, b.value.reasoning_content) << text;
  EXPECT_EQ(a.value.content, b.value.content) << text;
  EXPECT_EQ(a.value.tool_calls, b.value.tool_calls) << text;
  EXPECT_EQ(a.value.saw_eos, b.value.saw_eos) << text;
}

unsigned FreshSeed(const char* name) {
  unsigned seed = static_cast<unsigned>(std::chrono::steady_clock::now().time_since_epoch().count());
  std::printf("%s seed=%u\n", name, seed);
  return seed;
}

// ---------------------------------------------------------------------------------------------
// Fixed cases

TEST(DsmlParser, ChatContent) {
  ParsedCompletion r = parse_completion("Hello, world." + EOS, false);
  EXPECT_EQ(r.reasoning_content, "");
  EXPECT_EQ(r.content, "Hello, world.");
  EXPECT_TRUE(r.tool_calls.empty());
  EXPECT_TRUE(r.saw_eos);
  // No EOS (cut by max_tokens or a stop string): what was read is the result.
  r = parse_completion("Hello", false);
  EXPECT_EQ(r.content, "Hello");
  EXPECT_FALSE(r.saw_eos);
}

TEST(DsmlParser, ThinkingReasoningThenContent) {
  ParsedCompletion r = parse_completion("Let me think.\nOK.</think>The answer is 4." + EOS, true);
  EXPECT_EQ(r.reasoning_content, "Let me think.\nOK.");
  EXPECT_EQ(r.content, "The answer is 4.");
  EXPECT_TRUE(r.saw_eos);
  // Reasoning cut before </think>.
  r = parse_completion("still thinking", true);
  EXPECT_EQ(r.reasoning_content, "still thinking");
  EXPECT_EQ(r.content, "");
}

TEST(DsmlParser, ToolCallsFromTheReleaseCase) {
  // The assistant turn of the release's test case 1, as the model writes it after "<think>".
  std::string text = "The user wants the weather in Beijing. I should call get_weather.</think>" +
                     Calls(Invoke("get_weather", Param("location", "true", "Beijing") + "\n" +
                                                     Param("unit", "true", "celsius"))) +
                     EOS;
  ParsedCompletion r = parse_completion(text, true);
  EXPECT_EQ(r.reasoning_content, "The user wants the weather in Beijing. I should call get_weather.");
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].name, "get_weather");
  EXPECT_EQ(r.tool_calls[0].arguments, R"({"location": "Beijing", "unit": "celsius"})");
}

TEST(DsmlParser, ArgumentsJsonText) {
  std::string text = "Checking." +
                     Calls(Invoke("f", Param("n", "false", "3") + "\n" + Param("obj", "false", "{\"a\":[1, 2.50]}") +
                                           "\n" + Param("s", "true", "a \"b\"\nc é <x>") + "\n" +
                                           Param("e", "true", "") + "\n" + Param("t", "false", " true ")) +
                           "\n" + Invoke("g", "")) +
                     EOS;
  ParsedCompletion r = parse_completion(text, false);
  EXPECT_EQ(r.content, "Checking.");
  ASSERT_EQ(r.tool_calls.size(), 2u);
  // string="true" values are JSON-quoted as Python does; string="false" values stay as written.
  EXPECT_EQ(r.tool_calls[0].arguments, R"({"n": 3, "obj": {"a":[1, 2.50]}, "s": "a \"b\"\nc é <x>", "e": "", "t":  true })");
  EXPECT_TRUE(Json::accept(r.tool_calls[0].arguments));
  EXPECT_EQ(r.tool_calls[1].name, "g");
  EXPECT_EQ(r.tool_calls[1].arguments, "{}");
}

TEST(DsmlParser, ReferencePatternQuirksAccepted) {
  // The reference's patterns end in `$`, which also matches before one final "\n".
  std::string text = "\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n\n"
                     "<｜DSML｜ parameter name=\"a\" string=\"true\">v<\n/｜DSML｜ parameter>\n"
                     "</｜DSML｜ invoke>\n</｜DSML｜ calls>";
  ParsedCompletion r = parse_completion(text, false);
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].arguments, R"({"a": "v"})");
  // A key may hold anything up to the first ` string="...">`.
  r = parse_completion(Calls(Invoke("f", Param("we\"ird>", "false", "1"))), false);
  EXPECT_EQ(r.tool_calls[0].arguments, R"({"we\"ird>": 1})");
}

TEST(DsmlParser, StreamingDeltas) {
  CompletionParser p(false);
  EXPECT_EQ(p.feed("Hel").content, "Hel");
  EXPECT_EQ(p.feed("lo\n").content, "lo");        // "\n" may start the calls block: held
  EXPECT_EQ(p.feed("\nmore").content, "\n\nmore");  // it did not
  CompletionDelta d = p.feed("\n\n<｜DS");
  EXPECT_TRUE(d.empty());
  d = p.feed("ML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n" + Param("k", "true", "v") + "\n</｜DSML｜ inv");
  EXPECT_TRUE(d.empty());
  d = p.feed("oke");  // the invoke is closed: the call is delivered
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0], (ParsedToolCall{"f", R"({"k": "v"})"}));
  EXPECT_TRUE(p.feed(">\n</｜DSML｜ calls>").empty());
  EXPECT_FALSE(p.saw_eos());
  EXPECT_TRUE(p.feed(EOS.substr(0, 5)).empty());
  EXPECT_TRUE(p.feed(EOS.substr(5)).empty());
  EXPECT_TRUE(p.saw_eos());
  EXPECT_TRUE(p.finish().empty());

  // UTF-8 characters are never cut in a delta.
  CompletionParser q(true);
  std::string e_acute = "é";
  EXPECT_EQ(q.feed(e_acute.substr(0, 1)).reasoning_content, "");
  EXPECT_EQ(q.feed(e_acute.substr(1) + "</thi").reasoning_content, "é");
  d = q.feed("nk>x");
  EXPECT_EQ(d.reasoning_content, "");
  EXPECT_EQ(d.content, "x");
  // Held-back text that never became a tag is released at the end.
  EXPECT_TRUE(q.feed("\n\n<｜DS").empty());
  EXPECT_EQ(q.finish().content, "\n\n<｜DS");
}

const std::vector<std::pair<std::string, bool>>& MalformedCases() {
  static const std::vector<std::pair<std::string, bool>> cases = {
      // Calls block: framing.
      {"\n\n<｜DSML｜ calls><｜DSML｜ invoke name=\"f\">\n</｜DSML｜ invoke>\n</｜DSML｜ calls>", false},
      {"\n\n<｜DSML｜ calls>\nx<｜DSML｜ invoke name=\"f\">\n</｜DSML｜ invoke>\n</｜DSML｜ calls>", false},
      {Calls(Invoke("f", "")) + "oops", false},
      {Calls(Invoke("f", "")) + "\n" + EOS, false},
      {Calls(Invoke("f", "") + "\nxx" + Invoke("g", "")), false},
      {"\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n</｜DSML｜ invoke>\n", false},  // never closed
      {"\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n" + std::string("<｜DSML｜ parameter name=\"a\" string=\"true\">v"), false},
      {"\n\n<｜DSML｜ calls", false},
      // Invoke and parameter tags.
      {Calls("<｜DSML｜ invoke nam=\"f\">\n\n</｜DSML｜ invoke>"), false},
      {Calls("<｜DSML｜ invoke name=\"f\">\n" + Param("a", "true", "1") + "</｜DSML｜ invoke>"), false},
      {Calls(Invoke("f", Param("a", "maybe", "1"))), false},
      {Calls(Invoke("f", "<｜DSML｜ parameter  name=\"a\" string=\"true\">1</｜DSML｜ parameter>")), false},
      {Calls(Invoke("f", "<｜DSML｜ parameter name=\"a\">1</｜DSML｜ parameter>")), false},
      {Calls(Invoke("f", Param("a", "true", "1") + "\n" + Param("a", "true", "2"))), false},
      {Calls(Invoke("f", Param("a", "false", "hello"))), false},
      {Calls(Invoke("f", Param("a", "false", "{\"x\": 1"))), false},
      {Calls(Invoke("f", Param("a", "true", "1") + Param("b", "true", "2"))), false},
      // Structure and special tokens.
      {"hi" + EOS + "more", false},
      {"a<think>b", false},
      {"a</think>b", false},
      {"a｜DSML｜b", false},
      {"<｜begin▁of▁sentence｜>x", false},
      {"x<｜DSML｜ calls>", false},
      {"r\n\n<｜DSML｜ calls>\n" + Invoke("f", "") + "\n</｜DSML｜ calls>", true},
      {"r" + EOS, true},
      {"r<think></think>c", true},
      {"r</think>c<think>", true},
      {"r</think>c</think>", true},
  };
  return cases;
}

TEST(DsmlParser, MalformedIsAnError) {
  std::mt19937 rng(FreshSeed("DsmlParser.MalformedIsAnError"));
  for (const auto& [text, thinking] : MalformedCases()) {
    Outcome one = OneShot(text, thinking);
    EXPECT_FALSE(one.ok) << "accepted: " << text;
    EXPECT_EQ(one.error.rfind("malformed completion: ", 0), 0u) << one.error;
    for (size_t max_chunk : {1, 3, 17}) {
      Outcome s = Streamed(text, thinking, rng, max_chunk);
      EXPECT_FALSE(s.ok) << "streamed, accepted: " << text;
    }
  }
  // An error is sticky.
  CompletionParser p(false);
  EXPECT_THROW(p.feed("a<think>"), Error);
  EXPECT_THROW(p.feed("more"), Error);
  EXPECT_THROW(p.finish(), Error);
}

// ---------------------------------------------------------------------------------------------
// Round trips through the encoder, one-shot and streamed

struct RandomAssistant {
  std::mt19937& rng;

  std::string Text(int max_atoms) {
    static const std::vector<std::string> atoms = {"a", "Zed", " ", "\n", "\n\n", "\"", "\\", "<", ">", "</", "é",
                                                   "中文", "😀", "{}", "[1]", "thin", "DSM", "｜", "calls", "\t"};
    std::string s;
    for (int i = static_cast<int>(rng() % (max_atoms + 1)); i > 0; --i) s += atoms[rng() % atoms.size()];
    return s;
  }

  Json Value(int depth) {
    switch (rng() % (depth > 2 ? 6 : 8)) {
      case 0: return nullptr;
      case 1: return rng() % 2 == 1;
      case 2: return static_cast<int64_t>(rng() % 2000001) - 1000000;
      case 3: return (static_cast<double>(rng() % 100000) - 50000.0) / 64.0;
      case 4: return 1e-9 * static_cast<double>(rng() % 1000 + 1);
      case 5: return Text(6);
      case 6: {
        Json a = Json::array();
        for (int i = static_cast<int>(rng() % 4); i > 0; --i) a.push_back(Value(depth + 1));
        return a;
      }
      default: {
        Json o = Json::object();
        for (int i = static_cast<int>(rng() % 4); i > 0; --i) o[Text(2) + std::to_string(i)] = Value(depth + 1);
        return o;
      }
    }
  }

  Json Message(bool* has_reasoning) {
    Json m = {{"role", "assistant"}, {"content", Text(8)}};
    *has_reasoning = rng() % 2;
    if (*has_reasoning) m["reasoning_content"] = Text(8);
    int n_calls = static_cast<int>(rng() % 4);
    if (n_calls) m["tool_calls"] = Json::array();
    static const std::vector<std::string> keys = {"city", "n", "query", "é", "a b", "x-1", "list", "opt"};
    for (int c = 0; c < n_calls; ++c) {
      Json args = Json::object();
      for (int k = static_cast<int>(rng() % 4); k > 0; --k) args[keys[rng() % keys.size()]] = Value(0);
      Json fn = {{"name", "fn_" + std::to_string(rng() % 5)}};
      if (rng() % 2) {
        fn["arguments"] = args.dump();  // JSON text, as OpenAI clients send it
      } else {
        fn["arguments"] = args;
      }
      m["tool_calls"].push_back({{"id", "call_" + std::to_string(c)}, {"type", "function"}, {"function", fn}});
    }
    return m;
  }
};

TEST(DsmlParser, RoundTripThroughEncoderAndRandomStreaming) {
  std::mt19937 rng(FreshSeed("DsmlParser.RoundTripThroughEncoderAndRandomStreaming"));
  RandomAssistant gen{rng};
  for (int iter = 0; iter < 300; ++iter) {
    bool thinking = rng() % 2;
    bool has_reasoning = false;
    Json assistant = gen.Message(&has_reasoning);
    Json request = {{"thinking", thinking}, {"messages", {{{"role", "user"}, {"content", "q"}}, assistant}}};
    std::string prompt = encode_chat_request(request).text;
    std::string header = AST + (thinking ? "<think>" : "</think>");
    size_t at = prompt.find(header);
    ASSERT_NE(at, std::string::npos);
    std::string completion = prompt.substr(at + header.size());

    Outcome one = OneShot(completion, thinking);
    ASSERT_TRUE(one.ok) << one.error << "\ncompletion: " << completion;
    EXPECT_EQ(one.value.reasoning_content, has_reasoning && thinking ? assistant["reasoning_content"].get<std::string>() : "");
    EXPECT_EQ(one.value.content, assistant["content"].get<std::string>());
    EXPECT_TRUE(one.value.saw_eos);
    size_t n_calls = assistant.contains("tool_calls") ? assistant["tool_calls"].size() : 0;
    ASSERT_EQ(one.value.tool_calls.size(), n_calls) << completion;
    for (size_t c = 0; c < n_calls; ++c) {
      const Json& fn = assistant["tool_calls"][c]["function"];
      Json args = fn["arguments"].is_string() ? Json::parse(fn["arguments"].get<std::string>()) : fn["arguments"];
      EXPECT_EQ(one.value.tool_calls[c].name, fn["name"].get<std::string>());
      // Exactly the reference's text for the same call, and the same JSON value.
      EXPECT_EQ(one.value.tool_calls[c].arguments, python_json_dumps(args));
      EXPECT_EQ(Json::parse(one.value.tool_calls[c].arguments), args);
    }
    for (size_t max_chunk : {1, 2, 7, 64}) ExpectSame(one, Streamed(completion, thinking, rng, max_chunk), completion);
  }
}

TEST(DsmlParser, RandomTextsStreamLikeOneShot) {
  // Random mixtures of fragments, mostly malformed: streaming must reach the same verdict and result.
  std::mt19937 rng(FreshSeed("DsmlParser.RandomTextsStreamLikeOneShot"));
  const std::vector<std::string> frags = {"a", "é", "\n", "\n\n", ">\n", "</think>", "<think>", EOS,
                                          "\n\n<｜DSML｜ calls>\n", "<｜DSML｜ invoke name=\"f\">\n",
                                          Param("k", "true", "v"), Param("n", "false", "1"), "</｜DSML｜ invoke>",
                                          "</｜DSML｜ calls>", "<｜DSML｜ parameter", "/｜DSML｜ parameter>", "｜"};
  int accepted = 0;
  for (int iter = 0; iter < 2000; ++iter) {
    std::string text;
    for (int i = static_cast<int>(rng() % 10); i > 0; --i) text += frags[rng() % frags.size()];
    bool thinking = rng() % 2;
    Outcome one = OneShot(text, thinking);
    accepted += one.ok;
    ExpectSame(one, Streamed(text, thinking, rng, 1 + rng() % 12), text);
  }
  std::printf("accepted %d of 2000 random texts\n", accepted);
}

}  // namespace
}  // namespace di
