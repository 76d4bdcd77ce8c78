#include "tokenizer/bpe_model.h"

#include <algorithm>
#include <climits>
#include <functional>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/utf8.h"

namespace di {

namespace {

constexpr size_t kScanMaxBytes = 64;  // longer words use the heap

bool non_empty_string(const nlohmann::json& m, const char* key) {
  auto it = m.find(key);
  return it != m.end() && it->is_string() && !it->get<std::string>().empty();
}

}  // namespace

BpeModel::BpeModel(const nlohmann::json& model, const std::string& origin) {
  const std::string where = origin + ": model";
  if (!model.is_object()) throw Error(where + ": expected an object");
  if (auto t = model.find("type"); t != model.end() && !(t->is_string() && *t == "BPE"))
    throw Error(where + ".type: expected \"BPE\", got " + t->dump());
  if (auto d = model.find("dropout"); d != model.end() && !d->is_null() &&
                                      !(d->is_number() && d->get<double>() == 0.0))
    throw Error(where + ".dropout: BPE dropout is not supported (expected null)");
  if (non_empty_string(model, "continuing_subword_prefix") || non_empty_string(model, "end_of_word_suffix"))
    throw Error(where + ": continuing_subword_prefix / end_of_word_suffix are not supported");
  if (auto b = model.find("byte_fallback"); b != model.end() && b->is_boolean() && b->get<bool>())
    throw Error(where + ".byte_fallback: not supported for byte-level BPE (expected false)");
  if (auto im = model.find("ignore_merges"); im != model.end() && !im->is_null()) {
    if (!im->is_boolean()) throw Error(where + ".ignore_merges: expected true or false");
    ignore_merges_ = im->get<bool>();
  }

  // Vocab.
  auto vocab = model.find("vocab");
  if (vocab == model.end() || !vocab->is_object()) throw Error(where + ".vocab: expected an object");
  int64_t max_id = -1;
  vocab_.reserve(vocab->size());
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() >= INT32_MAX)
      throw Error(where + ".vocab[\"" + it.key() + "\"]: expected a non-negative integer id");
    const auto id = static_cast<int32_t>(it->get<int64_t>());
    vocab_.emplace(it.key(), id);
    max_id = std::max<int64_t>(max_id, id);
  }
  id_to_token_.resize(static_cast<size_t>(max_id + 1));
  has_token_.assign(static_cast<size_t>(max_id + 1), 0);
  for (const auto& [text, id] : vocab_) {
    id_to_token_[static_cast<size_t>(id)] = text;
    has_token_[static_cast<size_t>(id)] = 1;
  }

  // Each byte's starting id: its byte-level character's token, else the unk token, else none.
  int32_t unk = -1;
  if (auto u = model.find("unk_token"); u != model.end() && u->is_string()) {
    auto it = vocab_.find(u->get<std::string>());
    if (it == vocab_.end()) throw Error(where + ".unk_token: '" + u->get<std::string>() + "' is not in the vocab");
    unk = it->second;
  }
  for (int b = 0; b < 256; ++b) {
    std::string ch;
    utf8::append(ch, byte_level::byte_to_char(static_cast<unsigned char>(b)));
    auto it = vocab_.find(ch);
    byte_ids_[b] = it != vocab_.end() ? it->second : unk;
  }

  // Merges, by rank (their order). Old files spell a merge "left right", newer ones ["left", "right"].
  auto merges = model.find("merges");
  if (merges == model.end() || !merges->is_array()) throw Error(where + ".merges: expected an array");
  size_t cap = 16;
  while (cap < merges->size() * 2) cap <<= 1;
  merges_.assign(cap, MergeEntry{kEmptyKey, 0, 0});
  merge_shift_ = 64 - __builtin_ctzll(cap);
  std::string left, right;
  for (size_t r = 0; r < merges->size(); ++r) {
    const auto& m = (*merges)[r];
    const std::string at = where + ".merges[" + std::to_string(r) + "]";
    if (m.is_string()) {
      const std::string& s = m.get_ref<const std::string&>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        throw Error(at + ": expected \"left right\", got \"" + s + "\"");
      left = s.substr(0, sp);
      right = s.substr(sp + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      left = m[0].get<std::string>();
      right = m[1].get<std::string>();
    } else {
      throw Error(at + ": expected a string or a pair of strings");
    }
    auto l = vocab_.find(left), rt = vocab_.find(right), res = vocab_.find(left + right);
    if (l == vocab_.end() || rt == vocab_.end() || res == vocab_.end())
      throw Error(at + ": '" + left + "', '" + right + "' or their merge '" + left + right +
                  "' is not in the vocab");
    add_merge(l->second, rt->second, static_cast<int32_t>(r), res->second);
  }
}

void BpeModel::add_merge(int32_t left, int32_t right, int32_t rank, int32_t id) {
  const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  size_t i = (key * 0x9E3779B97F4A7C15ull) >> merge_shift_;
  while (merges_[i].key != kEmptyKey && merges_[i].key != key) i = (i + 1) & (merges_.size() - 1);
  if (merges_[i].key == kEmptyKey) ++merge_count_;
  merges_[i] = MergeEntry{key, rank, id};  // a repeated pair keeps its last rank, as HF's map does
}

const std::string* BpeModel::token_text(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size() || !has_token_[static_cast<size_t>(id)])
    return nullptr;
  return &id_to_token_[static_cast<size_t>(id)];
}

size_t BpeModel::initial_ids(std::string_view bytes, int32_t* ids) const {
  size_t m = 0;
  for (char c : bytes) {
    const int32_t id = byte_ids_[static_cast<unsigned char>(c)];
    if (id >= 0) ids[m++] = id;
  }
  return m;
}

void BpeModel::encode_word(std::string_view bytes, std::vector<int32_t>& out) const {
  if (bytes.empty()) return;
  if (ignore_merges_) {
    auto it = vocab_.find(byte_level::encode(bytes));
    if (it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  if (bytes.size() == 1) {
    const int32_t id = byte_ids_[static_cast<unsigned char>(bytes[0])];
    if (id >= 0) out.push_back(id);
    return;
  }
  if (bytes.size() <= kScanMaxBytes) {
    encode_word_scan(bytes, out);
  } else {
    encode_word_heap(bytes, out);
  }
}

void BpeModel::encode_word_scan(std::string_view bytes, std::vector<int32_t>& out) const {
  DI_CHECK(bytes.size() <= kScanMaxBytes);
  int32_t ids[kScanMaxBytes];       // [m] current symbols
  int32_t ranks[kScanMaxBytes];     // [m - 1] rank of (ids[i], ids[i + 1]); INT32_MAX: no merge
  int32_t merged[kScanMaxBytes];    // [m - 1] the id that pair merges into
  size_t m = initial_ids(bytes, ids);
  auto pair_at = [&](size_t i) {
    const MergeEntry* e = find_merge(ids[i], ids[i + 1]);
    ranks[i] = e ? e->rank : INT32_MAX;
    merged[i] = e ? e->id : -1;
  };
  for (size_t i = 0; i + 1 < m; ++i) pair_at(i);
  while (m > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < m; ++i)
      if (ranks[i] < ranks[best]) best = i;
    if (ranks[best] == INT32_MAX) break;
    ids[best] = merged[best];
    // Drop symbol best + 1 and pair best + 1.
    for (size_t i = best + 1; i + 1 < m; ++i) ids[i] = ids[i + 1];
    for (size_t i = best + 1; i + 2 < m; ++i) {
      ranks[i] = ranks[i + 1];
      merged[i] = merged[i + 1];
    }
    --m;
    if (best > 0) pair_at(best - 1);
    if (best + 1 < m) pair_at(best);
  }
  out.insert(out.end(), ids, ids + m);
}

void BpeModel::encode_word_heap(std::string_view bytes, std::vector<int32_t>& out) const {
  struct Sym {
    int32_t id;  // -1 once merged into its left neighbour
    int32_t prev, next;
  };
  struct Cand {
    int32_t rank, pos;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  // Per-thread scratch: long words (CJK runs, whitespace runs) are common enough to avoid mallocs.
  thread_local std::vector<int32_t> ids;
  thread_local std::vector<Sym> syms;
  thread_local std::vector<Cand> heap;
  ids.resize(bytes.size());
  const size_t m = initial_ids(bytes, ids.data());
  if (m == 0) return;
  syms.resize(m);
  heap.clear();
  const auto push = [](Cand c) {
    heap.push_back(c);
    std::push_heap(heap.begin(), heap.end(), std::greater<Cand>());
  };
  for (size_t i = 0; i < m; ++i) {
    syms[i] = Sym{ids[i], static_cast<int32_t>(i) - 1, i + 1 < m ? static_cast<int32_t>(i + 1) : -1};
    if (i + 1 < m)
      if (const MergeEntry* e = find_merge(ids[i], ids[i + 1])) heap.push_back(Cand{e->rank, static_cast<int32_t>(i)});
  }
  std::make_heap(heap.begin(), heap.end(), std::greater<Cand>());
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<Cand>());
    const Cand c = heap.back();
    heap.pop_back();
    Sym& s = syms[static_cast<size_t>(c.pos)];
    if (s.id < 0 || s.next < 0) continue;
    Sym& right = syms[static_cast<size_t>(s.next)];
    const MergeEntry* e = find_merge(s.id, right.id);
    if (e == nullptr || e->rank != c.rank) continue;  // stale: the pair changed since the push
    s.id = e->id;
    right.id = -1;
    s.next = right.next;
    if (s.next >= 0) syms[static_cast<size_t>(s.next)].prev = c.pos;
    if (s.prev >= 0)
      if (const MergeEntry* l = find_merge(syms[static_cast<size_t>(s.prev)].id, s.id)) push(Cand{l->rank, s.prev});
    if (s.next >= 0)
      if (const MergeEntry* r = find_merge(s.id, syms[static_cast<size_t>(s.next)].id)) push(Cand{r->rank, c.pos});
  }
  for (int32_t i = 0; i >= 0; i = syms[static_cast<size_t>(i)].next) out.push_back(syms[static_cast<size_t>(i)].id);
  if (ids.capacity() > (size_t{1} << 20)) {  // do not keep a huge word's scratch around
    std::vector<int32_t>().swap(ids);
    std::vector<Sym>().swap(syms);
    std::vector<Cand>().swap(heap);
  }
}

}  // namespace di
