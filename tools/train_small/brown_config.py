"""The brown-small configuration: a V4.1-architecture model of ~13 M parameters (+ Engram tables) that
has every layer kind of V4.1-Flash:

  layer 0   ratio 0  sliding window only
  layer 1   ratio 0  sliding window + Engram table 0
  layer 2   ratio 2  Full (compressor + indexer) + Engram table 1
  layer 3   ratio 2  Reuse (layer 2's compressed KV and top-k)
  layer 4   ratio 1  Full + two-level candidate source
  layer 5   ratio 1  Reuse
  layer 6   ratio 1  Reindex (own indexer over layer 4's keys, within layer 4's candidates)
  layer 7   ratio 1  Reuse (layer 6's top-k)
  mtp.0-2   DSpark stages, taps at layers 5, 6, 7

Writes config.json (HF text_config form) and inference/config.json (the reference's flat form).
"""
import json
import os

from v41_io import engram_layout, engram_token_map

TEXT = dict(
    vocab_size=4096, hidden_size=256, num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=1,
    head_dim=128, qk_rope_head_dim=32, q_lora_rank=128, o_lora_rank=128, o_groups=2,
    rope_theta=10000.0, compress_rope_theta=160000.0,
    rope_scaling={"rope_type": "yarn", "factor": 4, "beta_fast": 32, "beta_slow": 1,
                  "original_max_position_embeddings": 256},
    max_position_embeddings=1024, sliding_window=64,
    compress_ratios=[0, 0, 2, 2, 1, 1, 1, 1, 0, 0, 0],
    kv_source_layer_ids=[2, 4], index_source_layer_ids=[2, 4, 6], candidate_source_layer_id=4,
    candidate_topk_blocks=16, candidate_block_size=8, index_n_heads=4, index_head_dim=64, index_topk=64,
    n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, moe_intermediate_size=128,
    scoring_func="sqrtsoftplus", topk_method="noaux_tc", norm_topk_prob=True, routed_scaling_factor=1.5,
    gate_temp=1.0, swiglu_limit=10.0, first_k_dense_replace=0,
    hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-06, rms_norm_eps=1e-20, hidden_act="silu",
    engram_layer_ids=[1, 2], engram_max_ngram_size=4, engram_vocab_size=4000, engram_n_heads=2,
    engram_head_dim=32, engram_pad_token_id=2,
    num_nextn_predict_layers=3, dspark_block_size=5, dspark_target_layer_ids=[5, 6, 7], dspark_markov_rank=32,
    dspark_n_routed_experts=4, dspark_num_experts_per_tok=2,
    bos_token_id=0, eos_token_id=1, pad_token_id=2)

QUANT = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [32, 32],
         "scale_fmt": "ue8m0", "expert_dtype": "fp4"}


def text_config(tokenizer_json):
    tc = dict(TEXT, model_type="deepseek_v41_text")
    tok = json.load(open(tokenizer_json))
    noise = [a["id"] for a in tok["added_tokens"] if a["content"] == "</think>"]
    tc["dspark_noise_token_id"] = noise[0]
    _, n_classes = engram_token_map(tokenizer_json)
    tc["engram_compressed_vocab_size"] = n_classes
    primes, _, _ = engram_layout(tc["engram_layer_ids"], tc["engram_max_ngram_size"], tc["engram_n_heads"],
                                 tc["engram_vocab_size"], n_classes)
    tc["engram_num_embeddings"] = [sum(p) for p in primes]
    return tc


def write_configs(tc, out_dir):
    top = {"architectures": ["DeepseekV41ForCausalLM"], "model_type": "deepseek_v41", "text_config": tc,
           "bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2, "tie_word_embeddings": False,
           "dtype": "bfloat16", "quantization_config": QUANT}
    rs = tc["rope_scaling"]
    inf = {"dtype": "fp8", "expert_dtype": "fp4", "vocab_size": tc["vocab_size"], "dim": tc["hidden_size"],
           "moe_inter_dim": tc["moe_intermediate_size"], "n_layers": tc["num_hidden_layers"],
           "n_mtp_layers": tc["num_nextn_predict_layers"], "n_heads": tc["num_attention_heads"],
           "n_routed_experts": tc["n_routed_experts"], "n_shared_experts": tc["n_shared_experts"],
           "n_activated_experts": tc["num_experts_per_tok"], "score_func": tc["scoring_func"],
           "gate_temp": tc["gate_temp"], "norm_topk_prob": tc["norm_topk_prob"],
           "route_scale": tc["routed_scaling_factor"], "swiglu_limit": tc["swiglu_limit"],
           "q_lora_rank": tc["q_lora_rank"], "head_dim": tc["head_dim"], "rope_head_dim": tc["qk_rope_head_dim"],
           "norm_eps": tc["rms_norm_eps"], "o_groups": tc["o_groups"], "o_lora_rank": tc["o_lora_rank"],
           "window_size": tc["sliding_window"], "compress_ratios": tc["compress_ratios"],
           "kv_source_layers": tc["kv_source_layer_ids"], "index_source_layers": tc["index_source_layer_ids"],
           "compress_rope_theta": tc["compress_rope_theta"], "original_seq_len": rs["original_max_position_embeddings"],
           "rope_theta": tc["rope_theta"], "rope_factor": rs["factor"], "beta_fast": rs["beta_fast"],
           "beta_slow": rs["beta_slow"], "index_n_heads": tc["index_n_heads"], "index_head_dim": tc["index_head_dim"],
           "index_topk": tc["index_topk"], "candidate_source_layer": tc["candidate_source_layer_id"],
           "candidate_topk_blocks": tc["candidate_topk_blocks"], "candidate_block_size": tc["candidate_block_size"],
           "hc_mult": tc["hc_mult"], "hc_sinkhorn_iters": tc["hc_sinkhorn_iters"], "hc_eps": tc["hc_eps"],
           "engram_layer_ids": tc["engram_layer_ids"], "engram_num_embeddings": tc["engram_num_embeddings"],
           "engram_max_ngram_size": tc["engram_max_ngram_size"], "engram_vocab_size": tc["engram_vocab_size"],
           "engram_n_heads": tc["engram_n_heads"], "engram_head_dim": tc["engram_head_dim"],
           "engram_pad_id": tc["engram_pad_token_id"], "engram_compressed_vocab_size": tc["engram_compressed_vocab_size"],
           "vision_n_layers": 0, "dspark_block_size": tc["dspark_block_size"],
           "dspark_noise_token_id": tc["dspark_noise_token_id"], "dspark_target_layer_ids": tc["dspark_target_layer_ids"],
           "dspark_markov_rank": tc["dspark_markov_rank"], "dspark_n_routed_experts": tc["dspark_n_routed_experts"],
           "dspark_n_activated_experts": tc["dspark_num_experts_per_tok"]}
    os.makedirs(os.path.join(out_dir, "inference"), exist_ok=True)
    json.dump(top, open(os.path.join(out_dir, "config.json"), "w"), indent=2)
    json.dump(inf, open(os.path.join(out_dir, "inference", "config.json"), "w"), indent=2)


def main():
    import argparse
    ap = argparse.ArgumentParser(description="write brown-small's config and Engram token map into the data dir")
    ap.add_argument("--data", default="out/train_small", help="train_bpe.py output (tokenizer.json)")
    args = ap.parse_args()
    tok = os.path.join(args.data, "tokenizer.json")
    tc = text_config(tok)
    write_configs(tc, args.data)
    tmap, n = engram_token_map(tok)
    json.dump({"token_map": tmap, "compressed_vocab_size": n}, open(os.path.join(args.data, "engram_token_map.json"), "w"))
    print(f"config: engram_compressed_vocab_size {n}, engram_num_embeddings {tc['engram_num_embeddings']}, "
          f"dspark_noise_token_id {tc['dspark_noise_token_id']}")


if __name__ == "__main__":
    main()
