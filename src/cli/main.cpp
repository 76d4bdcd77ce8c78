// `deepinfer <command> [options]`: dispatches to one cmd_* function per subcommand.
#include <cstdio>
#include <exception>
#include <string>

#ifdef __GLIBC__  // defined by the C library headers above
#include <malloc.h>
#endif

#include "cli/commands.h"
#include "core/error.h"

namespace {

// Each decode step allocates and frees tens of MB of host buffers (per-request logits rows: 64 x 517 KB
// at V4.1's vocabulary). With glibc's defaults the freed heap top is returned to the system and the
// next step page-faults it back in (measured on the H200 bench: 180.5 -> 169.1 ms per batch-64 step,
// 520 -> 472 ms at 256, with these settings). The CLI keeps that memory mapped; a library does not
// set process-wide allocator options, so this lives here.
void keep_step_buffers_mapped() {
#ifdef __GLIBC__
  mallopt(M_MMAP_THRESHOLD, 32 << 20);    // chunks below 32 MB from the heap (no dynamic threshold)
  mallopt(M_TRIM_THRESHOLD, 1 << 30);     // return the heap top only past 1 GB free
  mallopt(M_TOP_PAD, 256 << 20);          // grow it in large steps
#endif
}

struct Command {
  const char* name;
  int (*run)(const di::cli::Argv&);
  const char* summary;
};

const Command kCommands[] = {
    {"generate", di::cli::cmd_generate, "generate text from a prompt, or a JSONL file of requests"},
    {"chat", di::cli::cmd_chat, "interactive multi-turn chat (V4.1 chat encoding, streamed replies)"},
    {"score", di::cli::cmd_score, "write logits for a prompt and forced continuation (golden layout)"},
    {"inspect", di::cli::cmd_inspect, "validate a checkpoint; print config, layer schedule, tensor bytes"},
    {"tokenize", di::cli::cmd_tokenize, "JSONL {\"text\"} on stdin -> {\"ids\"} on stdout"},
    {"encode-chat", di::cli::cmd_encode_chat, "render a chat-completions request as V4.1 prompt text and ids"},
    {"parse-completion", di::cli::cmd_parse_completion, "split completion text into reasoning, content, tool calls"},
    {"write-checkpoint", di::cli::cmd_write_checkpoint, "write a random checkpoint in the released format"},
    {"bench", di::cli::cmd_bench, "time decode and prefill per layer and per op against measured ceilings"},
};

void usage(FILE* out) {
  std::fprintf(out, "usage: deepinfer <command> [options]\n\ncommands:\n");
  for (const Command& c : kCommands) std::fprintf(out, "  %-18s %s\n", c.name, c.summary);
}

}  // namespace

int main(int argc, char** argv) {
  keep_step_buffers_mapped();
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  std::string name = argv[1];
  if (name == "-h" || name == "--help" || name == "help") {
    usage(stdout);
    return 0;
  }
  di::cli::Argv args(argv + 2, argv + argc);
  for (const Command& c : kCommands) {
    if (name != c.name) continue;
    try {
      return c.run(args);
    } catch (const di::Error& e) {
      std::fprintf(stderr, "error: %s\n", e.what());
      return 1;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "error: %s\n", e.what());
      return 1;
    }
  }
  std::fprintf(stderr, "error: unknown command '%s'\n", name.c_str());
  usage(stderr);
  return 2;
}
