// deepinfer generate [--model DIR] --prompt TEXT [--chat] [--max-tokens N] [--temperature T]
//                    [--top-p P] [--top-k K] [--seed S] [--device cpu|cuda] [--no-reference-quirks]
//                    [--prefix-cache off|replay|exact] [--exact-snapshot-blocks N] [--batch-invariant]
//                    [--no-async] [--dp N] [--ep N]
//   Prints the generated text as it is produced.
// deepinfer generate [--model DIR] --prompts IN.jsonl --output OUT.jsonl [same sampling and engine flags]
//   Offline batch generation (generate_jsonl.h).
// Without --model, the embedded default model. Both go through the Engine (include/deepinfer/engine.h).
#include <cstdio>

#include <nlohmann/json.hpp>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/engine_flags.h"
#include "cli/generate_jsonl.h"
#include "cli/parallel_flags.h"
#include "core/error.h"
#include "deepinfer/engine.h"

namespace di::cli {

namespace {

// One prompt, streamed to stdout. Reproduces the official reference's decode unless
// --no-reference-quirks or --batch-invariant (the reference's decode depends on prompt chunking),
// and samples with seed 0 unless --seed: the same command prints the same text.
int generate_one(const Args& args) {
  Request req;
  req.sampling = sampling_options(args, /*default_max_tokens=*/64);
  if (!req.sampling.seed) req.sampling.seed = 0;
  const std::string prompt = args.get("prompt");
  if (args.flag("chat")) {
    req.chat_json = nlohmann::json{{"messages", {{{"role", "user"}, {"content", prompt}}}}}.dump();
  } else {
    req.prompt = prompt;
  }
  req.stream = true;
  EngineOptions options = engine_options(args);
  options.reference_decode_quirks = !args.flag("no-reference-quirks") && !options.batch_invariant;
  std::unique_ptr<Engine> engine = Engine::create(options);
  const RequestId id = engine->submit(std::move(req));
  for (;;) {
    std::optional<TokenEvent> ev = engine->next_event(id, std::chrono::milliseconds(100));
    if (!ev) continue;
    std::fwrite(ev->text.data(), 1, ev->text.size(), stdout);  // the text may hold NUL bytes
    std::fflush(stdout);
    if (ev->finished) {
      std::fputc('\n', stdout);
      if (ev->finish_reason == "error") throw Error(ev->error);
      return 0;
    }
  }
}

}  // namespace

int cmd_generate(const Argv& argv) {
  Args args(argv,
            with_options(with_options(with_options({"prompt", "prompts", "output"}, kEngineValueOptions),
                                      kSamplingValueOptions),
                         kParallelValueOptions),
            with_options({"chat", "no-reference-quirks"}, kEngineFlagOptions));
  parallel_options(args, args.get_or("device", EngineOptions{}.device));  // checked before anything loads
  if (args.has("prompt") == args.has("prompts"))
    throw Error("generate: give exactly one of --prompt TEXT or --prompts FILE.jsonl");
  if (args.has("prompts")) {
    if (!args.has("output")) throw Error("generate: --prompts needs --output FILE.jsonl ('-' for stdout)");
    if (args.flag("chat") || args.flag("no-reference-quirks"))
      throw Error("generate: --chat and --no-reference-quirks go with --prompt; "
                  "a --prompts line gives \"messages\" for chat");
    return generate_jsonl(args);
  }
  if (args.has("output")) throw Error("generate: --output goes with --prompts");
  return generate_one(args);
}

}  // namespace di::cli
