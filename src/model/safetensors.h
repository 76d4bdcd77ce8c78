// Safetensors checkpoints, single file or sharded (model.safetensors.index.json), memory-mapped.
// Parsing never trusts the file: header length, JSON, dtypes, shapes, offsets (in range, no
// overlap, sizes matching shape x dtype) are all checked; errors name the file and the tensor.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace di {

enum class DType { kF8E4M3, kF8E8M0, kI8, kU8, kBF16, kF16, kF32, kI32, kI64 };

const char* dtype_name(DType t);      // safetensors spelling: "F8_E4M3", "BF16", ...
size_t dtype_size(DType t);           // bytes per element

struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;      // points into the mmapped file (no alignment guarantee)
  uint64_t data_offset = 0;           // begin of data_offsets, relative to the data section
  uint64_t nbytes = 0;
  std::string file;                   // shard file name, for errors

  int64_t numel() const;
  int64_t dim(int i) const { return shape.at(static_cast<size_t>(i)); }
};

// Parses one safetensors header (the bytes after the 8-byte length prefix) against a data
// section of `data_size` bytes. Throws di::Error naming `file_name`. Exposed for the fuzz target.
std::vector<TensorView> parse_safetensors_header(std::string_view header_json, uint64_t data_size,
                                                 const std::string& file_name);

// Parses model.safetensors.index.json: returns its `weight_map` (tensor name -> shard file name).
// Shard names must be plain file names (no directories). Throws di::Error naming `file_name`.
std::map<std::string, std::string> parse_safetensors_index(std::string_view index_json,
                                                           const std::string& file_name);

class Checkpoint {
 public:
  // Opens DIR/model.safetensors.index.json if present, else DIR/model.safetensors, else every
  // *.safetensors file in DIR. With an index, every listed shard must exist and hold exactly the
  // tensors mapped to it. A name in two files is an error. Throws di::Error.
  static std::unique_ptr<Checkpoint> open(const std::filesystem::path& model_dir);
  // Opens one safetensors file.
  static std::unique_ptr<Checkpoint> open_file(const std::filesystem::path& file);
  // A checkpoint over tensors whose bytes live elsewhere (e.g. the synthetic weights of `deepinfer
  // bench`); `owner` keeps that memory alive as long as the checkpoint. A repeated name is an error.
  static std::unique_ptr<Checkpoint> from_views(std::vector<TensorView> views, std::shared_ptr<void> owner);

  ~Checkpoint();
  Checkpoint(const Checkpoint&) = delete;
  Checkpoint& operator=(const Checkpoint&) = delete;

  const TensorView* find(std::string_view name) const;   // nullptr when absent
  const TensorView& get(std::string_view name) const;    // throws di::Error when absent
  const std::map<std::string, TensorView, std::less<>>& tensors() const { return tensors_; }

  struct Mapping;

 private:
  Checkpoint() = default;
  void add_file(const std::filesystem::path& file);
  static std::vector<TensorView> parse_mapped(const std::filesystem::path& file, Mapping& m);
  std::vector<std::unique_ptr<Mapping>> mappings_;
  std::map<std::string, TensorView, std::less<>> tensors_;
  std::shared_ptr<void> owner_;  // from_views
};

}  // namespace di
