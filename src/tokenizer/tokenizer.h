// Byte-level BPE tokenizer loaded from a Hugging Face tokenizer.json of the DeepSeek family:
// the pre-tokenizer Sequence of Split regexes and ByteLevel, BPE merges, added/special tokens and
// the ByteLevel decoder.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace di {

class Tokenizer {
 public:
  // Reads DIR/tokenizer.json (and DIR/tokenizer_config.json for bos/eos names when present).
  // Throws di::Error naming the file and field. Thread-safe after loading: encode may run on many
  // threads at once (each thread keeps its own word cache).
  static std::unique_ptr<Tokenizer> load(const std::filesystem::path& model_dir);
  static std::unique_ptr<Tokenizer> from_json(const std::string& tokenizer_json, const std::string& origin);
  virtual ~Tokenizer() = default;

  // Token ids for `text`, no BOS. Added tokens in the text are matched as single tokens when
  // `allow_special` (as HF does); otherwise the text is encoded as plain bytes. Invalid UTF-8 input
  // is a di::Error.
  virtual std::vector<int32_t> encode(std::string_view text, bool allow_special = true) const = 0;
  // Concatenated bytes of the tokens (may be partial UTF-8 at the ends).
  virtual std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const = 0;
  // The raw bytes one token stands for (byte-level decoded; added tokens: their content).
  virtual std::string token_bytes(int32_t id) const = 0;
  // An added token's content ("<｜User｜>") or a model token's byte-level spelling ("Ġthe").
  virtual std::optional<int32_t> token_to_id(std::string_view token) const = 0;
  virtual bool is_special(int32_t id) const = 0;
  virtual int32_t vocab_size() const = 0;     // max id + 1
  // From tokenizer_config.json's bos_token / eos_token, else <｜begin▁of▁sentence｜> /
  // <｜end▁of▁sentence｜>; -1 when the tokenizer has no such token.
  virtual int32_t bos_id() const = 0;
  virtual int32_t eos_id() const = 0;
};

}  // namespace di
