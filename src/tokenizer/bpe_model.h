// The BPE model of a byte-level tokenizer.json: vocab (byte-level spelled tokens -> ids) and merges
// by rank. Words arrive as raw bytes; each byte starts as the id of its byte-level character, then
// the lowest-ranked adjacent pair is merged (leftmost first among equal ranks) until none applies,
// exactly as Hugging Face's BPE does without dropout.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace di {

class BpeModel {
 public:
  // `model` is the "model" object of tokenizer.json. Throws di::Error naming `origin` and the field
  // (unknown type, dropout, a merge whose parts or result are not in the vocab, ...).
  BpeModel(const nlohmann::json& model, const std::string& origin);

  // Appends the ids of one word given as raw bytes.
  void encode_word(std::string_view bytes, std::vector<int32_t>& out) const;

  // The two merge strategies, public so tests can check they agree: a linear scan for short words,
  // a heap for long ones (O(n log n) on megabyte-long words).
  void encode_word_scan(std::string_view bytes, std::vector<int32_t>& out) const;
  void encode_word_heap(std::string_view bytes, std::vector<int32_t>& out) const;

  const std::unordered_map<std::string, int32_t>& vocab() const { return vocab_; }
  // Byte-level spelling of model token `id`, or nullptr when no model token has that id.
  const std::string* token_text(int32_t id) const;
  int32_t max_id() const { return static_cast<int32_t>(id_to_token_.size()) - 1; }
  size_t merge_count() const { return merge_count_; }

 private:
  struct MergeEntry {
    uint64_t key;  // left << 32 | right; kEmptyKey when empty
    int32_t rank;
    int32_t id;
  };
  static constexpr uint64_t kEmptyKey = ~uint64_t{0};
  // The merge of (left, right), or nullptr.
  const MergeEntry* find_merge(int32_t left, int32_t right) const {
    const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
                         static_cast<uint32_t>(right);
    size_t i = (key * 0x9E3779B97F4A7C15ull) >> merge_shift_;
    for (;;) {
      const MergeEntry& e = merges_[i];
      if (e.key == key) return &e;
      if (e.key == kEmptyKey) return nullptr;
      i = (i + 1) & (merges_.size() - 1);
    }
  }
  void add_merge(int32_t left, int32_t right, int32_t rank, int32_t id);
  // Byte ids of a word, skipping bytes that have no token (as HF does without an unk token).
  size_t initial_ids(std::string_view bytes, int32_t* ids) const;

  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<std::string> id_to_token_;
  std::vector<uint8_t> has_token_;
  int32_t byte_ids_[256];
  std::vector<MergeEntry> merges_;
  int merge_shift_ = 64;
  size_t merge_count_ = 0;
  bool ignore_merges_ = false;
};

}  // namespace di
