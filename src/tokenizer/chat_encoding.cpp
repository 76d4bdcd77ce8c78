#include "tokenizer/chat_encoding.h"

#include <algorithm>
#include <optional>
#include <vector>

#include "core/error.h"
#include "tokenizer/python_json.h"
#include "tokenizer/v41_tokens.h"

namespace di {
namespace {

using Json = nlohmann::ordered_json;

enum class Role { kSystem, kUser, kAssistant, kTool, kDeveloper, kLatestReminder };

constexpr const char* kRoleList = "system, user, assistant, tool, developer, latest_reminder";

// One piece of a user turn: a text part or a merged tool result.
struct Block {
  bool tool_result = false;
  std::string text;
  std::string tool_use_id;
};

struct ToolCall {
  std::string id;
  std::string name;
  Json arguments;  // a JSON object, keys in the order given
};

struct Message {
  Role role = Role::kUser;
  std::string content;            // text content (parts joined with "\n\n")
  std::vector<std::string> parts; // user: the text parts as given (a string content is one part)
  std::vector<Block> blocks;      // user, after merging: text parts and tool results
  std::string reasoning;
  std::vector<ToolCall> tool_calls;
  std::vector<Json> tools;        // function objects, keys reordered
  std::string tool_call_id;
  bool wo_eos = false;
};

// ---------------------------------------------------------------------------------------------
// Errors

std::string got(const Json& v) {
  switch (v.type()) {
    case Json::value_t::string: {
      const std::string& s = v.get_ref<const std::string&>();
      return "'" + (s.size() > 60 ? s.substr(0, 60) + "..." : s) + "'";
    }
    case Json::value_t::array: return "an array";
    case Json::value_t::object: return "an object";
    default: return v.dump();
  }
}

[[noreturn]] void fail(const std::string& path, const std::string& what) { throw Error(path + ": " + what); }

[[noreturn]] void fail_type(const std::string& path, const std::string& expected, const Json& v) {
  fail(path, "expected " + expected + ", got " + got(v));
}

const Json* find_field(const Json& obj, const char* key) {
  auto it = obj.find(key);
  return it == obj.end() ? nullptr : &*it;
}

// Absent and null both read as "not given".
const Json* given(const Json& obj, const char* key) {
  const Json* v = find_field(obj, key);
  return (v == nullptr || v->is_null()) ? nullptr : v;
}

void reject_image_token(const std::string& text, const std::string& path) {
  if (text.find(v41::kImage) != std::string::npos) {
    fail(path, "contains the image placeholder token " + std::string(v41::kImage) +
                   "; images must be given as content parts");
  }
}

// ---------------------------------------------------------------------------------------------
// Request → messages

bool is_image_part_type(const std::string& type) {
  return type == "image" || type == "image_url" || type == "input_image" || type == "image_pil";
}

// A content field: a string or an array of text parts. Returns the parts.
std::vector<std::string> read_content_parts(const Json& v, const std::string& path) {
  if (v.is_string()) {
    reject_image_token(v.get_ref<const std::string&>(), path);
    return {v.get<std::string>()};
  }
  if (!v.is_array()) fail_type(path, "a string or an array of text parts", v);
  std::vector<std::string> parts;
  for (size_t i = 0; i < v.size(); ++i) {
    const Json& part = v[i];
    std::string part_path = path + "[" + std::to_string(i) + "]";
    if (!part.is_object()) fail_type(part_path, "a content part object", part);
    const Json* type = find_field(part, "type");
    if (type == nullptr) fail(part_path + ".type", "missing");
    if (!type->is_string()) fail_type(part_path + ".type", "a string", *type);
    const std::string& t = type->get_ref<const std::string&>();
    if (is_image_part_type(t)) fail(part_path, "image content is not supported yet (type '" + t + "')");
    if (t != "text") fail(part_path + ".type", "expected 'text', got '" + t + "'");
    const Json* text = find_field(part, "text");
    if (text == nullptr) fail(part_path + ".text", "missing");
    if (!text->is_string()) fail_type(part_path + ".text", "a string", *text);
    reject_image_token(text->get_ref<const std::string&>(), part_path + ".text");
    parts.push_back(text->get<std::string>());
  }
  return parts;
}

std::string join(const std::vector<std::string>& parts, std::string_view sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i) out += sep;
    out += parts[i];
  }
  return out;
}

// OpenAI function tools → function objects with keys name, description, parameters, then the rest.
std::vector<Json> read_tools(const Json& v, const std::string& path) {
  if (!v.is_array()) fail_type(path, "an array of tools", v);
  std::vector<Json> functions;
  for (size_t i = 0; i < v.size(); ++i) {
    const Json& tool = v[i];
    std::string tool_path = path + "[" + std::to_string(i) + "]";
    if (!tool.is_object()) fail_type(tool_path, "a tool object", tool);
    if (const Json* type = given(tool, "type"); type && *type != "function") {
      fail_type(tool_path + ".type", "'function'", *type);
    }
    const Json* fn = find_field(tool, "function");
    if (fn == nullptr) fail(tool_path + ".function", "missing");
    if (!fn->is_object()) fail_type(tool_path + ".function", "an object", *fn);
    const Json* name = find_field(*fn, "name");
    if (name == nullptr) fail(tool_path + ".function.name", "missing");
    if (!name->is_string()) fail_type(tool_path + ".function.name", "a string", *name);
    Json ordered = Json::object();
    for (const char* key : {"name", "description", "parameters"}) {
      if (const Json* field = find_field(*fn, key)) ordered[key] = *field;
    }
    for (const auto& [key, field] : fn->items()) {
      if (key != "name" && key != "description" && key != "parameters") ordered[key] = field;
    }
    functions.push_back(std::move(ordered));
  }
  return functions;
}

std::vector<ToolCall> read_tool_calls(const Json& v, const std::string& path) {
  if (!v.is_array()) fail_type(path, "an array of tool calls", v);
  std::vector<ToolCall> calls;
  for (size_t i = 0; i < v.size(); ++i) {
    const Json& call = v[i];
    std::string call_path = path + "[" + std::to_string(i) + "]";
    if (!call.is_object()) fail_type(call_path, "a tool call object", call);
    if (const Json* type = given(call, "type"); type && *type != "function") {
      fail_type(call_path + ".type", "'function'", *type);
    }
    const Json* fn = find_field(call, "function");
    if (fn == nullptr) fail(call_path + ".function", "missing");
    if (!fn->is_object()) fail_type(call_path + ".function", "an object", *fn);
    ToolCall tc;
    // The reference takes the id from the call, else from its function.
    for (const Json* holder : {&call, fn}) {
      const Json* id = given(*holder, "id");
      if (id == nullptr) continue;
      std::string id_path = call_path + (holder == fn ? ".function.id" : ".id");
      if (!id->is_string()) fail_type(id_path, "a string", *id);
      if (tc.id.empty()) tc.id = id->get<std::string>();
    }
    const Json* name = find_field(*fn, "name");
    if (name == nullptr) fail(call_path + ".function.name", "missing");
    if (!name->is_string()) fail_type(call_path + ".function.name", "a string", *name);
    tc.name = name->get<std::string>();
    const Json* args = find_field(*fn, "arguments");
    std::string args_path = call_path + ".function.arguments";
    if (args == nullptr) fail(args_path, "missing");
    if (args->is_string()) {
      try {
        tc.arguments = Json::parse(args->get_ref<const std::string&>());
      } catch (const Json::exception& e) {
        fail(args_path, std::string("invalid JSON text: ") + e.what());
      }
      if (!tc.arguments.is_object()) fail_type(args_path, "a JSON object", tc.arguments);
    } else if (args->is_object()) {
      tc.arguments = *args;
    } else {
      fail_type(args_path, "a JSON object (or its JSON text)", *args);
    }
    calls.push_back(std::move(tc));
  }
  return calls;
}

Role read_role(const Json& msg, const std::string& path) {
  const Json* role = find_field(msg, "role");
  if (role == nullptr) fail(path + ".role", std::string("missing (expected one of ") + kRoleList + ")");
  if (role->is_string()) {
    const std::string& r = role->get_ref<const std::string&>();
    if (r == "system") return Role::kSystem;
    if (r == "user") return Role::kUser;
    if (r == "assistant") return Role::kAssistant;
    if (r == "tool") return Role::kTool;
    if (r == "developer") return Role::kDeveloper;
    if (r == "latest_reminder") return Role::kLatestReminder;
  }
  fail_type(path + ".role", std::string("one of ") + kRoleList, *role);
}

Message read_message(const Json& msg, const std::string& path, bool is_last) {
  if (!msg.is_object()) fail_type(path, "a message object", msg);
  Message m;
  m.role = read_role(msg, path);

  if (const Json* name = given(msg, "name"); name && !name->is_string()) {
    fail_type(path + ".name", "a string", *name);
  }

  const Json* content = given(msg, "content");
  if (content != nullptr) {
    m.parts = read_content_parts(*content, path + ".content");
    m.content = join(m.parts, "\n\n");
  } else if (m.role != Role::kAssistant) {
    const Json* raw = find_field(msg, "content");
    fail(path + ".content", raw ? "expected a string or an array of text parts, got null (only assistant content may be null)"
                                : "missing (only assistant messages may omit content)");
  }
  if (m.role == Role::kDeveloper && m.content.empty()) {
    fail(path + ".content", "a developer message must not be empty");
  }

  if (const Json* rc = given(msg, "reasoning_content")) {
    if (m.role != Role::kAssistant) fail(path + ".reasoning_content", "only allowed on assistant messages");
    if (!rc->is_string()) fail_type(path + ".reasoning_content", "a string", *rc);
    reject_image_token(rc->get_ref<const std::string&>(), path + ".reasoning_content");
    m.reasoning = rc->get<std::string>();
  }

  if (const Json* calls = given(msg, "tool_calls")) {
    if (m.role != Role::kAssistant) fail(path + ".tool_calls", "only allowed on assistant messages");
    m.tool_calls = read_tool_calls(*calls, path + ".tool_calls");
  }

  if (const Json* id = given(msg, "tool_call_id")) {
    if (m.role != Role::kTool) fail(path + ".tool_call_id", "only allowed on tool messages");
    if (!id->is_string()) fail_type(path + ".tool_call_id", "a string", *id);
    m.tool_call_id = id->get<std::string>();
  }

  if (const Json* tools = given(msg, "tools")) {
    if (m.role != Role::kSystem && m.role != Role::kDeveloper) {
      fail(path + ".tools", "only allowed on system or developer messages (or as the request's top-level tools)");
    }
    m.tools = read_tools(*tools, path + ".tools");
  }

  if (const Json* prefix = given(msg, "prefix")) {
    if (!prefix->is_boolean()) fail_type(path + ".prefix", "a boolean", *prefix);
    if (prefix->get<bool>()) {
      if (m.role != Role::kAssistant || !is_last) {
        fail(path + ".prefix", "only the final message, an assistant message, can be a prefix to continue");
      }
      m.wo_eos = true;
    }
  }
  return m;
}

// int 1..100 or a named level; absent/null = "high".
int read_reasoning_effort(const Json& request) {
  const Json* effort = given(request, "reasoning_effort");
  if (effort == nullptr) return 50;
  if (effort->is_number_integer()) {
    int64_t n = effort->get<int64_t>();
    if (n >= 1 && n <= 100) return static_cast<int>(n);
  } else if (effort->is_string()) {
    const std::string& s = effort->get_ref<const std::string&>();
    if (s == "low") return 25;
    if (s == "high") return 50;
    if (s == "xhigh") return 75;
    if (s == "max") return 100;
  }
  fail_type("reasoning_effort", "an integer 1-100 or one of low, high, xhigh, max", *effort);
}

std::optional<bool> read_thinking_value(const Json& v, const std::string& path) {
  if (v.is_null()) return std::nullopt;
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_object()) {
    const Json* type = find_field(v, "type");
    if (type && *type == "enabled") return true;
    if (type && *type == "disabled") return false;
    fail_type(path + ".type", "'enabled' or 'disabled'", type ? *type : Json());
  }
  fail_type(path, "a boolean (or {\"type\": \"enabled\"|\"disabled\"})", v);
}

bool read_thinking(const Json& request) {
  std::optional<bool> top, kwarg;
  if (const Json* t = find_field(request, "thinking")) top = read_thinking_value(*t, "thinking");
  if (const Json* kwargs = given(request, "chat_template_kwargs")) {
    if (!kwargs->is_object()) fail_type("chat_template_kwargs", "an object", *kwargs);
    if (const Json* t = find_field(*kwargs, "thinking")) {
      kwarg = read_thinking_value(*t, "chat_template_kwargs.thinking");
    }
  }
  if (top && kwarg && *top != *kwarg) fail("thinking", "disagrees with chat_template_kwargs.thinking");
  return top.value_or(kwarg.value_or(false));
}

// ---------------------------------------------------------------------------------------------
// Preprocessing, as the reference does it

// Tool messages become tool-result blocks of a user turn; consecutive user turns (and tool results)
// merge into one.
std::vector<Message> merge_tool_messages(std::vector<Message> messages) {
  std::vector<Message> merged;
  for (Message& m : messages) {
    bool extend = !merged.empty() && merged.back().role == Role::kUser;
    if (m.role == Role::kTool) {
      Block b{true, m.content, m.tool_call_id};
      if (extend) {
        merged.back().blocks.push_back(std::move(b));
      } else {
        Message user;
        user.role = Role::kUser;
        user.blocks.push_back(std::move(b));
        merged.push_back(std::move(user));
      }
    } else if (m.role == Role::kUser) {
      std::vector<Block> blocks;
      for (std::string& p : m.parts) blocks.push_back(Block{false, std::move(p), {}});
      if (extend) {
        for (Block& b : blocks) merged.back().blocks.push_back(std::move(b));
      } else {
        m.blocks = std::move(blocks);
        merged.push_back(std::move(m));
      }
    } else {
      merged.push_back(std::move(m));
    }
  }
  return merged;
}

// Tool results of a user turn are put in the order of the latest assistant's tool calls (a stable
// sort; unknown ids sort as call 0).
void sort_tool_results(std::vector<Message>& messages) {
  std::vector<std::string> order;  // ids of the latest calls, by index
  for (Message& m : messages) {
    if (m.role == Role::kAssistant && !m.tool_calls.empty()) {
      order.clear();
      for (const ToolCall& tc : m.tool_calls) order.push_back(tc.id);
    } else if (m.role == Role::kUser) {
      auto rank = [&](const Block& b) -> size_t {
        if (b.tool_use_id.empty()) return 0;
        // The reference keeps the last index of a repeated id.
        for (size_t i = order.size(); i-- > 0;) {
          if (order[i] == b.tool_use_id) return i;
        }
        return 0;
      };
      bool any_id = std::any_of(order.begin(), order.end(), [](const std::string& s) { return !s.empty(); });
      std::vector<Block> results;
      for (const Block& b : m.blocks) {
        if (b.tool_result) results.push_back(b);
      }
      if (results.size() < 2 || !any_id) continue;
      std::stable_sort(results.begin(), results.end(),
                       [&](const Block& a, const Block& b) { return rank(a) < rank(b); });
      size_t next = 0;
      for (Block& b : m.blocks) {
        if (b.tool_result) b = results[next++];
      }
    }
  }
}

// Last user-like turn: user, developer, or a system message after the first message. -1 if none.
int last_user_index(const std::vector<Message>& messages) {
  for (size_t i = messages.size(); i-- > 0;) {
    Role r = messages[i].role;
    if (r == Role::kUser || r == Role::kDeveloper || (r == Role::kSystem && i > 0)) return static_cast<int>(i);
  }
  return -1;
}

// Thinking mode without tools: turns before the last user turn lose their reasoning, and developer
// messages there are dropped.
std::vector<Message> drop_thinking_messages(std::vector<Message> messages) {
  int last_user = last_user_index(messages);
  std::vector<Message> kept;
  for (size_t i = 0; i < messages.size(); ++i) {
    Message& m = messages[i];
    bool before = static_cast<int>(i) < last_user;
    if (before && m.role == Role::kDeveloper) continue;
    if (before && m.role == Role::kAssistant) m.reasoning.clear();
    kept.push_back(std::move(m));
  }
  return kept;
}

// ---------------------------------------------------------------------------------------------
// Rendering

constexpr std::string_view kToolsHead =
    "## Tools\n"
    "\n"
    "You have access to a set of tools to help answer the user's question. You can invoke tools by "
    "writing a \"<｜DSML｜ calls>\" block like the following:\n"
    "\n"
    "<｜DSML｜ calls>\n"
    "<｜DSML｜ invoke name=\"$TOOL_NAME\">\n"
    "<｜DSML｜ parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</｜DSML｜ parameter>\n"
    "...\n"
    "</｜DSML｜ invoke>\n"
    "<｜DSML｜ invoke name=\"$TOOL_NAME2\">\n"
    "...\n"
    "</｜DSML｜ invoke>\n"
    "</｜DSML｜ calls>\n"
    "\n"
    "String parameters should be specified as is and set `string=\"true\"`. For all other types "
    "(numbers, booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n"
    "\n"
    "If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside "
    "<think>...</think> BEFORE any tool calls or final response.\n"
    "\n"
    "Otherwise, output directly after </think> with tool calls or final response.\n"
    "\n"
    "### Available Tool Schemas\n"
    "\n";
constexpr std::string_view kToolsTail =
    "\n"
    "\n"
    "You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n";

std::string render_tools(const std::vector<Json>& functions) {
  std::string out(kToolsHead);
  for (size_t i = 0; i < functions.size(); ++i) {
    if (i) out += "\n";
    append_python_json(out, functions[i]);
  }
  out += kToolsTail;
  return out;
}

std::string render_tool_calls(const std::vector<ToolCall>& calls) {
  std::string out = "\n\n";
  out += v41::kCallsOpen;
  out += "\n";
  for (size_t i = 0; i < calls.size(); ++i) {
    if (i) out += "\n";
    out += v41::kInvokeOpenPrefix;
    out += " name=\"" + calls[i].name + "\">\n";
    bool first = true;
    for (const auto& [key, value] : calls[i].arguments.items()) {
      if (!first) out += "\n";
      first = false;
      out += v41::kParamOpenPrefix;
      out += " name=\"" + key + "\" string=\"";
      if (value.is_string()) {
        out += "true\">" + value.get<std::string>();
      } else {
        out += "false\">";
        append_python_json(out, value);
      }
      out += v41::kParamClose;
    }
    out += "\n";
    out += v41::kInvokeClose;
  }
  out += "\n";
  out += v41::kCallsClose;
  return out;
}

struct RenderContext {
  bool thinking = false;
  bool drop_thinking = true;
  int effort = 50;
  int last_user = -1;
};

std::string render_message(const std::vector<Message>& messages, size_t index, const RenderContext& ctx) {
  const Message& m = messages[index];
  const int idx = static_cast<int>(index);
  std::string out;

  // The first message hosts <｜System｜> when it is a system message or the effort line needs it.
  bool effort_line = index == 0 && ctx.thinking;
  if (index == 0 && (effort_line || m.role == Role::kSystem)) out += v41::kSystem;
  if (effort_line) {
    out += "Reasoning Effort: " + std::to_string(ctx.effort) +
           " (range 1-100, the higher the value, the more thorough the reasoning)\n\n";
  }

  switch (m.role) {
    case Role::kSystem:
      if (index > 0) out += v41::kSystem;
      out += m.content;
      if (!m.tools.empty()) out += "\n\n" + render_tools(m.tools);
      break;
    case Role::kDeveloper:
      out += v41::kUser;
      out += m.content;
      if (!m.tools.empty()) out += "\n\n" + render_tools(m.tools);
      break;
    case Role::kUser: {
      out += v41::kUser;
      for (size_t i = 0; i < m.blocks.size(); ++i) {
        if (i) out += "\n\n";
        const Block& b = m.blocks[i];
        if (b.tool_result) {
          out += v41::kToolResultOpen;
          out += b.text;
          out += v41::kToolResultClose;
        } else {
          out += b.text;
        }
      }
      break;
    }
    case Role::kLatestReminder:
      out += v41::kLatestReminder;
      out += m.content;
      break;
    case Role::kAssistant: {
      if (ctx.thinking && (!ctx.drop_thinking || idx > ctx.last_user)) {
        out += m.reasoning;
        out += v41::kThinkEnd;
      }
      out += m.content;
      if (!m.tool_calls.empty()) out += render_tool_calls(m.tool_calls);
      if (!m.wo_eos) out += v41::kEos;
      break;
    }
    case Role::kTool:
      DI_CHECK_MSG(false, "tool messages are merged into user turns before rendering");
  }

  // The generation header follows a user-like turn unless another user-like turn comes next.
  if (index + 1 < messages.size()) {
    Role next = messages[index + 1].role;
    if (next != Role::kAssistant && next != Role::kLatestReminder) return out;
  }
  bool user_like = m.role == Role::kUser || m.role == Role::kDeveloper || (m.role == Role::kSystem && index > 0);
  if (user_like) {
    out += v41::kAssistant;
    bool open_think = ctx.thinking && (!ctx.drop_thinking || idx >= ctx.last_user);
    out += open_think ? v41::kThinkStart : v41::kThinkEnd;
  }
  return out;
}

}  // namespace

ChatPrompt encode_chat_request(const nlohmann::ordered_json& request) {
  if (!request.is_object()) fail_type("request", "a JSON object", request);

  ChatPrompt prompt;
  prompt.thinking = read_thinking(request);
  RenderContext ctx;
  ctx.thinking = prompt.thinking;
  ctx.effort = read_reasoning_effort(request);

  const Json* msgs = find_field(request, "messages");
  if (msgs == nullptr) fail("messages", "missing");
  if (!msgs->is_array() || msgs->empty()) fail_type("messages", "a non-empty array of messages", *msgs);
  std::vector<Message> messages;
  for (size_t i = 0; i < msgs->size(); ++i) {
    messages.push_back(read_message((*msgs)[i], "messages[" + std::to_string(i) + "]", i + 1 == msgs->size()));
  }

  if (const Json* tools = given(request, "tools")) {
    std::vector<Json> functions = read_tools(*tools, "tools");
    if (!functions.empty()) {
      if (messages[0].role != Role::kSystem) {
        Message system;
        system.role = Role::kSystem;
        messages.insert(messages.begin(), std::move(system));
      }
      if (!messages[0].tools.empty()) fail("tools", "messages[0] already carries its own tools; give them in one place");
      messages[0].tools = std::move(functions);
    }
  }

  if (const Json* cont = given(request, "continue_final_message")) {
    if (!cont->is_boolean()) fail_type("continue_final_message", "a boolean", *cont);
    if (cont->get<bool>()) {
      if (messages.back().role != Role::kAssistant) {
        fail("continue_final_message", "the last message must be an assistant message to continue");
      }
      messages.back().wo_eos = true;
    }
  }
  prompt.continue_final = messages.back().wo_eos;

  messages = merge_tool_messages(std::move(messages));
  sort_tool_results(messages);

  // Tools anywhere keep all reasoning (the reference turns drop_thinking off).
  ctx.drop_thinking = std::none_of(messages.begin(), messages.end(),
                                   [](const Message& m) { return !m.tools.empty(); });
  if (ctx.thinking && ctx.drop_thinking) messages = drop_thinking_messages(std::move(messages));
  ctx.last_user = last_user_index(messages);

  prompt.text = v41::kBos;
  for (size_t i = 0; i < messages.size(); ++i) prompt.text += render_message(messages, i, ctx);
  return prompt;
}

ChatPrompt encode_chat_request_text(std::string_view json_text, const std::string& origin) {
  nlohmann::ordered_json request;
  try {
    request = nlohmann::ordered_json::parse(json_text);
  } catch (const nlohmann::ordered_json::exception& e) {
    throw Error(origin + ": invalid JSON: " + e.what());
  }
  return encode_chat_request(request);
}

}  // namespace di
