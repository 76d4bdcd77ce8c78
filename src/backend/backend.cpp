#include "backend/backend.h"

#include <algorithm>
#include <string>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"

namespace di {

Tensor copy_tensor(Backend& b, const Tensor& t) {
  if (t.empty()) return t;
  Tensor out = b.alloc(t.type, t.shape);
  if (t.rows() > 0) b.copy_rows(out, 0, t, 0, t.rows());
  return out;
}

int64_t index_width(const std::vector<int64_t>& visible) {
  int64_t w = 0;
  for (int64_t v : visible) w = std::max(w, v);
  return w;
}

void check_key_offsets(const std::vector<int64_t>& key_offsets, const std::vector<int64_t>& visible, int64_t key_rows) {
  if (key_offsets.empty()) return;
  if (key_offsets.size() != visible.size())
    throw Error("index_scores: " + std::to_string(key_offsets.size()) + " key offsets for " +
                std::to_string(visible.size()) + " rows");
  for (size_t r = 0; r < visible.size(); ++r)
    if (visible[r] > 0 && (key_offsets[r] < 0 || key_offsets[r] + visible[r] > key_rows))
      throw Error("index_scores: row " + std::to_string(r) + " reads keys [" + std::to_string(key_offsets[r]) + ", " +
                  std::to_string(key_offsets[r] + visible[r]) + ") of " + std::to_string(key_rows));
}

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

#ifdef DEEPINFER_HAVE_CUDA
std::unique_ptr<Backend> make_cuda_backend();  // src/backend/cuda
#endif

std::unique_ptr<Backend> make_backend(const std::string& device) {
  if (device == "cpu") return make_cpu_backend();
  if (device == "cuda") {
#ifdef DEEPINFER_HAVE_CUDA
    return make_cuda_backend();
#else
    throw Error("--device cuda: this build has no CUDA backend (configure with nvcc present, -DDEEPINFER_CUDA=ON)");
#endif
  }
  throw Error("--device: expected 'cpu' or 'cuda', got '" + device + "'");
}

}  // namespace di
