// Tokenizer::load / from_json: read tokenizer.json (+ tokenizer_config.json) into a BpeTokenizer.
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/bpe_tokenizer.h"

namespace di {

namespace {

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path.string() + ": cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw Error(path.string() + ": read failed");
  return ss.str();
}

nlohmann::json parse_json(const std::string& text, const std::string& origin) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(origin + ": invalid JSON (" + e.what() + ")");
  }
}

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::load(const std::filesystem::path& model_dir) {
  const auto tok_path = model_dir / "tokenizer.json";
  const std::string origin = tok_path.string();
  nlohmann::json tok = parse_json(read_file(tok_path), origin);
  nlohmann::json config;
  const auto cfg_path = model_dir / "tokenizer_config.json";
  if (std::filesystem::exists(cfg_path)) config = parse_json(read_file(cfg_path), cfg_path.string());
  return std::make_unique<BpeTokenizer>(tok, config, origin);
}

std::unique_ptr<Tokenizer> Tokenizer::from_json(const std::string& tokenizer_json, const std::string& origin) {
  return std::make_unique<BpeTokenizer>(parse_json(tokenizer_json, origin), nlohmann::json(), origin);
}

}  // namespace di
