#include "runtime/request_input.h"

#include <string>

#include "core/error.h"
#include "sampling/sampling_params.h"
#include "tokenizer/chat_encoding.h"

namespace di {

PreparedInput prepare_input(const Request& request, const Tokenizer& tokenizer, const ModelConfig& cfg) {
  int n_inputs = !request.prompt_ids.empty() + request.prompt.has_value() + request.chat_json.has_value();
  if (n_inputs != 1)
    throw Error("request: expected exactly one of prompt_ids, prompt, chat_json; got " + std::to_string(n_inputs));
  validate_sampling(request.sampling, cfg.vocab_size);
  PreparedInput in;
  if (!request.prompt_ids.empty()) {
    in.prompt = request.prompt_ids;
  } else if (request.prompt) {
    if (tokenizer.bos_id() >= 0) in.prompt.push_back(tokenizer.bos_id());
    std::vector<int32_t> body = tokenizer.encode(*request.prompt, /*allow_special=*/false);
    in.prompt.insert(in.prompt.end(), body.begin(), body.end());
  } else {
    ChatPrompt chat = encode_chat_request_text(*request.chat_json, "chat_json");
    in.prompt = tokenizer.encode(chat.text, /*allow_special=*/true);
  }
  if (in.prompt.empty()) throw Error("request: the prompt has no tokens");
  for (size_t i = 0; i < in.prompt.size(); ++i)
    if (in.prompt[i] < 0 || in.prompt[i] >= cfg.vocab_size)
      throw Error("prompt_ids[" + std::to_string(i) + "]: token id " + std::to_string(in.prompt[i]) +
                  " out of range [0, " + std::to_string(cfg.vocab_size) + ")");
  const int64_t n = static_cast<int64_t>(in.prompt.size());
  if (n >= cfg.max_position)
    throw Error("prompt of " + std::to_string(n) + " tokens leaves no room to generate in the model's context of " +
                std::to_string(cfg.max_position) + " tokens");
  in.max_tokens = cfg.max_position - n;
  if (request.sampling.max_tokens) in.max_tokens = std::min<int64_t>(in.max_tokens, *request.sampling.max_tokens);
  return in;
}

}  // namespace di
