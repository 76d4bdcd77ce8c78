// The byte-level BPE Tokenizer behind di::Tokenizer::load: added-token splitting, then the
// pre-tokenizer, then BPE per word through a per-thread word cache.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe_model.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"

namespace di {

class BpeTokenizer final : public Tokenizer {
 public:
  // `config` is tokenizer_config.json (or null) for the bos/eos names.
  BpeTokenizer(const nlohmann::json& tokenizer, const nlohmann::json& config, const std::string& origin);
  ~BpeTokenizer() override;

  std::vector<int32_t> encode(std::string_view text, bool allow_special = true) const override;
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const override;
  std::string token_bytes(int32_t id) const override;
  std::optional<int32_t> token_to_id(std::string_view token) const override;
  bool is_special(int32_t id) const override;
  int32_t vocab_size() const override { return static_cast<int32_t>(token_bytes_.size()); }
  int32_t bos_id() const override { return bos_id_; }
  int32_t eos_id() const override { return eos_id_; }

  // Appends the ids of `text` to `out` (encode without the vector allocation).
  void encode_into(std::string_view text, bool allow_special, std::vector<int32_t>& out) const;

 private:
  struct ThreadState;
  ThreadState& thread_state() const;
  void encode_plain(std::string_view text, ThreadState& st, std::vector<int32_t>& out) const;
  int32_t resolve_token_name(const nlohmann::json& config, const char* key, const char* fallback) const;

  std::unique_ptr<BpeModel> model_;
  std::unique_ptr<PreTokenizer> pre_;
  std::unique_ptr<AddedTokenSplitter> splitter_;
  std::vector<AddedToken> added_;           // as listed in the file
  std::unordered_map<std::string, int32_t> added_ids_;  // content -> id (first listed wins)
  std::vector<std::string> token_bytes_;    // [vocab_size] raw bytes per id ("" for unused ids)
  std::vector<uint8_t> special_;            // [vocab_size] 1 for special added tokens
  int32_t bos_id_ = -1;
  int32_t eos_id_ = -1;
  uint64_t serial_;                         // tells thread-local caches which tokenizer they hold
  std::string origin_;
};

}  // namespace di
