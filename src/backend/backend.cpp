#include "backend/backend.h"

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"

namespace di {

Tensor copy_tensor(Backend& b, const Tensor& t) {
  if (t.empty()) return t;
  Tensor out = b.alloc(t.type, t.shape);
  if (t.rows() > 0) b.copy_rows(out, 0, t, 0, t.rows());
  return out;
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
