#include "model/synthetic_checkpoint.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/error.h"
#include "model/engram_hash.h"

namespace di {

namespace {

// The released schedule (spec §1.3): ratio, kv source, index source per layer 0..39.
constexpr int kReleasedLayers = 40;
int released_ratio(int l) { return l < 2 ? 0 : l < 20 ? 2 : 1; }
bool released_kv_source(int l) { return l == 2 || l == 8 || l == 14 || l == 20; }
bool released_index_source(int l) { return released_kv_source(l) || (l > 20 && l % 4 == 0); }

// Layer kinds first (see the header), then the rest in an order that keeps each picked Reuse or
// Reindex layer after a picked source of its group.
constexpr int kPickOrder[kReleasedLayers] = {0,  1,  2,  3,  20, 21, 24, 25, 4,  22, 26, 5,  23, 27,
                                            28, 29, 6,  7,  30, 31, 8,  9,  32, 33, 10, 11, 34, 35,
                                            12, 13, 36, 37, 14, 15, 38, 39, 16, 17, 18, 19};

void add_synthetic_dims(const std::string& preset, ModelConfig& c) {
  if (preset == "v41-flash") {  // spec §1.2
    c.vocab_size = 129280;
    c.hidden_size = 5120;
    c.n_heads = 64;
    c.head_dim = 512;
    c.rope_dim = 64;
    c.q_lora_rank = 1280;
    c.o_lora_rank = 1024;
    c.o_groups = 8;
    c.max_position = 1048576;
    c.window = 128;
    c.yarn_factor = 16;
    c.yarn_original_max_position = 65536;
    c.candidate_topk_blocks = 2048;
    c.candidate_block_size = 8;
    c.index_n_heads = 32;
    c.index_head_dim = 128;
    c.index_topk = 512;
    c.n_routed_experts = 384;
    c.n_activated_experts = 6;
    c.moe_inter_dim = 2304;
    c.engram_n_heads = 8;
    c.engram_head_dim = 256;
    c.engram_vocab_size = 40000;  // released: 16000000 (384M rows per table)
    c.engram_compressed_vocab_size = 99092;
  } else if (preset == "v41-tiny") {  // the golden_dev model's dimensions, longer positions
    c.vocab_size = 512;
    c.hidden_size = 256;
    c.n_heads = 4;
    c.head_dim = 64;
    c.rope_dim = 16;
    c.q_lora_rank = 64;
    c.o_lora_rank = 64;
    c.o_groups = 2;
    c.max_position = 65536;
    c.window = 16;
    c.yarn_factor = 4;
    c.yarn_original_max_position = 32;
    c.candidate_topk_blocks = 3;
    c.candidate_block_size = 4;
    c.index_n_heads = 4;
    c.index_head_dim = 64;
    c.index_topk = 8;
    c.n_routed_experts = 8;
    c.n_activated_experts = 2;
    c.moe_inter_dim = 128;
    c.engram_n_heads = 2;
    c.engram_head_dim = 32;
    c.engram_vocab_size = 100;
    c.engram_compressed_vocab_size = 413;
  } else {
    throw Error("--synthetic: unknown preset '" + preset + "', expected v41-flash or v41-tiny");
  }
  c.n_kv_heads = 1;
  c.rope_theta = 10000;
  c.compress_rope_theta = 160000;
  c.yarn_beta_fast = 32;
  c.yarn_beta_slow = 1;
  c.n_shared_experts = 1;
  c.route_scale = 1.5;
  c.gate_temp = 1.0;
  c.swiglu_limit = 10.0;
  c.hc_mult = 4;
  c.hc_sinkhorn_iters = 20;
  c.hc_eps = 1e-6;
  c.norm_eps = 1e-20;
  c.engram_max_ngram = 4;
  c.engram_pad_id = 2;
  c.n_mtp_layers = 0;
}

synthetic::FillSpec uniform(uint64_t seed, DType dt, double lo, double hi) {
  synthetic::FillSpec f;
  f.kind = synthetic::FillKind::kUniform;
  f.elem_bytes = static_cast<uint8_t>(dtype_size(dt));
  f.seed = seed;
  f.lo = static_cast<float>(lo);
  f.hi = static_cast<float>(hi);
  return f;
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// checkpoint_writer.cpp's distributions, per tensor kind.
synthetic::FillSpec fill_spec(const ExpectedTensor& t, uint64_t seed) {
  using synthetic::FillKind;
  const uint64_t s = synthetic::mix64(seed ^ fnv1a(t.name));
  synthetic::FillSpec f;
  f.seed = s;
  f.elem_bytes = 1;
  const double a = std::sqrt(3.0 / static_cast<double>(std::max<int64_t>(t.fan_in, 1)));
  switch (t.kind) {
    case TensorKind::kFp8Weight:
    case TensorKind::kEngramTable: f.kind = FillKind::kFp8Code; return f;
    case TensorKind::kFp4Weight: f.kind = FillKind::kFp4Pair; return f;
    case TensorKind::kBlockScale:
      f.kind = FillKind::kE8m0Scale;
      f.scale_exp = synthetic::scale_exponent(t.fan_in, 1.6);
      return f;
    case TensorKind::kFp4Scale:
      f.kind = FillKind::kE8m0Scale;
      f.scale_exp = synthetic::scale_exponent(t.fan_in, 2.93);
      return f;
    case TensorKind::kEngramScale: f.kind = FillKind::kE8m0TableRow; return f;
    case TensorKind::kNorm: return uniform(s, t.dtype, 0.9, 1.1);
    case TensorKind::kEngramGate: return uniform(s, t.dtype, 0.8, 1.2);
    case TensorKind::kEmbedding: return uniform(s, t.dtype, -1.7320508, 1.7320508);
    case TensorKind::kMatrix:
    case TensorKind::kHcFn: return uniform(s, t.dtype, -a, a);
    case TensorKind::kHcBase: return uniform(s, t.dtype, -0.5, 0.5);
    case TensorKind::kHcScale: return uniform(s, t.dtype, 0.1, 1.0);
    case TensorKind::kAttnSink: return uniform(s, t.dtype, -1.0, 1.0);
    case TensorKind::kRouterBias: return uniform(s, t.dtype, -0.1, 0.1);
  }
  return f;
}

void fill_host(const SyntheticTensor& t, uint8_t* dst) {
  const uint64_t n = t.tensor.numel(), eb = t.fill.elem_bytes;
  for (uint64_t i = 0; i < n; ++i) synthetic::fill_element(t.fill, i, dst + i * eb);
}

}  // namespace

std::vector<int> synthetic_layer_ids(int n_layers) {
  if (n_layers < 1 || n_layers > kReleasedLayers)
    throw Error("--layers: expected 1..40 layers of the released schedule, got " + std::to_string(n_layers));
  std::vector<int> ids(kPickOrder, kPickOrder + n_layers);
  std::sort(ids.begin(), ids.end());
  return ids;
}

ModelConfig synthetic_config(const std::string& preset, int n_layers) {
  ModelConfig c;
  add_synthetic_dims(preset, c);
  const std::vector<int> picked = synthetic_layer_ids(n_layers);
  c.n_layers = n_layers;
  for (int i = 0; i < n_layers; ++i) {
    const int l = picked[static_cast<size_t>(i)];
    c.compress_ratios.push_back(released_ratio(l));
    if (released_kv_source(l)) c.kv_source_layers.push_back(i);
    if (released_index_source(l)) c.index_source_layers.push_back(i);
    if (l == 20) c.candidate_source_layer = i;
    if (l == 1 || l == 14) c.engram_layer_ids.push_back(i);
  }
  if (c.candidate_source_layer < 0) c.candidate_topk_blocks = c.candidate_block_size = 0;
  if (!c.engram_layer_ids.empty()) {
    // The table holds exactly the rows its hash reaches (validated): size it from the primes.
    c.engram_num_embeddings.assign(c.engram_layer_ids.size(), 1);
    const EngramLayout layout = make_engram_layout(c);
    for (int s = 0; s < layout.n_slots(); ++s) c.engram_num_embeddings[static_cast<size_t>(s)] = layout.rows_used(s);
  }
  derive_schedule(c);
  return c;
}

SyntheticWeights::SyntheticWeights(const ModelConfig& cfg, uint64_t seed, Placement placement) : placement_(placement) {
  constexpr uint64_t kAlign = 4096;  // page-aligned tensors: host-filled ones are made accessible alone
  for (ExpectedTensor& e : expected_tensors(cfg)) {
    if (e.optional) continue;
    SyntheticTensor t;
    t.fill = fill_spec(e, seed);
    t.tensor = std::move(e);
    t.offset = size_;
    t.on_host = placement == Placement::kHost || t.tensor.kind == TensorKind::kEngramScale;
    size_ += (t.tensor.nbytes() + kAlign - 1) / kAlign * kAlign;
    tensors_.push_back(std::move(t));
  }
  // Address space only: MAP_NORESERVE + PROT_NONE commits no memory until a range is opened.
  void* p = mmap(nullptr, std::max<uint64_t>(size_, kAlign), PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED)
    throw Error("synthetic checkpoint: cannot reserve " + std::to_string(size_) + " bytes of address space: " +
                std::strerror(errno));
  base_ = static_cast<uint8_t*>(p);
  for (const SyntheticTensor& t : tensors_) {
    if (!t.on_host || t.tensor.nbytes() == 0) continue;
    if (mprotect(base_ + t.offset, t.tensor.nbytes(), PROT_READ | PROT_WRITE) != 0)
      throw Error("synthetic checkpoint: cannot commit " + std::to_string(t.tensor.nbytes()) + " bytes for " +
                  t.tensor.name + ": " + std::strerror(errno));
    fill_host(t, base_ + t.offset);
  }
}

SyntheticWeights::~SyntheticWeights() {
  if (base_) munmap(base_, std::max<uint64_t>(size_, 4096));
}

const SyntheticTensor* SyntheticWeights::find(const void* p) const {
  const uint8_t* q = static_cast<const uint8_t*>(p);
  if (q < base_ || q >= base_ + size_) return nullptr;
  const uint64_t off = static_cast<uint64_t>(q - base_);
  auto it = std::lower_bound(tensors_.begin(), tensors_.end(), off,
                             [](const SyntheticTensor& t, uint64_t o) { return t.offset < o; });
  return it != tensors_.end() && it->offset == off ? &*it : nullptr;
}

std::vector<TensorView> SyntheticWeights::views() const {
  std::vector<TensorView> out;
  out.reserve(tensors_.size());
  for (const SyntheticTensor& t : tensors_) {
    TensorView v;
    v.name = t.tensor.name;
    v.dtype = t.tensor.dtype;
    v.shape = t.tensor.shape;
    v.data = base_ + t.offset;
    v.data_offset = t.offset;
    v.nbytes = t.tensor.nbytes();
    v.file = "<synthetic>";
    out.push_back(std::move(v));
  }
  return out;
}

SyntheticModel make_synthetic_model(const std::string& preset, int n_layers, uint64_t seed,
                                    SyntheticWeights::Placement placement) {
  SyntheticModel m;
  m.config = synthetic_config(preset, n_layers);
  auto w = std::make_shared<SyntheticWeights>(m.config, seed, placement);
  m.checkpoint = Checkpoint::from_views(w->views(), w);
  m.weights = w;
  // Engram classes: any surjection onto the compressed id space serves a benchmark.
  m.engram_map.compressed_vocab_size = m.config.engram_compressed_vocab_size;
  if (m.engram_map.compressed_vocab_size > 0) {
    m.engram_map.token_map.resize(static_cast<size_t>(m.config.vocab_size));
    for (int i = 0; i < m.config.vocab_size; ++i)
      m.engram_map.token_map[static_cast<size_t>(i)] = static_cast<int32_t>(i % m.engram_map.compressed_vocab_size);
  }
  return m;
}

}  // namespace di
