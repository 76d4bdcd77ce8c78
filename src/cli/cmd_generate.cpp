// deepinfer generate [--model DIR] --prompt TEXT [--chat] [--max-tokens N] [--temperature T]
//                    [--top-p P] [--top-k K] [--seed S] [--device cpu|cuda]
// Prints the generated text as it is produced. Without --model, the embedded default model.
#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "core/error.h"
#include "model/model.h"
#include "sampling/sampler.h"
#include "tokenizer/chat_encoding.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/tokenizer.h"

namespace di::cli {

// The model that ships in the repository (a tiny V4.1-architecture checkpoint in the released format).
std::filesystem::path default_model_dir() {
  return std::filesystem::path(DEEPINFER_SOURCE_DIR) / "tests" / "data" / "golden_dev" / "model";
}

int cmd_generate(const Argv& argv) {
  Args args(argv, {"model", "prompt", "max-tokens", "temperature", "top-p", "top-k", "seed", "device"}, {"chat", "no-reference-quirks"});
  std::filesystem::path dir = args.get_or("model", default_model_dir().string());
  std::string prompt = args.get("prompt");
  long long max_tokens = args.get_int_or("max-tokens", 64);
  if (max_tokens < 1) throw Error("--max-tokens: expected a positive number, got " + std::to_string(max_tokens));
  SamplingParams sp;
  sp.temperature = static_cast<float>(args.get_double_or("temperature", 1.0));
  sp.top_p = static_cast<float>(args.get_double_or("top-p", 1.0));
  sp.top_k = static_cast<int>(args.get_int_or("top-k", 0));
  sp.seed = static_cast<uint64_t>(args.get_int_or("seed", 0));

  std::unique_ptr<Backend> backend = make_backend(args.get_or("device", "cpu"));
  ModelOptions opts;
  opts.reference_decode_quirks = !args.flag("no-reference-quirks");
  std::unique_ptr<Model> model = Model::load(dir, *backend, opts);
  std::unique_ptr<Tokenizer> tok = Tokenizer::load(dir);
  std::vector<int32_t> ids;
  if (args.flag("chat")) {
    nlohmann::ordered_json req = {{"messages", {{{"role", "user"}, {"content", prompt}}}}};
    ids = tok->encode(encode_chat_request(req).text, true);
  } else {
    ids = {tok->bos_id()};
    std::vector<int32_t> body = tok->encode(prompt, false);
    ids.insert(ids.end(), body.begin(), body.end());
  }
  const int64_t vocab = model->config().vocab_size;
  if (static_cast<int64_t>(ids.size()) + max_tokens > model->config().max_position)
    throw Error("prompt of " + std::to_string(ids.size()) + " tokens + --max-tokens " + std::to_string(max_tokens) +
                " exceeds the model's context of " + std::to_string(model->config().max_position) + " tokens");

  RequestSampler sampler(sp, vocab, ids);
  std::vector<int32_t> output;
  SequenceState st = model->new_sequence();
  Detokenizer detok(*tok, /*skip_special=*/true);
  ForwardResult out = model->forward(st, ids);
  for (long long i = 0; i < max_tokens; ++i) {
    int32_t next = sampler.sample(std::span<const float>(out.logits.data(), vocab), output).id;
    if (next == tok->eos_id()) break;
    output.push_back(next);
    std::fputs(detok.push(next).c_str(), stdout);
    std::fflush(stdout);
    if (i + 1 < max_tokens) out = model->forward(st, {next});
  }
  std::fputs(detok.flush().c_str(), stdout);
  std::fputc('\n', stdout);
  return 0;
}

}  // namespace di::cli
