// V4.1 chat encoding: expected prompts hand-traced from DeepSeek's reference encoder
// (encoding/encoding.py; SGLang's copy encoding_dsv41.py). The Hf* cases are the V4.1 release's own
// encoding test cases (encoding/tests/test_input_{1,2,3}.json) with their reference outputs.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/chat_encoding.h"
#include "tokenizer/python_json.h"

namespace di {
namespace {

using Json = nlohmann::ordered_json;

const std::string BOS = "<｜begin▁of▁sentence｜>";
const std::string EOS = "<｜end▁of▁sentence｜>";
const std::string SYS = "<｜System｜>";
const std::string USR = "<｜User｜>";
const std::string AST = "<｜Assistant｜>";
const std::string LR = "<｜latest_reminder｜>";
const std::string THINK = "<think>";
const std::string ENDTHINK = "</think>";

std::string Effort(int n) {
  return "Reasoning Effort: " + std::to_string(n) +
         " (range 1-100, the higher the value, the more thorough the reasoning)\n\n";
}

// The tools block of the reference, typed out once here.
std::string Tools(const std::vector<std::string>& schemas) {
  std::string head = R"(## Tools

You have access to a set of tools to help answer the user's question. You can invoke tools by writing a "<｜DSML｜ calls>" block like the following:

<｜DSML｜ calls>
<｜DSML｜ invoke name="$TOOL_NAME">
<｜DSML｜ parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</｜DSML｜ parameter>
...
</｜DSML｜ invoke>
<｜DSML｜ invoke name="$TOOL_NAME2">
...
</｜DSML｜ invoke>
</｜DSML｜ calls>

String parameters should be specified as is and set `string="true"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string="false"`.

If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside <think>...</think> BEFORE any tool calls or final response.

Otherwise, output directly after </think> with tool calls or final response.

### Available Tool Schemas

)";
  std::string joined;
  for (size_t i = 0; i < schemas.size(); ++i) joined += (i ? "\n" : "") + schemas[i];
  return head + joined +
         "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n";
}

std::string Calls(const std::string& invokes) {
  return "\n\n<｜DSML｜ calls>\n" + invokes + "\n</｜DSML｜ calls>";
}
std::string Invoke(const std::string& name, const std::string& params) {
  return "<｜DSML｜ invoke name=\"" + name + "\">\n" + params + "\n</｜DSML｜ invoke>";
}
std::string Param(const std::string& key, bool is_string, const std::string& value) {
  return "<｜DSML｜ parameter name=\"" + key + "\" string=\"" + (is_string ? "true" : "false") + "\">" + value +
         "</｜DSML｜ parameter>";
}

std::string Enc(const std::string& request_json) { return encode_chat_request_text(request_json, "test").text; }

// The error message for an invalid request ("" when it was accepted).
std::string ErrorOf(const std::string& request_json) {
  try {
    encode_chat_request_text(request_json, "test");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

const char* kWeatherTool =
    R"({"type":"function","function":{"name":"get_weather","description":"Get the weather for a specific location","parameters":{"type":"object","properties":{"location":{"type":"string","description":"The city name"},"unit":{"type":"string","enum":["celsius","fahrenheit"],"description":"Temperature unit"}},"required":["location"]}}})";
const char* kWeatherSchema =
    R"({"name": "get_weather", "description": "Get the weather for a specific location", "parameters": {"type": "object", "properties": {"location": {"type": "string", "description": "The city name"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "description": "Temperature unit"}}, "required": ["location"]}})";
const char* kLookupTool =
    R"({"type":"function","function":{"name":"lookup","description":"Look up","parameters":{"type":"object","properties":{"query":{"type":"string"}},"required":["query"]}}})";
const char* kLookupSchema =
    R"({"name": "lookup", "description": "Look up", "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}})";

// ---------------------------------------------------------------------------------------------
// The release's own test cases

TEST(ChatEncoding, HfCase1ToolCallRoundTripThinking) {
  std::string request = std::string(R"({"thinking": true, "messages": [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What's the weather like in Beijing?"},
    {"role": "assistant", "reasoning_content": "The user wants the weather in Beijing. I should call get_weather.",
     "content": "", "tool_calls": [{"type": "function", "function": {"name": "get_weather",
       "arguments": "{\"location\": \"Beijing\", \"unit\": \"celsius\"}"}}]},
    {"role": "tool", "tool_call_id": "call_0", "content": "{\"temperature\": 22, \"condition\": \"sunny\", \"humidity\": 45}"},
    {"role": "assistant", "reasoning_content": "Got the weather data. Let me format a nice response.",
     "content": "The weather in Beijing is currently sunny with a temperature of 22°C and 45% humidity."}],
    "tools": [)") + kWeatherTool +
                        R"(, {"type": "function", "function": {"name": "search", "description": "Search the web for information", "parameters": {"type": "object", "properties": {"query": {"type": "string", "description": "Search query"}, "num_results": {"type": "integer", "description": "Number of results to return"}}, "required": ["query"]}}}]})";
  std::string search_schema =
      R"({"name": "search", "description": "Search the web for information", "parameters": {"type": "object", "properties": {"query": {"type": "string", "description": "Search query"}, "num_results": {"type": "integer", "description": "Number of results to return"}}, "required": ["query"]}})";
  std::string expected =
      BOS + SYS + Effort(50) + "You are a helpful assistant.\n\n" + Tools({kWeatherSchema, search_schema}) + USR +
      "What's the weather like in Beijing?" + AST + THINK +
      "The user wants the weather in Beijing. I should call get_weather." + ENDTHINK +
      Calls(Invoke("get_weather", Param("location", true, "Beijing") + "\n" + Param("unit", true, "celsius"))) + EOS +
      USR + R"(<tool_result>{"temperature": 22, "condition": "sunny", "humidity": 45}</tool_result>)" + AST + THINK +
      "Got the weather data. Let me format a nice response." + ENDTHINK +
      "The weather in Beijing is currently sunny with a temperature of 22°C and 45% humidity." + EOS;
  EXPECT_EQ(Enc(request), expected);
}

TEST(ChatEncoding, HfCase2MultiTurnChat) {
  std::string request = R"({"messages": [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Hello"},
    {"role": "assistant", "reasoning_content": "The user said hello, I should greet back.", "content": "Hi there! How can I help you?"},
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "reasoning_content": "The user asks about the capital of France. It is Paris.", "content": "The capital of France is Paris."}]})";
  std::string expected = BOS + SYS + "You are a helpful assistant." + USR + "Hello" + AST + ENDTHINK +
                         "Hi there! How can I help you?" + EOS + USR + "What is the capital of France?" + AST +
                         ENDTHINK + "The capital of France is Paris." + EOS;
  EXPECT_EQ(Enc(request), expected);
}

TEST(ChatEncoding, HfCase3LatestReminderAndMidSystemWithMessageTools) {
  std::string request = R"({"messages": [
    {"role": "system", "content": "该助手为DeepSeek，由深度求索公司创造。"},
    {"role": "latest_reminder", "content": "2026-02-21,星期六,广州,App,中文"},
    {"role": "system", "content": "CITATION FORMAT: 【{cursor_id}†L{start_line_id}(-L{end_line_id})?】",
     "tools": [{"type": "function", "function": {"name": "search", "description": "Web search. Split multiple queries with '||'.", "parameters": {"type": "object", "properties": {"queries": {"type": "string", "description": "query1||query2"}}, "required": ["queries"], "additionalProperties": false}}},
               {"type": "function", "function": {"name": "open", "description": "Batch open IDs (format 【{id}†...】) or URLs.", "parameters": {"type": "object", "properties": {"open_list": {"type": "array", "items": {"type": "object", "properties": {"id": {"description": "ID or URL", "anyOf": [{"type": "integer"}, {"type": "string"}], "default": -1}, "loc": {"type": "integer", "description": "Start line", "default": -1}, "num_lines": {"type": "integer", "description": "", "default": -1}}, "additionalProperties": false}, "description": ""}}, "required": ["open_list"], "additionalProperties": false}}}]},
    {"role": "user", "content": "小柴胡冲剂和布洛芬能一起吃吗？"},
    {"role": "assistant", "content": "", "reasoning_content": "用户想知道小柴胡冲剂和布洛芬能否一起服用。",
     "tool_calls": [{"type": "function", "function": {"name": "search", "arguments": "{\"queries\": \"小柴胡冲剂 布洛芬 相互作用 一起吃\"}"}}]},
    {"role": "tool", "content": "[0]"},
    {"role": "assistant", "content": "请及时就医。", "reasoning_content": "现在开始组织回答。", "tool_calls": []}]})";
  std::string search =
      R"({"name": "search", "description": "Web search. Split multiple queries with '||'.", "parameters": {"type": "object", "properties": {"queries": {"type": "string", "description": "query1||query2"}}, "required": ["queries"], "additionalProperties": false}})";
  std::string open =
      R"({"name": "open", "description": "Batch open IDs (format 【{id}†...】) or URLs.", "parameters": {"type": "object", "properties": {"open_list": {"type": "array", "items": {"type": "object", "properties": {"id": {"description": "ID or URL", "anyOf": [{"type": "integer"}, {"type": "string"}], "default": -1}, "loc": {"type": "integer", "description": "Start line", "default": -1}, "num_lines": {"type": "integer", "description": "", "default": -1}}, "additionalProperties": false}, "description": ""}}, "required": ["open_list"], "additionalProperties": false}})";
  std::string expected = BOS + SYS + "该助手为DeepSeek，由深度求索公司创造。" + LR + "2026-02-21,星期六,广州,App,中文" +
                         SYS + "CITATION FORMAT: 【{cursor_id}†L{start_line_id}(-L{end_line_id})?】\n\n" +
                         Tools({search, open}) + USR + "小柴胡冲剂和布洛芬能一起吃吗？" + AST + ENDTHINK +
                         Calls(Invoke("search", Param("queries", true, "小柴胡冲剂 布洛芬 相互作用 一起吃"))) + EOS +
                         USR + "<tool_result>[0]</tool_result>" + AST + ENDTHINK + "请及时就医。" + EOS;
  EXPECT_EQ(Enc(request), expected);
}

// ---------------------------------------------------------------------------------------------
// Modes and reasoning effort

TEST(ChatEncoding, ChatModeSingleTurn) {
  EXPECT_EQ(Enc(R"({"messages":[{"role":"user","content":"q"}]})"), BOS + USR + "q" + AST + ENDTHINK);
  EXPECT_EQ(Enc(R"({"messages":[{"role":"system","content":"S"},{"role":"user","content":"q"}]})"),
            BOS + SYS + "S" + USR + "q" + AST + ENDTHINK);
}

TEST(ChatEncoding, ThinkingModeSourcesAndDefaultEffort) {
  std::string expected = BOS + SYS + Effort(50) + USR + "q" + AST + THINK;
  EXPECT_EQ(Enc(R"({"thinking":true,"messages":[{"role":"user","content":"q"}]})"), expected);
  EXPECT_EQ(Enc(R"({"chat_template_kwargs":{"thinking":true},"messages":[{"role":"user","content":"q"}]})"), expected);
  EXPECT_EQ(Enc(R"({"thinking":{"type":"enabled"},"messages":[{"role":"user","content":"q"}]})"), expected);
  EXPECT_EQ(Enc(R"({"thinking":true,"chat_template_kwargs":{"thinking":true},"messages":[{"role":"user","content":"q"}]})"),
            expected);
  // Off: absent, false, disabled, null.
  std::string chat = BOS + USR + "q" + AST + ENDTHINK;
  EXPECT_EQ(Enc(R"({"thinking":false,"messages":[{"role":"user","content":"q"}]})"), chat);
  EXPECT_EQ(Enc(R"({"thinking":null,"chat_template_kwargs":{"thinking":false},"messages":[{"role":"user","content":"q"}]})"),
            chat);
  EXPECT_EQ(Enc(R"({"thinking":{"type":"disabled"},"messages":[{"role":"user","content":"q"}]})"), chat);
  // System first: the effort line goes inside the same <｜System｜>.
  EXPECT_EQ(Enc(R"({"thinking":true,"messages":[{"role":"system","content":"S"},{"role":"user","content":"q"}]})"),
            BOS + SYS + Effort(50) + "S" + USR + "q" + AST + THINK);

  EXPECT_NE(ErrorOf(R"({"thinking":"yes","messages":[{"role":"user","content":"q"}]})").find("thinking:"), std::string::npos);
  EXPECT_NE(ErrorOf(R"({"thinking":true,"chat_template_kwargs":{"thinking":false},"messages":[{"role":"user","content":"q"}]})")
                .find("disagrees"),
            std::string::npos);
  EXPECT_NE(ErrorOf(R"({"thinking":{"type":"maybe"},"messages":[{"role":"user","content":"q"}]})").find("thinking.type"),
            std::string::npos);
}

TEST(ChatEncoding, ReasoningEffortValues) {
  struct Case {
    const char* value;
    int budget;
  } cases[] = {{"\"low\"", 25}, {"\"high\"", 50}, {"\"xhigh\"", 75}, {"\"max\"", 100},
               {"1", 1},       {"42", 42},       {"100", 100},      {"null", 50}};
  for (const Case& c : cases) {
    std::string req = std::string(R"({"thinking":true,"reasoning_effort":)") + c.value +
                      R"(,"messages":[{"role":"user","content":"q"}]})";
    EXPECT_EQ(Enc(req), BOS + SYS + Effort(c.budget) + USR + "q" + AST + THINK) << c.value;
    // Chat mode: validated, never rendered.
    std::string chat_req = std::string(R"({"reasoning_effort":)") + c.value + R"(,"messages":[{"role":"user","content":"q"}]})";
    EXPECT_EQ(Enc(chat_req), BOS + USR + "q" + AST + ENDTHINK) << c.value;
  }
}

TEST(ChatEncoding, ReasoningEffortErrors) {
  for (const char* bad : {"0", "101", "-5", "50.0", "2.5", "\"medium\"", "\"50\"", "\"none\"", "\"HIGH\"", "true", "[]", "{}"}) {
    for (const char* mode : {"true", "false"}) {
      std::string req = std::string(R"({"thinking":)") + mode + R"(,"reasoning_effort":)" + bad +
                        R"(,"messages":[{"role":"user","content":"q"}]})";
      std::string err = ErrorOf(req);
      EXPECT_EQ(err.rfind("reasoning_effort: expected an integer 1-100 or one of low, high, xhigh, max, got ", 0), 0u)
          << bad << " -> " << err;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Tools

TEST(ChatEncoding, ToolsAttachToInsertedEmptySystem) {
  std::string req = std::string(R"({"tools":[)") + kLookupTool + R"(],"messages":[{"role":"user","content":"q"}]})";
  EXPECT_EQ(Enc(req), BOS + SYS + "\n\n" + Tools({kLookupSchema}) + USR + "q" + AST + ENDTHINK);
  std::string think = std::string(R"({"thinking":true,"tools":[)") + kLookupTool +
                      R"(],"messages":[{"role":"user","content":"q"}]})";
  EXPECT_EQ(Enc(think), BOS + SYS + Effort(50) + "\n\n" + Tools({kLookupSchema}) + USR + "q" + AST + THINK);
  // A developer first message also gets the empty system before it.
  std::string dev = std::string(R"({"tools":[)") + kLookupTool +
                    R"(],"messages":[{"role":"developer","content":"D"},{"role":"user","content":"q"}]})";
  EXPECT_EQ(Enc(dev), BOS + SYS + "\n\n" + Tools({kLookupSchema}) + USR + "D" + USR + "q" + AST + ENDTHINK);
  // Empty or null tools change nothing.
  EXPECT_EQ(Enc(R"({"tools":[],"messages":[{"role":"user","content":"q"}]})"), BOS + USR + "q" + AST + ENDTHINK);
  EXPECT_EQ(Enc(R"({"tools":null,"messages":[{"role":"user","content":"q"}]})"), BOS + USR + "q" + AST + ENDTHINK);
}

TEST(ChatEncoding, ToolFunctionKeysReorderedAndPythonJson) {
  // Keys come out name, description, parameters, then the rest in their given order; nested order is
  // kept; floats/escapes/non-ASCII as Python's json.dumps(ensure_ascii=False).
  std::string req = R"({"tools":[{"type":"function","function":{
      "strict": true, "parameters": {"type":"object","properties":{"t":{"type":"number","minimum":0.5,"maximum":100.0,"default":1e-7,"big":1e16,"neg":-0.0,"e":2.5e-300}},
      "required":["t"]}, "x-extra": [1, "two", null, false], "description": "Température in °C, \"quoted\",\ttab\nline\u0001", "name": "temp"}}],
    "messages":[{"role":"user","content":"q"}]})";
  std::string schema =
      R"({"name": "temp", "description": "Température in °C, \"quoted\",\ttab\nline\u0001", "parameters": {"type": "object", "properties": {"t": {"type": "number", "minimum": 0.5, "maximum": 100.0, "default": 1e-07, "big": 1e+16, "neg": -0.0, "e": 2.5e-300}}, "required": ["t"]}, "strict": true, "x-extra": [1, "two", null, false]})";
  EXPECT_EQ(Enc(req), BOS + SYS + "\n\n" + Tools({schema}) + USR + "q" + AST + ENDTHINK);
}

TEST(ChatEncoding, ToolCallArgumentsStringOrObjectAndNonStringParams) {
  std::string tail = R"(,"messages":[{"role":"user","content":"q"},
     {"role":"assistant","content":"calling","tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":ARGS}}]},
     {"role":"tool","tool_call_id":"c1","content":"done"}]})";
  std::string obj =
      R"({"n": 3, "ok": true, "none": null, "x": 1.5, "arr": [1, "a", {"k": "v"}], "obj": {"temp": "C", "deg": "°"}, "s": "raw <x> \"q\"\nnext", "e": ""})";
  auto with_args = [&](const std::string& args) {
    std::string t = tail;
    t.replace(t.find("ARGS"), 4, args);
    return std::string(R"({"thinking":true,"tools":[)") + kLookupTool + "]" + t;
  };
  std::string expected =
      BOS + SYS + Effort(50) + "\n\n" + Tools({kLookupSchema}) + USR + "q" + AST + THINK + ENDTHINK + "calling" +
      Calls(Invoke("f", Param("n", false, "3") + "\n" + Param("ok", false, "true") + "\n" + Param("none", false, "null") +
                            "\n" + Param("x", false, "1.5") + "\n" + Param("arr", false, R"([1, "a", {"k": "v"}])") + "\n" +
                            Param("obj", false, R"({"temp": "C", "deg": "°"})") + "\n" +
                            Param("s", true, "raw <x> \"q\"\nnext") + "\n" + Param("e", true, ""))) +
      EOS + USR + "<tool_result>done</tool_result>" + AST + THINK;
  EXPECT_EQ(Enc(with_args(obj)), expected);                         // arguments as an object
  EXPECT_EQ(Enc(with_args(Json(obj).dump())), expected);            // arguments as JSON text
  // Compact JSON text renders the same (values are re-serialised).
  EXPECT_EQ(Enc(with_args(Json(Json::parse(obj).dump()).dump())), expected);

  // Two calls, one without arguments.
  std::string two = R"({"messages":[{"role":"user","content":"q"},{"role":"assistant","content":null,"tool_calls":[
      {"function":{"name":"a","arguments":"{}"}},{"function":{"name":"b","arguments":{"k":"v"}}}]}]})";
  EXPECT_EQ(Enc(two), BOS + USR + "q" + AST + ENDTHINK +
                          Calls(Invoke("a", "") + "\n" + Invoke("b", Param("k", true, "v"))) + EOS);
}

TEST(ChatEncoding, ToolResultsSortedIntoCallOrder) {
  std::string req = std::string(R"({"thinking":true,"tools":[)") + kLookupTool + R"(],"messages":[
    {"role":"user","content":"question"},
    {"role":"assistant","reasoning_content":"reason","content":"summary","tool_calls":[
      {"id":"call_a","type":"function","function":{"name":"lookup","arguments":"{\"query\": \"first\"}"}},
      {"id":"call_b","type":"function","function":{"name":"lookup","arguments":"{\"query\": \"second\"}"}},
      {"id":"call_c","type":"function","function":{"name":"lookup","arguments":"{\"query\": \"third\"}"}}]},
    {"role":"tool","tool_call_id":"call_c","content":"third result"},
    {"role":"tool","tool_call_id":"call_a","content":[{"type":"text","text":"first"},{"type":"text","text":"result"}]},
    {"role":"user","content":"and now?"},
    {"role":"tool","tool_call_id":"call_b","content":"second result"}]})";
  std::string calls = Calls(Invoke("lookup", Param("query", true, "first")) + "\n" +
                            Invoke("lookup", Param("query", true, "second")) + "\n" +
                            Invoke("lookup", Param("query", true, "third")));
  // One merged user turn: tool results take the call order in their slots; the text stays in place.
  std::string expected = BOS + SYS + Effort(50) + "\n\n" + Tools({kLookupSchema}) + USR + "question" + AST + THINK +
                         "reason" + ENDTHINK + "summary" + calls + EOS + USR +
                         "<tool_result>first\n\nresult</tool_result>\n\n<tool_result>second result</tool_result>\n\n"
                         "and now?\n\n<tool_result>third result</tool_result>" +
                         AST + THINK;
  EXPECT_EQ(Enc(req), expected);
}

TEST(ChatEncoding, ToolResultsWithUnknownIdSortFirst) {
  std::string req = R"({"messages":[{"role":"user","content":"q"},
    {"role":"assistant","content":"","tool_calls":[{"id":"a","function":{"name":"f","arguments":"{}"}},{"id":"b","function":{"name":"f","arguments":"{}"}}]},
    {"role":"tool","tool_call_id":"b","content":"B"},{"role":"tool","tool_call_id":"zz","content":"Z"},{"role":"tool","tool_call_id":"a","content":"A"}]})";
  // Unknown ids rank as call 0; the sort is stable.
  EXPECT_EQ(Enc(req), BOS + USR + "q" + AST + ENDTHINK + Calls(Invoke("f", "") + "\n" + Invoke("f", "")) + EOS + USR +
                          "<tool_result>Z</tool_result>\n\n<tool_result>A</tool_result>\n\n<tool_result>B</tool_result>" +
                          AST + ENDTHINK);
}

// ---------------------------------------------------------------------------------------------
// Reasoning drop rule

TEST(ChatEncoding, ReasoningDroppedBeforeLastUserWithoutTools) {
  std::string msgs = R"("messages":[{"role":"user","content":"q1"},{"role":"assistant","reasoning_content":"r1","content":"a1"},
     {"role":"user","content":"q2"},{"role":"assistant","reasoning_content":"r2","content":"a2"},{"role":"user","content":"q3"}])";
  EXPECT_EQ(Enc("{\"thinking\":true," + msgs + "}"), BOS + SYS + Effort(50) + USR + "q1" + AST + ENDTHINK + "a1" + EOS +
                                                         USR + "q2" + AST + ENDTHINK + "a2" + EOS + USR + "q3" + AST + THINK);
  // Tools anywhere keep every turn's reasoning and open <think> after every user turn.
  std::string tools = std::string("{\"thinking\":true,\"tools\":[") + kLookupTool + "]," + msgs + "}";
  EXPECT_EQ(Enc(tools), BOS + SYS + Effort(50) + "\n\n" + Tools({kLookupSchema}) + USR + "q1" + AST + THINK + "r1" +
                            ENDTHINK + "a1" + EOS + USR + "q2" + AST + THINK + "r2" + ENDTHINK + "a2" + EOS + USR + "q3" +
                            AST + THINK);
  // Chat mode never renders reasoning.
  EXPECT_EQ(Enc("{" + msgs + "}"), BOS + USR + "q1" + AST + ENDTHINK + "a1" + EOS + USR + "q2" + AST + ENDTHINK + "a2" +
                                       EOS + USR + "q3" + AST + ENDTHINK);
}

TEST(ChatEncoding, ReasoningAfterLastUserKept) {
  // A final assistant turn (after the last user) keeps its reasoning, even with empty reasoning.
  EXPECT_EQ(Enc(R"({"thinking":true,"messages":[{"role":"user","content":"q"},{"role":"assistant","content":"a"}]})"),
            BOS + SYS + Effort(50) + USR + "q" + AST + THINK + ENDTHINK + "a" + EOS);
  EXPECT_EQ(Enc(R"({"thinking":true,"messages":[{"role":"user","content":"q"},{"role":"assistant","reasoning_content":"r","content":"a"}]})"),
            BOS + SYS + Effort(50) + USR + "q" + AST + THINK + "r" + ENDTHINK + "a" + EOS);
}

// ---------------------------------------------------------------------------------------------
// Roles

TEST(ChatEncoding, DeveloperRole) {
  // Chat mode: rendered as a user turn.
  EXPECT_EQ(Enc(R"({"messages":[{"role":"system","content":"S"},{"role":"developer","content":"D"},{"role":"user","content":"U"}]})"),
            BOS + SYS + "S" + USR + "D" + USR + "U" + AST + ENDTHINK);
  // Last: it gets the generation header.
  EXPECT_EQ(Enc(R"({"messages":[{"role":"user","content":"U"},{"role":"developer","content":"D"}]})"),
            BOS + USR + "U" + USR + "D" + AST + ENDTHINK);
  // Thinking mode without tools: a developer message before the last user turn is dropped (and the
  // next message becomes the first, hosting the effort line).
  EXPECT_EQ(Enc(R"({"thinking":true,"messages":[{"role":"developer","content":"D"},{"role":"user","content":"U"}]})"),
            BOS + SYS + Effort(50) + USR + "U" + AST + THINK);
  EXPECT_EQ(Enc(R"({"thinking":true,"messages":[{"role":"developer","content":"D"},{"role":"system","content":"S"},{"role":"user","content":"U"}]})"),
            BOS + SYS + Effort(50) + "S" + USR + "U" + AST + THINK);
  EXPECT_EQ(Enc(R"({"thinking":true,"messages":[{"role":"user","content":"U"},{"role":"developer","content":"D"}]})"),
            BOS + SYS + Effort(50) + USR + "U" + USR + "D" + AST + THINK);
  // Message-level tools on a developer message render inside its user turn.
  std::string dev_tools = std::string(R"({"messages":[{"role":"developer","content":"D","tools":[)") + kLookupTool +
                          R"(]},{"role":"user","content":"U"}]})";
  EXPECT_EQ(Enc(dev_tools), BOS + USR + "D\n\n" + Tools({kLookupSchema}) + USR + "U" + AST + ENDTHINK);
  EXPECT_NE(ErrorOf(R"({"messages":[{"role":"developer","content":""}]})").find("messages[0].content"), std::string::npos);
}

TEST(ChatEncoding, LatestReminderRole) {
  EXPECT_EQ(Enc(R"({"messages":[{"role":"system","content":"S"},{"role":"latest_reminder","content":"2026-01-01, Paris"},{"role":"user","content":"U"}]})"),
            BOS + SYS + "S" + LR + "2026-01-01, Paris" + USR + "U" + AST + ENDTHINK);
  // After the last user turn the header comes first (the reference renders it so).
  EXPECT_EQ(Enc(R"({"messages":[{"role":"user","content":"U"},{"role":"latest_reminder","content":"R"}]})"),
            BOS + USR + "U" + AST + ENDTHINK + LR + "R");
  // As the first message in thinking mode: the effort line still opens with <｜System｜>.
  EXPECT_EQ(Enc(R"({"thinking":true,"messages":[{"role":"latest_reminder","content":"R"},{"role":"user","content":"U"}]})"),
            BOS + SYS + Effort(50) + LR + "R" + USR + "U" + AST + THINK);
}

TEST(ChatEncoding, MidConversationSystem) {
  std::string msgs = R"("messages":[{"role":"user","content":"q1"},{"role":"assistant","reasoning_content":"r1","content":"a1"},{"role":"system","content":"MID"}])";
  EXPECT_EQ(Enc("{" + msgs + "}"), BOS + USR + "q1" + AST + ENDTHINK + "a1" + EOS + SYS + "MID" + AST + ENDTHINK);
  // It counts as the last user turn: the earlier reasoning is dropped.
  EXPECT_EQ(Enc("{\"thinking\":true," + msgs + "}"),
            BOS + SYS + Effort(50) + USR + "q1" + AST + ENDTHINK + "a1" + EOS + SYS + "MID" + AST + THINK);
  EXPECT_EQ(Enc(R"({"thinking":true,"messages":[{"role":"user","content":"q1"},{"role":"assistant","content":"a1"},{"role":"system","content":"MID"},{"role":"user","content":"q2"}]})"),
            BOS + SYS + Effort(50) + USR + "q1" + AST + ENDTHINK + "a1" + EOS + SYS + "MID" + USR + "q2" + AST + THINK);
  // Top-level tools still go to messages[0] (an inserted empty system), not to the mid system.
  std::string tools = std::string(R"({"thinking":true,"tools":[)") + kLookupTool +
                      R"(],"messages":[{"role":"user","content":"q1"},{"role":"assistant","content":"a1"},{"role":"system","content":"MID"},{"role":"user","content":"q2"}]})";
  EXPECT_EQ(Enc(tools), BOS + SYS + Effort(50) + "\n\n" + Tools({kLookupSchema}) + USR + "q1" + AST + THINK + ENDTHINK +
                            "a1" + EOS + SYS + "MID" + USR + "q2" + AST + THINK);
}

// ---------------------------------------------------------------------------------------------
// Continuation, content forms, ignored fields

TEST(ChatEncoding, ContinueFinalMessage) {
  std::string msgs = R"("messages":[{"role":"user","content":"q"},{"role":"assistant","reasoning_content":"r","content":"Sure,"}])";
  ChatPrompt p = encode_chat_request_text("{\"thinking\":true,\"continue_final_message\":true," + msgs + "}", "t");
  EXPECT_EQ(p.text, BOS + SYS + Effort(50) + USR + "q" + AST + THINK + "r" + ENDTHINK + "Sure,");
  EXPECT_TRUE(p.continue_final);
  EXPECT_TRUE(p.thinking);
  EXPECT_EQ(Enc("{\"continue_final_message\":true," + msgs + "}"), BOS + USR + "q" + AST + ENDTHINK + "Sure,");
  // Without it the turn is closed.
  EXPECT_EQ(Enc("{" + msgs + "}"), BOS + USR + "q" + AST + ENDTHINK + "Sure," + EOS);
  // DeepSeek's `prefix: true` on the final assistant message does the same.
  EXPECT_EQ(Enc(R"({"messages":[{"role":"user","content":"q"},{"role":"assistant","content":"Sure,","prefix":true}]})"),
            BOS + USR + "q" + AST + ENDTHINK + "Sure,");
  // A continued message with tool calls keeps its closed calls block; only the EOS goes.
  EXPECT_EQ(Enc(R"({"continue_final_message":true,"messages":[{"role":"user","content":"q"},{"role":"assistant","content":"x","tool_calls":[{"function":{"name":"f","arguments":"{}"}}]}]})"),
            BOS + USR + "q" + AST + ENDTHINK + "x" + Calls(Invoke("f", "")));

  EXPECT_NE(ErrorOf(R"({"continue_final_message":true,"messages":[{"role":"user","content":"q"}]})").find("continue_final_message"),
            std::string::npos);
  EXPECT_NE(ErrorOf(R"({"continue_final_message":"yes","messages":[{"role":"user","content":"q"}]})").find("continue_final_message"),
            std::string::npos);
  EXPECT_NE(ErrorOf(R"({"messages":[{"role":"assistant","content":"a","prefix":true},{"role":"user","content":"q"}]})")
                .find("messages[0].prefix"),
            std::string::npos);
}

TEST(ChatEncoding, ContentPartsNamesAndMergedUsers) {
  EXPECT_EQ(Enc(R"({"messages":[{"role":"system","content":[{"type":"text","text":"S1"},{"type":"text","text":"S2"}]},
      {"role":"user","name":"alice","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
      {"role":"user","content":"c"},{"role":"assistant","name":"bot","content":[{"type":"text","text":"x"}]},{"role":"user","content":[]}]})"),
            BOS + SYS + "S1\n\nS2" + USR + "a\n\nb\n\nc" + AST + ENDTHINK + "x" + EOS + USR + AST + ENDTHINK);
  // Empty part lists add nothing when merged.
  EXPECT_EQ(Enc(R"({"messages":[{"role":"user","content":"a"},{"role":"user","content":[]},{"role":"user","content":""}]})"),
            BOS + USR + "a\n\n" + AST + ENDTHINK);
}

TEST(ChatEncoding, ResponseFormatAndToolChoiceDoNotChangeThePrompt) {
  std::string base = Enc(R"({"messages":[{"role":"user","content":"q"}]})");
  EXPECT_EQ(Enc(R"({"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"object"}}},
      "tool_choice":"required","model":"m","temperature":0.5,"stream":true,"messages":[{"role":"user","content":"q"}]})"),
            base);
  std::string with_tools = std::string(R"({"tools":[)") + kLookupTool + R"(],"messages":[{"role":"user","content":"q"}]})";
  std::string forced = std::string(R"({"tool_choice":{"type":"function","function":{"name":"lookup"}},"tools":[)") +
                       kLookupTool + R"(],"messages":[{"role":"user","content":"q"}]})";
  EXPECT_EQ(Enc(forced), Enc(with_tools));
}

TEST(ChatEncoding, ImagesRejected) {
  std::string err = ErrorOf(R"({"messages":[{"role":"user","content":[{"type":"text","text":"look"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AA=="}}]}]})");
  EXPECT_NE(err.find("messages[0].content[1]"), std::string::npos) << err;
  EXPECT_NE(err.find("image content is not supported"), std::string::npos) << err;
  EXPECT_NE(ErrorOf(R"({"messages":[{"role":"user","content":[{"type":"image","source":"x"}]}]})").find("image"), std::string::npos);
  // The placeholder token typed into text is refused, as the reference does.
  err = ErrorOf(R"({"messages":[{"role":"user","content":"hi <｜deepseek_image｜>"}]})");
  EXPECT_NE(err.find("messages[0].content"), std::string::npos) << err;
  EXPECT_NE(ErrorOf(R"({"messages":[{"role":"user","content":"q"},{"role":"assistant","reasoning_content":"<｜deepseek_image｜>","content":"a"}]})")
                .find("messages[1].reasoning_content"),
            std::string::npos);
  // Other part types name the field.
  EXPECT_EQ(ErrorOf(R"({"messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{}}]}]})"),
            "messages[0].content[0].type: expected 'text', got 'input_audio'");
}

TEST(ChatEncoding, InvalidRequestsNameTheField) {
  EXPECT_EQ(ErrorOf(R"({"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"},{"role":"foo","content":"c"}]})"),
            "messages[2].role: expected one of system, user, assistant, tool, developer, latest_reminder, got 'foo'");
  EXPECT_EQ(ErrorOf(R"({"messages":[{"role":7,"content":"c"}]})"),
            "messages[0].role: expected one of system, user, assistant, tool, developer, latest_reminder, got 7");
  struct Case {
    const char* request;
    const char* field;
  } cases[] = {
      {R"([1,2])", "request:"},
      {R"({})", "messages: missing"},
      {R"({"messages":[]})", "messages: expected a non-empty array"},
      {R"({"messages":{"role":"user"}})", "messages: expected"},
      {R"({"messages":["hi"]})", "messages[0]: expected a message object"},
      {R"({"messages":[{"content":"x"}]})", "messages[0].role: missing"},
      {R"({"messages":[{"role":"user"}]})", "messages[0].content: missing"},
      {R"({"messages":[{"role":"user","content":5}]})", "messages[0].content: expected a string or an array"},
      {R"({"messages":[{"role":"user","content":null}]})", "messages[0].content: expected a string or an array"},
      {R"({"messages":[{"role":"user","content":[{"type":"text"}]}]})", "messages[0].content[0].text: missing"},
      {R"({"messages":[{"role":"user","content":[{"type":"text","text":1}]}]})", "messages[0].content[0].text: expected a string"},
      {R"({"messages":[{"role":"user","content":"x","name":3}]})", "messages[0].name: expected a string"},
      {R"({"messages":[{"role":"user","content":"x","reasoning_content":"r"}]})", "messages[0].reasoning_content: only"},
      {R"({"messages":[{"role":"user","content":"x","tool_calls":[]}]})", "messages[0].tool_calls: only"},
      {R"({"messages":[{"role":"assistant","content":"x","reasoning_content":5}]})", "messages[0].reasoning_content: expected a string"},
      {R"({"messages":[{"role":"assistant","tool_calls":{}}]})", "messages[0].tool_calls: expected an array"},
      {R"({"messages":[{"role":"assistant","tool_calls":[{"type":"function"}]}]})", "messages[0].tool_calls[0].function: missing"},
      {R"({"messages":[{"role":"assistant","tool_calls":[{"type":"code","function":{"name":"f","arguments":"{}"}}]}]})", "messages[0].tool_calls[0].type"},
      {R"({"messages":[{"role":"assistant","tool_calls":[{"function":{"arguments":"{}"}}]}]})", "messages[0].tool_calls[0].function.name: missing"},
      {R"({"messages":[{"role":"assistant","tool_calls":[{"function":{"name":"f"}}]}]})", "messages[0].tool_calls[0].function.arguments: missing"},
      {R"({"messages":[{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"{bad"}}]}]})", "messages[0].tool_calls[0].function.arguments: invalid JSON"},
      {R"({"messages":[{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"[1, 2]"}}]}]})", "messages[0].tool_calls[0].function.arguments: expected a JSON object"},
      {R"({"messages":[{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"\"{\\\"a\\\": 1}\""}}]}]})", "messages[0].tool_calls[0].function.arguments: expected a JSON object"},
      {R"({"messages":[{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":[1]}}]}]})", "messages[0].tool_calls[0].function.arguments: expected a JSON object"},
      {R"({"messages":[{"role":"assistant","tool_calls":[{"id":5,"function":{"name":"f","arguments":"{}"}}]}]})", "messages[0].tool_calls[0].id: expected a string"},
      {R"({"messages":[{"role":"tool","content":"x","tool_call_id":1}]})", "messages[0].tool_call_id: expected a string"},
      {R"({"messages":[{"role":"tool"}]})", "messages[0].content: missing"},
      {R"({"messages":[{"role":"user","content":"x","tools":[]}]})", "messages[0].tools: only"},
      {R"({"tools":{},"messages":[{"role":"user","content":"x"}]})", "tools: expected an array"},
      {R"({"tools":[{"type":"function"}],"messages":[{"role":"user","content":"x"}]})", "tools[0].function: missing"},
      {R"({"tools":[{"type":"function","function":{"description":"d"}}],"messages":[{"role":"user","content":"x"}]})", "tools[0].function.name: missing"},
      {R"({"tools":[{"type":"retrieval","function":{"name":"f"}}],"messages":[{"role":"user","content":"x"}]})", "tools[0].type: expected 'function'"},
      {R"({"chat_template_kwargs":[],"messages":[{"role":"user","content":"x"}]})", "chat_template_kwargs: expected an object"},
  };
  for (const Case& c : cases) {
    std::string err = ErrorOf(c.request);
    EXPECT_EQ(err.rfind(c.field, 0), 0u) << c.request << "\n  got: " << err;
  }
  std::string err = ErrorOf("{\"messages\": [");
  EXPECT_EQ(err.rfind("test: invalid JSON", 0), 0u) << err;
}

// ---------------------------------------------------------------------------------------------
// Python JSON serialisation

TEST(PythonJson, FloatRepr) {
  struct Case {
    double v;
    const char* repr;
  } cases[] = {{0.1, "0.1"},
               {1.0, "1.0"},
               {-2.0, "-2.0"},
               {1.5, "1.5"},
               {123456789.0, "123456789.0"},
               {1e15, "1000000000000000.0"},
               {9999999999999998.0, "9999999999999998.0"},
               {1e16, "1e+16"},
               {1e22, "1e+22"},
               {0.0001, "0.0001"},
               {0.00001, "1e-05"},
               {2.5e-7, "2.5e-07"},
               {12345.678, "12345.678"},
               {-0.0, "-0.0"},
               {0.0, "0.0"},
               {5e-324, "5e-324"},
               {1.7976931348623157e308, "1.7976931348623157e+308"},
               {1.0 / 3.0, "0.3333333333333333"},
               {123456789012345680.0, "1.2345678901234568e+17"}};
  for (const Case& c : cases) EXPECT_EQ(python_float_repr(c.v), c.repr);
}

TEST(PythonJson, RandomValuesRoundTrip) {
  unsigned seed = static_cast<unsigned>(std::chrono::steady_clock::now().time_since_epoch().count());
  std::printf("PythonJson.RandomValuesRoundTrip seed=%u\n", seed);
  std::mt19937 rng(seed);
  const std::vector<std::string> atoms = {"a", "Z", " ", "\"", "\\", "\n", "\t", "\x01", "\x1f", "é", "中", "😀", "/", "<｜"};
  auto rand_string = [&]() {
    std::string s;
    int n = static_cast<int>(rng() % 8);
    for (int i = 0; i < n; ++i) s += atoms[rng() % atoms.size()];
    return s;
  };
  std::function<Json(int)> rand_value = [&](int depth) -> Json {
    switch (rng() % (depth > 3 ? 5 : 7)) {
      case 0: return nullptr;
      case 1: return rng() % 2 == 0;
      case 2: return static_cast<int64_t>(rng()) - (1LL << 31);
      case 3: {
        std::uniform_real_distribution<double> mant(-10, 10);
        return mant(rng) * std::pow(10.0, static_cast<int>(rng() % 60) - 30);
      }
      case 4: return rand_string();
      case 5: {
        Json a = Json::array();
        for (int i = static_cast<int>(rng() % 4); i > 0; --i) a.push_back(rand_value(depth + 1));
        return a;
      }
      default: {
        Json o = Json::object();
        for (int i = static_cast<int>(rng() % 4); i > 0; --i) o[rand_string() + std::to_string(i)] = rand_value(depth + 1);
        return o;
      }
    }
  };
  for (int iter = 0; iter < 300; ++iter) {
    Json v = rand_value(0);
    std::string text = python_json_dumps(v);
    Json back = Json::parse(text);
    ASSERT_EQ(back, v) << text;
    // Python's separators and no ASCII escaping of non-ASCII text.
    EXPECT_EQ(text.find("\\u00e9"), std::string::npos);
  }
  EXPECT_EQ(python_json_dumps(Json::parse(R"({"a":[1,2,{"b":null}],"c":"x"})")), R"({"a": [1, 2, {"b": null}], "c": "x"})");
}

// ---------------------------------------------------------------------------------------------
// Random plain conversations against an independent model of the format

TEST(ChatEncoding, RandomPlainConversations) {
  unsigned seed = static_cast<unsigned>(std::chrono::steady_clock::now().time_since_epoch().count());
  std::printf("ChatEncoding.RandomPlainConversations seed=%u\n", seed);
  std::mt19937 rng(seed);
  const std::vector<std::string> atoms = {"hi", " ", "\n", "\"", "\\", "é", "中文", "😀", "<b>", "{x}", "think", "..."};
  auto text = [&]() {
    std::string s;
    for (int i = static_cast<int>(rng() % 6) + 1; i > 0; --i) s += atoms[rng() % atoms.size()];
    return s;
  };
  for (int iter = 0; iter < 200; ++iter) {
    bool thinking = rng() % 2;
    bool system = rng() % 2;
    int effort = static_cast<int>(rng() % 100) + 1;
    int turns = static_cast<int>(rng() % 4) + 1;  // user turns; an assistant reply between them
    Json request = {{"thinking", thinking}, {"reasoning_effort", effort}, {"messages", Json::array()}};
    std::string expected = BOS;
    if (system || thinking) expected += SYS;
    if (thinking) expected += Effort(effort);
    if (system) {
      std::string s = text();
      request["messages"].push_back({{"role", "system"}, {"content", s}});
      expected += s;
    }
    for (int t = 0; t < turns; ++t) {
      bool last = t + 1 == turns;
      std::string u = text();
      request["messages"].push_back({{"role", "user"}, {"content", u}});
      expected += USR + u + AST + (thinking && last ? THINK : ENDTHINK);
      if (!last) {
        std::string r = text(), a = text();
        request["messages"].push_back({{"role", "assistant"}, {"reasoning_content", r}, {"content", a}});
        expected += a + EOS;  // reasoning before the last user turn is dropped (and never shown in chat)
      }
    }
    ASSERT_EQ(encode_chat_request(request).text, expected) << request.dump();
  }
}

}  // namespace
}  // namespace di
