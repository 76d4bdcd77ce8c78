// expected_tensors(): the released V4.1 checkpoint layout (spec §4.2, §4.3; reference model.py
// module tree). Quantized linears: FP8 e4m3 [out, in] + E8M0 [ceil(out/32), ceil(in/32)];
// routed experts: I8 [out, in/2] (E2M1 pairs) + E8M0 [out, in/32].
#include "model/checkpoint_validate.h"

namespace di {

uint64_t ExpectedTensor::numel() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

uint64_t ExpectedTensor::nbytes() const { return numel() * dtype_size(dtype); }

const char* tensor_group_name(TensorGroup g) {
  switch (g) {
    case TensorGroup::kBackbone: return "backbone";
    case TensorGroup::kEngramTable: return "engram tables";
    case TensorGroup::kDSpark: return "dspark";
  }
  return "?";
}

bool is_vision_tensor(const std::string& name) {
  return name.rfind("vision.", 0) == 0 || name.rfind("aligner.", 0) == 0 || name.rfind("image_", 0) == 0;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  s += "]";
  return s;
}

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

class Builder {
 public:
  Builder(const ModelConfig& cfg, std::vector<ExpectedTensor>& out) : cfg_(cfg), out_(out) {}
  TensorGroup group = TensorGroup::kBackbone;

  void add(std::string name, DType dt, std::vector<int64_t> shape, TensorKind kind, int64_t fan_in = 0,
           bool optional = false) {
    ExpectedTensor t;
    t.name = std::move(name);
    t.dtype = dt;
    t.shape = std::move(shape);
    t.group = group;
    t.kind = kind;
    t.fan_in = fan_in;
    t.optional = optional;
    out_.push_back(std::move(t));
  }
  // FP8 block-quantized linear `name`.weight [out, in] + `name`.scale.
  void fp8(const std::string& name, int64_t out, int64_t in) {
    const int64_t b = cfg_.weight_block;
    add(name + ".weight", DType::kF8E4M3, {out, in}, TensorKind::kFp8Weight, in);
    add(name + ".scale", DType::kF8E8M0, {ceil_div(out, b), ceil_div(in, b)}, TensorKind::kBlockScale, in);
  }
  // FP4 (E2M1 pairs in I8) linear with one E8M0 scale per row per 32 inputs.
  void fp4(const std::string& name, int64_t out, int64_t in) {
    add(name + ".weight", DType::kI8, {out, in / 2}, TensorKind::kFp4Weight, in);
    add(name + ".scale", DType::kF8E8M0, {out, in / 32}, TensorKind::kFp4Scale, in);
  }
  void bf16(const std::string& name, std::vector<int64_t> shape, TensorKind kind, int64_t fan_in = 0) {
    add(name, DType::kBF16, std::move(shape), kind, fan_in);
  }
  void norm(const std::string& name, int64_t dim) { bf16(name + ".weight", {dim}, TensorKind::kNorm); }

 private:
  const ModelConfig& cfg_;
  std::vector<ExpectedTensor>& out_;
};

void add_block(const ModelConfig& c, const LayerSchedule& s, Builder& b) {
  const std::string p = layer_tensor_prefix(c, s.layer);
  const int64_t D = c.hidden_size, Dh = c.head_dim, H = c.n_heads;

  if (s.engram_slot >= 0) {
    const int64_t rows = c.engram_num_embeddings[static_cast<size_t>(s.engram_slot)];
    const int64_t hd = c.engram_head_dim;
    b.group = TensorGroup::kEngramTable;
    b.add(p + "engram.embed.weight", DType::kF8E4M3, {rows, hd}, TensorKind::kEngramTable, hd);
    b.add(p + "engram.embed.scale", DType::kF8E8M0, {rows, hd / 32}, TensorKind::kEngramScale, hd);
    b.group = TensorGroup::kBackbone;
    b.fp8(p + "engram.wkv", D * (c.hc_mult + 1), int64_t{c.engram_n_cols()} * hd);
    b.bf16(p + "engram.q_weight", {c.hc_mult, D}, TensorKind::kEngramGate);
    b.bf16(p + "engram.k_weight", {c.hc_mult, D}, TensorKind::kEngramGate);
  }

  // Attention (every layer, DSpark stages included).
  b.norm(p + "attn_norm", D);
  b.fp8(p + "attn.wq_a", c.q_lora_rank, D);
  b.norm(p + "attn.q_norm", c.q_lora_rank);
  b.fp8(p + "attn.wq_b", H * Dh, c.q_lora_rank);
  b.fp8(p + "attn.wkv", Dh, D);
  b.norm(p + "attn.kv_norm", Dh);
  b.fp8(p + "attn.wo_a", int64_t{c.o_groups} * c.o_lora_rank, H * Dh / c.o_groups);
  b.fp8(p + "attn.wo_b", D, int64_t{c.o_groups} * c.o_lora_rank);
  b.add(p + "attn.attn_sink", DType::kF32, {H}, TensorKind::kAttnSink);

  if (s.mode == AttnMode::kFull) {
    b.bf16(p + "attn.compressor.wkv.weight", {Dh, D}, TensorKind::kMatrix, D);
    if (s.ratio > 1) b.bf16(p + "attn.compressor.wgate.weight", {Dh, D}, TensorKind::kMatrix, D);
    b.norm(p + "attn.compressor.norm", Dh);
  }
  if (s.mode == AttnMode::kFull || s.mode == AttnMode::kReindex) {
    b.fp8(p + "attn.indexer.wq_b", int64_t{c.index_n_heads} * c.index_head_dim, c.q_lora_rank);
    b.bf16(p + "attn.indexer.weights_proj.weight", {c.index_n_heads, D}, TensorKind::kMatrix, D);
  }
  if (s.mode == AttnMode::kFull) {
    b.bf16(p + "attn.indexer.wk.weight", {c.index_head_dim, Dh}, TensorKind::kMatrix, Dh);
    b.norm(p + "attn.indexer.k_norm", c.index_head_dim);
  }

  // Hyper-connections.
  const int64_t mix = c.hc_mix_dim(), hc_dim = c.hc_dim();
  for (const char* site : {"attn", "ffn"}) {
    const std::string n = p + "hc_" + site;
    b.add(n + "_fn", DType::kF32, {mix, hc_dim}, TensorKind::kHcFn, hc_dim);
    b.add(n + "_base", DType::kF32, {mix}, TensorKind::kHcBase);
    b.add(n + "_scale", DType::kF32, {3}, TensorKind::kHcScale);
  }

  // MoE.
  const int64_t E = c.layer_n_routed_experts(s.layer), I = c.moe_inter_dim;
  b.norm(p + "ffn_norm", D);
  b.bf16(p + "ffn.gate.weight", {E, D}, TensorKind::kMatrix, D);
  b.add(p + "ffn.gate.bias", DType::kF32, {E}, TensorKind::kRouterBias);
  b.add(p + "ffn.gate.bias_vl", DType::kF32, {E}, TensorKind::kRouterBias, 0, /*optional=*/true);
  for (int64_t e = 0; e < E; ++e) {
    const std::string n = p + "ffn.experts." + std::to_string(e) + ".";
    b.fp4(n + "w1", I, D);
    b.fp4(n + "w2", D, I);
    b.fp4(n + "w3", I, D);
  }
  b.fp8(p + "ffn.shared_experts.w1", I, D);
  b.fp8(p + "ffn.shared_experts.w2", D, I);
  b.fp8(p + "ffn.shared_experts.w3", I, D);

  // DSpark stage extras.
  if (s.is_dspark) {
    const int stage = s.layer - c.n_layers;
    if (stage == 0) {
      b.fp8(p + "main_proj", D, D * static_cast<int64_t>(c.dspark_target_layer_ids.size()));
      b.norm(p + "main_norm", D);
    }
    if (stage == c.n_mtp_layers - 1) {
      const int64_t R = c.dspark_markov_rank;
      b.norm(p + "norm", D);
      b.bf16(p + "markov_head.embed.weight", {c.vocab_size, R}, TensorKind::kEmbedding);
      b.bf16(p + "markov_head.head.weight", {c.vocab_size, R}, TensorKind::kMatrix, R);
      b.bf16(p + "confidence_head.proj.weight", {1, D + R}, TensorKind::kMatrix, D + R);
    }
  }
}

}  // namespace

std::vector<ExpectedTensor> expected_tensors(const ModelConfig& c) {
  std::vector<ExpectedTensor> out;
  Builder b(c, out);
  b.bf16("embed.weight", {c.vocab_size, c.hidden_size}, TensorKind::kEmbedding);
  b.bf16("head.weight", {c.vocab_size, c.hidden_size}, TensorKind::kMatrix, c.hidden_size);
  b.norm("norm", c.hidden_size);
  for (const LayerSchedule& s : c.layers) {
    b.group = s.is_dspark ? TensorGroup::kDSpark : TensorGroup::kBackbone;
    add_block(c, s, b);
  }
  return out;
}

}  // namespace di
