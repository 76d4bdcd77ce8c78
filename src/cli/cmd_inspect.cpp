// `deepinfer inspect --model DIR [--allow-unexpected] [--config-only] [--device cpu|cuda [--context N]]`:
// loads and validates the config and the checkpoint, then prints the config summary, the per-layer
// schedule, tensor counts and bytes per dtype, the weight memory per pool and the KV-cache bytes.
// With --device: also loads the model on that backend, puts one sequence at N context tokens
// (default 0) and runs one decode token, and reports the memory in use: weights, caches, workspace.
#include <cstdio>
#include <map>
#include <string>

#include "cli/args.h"
#include "cli/commands.h"
#include "core/error.h"
#include "backend/profiling_backend.h"
#include "model/checkpoint_validate.h"
#include "model/config.h"
#include "model/memory_estimate.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "runtime/cache_fill.h"
#include "runtime/memory_report.h"

namespace di::cli {

namespace {

std::string human_bytes(double bytes) {
  char buf[64];
  if (bytes >= 1e9) {
    std::snprintf(buf, sizeof buf, "%.2f GB (%.2f GiB)", bytes / 1e9, bytes / (1024.0 * 1024 * 1024));
  } else if (bytes >= 1e6) {
    std::snprintf(buf, sizeof buf, "%.2f MB (%.2f MiB)", bytes / 1e6, bytes / (1024.0 * 1024));
  } else if (bytes >= 1e3) {
    std::snprintf(buf, sizeof buf, "%.2f KB", bytes / 1e3);
  } else {
    std::snprintf(buf, sizeof buf, "%.0f B", bytes);
  }
  return buf;
}

template <typename T>
std::string ints(const std::vector<T>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(v[i]);
  }
  s += "]";
  return s;
}

void print_config(const ModelConfig& c) {
  std::printf("config:\n");
  std::printf("  vocab %d, hidden %d, %d layers + %d DSpark stages, hc streams %d (sinkhorn %d, eps %g)\n",
              c.vocab_size, c.hidden_size, c.n_layers, c.n_mtp_layers, c.hc_mult, c.hc_sinkhorn_iters, c.hc_eps);
  std::printf("  attention: %d heads x %d (rope %d), q_lora %d, o_lora %d x %d groups, window %d, norm eps %g\n",
              c.n_heads, c.head_dim, c.rope_dim, c.q_lora_rank, c.o_lora_rank, c.o_groups, c.window, c.norm_eps);
  std::printf("  rope: theta %g (ratio 0), %g (compressed)", c.rope_theta, c.compress_rope_theta);
  if (c.yarn_original_max_position > 0) {
    std::printf(" + yarn factor %g, beta %g/%g, original %lld", c.yarn_factor, c.yarn_beta_fast, c.yarn_beta_slow,
                static_cast<long long>(c.yarn_original_max_position));
  }
  std::printf(", max position %lld\n", static_cast<long long>(c.max_position));
  std::printf("  csa2: kv sources %s, index sources %s, indexer %d heads x %d top-%d\n", ints(c.kv_source_layers).c_str(),
              ints(c.index_source_layers).c_str(), c.index_n_heads, c.index_head_dim, c.index_topk);
  if (c.candidate_source_layer >= 0) {
    std::printf("  candidates: layer %d, top %d blocks x %d\n", c.candidate_source_layer, c.candidate_topk_blocks,
                c.candidate_block_size);
  }
  std::printf("  moe: %d experts top-%d + %d shared, inter %d, %s, route scale %g, gate temp %g, swiglu limit %g\n",
              c.n_routed_experts, c.n_activated_experts, c.n_shared_experts, c.moe_inter_dim, c.score_func.c_str(),
              c.route_scale, c.gate_temp, c.swiglu_limit);
  if (!c.engram_layer_ids.empty()) {
    std::printf("  engram: layers %s, rows %s x %d, %d-grams x %d heads, vocab %lld, compressed vocab %lld, pad %d\n",
                ints(c.engram_layer_ids).c_str(), ints(c.engram_num_embeddings).c_str(), c.engram_head_dim,
                c.engram_max_ngram, c.engram_n_heads, static_cast<long long>(c.engram_vocab_size),
                static_cast<long long>(c.engram_compressed_vocab_size), c.engram_pad_id);
  }
  if (c.n_mtp_layers > 0) {
    std::printf("  dspark: %d stages, block %d, noise token %d, taps %s, markov rank %d, experts %d top-%d\n",
                c.n_mtp_layers, c.dspark_block_size, c.dspark_noise_token_id, ints(c.dspark_target_layer_ids).c_str(),
                c.dspark_markov_rank, c.layer_n_routed_experts(c.n_layers), c.layer_n_activated_experts(c.n_layers));
  }
  std::printf("  tokens: bos %d, eos %d, pad %d", c.bos_token_id, c.eos_token_id, c.pad_token_id);
  if (c.image_token_id >= 0) std::printf(", image %d", c.image_token_id);
  std::printf("\n");
}

TensorGroup group_of(const std::string& name) {
  if (name.rfind("mtp.", 0) == 0) return TensorGroup::kDSpark;
  if (name.find(".engram.embed.") != std::string::npos) return TensorGroup::kEngramTable;
  return TensorGroup::kBackbone;
}

void print_memory(const std::map<TensorGroup, uint64_t>& by_group, uint64_t vision, const KvCacheBytes& kv) {
  uint64_t total = 0;
  std::printf("weights (as stored):\n");
  for (TensorGroup g : {TensorGroup::kBackbone, TensorGroup::kEngramTable, TensorGroup::kDSpark}) {
    auto it = by_group.find(g);
    uint64_t b = it == by_group.end() ? 0 : it->second;
    total += b;
    std::printf("  %-14s %16llu bytes  %s\n", tensor_group_name(g), static_cast<unsigned long long>(b),
                human_bytes(static_cast<double>(b)).c_str());
  }
  std::printf("  %-14s %16llu bytes  %s\n", "total", static_cast<unsigned long long>(total),
              human_bytes(static_cast<double>(total)).c_str());
  if (vision) {
    std::printf("  %-14s %16llu bytes  (not loaded)\n", "vision", static_cast<unsigned long long>(vision));
  }
  uint64_t gpu_all = total;
  uint64_t gpu_host_engram = total - (by_group.count(TensorGroup::kEngramTable) ? by_group.at(TensorGroup::kEngramTable) : 0);
  std::printf("  on GPU: %s with Engram tables, %s with Engram tables in host memory\n",
              human_bytes(static_cast<double>(gpu_all)).c_str(), human_bytes(static_cast<double>(gpu_host_engram)).c_str());
  std::printf("kv cache:\n");
  std::printf("  global (compressed KV %llu B/row + index keys %llu B/row, per kv source / ratio): %.1f B/token\n",
              static_cast<unsigned long long>(kv.compressed_record), static_cast<unsigned long long>(kv.index_key_record),
              kv.global_per_token);
  std::printf("  window rings: %llu B/token/layer, %s per request\n", static_cast<unsigned long long>(kv.window_record),
              human_bytes(static_cast<double>(kv.window_per_request)).c_str());
  std::printf("  compressor tails: %s per request\n",
              human_bytes(static_cast<double>(kv.compressor_tail_per_request)).c_str());
  std::printf("  one request at 128K tokens: %s, at 1M tokens: %s\n",
              human_bytes(kv.global_per_token * 131072 + static_cast<double>(kv.window_per_request)).c_str(),
              human_bytes(kv.global_per_token * 1048576 + static_cast<double>(kv.window_per_request)).c_str());
}

// Loads the model on `device` behind an accounting backend and reports its memory after one decode
// token at `context`.
void print_device_memory(const std::string& dir, const std::string& device, int64_t context, bool allow_unexpected) {
  std::unique_ptr<Backend> inner = make_backend(device);
  ProfilingBackend pb(*inner);
  ModelOptions mo;
  mo.allow_unexpected_tensors = allow_unexpected;
  std::unique_ptr<Model> model = Model::load(dir, pb, mo);
  std::printf("memory on %s after load: %s\n", device.c_str(), format_memory_report(memory_report(pb, {})).c_str());
  SequenceState s = model->new_sequence();
  if (context > 0) CacheFiller(*model, context, 1, 1).fill(s);
  pb.reset_peak();
  model->forward(s, {model->config().bos_token_id});
  pb.synchronize();
  std::printf("memory on %s, one sequence after a decode token at context %lld: %s\n", device.c_str(),
              static_cast<long long>(context), format_memory_report(memory_report(pb, {&s})).c_str());
}

}  // namespace

int cmd_inspect(const Argv& argv) {
  Args args(argv, {"model", "device", "context"}, {"allow-unexpected", "config-only"});
  const std::string dir = args.get("model");
  ModelConfig cfg = load_model_config(dir);
  std::printf("model: %s\n", dir.c_str());
  print_config(cfg);
  std::printf("schedule (%d layers):\n", cfg.n_total_layers());
  for (const LayerSchedule& l : cfg.layers) std::printf("  %s\n", format_layer_schedule(l).c_str());

  const KvCacheBytes kv = kv_cache_bytes(cfg);
  std::map<TensorGroup, uint64_t> by_group;
  if (args.flag("config-only")) {
    const std::vector<ExpectedTensor> expected = expected_tensors(cfg);
    size_t n = 0;
    for (const ExpectedTensor& e : expected) {
      if (e.optional) continue;
      by_group[e.group] += e.nbytes();
      ++n;
    }
    std::printf("tensors implied by the config: %zu (checkpoint not opened)\n", n);
    print_memory(by_group, 0, kv);
    return 0;
  }

  std::unique_ptr<Checkpoint> ckpt = Checkpoint::open(dir);
  ValidationReport report = validate_checkpoint(cfg, *ckpt, args.flag("allow-unexpected"));
  std::map<DType, std::pair<size_t, uint64_t>> by_dtype;
  uint64_t vision = 0;
  for (const auto& [name, v] : ckpt->tensors()) {
    by_dtype[v.dtype].first += 1;
    by_dtype[v.dtype].second += v.nbytes;
    if (is_vision_tensor(name)) {
      vision += v.nbytes;
    } else {
      by_group[group_of(name)] += v.nbytes;
    }
  }
  std::printf("tensors: %zu (%zu expected, %zu optional absent, %zu vision ignored, %zu unexpected)\n",
              ckpt->tensors().size(), report.n_expected_found, report.n_optional_missing, report.n_vision_ignored,
              report.n_unexpected);
  for (const auto& [dt, nb] : by_dtype) {
    std::printf("  %-8s %8zu tensors %16llu bytes  %s\n", dtype_name(dt), nb.first,
                static_cast<unsigned long long>(nb.second), human_bytes(static_cast<double>(nb.second)).c_str());
  }
  print_memory(by_group, vision, kv);
  std::printf("ok: checkpoint matches the config\n");
  if (args.has("device"))
    print_device_memory(dir, args.get("device"), args.get_int_or("context", 0), args.flag("allow-unexpected"));
  return 0;
}

}  // namespace di::cli
