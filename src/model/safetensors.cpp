// Safetensors reader. The header is parsed with a SAX handler rather than into a JSON tree, so that
// duplicate keys are seen (a tree silently keeps the last one) and nesting deeper than the format
// allows is rejected before anything large is built.
#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "model/json_field.h"

namespace di {

namespace {

struct DTypeInfo {
  DType type;
  const char* name;
  size_t size;
};

constexpr DTypeInfo kDTypes[] = {
    {DType::kF8E4M3, "F8_E4M3", 1}, {DType::kF8E8M0, "F8_E8M0", 1}, {DType::kI8, "I8", 1},
    {DType::kU8, "U8", 1},          {DType::kBF16, "BF16", 2},      {DType::kF16, "F16", 2},
    {DType::kF32, "F32", 4},        {DType::kI32, "I32", 4},        {DType::kI64, "I64", 8},
};

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // the format's own limit
constexpr size_t kMaxRank = 8;

// A name for an error message: JSON-quoted, long names cut, broken UTF-8 replaced (never throws).
std::string quote_name(std::string_view s) {
  const auto replace = nlohmann::json::error_handler_t::replace;
  if (s.size() > 200) return nlohmann::json(std::string(s.substr(0, 200))).dump(-1, ' ', false, replace) + "...";
  return nlohmann::json(std::string(s)).dump(-1, ' ', false, replace);
}

// One header entry while it is being parsed.
struct RawEntry {
  std::string name;
  bool is_metadata = false;
  bool has_dtype = false, has_shape = false, has_offsets = false;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::vector<uint64_t> offsets;
};

// SAX handler for {"name": {"dtype": "F32", "shape": [..], "data_offsets": [b, e]}, ...,
// "__metadata__": {"k": "v"}}. Throws di::Error on anything else.
class HeaderSax {
 public:
  explicit HeaderSax(const std::string& file) : file_(file) {}

  std::vector<RawEntry> entries;

  bool null() { return scalar("null"); }
  bool boolean(bool) { return scalar("a boolean"); }
  bool number_integer(int64_t v) { return integer(v < 0 ? -1 : v, v < 0, false); }
  bool number_unsigned(uint64_t v) {
    return integer(v > static_cast<uint64_t>(INT64_MAX) ? -1 : static_cast<int64_t>(v), false, v > static_cast<uint64_t>(INT64_MAX));
  }
  bool number_float(double, const std::string& text) {
    if (depth_ == 3) fail_entry("'" + field_ + "' contains " + text.substr(0, 40) + ", expected non-negative integers");
    return scalar("a number");
  }
  bool binary(nlohmann::json::binary_t&) { return scalar("binary"); }
  bool string(std::string& s) {
    if (depth_ == 2 && !cur_.is_metadata && field_ == "dtype") {
      for (const DTypeInfo& d : kDTypes) {
        if (s == d.name) {
          cur_.dtype = d.type;
          cur_.has_dtype = true;
          return true;
        }
      }
      fail_entry("unknown dtype " + quote_name(s) +
                 " (expected F8_E4M3, F8_E8M0, I8, U8, BF16, F16, F32, I32 or I64)");
    }
    if (depth_ == 2 && cur_.is_metadata) return true;  // metadata values are free text
    return scalar("a string");
  }
  bool start_object(size_t) {
    if (depth_ == 0) {
      depth_ = 1;
      return true;
    }
    if (depth_ == 1) {
      depth_ = 2;
      return true;
    }
    return scalar("an object");
  }
  bool end_object() {
    if (depth_ == 2) {
      finish_entry();
      depth_ = 1;
    } else {
      depth_ = 0;
    }
    return true;
  }
  bool start_array(size_t) {
    if (depth_ == 2 && !cur_.is_metadata && (field_ == "shape" || field_ == "data_offsets")) {
      depth_ = 3;
      return true;
    }
    if (depth_ == 0) throw Error(file_ + ": header is a JSON array, expected an object of tensors");
    return scalar("an array");
  }
  bool end_array() {
    depth_ = 2;
    if (field_ == "data_offsets" && cur_.offsets.size() != 2) {
      fail_entry("'data_offsets' has " + std::to_string(cur_.offsets.size()) + " entries, expected [begin, end]");
    }
    if (field_ == "shape" && cur_.shape.size() > kMaxRank) {
      fail_entry("'shape' has " + std::to_string(cur_.shape.size()) + " dimensions, expected at most " +
                 std::to_string(kMaxRank));
    }
    return true;
  }
  bool key(std::string& k) {
    if (depth_ == 1) {
      if (k.empty()) throw Error(file_ + ": header has a tensor with an empty name");
      if (!names_.insert(k).second) throw Error(file_ + ": tensor " + quote_name(k) + " appears twice in the header");
      cur_ = RawEntry{};
      cur_.name = k;
      cur_.is_metadata = k == "__metadata__";
      return true;
    }
    if (depth_ == 2) {
      field_ = k;
      if (cur_.is_metadata) return true;
      if (k != "dtype" && k != "shape" && k != "data_offsets") {
        fail_entry("unexpected field " + quote_name(k) + " (expected dtype, shape, data_offsets)");
      }
      bool* seen = k == "dtype" ? &cur_.has_dtype : k == "shape" ? &cur_.has_shape
                   : k == "data_offsets" ? &cur_.has_offsets : nullptr;
      if (seen && *seen) fail_entry("field '" + k + "' appears twice");
      if (k == "shape") cur_.has_shape = true;
      if (k == "data_offsets") cur_.has_offsets = true;
      return true;
    }
    return true;
  }
  bool parse_error(size_t pos, const std::string&, const nlohmann::detail::exception& e) {
    throw Error(file_ + ": header is not valid JSON (byte " + std::to_string(pos) + " of the header): " + e.what());
  }

 private:
  bool scalar(const char* what) {
    if (depth_ == 0) throw Error(file_ + ": header is " + std::string(what) + ", expected a JSON object of tensors");
    if (depth_ == 1) {
      throw Error(file_ + ": header entry " + quote_name(cur_.name) + " is " + what + ", expected an object");
    }
    if (cur_.is_metadata) {
      throw Error(file_ + ": '__metadata__' value of " + quote_name(field_) + " is " + what + ", expected a string");
    }
    fail_entry("'" + field_ + "' is " + what + ", expected " +
               (field_ == "dtype" ? "a dtype string" : "a list of non-negative integers"));
  }

  bool integer(int64_t v, bool negative, bool too_big) {
    if (depth_ != 3) return scalar("a number");
    if (negative) fail_entry("'" + field_ + "' contains a negative value");
    if (field_ == "shape") {
      if (too_big) fail_entry("'shape' contains a dimension that does not fit 63 bits");
      if (cur_.shape.size() >= kMaxRank) {
        fail_entry("'shape' has more than " + std::to_string(kMaxRank) + " dimensions");
      }
      cur_.shape.push_back(v);
    } else {
      if (too_big) fail_entry("'data_offsets' contains a value that does not fit 63 bits");
      if (cur_.offsets.size() >= 2) fail_entry("'data_offsets' has more than 2 entries, expected [begin, end]");
      cur_.offsets.push_back(static_cast<uint64_t>(v));
    }
    return true;
  }

  void finish_entry() {
    if (cur_.is_metadata) return;
    if (!cur_.has_dtype) fail_entry("missing 'dtype'");
    if (!cur_.has_shape) fail_entry("missing 'shape'");
    if (!cur_.has_offsets) fail_entry("missing 'data_offsets'");
    entries.push_back(std::move(cur_));
    cur_ = RawEntry{};
  }

  [[noreturn]] void fail_entry(const std::string& what) {
    throw Error(file_ + ": tensor " + quote_name(cur_.name) + ": " + what);
  }

  const std::string& file_;
  int depth_ = 0;  // 0 outside, 1 in the top object, 2 in an entry, 3 in shape/data_offsets
  std::string field_;
  RawEntry cur_;
  std::set<std::string, std::less<>> names_;
};

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

}  // namespace

const char* dtype_name(DType t) {
  for (const DTypeInfo& d : kDTypes) {
    if (d.type == t) return d.name;
  }
  return "?";
}

size_t dtype_size(DType t) {
  for (const DTypeInfo& d : kDTypes) {
    if (d.type == t) return d.size;
  }
  return 0;
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<TensorView> parse_safetensors_header(std::string_view header_json, uint64_t data_size,
                                                 const std::string& file_name) {
  HeaderSax sax(file_name);
  nlohmann::json::sax_parse(header_json.begin(), header_json.end(), &sax,
                            nlohmann::json::input_format_t::json, true);

  std::vector<TensorView> out;
  out.reserve(sax.entries.size());
  for (RawEntry& e : sax.entries) {
    auto fail = [&](const std::string& what) -> void {
      throw Error(file_name + ": tensor " + quote_name(e.name) + ": " + what);
    };
    uint64_t numel = 1;
    for (int64_t d : e.shape) {
      if (__builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel)) {
        fail("shape " + shape_text(e.shape) + " overflows 64 bits");
      }
    }
    uint64_t nbytes = 0;
    if (__builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_size(e.dtype)), &nbytes) ||
        nbytes > static_cast<uint64_t>(INT64_MAX)) {
      fail("shape " + shape_text(e.shape) + " x " + dtype_name(e.dtype) + " overflows 63 bits");
    }
    uint64_t begin = e.offsets[0], end = e.offsets[1];
    if (end < begin) {
      fail("data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) + "] end before begin");
    }
    if (end > data_size) {
      fail("data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
           "] run past the data section of " + std::to_string(data_size) + " bytes");
    }
    if (end - begin != nbytes) {
      fail("data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) + "] hold " +
           std::to_string(end - begin) + " bytes, but shape " + shape_text(e.shape) + " " +
           dtype_name(e.dtype) + " needs " + std::to_string(nbytes));
    }
    TensorView v;
    v.name = std::move(e.name);
    v.dtype = e.dtype;
    v.shape = std::move(e.shape);
    v.nbytes = nbytes;
    v.file = file_name;
    // Until the caller binds the mapping, `data` carries the offset into the data section.
    v.data = nullptr;
    v.data_offset = begin;
    out.push_back(std::move(v));
  }

  // Overlap check: sort by begin; every non-empty tensor must start at or after the previous end.
  std::vector<const TensorView*> order;
  for (const TensorView& v : out) {
    if (v.nbytes > 0) order.push_back(&v);
  }
  std::sort(order.begin(), order.end(), [](const TensorView* a, const TensorView* b) {
    return a->data_offset < b->data_offset;
  });
  for (size_t i = 1; i < order.size(); ++i) {
    const TensorView* prev = order[i - 1];
    if (order[i]->data_offset < prev->data_offset + prev->nbytes) {
      throw Error(file_name + ": tensors " + quote_name(prev->name) + " (bytes " + std::to_string(prev->data_offset) +
                  ".." + std::to_string(prev->data_offset + prev->nbytes) + ") and " + quote_name(order[i]->name) +
                  " (from byte " + std::to_string(order[i]->data_offset) + ") overlap");
    }
  }
  return out;
}

std::map<std::string, std::string> parse_safetensors_index(std::string_view index_json,
                                                           const std::string& file_name) {
  nlohmann::json doc = parse_json_text(index_json, file_name);
  JsonObject top(doc, file_name, "");
  top.get_object("weight_map");  // checks it is an object
  std::map<std::string, std::string> out;
  const nlohmann::json& obj = doc["weight_map"];
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    if (!it.value().is_string()) {
      throw Error(file_name + ": weight_map entry " + quote_name(it.key()) + " = " + describe_json(it.value()) +
                  ", expected a shard file name");
    }
    const std::string& shard = it.value().get_ref<const std::string&>();
    if (shard.empty() || shard == "." || shard == ".." || shard.find('/') != std::string::npos ||
        shard.find('\\') != std::string::npos || shard.find('\0') != std::string::npos) {
      throw Error(file_name + ": weight_map entry " + quote_name(it.key()) + " names shard " + quote_name(shard) +
                  ", expected a plain file name in the model directory");
    }
    if (it.key().empty()) throw Error(file_name + ": weight_map has an empty tensor name");
    out.emplace(it.key(), shard);
  }
  if (out.empty()) throw Error(file_name + ": weight_map is empty, expected tensor -> shard entries");
  return out;
}

// ---------------------------------------------------------------------------------------------
// Checkpoint

struct Checkpoint::Mapping {
  std::string path;
  void* base = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (base) munmap(base, size);
  }
};

Checkpoint::~Checkpoint() = default;

const TensorView* Checkpoint::find(std::string_view name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

const TensorView& Checkpoint::get(std::string_view name) const {
  const TensorView* v = find(name);
  if (!v) throw Error("checkpoint has no tensor " + quote_name(name));
  return *v;
}

void Checkpoint::add_file(const std::filesystem::path& file) {
  auto mapping = std::make_unique<Mapping>();
  mapping->path = file.string();
  std::vector<TensorView> views = parse_mapped(file, *mapping);
  for (TensorView& v : views) {
    auto [it, inserted] = tensors_.emplace(v.name, v);
    if (!inserted) {
      throw Error("tensor " + quote_name(v.name) + " appears in both " + it->second.file + " and " + v.file);
    }
  }
  mappings_.push_back(std::move(mapping));
}

std::vector<TensorView> Checkpoint::parse_mapped(const std::filesystem::path& file, Mapping& m) {
  const std::string name = file.string();
  int fd = ::open(name.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(name + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    throw Error(name + ": cannot stat: " + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(name + ": not a regular file");
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    throw Error(name + ": file is " + std::to_string(size) + " bytes, shorter than the 8-byte header length");
  }
  void* base = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  int map_err = errno;
  ::close(fd);
  if (base == MAP_FAILED) throw Error(name + ": mmap failed: " + std::strerror(map_err));
  m.base = base;
  m.size = size;
  const auto* bytes = static_cast<const uint8_t*>(base);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];
  if (header_len > kMaxHeaderBytes) {
    throw Error(name + ": header length " + std::to_string(header_len) + " exceeds the 100 MB limit");
  }
  if (header_len > size - 8) {
    throw Error(name + ": header length " + std::to_string(header_len) + " runs past the end of the " +
                std::to_string(size) + "-byte file");
  }
  std::string_view header(reinterpret_cast<const char*>(bytes + 8), header_len);
  const uint64_t data_start = 8 + header_len;
  std::vector<TensorView> views = parse_safetensors_header(header, size - data_start, name);
  for (TensorView& v : views) v.data = bytes + data_start + v.data_offset;
  return views;
}

std::unique_ptr<Checkpoint> Checkpoint::open_file(const std::filesystem::path& file) {
  std::unique_ptr<Checkpoint> ck(new Checkpoint());
  ck->add_file(file);
  return ck;
}

std::unique_ptr<Checkpoint> Checkpoint::from_views(std::vector<TensorView> views, std::shared_ptr<void> owner) {
  std::unique_ptr<Checkpoint> ck(new Checkpoint());
  for (TensorView& v : views) {
    std::string name = v.name;
    if (!ck->tensors_.emplace(name, std::move(v)).second) throw Error("tensor " + quote_name(name) + " given twice");
  }
  ck->owner_ = std::move(owner);
  return ck;
}

std::unique_ptr<Checkpoint> Checkpoint::open(const std::filesystem::path& model_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(model_dir, ec)) throw Error(model_dir.string() + ": not a directory");
  std::unique_ptr<Checkpoint> ck(new Checkpoint());
  fs::path index = model_dir / "model.safetensors.index.json";
  if (fs::exists(index, ec)) {
    const std::string index_name = index.string();
    std::map<std::string, std::string> weight_map =
        parse_safetensors_index(read_text_file(index_name, 256ull << 20), index_name);
    std::set<std::string> shards;
    for (const auto& [tensor, shard] : weight_map) shards.insert(shard);
    for (const std::string& shard : shards) {
      fs::path p = model_dir / shard;
      if (!fs::is_regular_file(p, ec)) {
        throw Error(index_name + ": shard " + quote_name(shard) + " (holding e.g. tensor " +
                    quote_name(std::find_if(weight_map.begin(), weight_map.end(),
                                        [&](const auto& kv) { return kv.second == shard; })->first) +
                    ") does not exist in " + model_dir.string());
      }
      ck->add_file(p);
    }
    for (const auto& [tensor, shard] : weight_map) {
      const TensorView* v = ck->find(tensor);
      if (!v) throw Error(index_name + ": tensor " + quote_name(tensor) + " is missing from shard " + quote_name(shard));
      if (fs::path(v->file).filename() != shard) {
        throw Error(index_name + ": tensor " + quote_name(tensor) + " is mapped to shard " + quote_name(shard) +
                    " but found in " + v->file);
      }
    }
    for (const auto& [name, v] : ck->tensors_) {
      if (!weight_map.count(name)) {
        throw Error(v.file + ": tensor " + quote_name(name) + " is not listed in " + index_name);
      }
    }
    return ck;
  }
  fs::path single = model_dir / "model.safetensors";
  if (fs::exists(single, ec)) {
    ck->add_file(single);
    return ck;
  }
  std::vector<fs::path> files;
  for (const fs::directory_entry& e : fs::directory_iterator(model_dir, ec)) {
    if (e.path().extension() == ".safetensors") files.push_back(e.path());
  }
  if (files.empty()) {
    throw Error(model_dir.string() + ": no model.safetensors.index.json, model.safetensors or *.safetensors files");
  }
  std::sort(files.begin(), files.end());
  for (const fs::path& f : files) ck->add_file(f);
  return ck;
}

}  // namespace di
