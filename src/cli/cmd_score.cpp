// deepinfer score --model DIR --prompt-ids 0,5,9 --forced-ids 4,8,15 --out FILE [--chunk N]
//                 [--draft-out PREFIX] [--device cpu|cuda] [--no-reference-quirks] [--batch-invariant]
// Writes float32 little-endian logits [1 + len(forced), vocab] in the golden layout.
#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "core/error.h"
#include "model/model.h"
#include "runtime/score_run.h"

namespace di::cli {
namespace {

void write_f32(const std::string& path, const std::vector<float>& v) {
  std::ofstream f(path, std::ios::binary);
  if (!f) throw Error(path + ": cannot open for writing");
  f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
  if (!f) throw Error(path + ": write failed");
}

}  // namespace

int cmd_score(const Argv& argv) {
  Args args(argv, {"model", "prompt-ids", "forced-ids", "out", "chunk", "draft-out", "device"}, {"allow-unexpected", "no-reference-quirks", "batch-invariant"});
  std::vector<int> prompt = parse_int_list("prompt-ids", args.get("prompt-ids"));
  std::vector<int> forced = parse_int_list("forced-ids", args.get_or("forced-ids", ""));
  long long chunk = args.get_int_or("chunk", 0);
  if (chunk < 0) throw Error("--chunk: expected a positive number of tokens, got " + std::to_string(chunk));
  std::unique_ptr<Backend> backend = make_backend(args.get_or("device", "cpu"));
  // batch-invariant: reduction orders independent of the chunk's row count, and the chunking-
  // independent decode (the reference's decode quirks depend on prompt chunking)
  const bool invariant = args.flag("batch-invariant");
  backend->set_batch_invariant(invariant);
  ModelOptions opts;
  opts.allow_unexpected_tensors = args.flag("allow-unexpected");
  opts.reference_decode_quirks = !args.flag("no-reference-quirks") && !invariant;
  std::unique_ptr<Model> model = Model::load(args.get("model"), *backend, opts);
  auto draft_prefix = args.get_opt("draft-out");
  ScoreResult r = run_score(*model, prompt, forced, chunk, draft_prefix.has_value());
  write_f32(args.get("out"), r.logits);
  if (draft_prefix) {
    std::ofstream ids(*draft_prefix + "_draft_ids.json");
    if (!ids) throw Error(*draft_prefix + "_draft_ids.json: cannot open for writing");
    ids << nlohmann::json(r.draft_ids).dump() << "\n";
    write_f32(*draft_prefix + "_draft_logits.f32", r.draft_logits);
    write_f32(*draft_prefix + "_confidence.f32", r.confidence);
  }
  std::fprintf(stderr, "scored %zu prompt + %zu forced tokens (vocab %lld)\n", prompt.size(), forced.size(),
               static_cast<long long>(r.vocab));
  return 0;
}

}  // namespace di::cli
