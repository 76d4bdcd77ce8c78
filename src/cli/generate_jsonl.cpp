#include "cli/generate_jsonl.h"

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/engine_flags.h"
#include "cli/progress.h"
#include "cli/request_jsonl.h"
#include "core/error.h"

namespace di::cli {

namespace {

bool blank(const std::string& line) {
  return line.find_first_not_of(" \t\r") == std::string::npos;
}

// "-" reads stdin. Blank lines are skipped; line numbers count them.
std::vector<LineRequest> read_requests(const std::string& path, const SamplingParams& defaults) {
  std::ifstream file;
  if (path != "-") {
    file.open(path);
    if (!file) throw Error("--prompts: cannot open '" + path + "'");
  }
  std::istream& in = path == "-" ? std::cin : file;
  const std::string origin = path == "-" ? "<stdin>" : path;
  std::vector<LineRequest> requests;
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (!blank(line)) requests.push_back(parse_request_line(line, origin, line_no, defaults));
  }
  if (in.bad()) throw Error("--prompts: error reading '" + origin + "'");
  if (requests.empty()) throw Error("--prompts: '" + origin + "' holds no requests");
  return requests;
}

// Writes lines to a file or stdout ("-"); an error names the file.
class Output {
 public:
  explicit Output(const std::string& path) : path_(path) {
    file_ = path == "-" ? stdout : std::fopen(path.c_str(), "w");
    if (!file_) throw Error("--output: cannot open '" + path + "' for writing");
  }
  ~Output() {
    if (file_ && file_ != stdout) std::fclose(file_);
  }
  void line(const std::string& text) {
    if (std::fwrite(text.data(), 1, text.size(), file_) != text.size() || std::fputc('\n', file_) == EOF ||
        std::fflush(file_) != 0)
      throw Error("--output: cannot write to '" + path_ + "'");
  }

 private:
  std::string path_;
  FILE* file_ = nullptr;
};

}  // namespace

int generate_jsonl(const Args& args) {
  const SamplingParams defaults = sampling_options(args, /*default_max_tokens=*/64);
  std::vector<LineRequest> requests = read_requests(args.get("prompts"), defaults);
  Output out(args.get("output"));

  const auto load_start = std::chrono::steady_clock::now();
  std::unique_ptr<Engine> engine = Engine::create(engine_options(args));
  const auto start = std::chrono::steady_clock::now();
  std::vector<RequestId> ids;
  ids.reserve(requests.size());
  for (LineRequest& r : requests) ids.push_back(engine->submit(std::move(r.request)));

  int64_t failed = 0, prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
  {
    Progress progress(*engine, static_cast<int64_t>(ids.size()));
    for (size_t i = 0; i < ids.size(); ++i) {
      RequestResult r = engine->wait(ids[i]);
      progress.finished_one();
      failed += r.finish_reason == "error";
      prompt_tokens += r.prompt_tokens;
      completion_tokens += r.completion_tokens;
      cached_tokens += r.cached_tokens;
      out.line(result_json(static_cast<int64_t>(i), requests[i].id, r).dump());
    }
  }
  const auto end = std::chrono::steady_clock::now();
  const double seconds = std::chrono::duration<double>(end - start).count();
  const EngineStats stats = engine->stats();
  const auto per_s = [&](double n) { return seconds > 0 ? n / seconds : 0.0; };
  nlohmann::ordered_json summary = {
      {"requests", ids.size()},
      {"failed", failed},
      {"prompt_tokens", prompt_tokens},
      {"completion_tokens", completion_tokens},
      {"cached_tokens", cached_tokens},
      {"prefix_hit_tokens", stats.prefix_hit_tokens},
      {"prefix_lookup_tokens", stats.prefix_lookup_tokens},
      {"prefix_replay_tokens", stats.prefix_replay_tokens},
      {"preemptions", stats.preemptions},
      {"steps", stats.steps},
      {"forward_s", stats.busy_seconds},
      // time between one step's forward ending and the next one's starting (async scheduling shrinks it)
      {"host_gap_us_per_step", stats.host_gaps > 0 ? 1e6 * stats.host_gap_seconds / stats.host_gaps : 0.0},
      {"load_s", std::chrono::duration<double>(start - load_start).count()},
      {"elapsed_s", seconds},
      {"requests_per_s", per_s(static_cast<double>(ids.size()))},
      {"output_tokens_per_s", per_s(static_cast<double>(completion_tokens))},
      {"total_tokens_per_s", per_s(static_cast<double>(prompt_tokens + completion_tokens))},
  };
  std::fprintf(stderr, "%s\n", summary.dump().c_str());
  if (failed)
    throw Error(std::to_string(failed) + " of " + std::to_string(ids.size()) +
                " requests failed; their output lines carry \"error\"");
  return 0;
}

}  // namespace di::cli
