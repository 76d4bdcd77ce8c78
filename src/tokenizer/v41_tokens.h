// Special-token spellings of the DeepSeek-V4.1 prompt format, shared by the chat encoder and the
// completion parser. The bars are U+FF5C (full width) and the word separators U+2581; V4.1 DSML tag
// names start with a space (V4 had none).
#pragma once

#include <string_view>

namespace di::v41 {

inline constexpr std::string_view kBos = "<｜begin▁of▁sentence｜>";
inline constexpr std::string_view kEos = "<｜end▁of▁sentence｜>";
inline constexpr std::string_view kThinkStart = "<think>";
inline constexpr std::string_view kThinkEnd = "</think>";
inline constexpr std::string_view kSystem = "<｜System｜>";
inline constexpr std::string_view kUser = "<｜User｜>";
inline constexpr std::string_view kAssistant = "<｜Assistant｜>";
inline constexpr std::string_view kLatestReminder = "<｜latest_reminder｜>";
inline constexpr std::string_view kImage = "<｜deepseek_image｜>";
inline constexpr std::string_view kDsml = "｜DSML｜";

// DSML tool-call markup (V4.1: leading-space tag names).
inline constexpr std::string_view kCallsOpen = "<｜DSML｜ calls>";
inline constexpr std::string_view kCallsClose = "</｜DSML｜ calls>";
inline constexpr std::string_view kInvokeOpenPrefix = "<｜DSML｜ invoke";   // then ` name="N">`
inline constexpr std::string_view kInvokeClosePrefix = "</｜DSML｜ invoke"; // then `>`
inline constexpr std::string_view kInvokeClose = "</｜DSML｜ invoke>";
inline constexpr std::string_view kParamOpenPrefix = "<｜DSML｜ parameter"; // then ` name="K" string="B">`
inline constexpr std::string_view kParamClose = "</｜DSML｜ parameter>";
// The completion switches from content to tool calls at this text (the encoder writes "\n\n" before
// the calls block).
inline constexpr std::string_view kCallsStart = "\n\n<｜DSML｜ calls";

inline constexpr std::string_view kToolResultOpen = "<tool_result>";
inline constexpr std::string_view kToolResultClose = "</tool_result>";

}  // namespace di::v41
