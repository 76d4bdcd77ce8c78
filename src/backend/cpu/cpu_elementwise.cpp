// CPU backend: norms, RoPE, quantize-dequantize, packed cache rows and the mHC ops.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "model/quant.h"

namespace di {

Tensor CpuBackend::rmsnorm(const Tensor& x, const Weight& weight, float eps) {
  int64_t s = x.rows(), n = x.row_size();
  DI_CHECK(weight.cols == n || weight.rows * weight.cols == n);
  Tensor y = alloc(TType::kF32, {s, n});
  std::vector<float> w(n);
  for (int64_t i = 0; i < n; ++i) w[i] = cpu::weight_at(weight, i);
  parallel_for(s, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const float* xr = x.f32() + r * n;
      float var = cpu::sum_squares(xr, n) / static_cast<float>(n);
      float inv = 1.0f / std::sqrt(var + eps);
      for (int64_t i = 0; i < n; ++i) y.f32()[r * n + i] = quant::round_bf16(w[i] * (xr[i] * inv));
    }
  });
  return y;
}

void CpuBackend::rope(Tensor& x, int heads, int head_dim, int rope_dim, const std::vector<int64_t>& positions,
                      const RopeTable& table, bool inverse) {
  int64_t s = x.rows();
  DI_CHECK(x.row_size() == static_cast<int64_t>(heads) * head_dim);
  DI_CHECK(static_cast<int64_t>(positions.size()) == s && static_cast<int>(table.freqs.size()) * 2 == rope_dim);
  parallel_for(s, [&](int64_t b, int64_t e) {
    std::vector<float> c(rope_dim / 2), sn(rope_dim / 2);
    for (int64_t r = b; r < e; ++r) {
      for (int i = 0; i < rope_dim / 2; ++i) {
        float angle = static_cast<float>(positions[r]) * table.freqs[i];  // fp32, as torch.outer
        c[i] = std::cos(angle);
        sn[i] = inverse ? -std::sin(angle) : std::sin(angle);
      }
      for (int h = 0; h < heads; ++h) {
        float* p = x.f32() + r * heads * head_dim + h * head_dim + (head_dim - rope_dim);
        for (int i = 0; i < rope_dim / 2; ++i) {
          float a = p[2 * i], bb = p[2 * i + 1];
          p[2 * i] = quant::round_bf16(a * c[i] - bb * sn[i]);
          p[2 * i + 1] = quant::round_bf16(a * sn[i] + bb * c[i]);
        }
      }
    }
  });
}

void CpuBackend::round_bf16(Tensor& x) {
  for (int64_t i = 0; i < x.numel(); ++i) x.f32()[i] = quant::round_bf16(x.f32()[i]);
}

void CpuBackend::scale_bf16(Tensor& x, float factor) {
  for (int64_t i = 0; i < x.numel(); ++i) x.f32()[i] = quant::round_bf16(x.f32()[i] * factor);
}

void CpuBackend::qdq(Tensor& x, RowFormat format) {
  int64_t s = x.rows(), n = x.row_size();
  parallel_for(s, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      float* p = x.f32() + r * n;
      switch (format) {
        case RowFormat::kFp8Ue8m0: quant::fp8_ue8m0_qdq(p, p, static_cast<int>(n), 32); break;
        case RowFormat::kFp4E4m3: quant::fp4_e4m3_qdq(p, p, static_cast<int>(n)); break;
        case RowFormat::kFp4Ue8m0: quant::fp4_ue8m0_qdq(p, p, static_cast<int>(n)); break;
      }
    }
  });
}

namespace {

void pack_row(const float* p, RowFormat format, int64_t n, uint8_t* row) {
  switch (format) {
    case RowFormat::kFp8Ue8m0: quant::fp8_ue8m0_quant(p, static_cast<int>(n), 32, row, row + n); break;
    case RowFormat::kFp4E4m3: quant::fp4_e4m3_quant(p, static_cast<int>(n), row, row + n / 2); break;
    case RowFormat::kFp4Ue8m0: quant::fp4_ue8m0_quant(p, static_cast<int>(n), row, row + n / 2); break;
  }
}

}  // namespace

void CpuBackend::pack_rows(const Tensor& x, RowFormat format, Tensor& cache, const std::vector<int64_t>& slots) {
  int64_t n = x.row_size(), rb = packed_row_bytes(format, n);
  DI_CHECK(cache.type == TType::kU8 && cache.row_size() == rb && static_cast<int64_t>(slots.size()) == x.rows());
  for (size_t r = 0; r < slots.size(); ++r) {
    DI_CHECK(slots[r] >= 0 && slots[r] < cache.rows());
    pack_row(x.f32() + r * n, format, n, cache.u8() + slots[r] * rb);
  }
}

void CpuBackend::pack_rows_to(const Tensor& x, RowFormat format, const std::vector<Tensor>& caches,
                              const std::vector<int32_t>& cache_of_row, const std::vector<int64_t>& slots) {
  const int64_t n = x.row_size(), rb = packed_row_bytes(format, n);
  DI_CHECK(static_cast<int64_t>(cache_of_row.size()) == x.rows() && slots.size() == cache_of_row.size());
  for (size_t r = 0; r < slots.size(); ++r) {
    if (cache_of_row[r] < 0) continue;
    const Tensor& cache = caches.at(static_cast<size_t>(cache_of_row[r]));
    DI_CHECK(cache.type == TType::kU8 && cache.row_size() == rb && slots[r] >= 0 && slots[r] < cache.rows());
    pack_row(x.f32() + r * n, format, n, cache.u8() + slots[r] * rb);
  }
}

void CpuBackend::unpack_caches(const std::vector<Tensor>& caches, RowFormat format, Tensor& dst, int64_t d0) {
  const int64_t dim = dst.row_size(), rb = packed_row_bytes(format, dim);
  DI_CHECK(dst.type == TType::kF32);
  int64_t r = d0;
  for (const Tensor& c : caches) {
    DI_CHECK(c.type == TType::kU8 && c.row_size() == rb && r + c.rows() <= dst.rows());
    for (int64_t i = 0; i < c.rows(); ++i, ++r) cpu::unpack_row(c.u8() + i * rb, format, dim, dst.f32() + r * dim);
  }
}

Tensor CpuBackend::unpack_rows(const Tensor& cache, RowFormat format, int64_t dim, const std::vector<int64_t>& slots) {
  int64_t rb = packed_row_bytes(format, dim);
  DI_CHECK(cache.type == TType::kU8 && cache.row_size() == rb);
  Tensor out = alloc(TType::kF32, {static_cast<int64_t>(slots.size()), dim});
  parallel_for(static_cast<int64_t>(slots.size()), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      DI_CHECK(slots[r] >= 0 && slots[r] < cache.rows());
      cpu::unpack_row(cache.u8() + slots[r] * rb, format, dim, out.f32() + r * dim);
    }
  }, 64);
  return out;
}

void cpu::unpack_row(const uint8_t* row, RowFormat format, int64_t dim, float* y) {
  const int n = static_cast<int>(dim);
  switch (format) {
    case RowFormat::kFp8Ue8m0: quant::fp8_ue8m0_dequant(row, row + n, n, 32, y); break;
    case RowFormat::kFp4E4m3: quant::fp4_e4m3_dequant(row, row + n / 2, n, y); break;
    case RowFormat::kFp4Ue8m0: quant::fp4_ue8m0_dequant(row, row + n / 2, n, y); break;
  }
}

namespace {
float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
}  // namespace

Tensor CpuBackend::hc_mixes(const Tensor& x, int hc, const Weight& fn, const Weight& scale, const Weight& base,
                            float norm_eps, int sinkhorn_iters, float hc_eps) {
  int64_t s = x.rows(), n = x.row_size();
  int mix = (2 + hc) * hc;
  DI_CHECK(fn.rows == mix && fn.cols == n);
  Tensor out = alloc(TType::kF32, {s, mix});
  std::vector<float> fnv(mix * n);
  for (int j = 0; j < mix; ++j) cpu::weight_row_f32(fn, j, fnv.data() + j * n);
  float sc[3] = {cpu::weight_at(scale, 0), cpu::weight_at(scale, 1), cpu::weight_at(scale, 2)};
  std::vector<float> bs(mix);
  for (int j = 0; j < mix; ++j) bs[j] = cpu::weight_at(base, j);
  parallel_for(s, [&](int64_t b, int64_t e) {
    std::vector<float> m(mix), comb(hc * hc);
    for (int64_t r = b; r < e; ++r) {
      const float* xr = x.f32() + r * n;
      float rs = 1.0f / std::sqrt(cpu::sum_squares(xr, n) / static_cast<float>(n) + norm_eps);
      for (int j = 0; j < mix; ++j) m[j] = static_cast<float>(cpu::dot_f64(xr, fnv.data() + j * n, n)) * rs;
      float* o = out.f32() + r * mix;
      for (int k = 0; k < hc; ++k) o[k] = sigmoid(m[k] * sc[0] + bs[k]) + hc_eps;
      for (int k = 0; k < hc; ++k) o[hc + k] = 2.0f * sigmoid(m[hc + k] * sc[1] + bs[hc + k]);
      for (int i = 0; i < hc * hc; ++i) comb[i] = m[2 * hc + i] * sc[2] + bs[2 * hc + i];
      // softmax over each row (last dim), + eps, then column normalisation, then (iters-1) x (row, col)
      for (int j = 0; j < hc; ++j) {
        float mx = comb[j * hc];
        for (int k = 1; k < hc; ++k) mx = std::max(mx, comb[j * hc + k]);
        float sum = 0;
        for (int k = 0; k < hc; ++k) sum += (comb[j * hc + k] = std::exp(comb[j * hc + k] - mx));
        for (int k = 0; k < hc; ++k) comb[j * hc + k] = comb[j * hc + k] / sum + hc_eps;
      }
      auto col_norm = [&] {
        for (int k = 0; k < hc; ++k) {
          float sum = 0;
          for (int j = 0; j < hc; ++j) sum += comb[j * hc + k];
          for (int j = 0; j < hc; ++j) comb[j * hc + k] /= (sum + hc_eps);
        }
      };
      auto row_norm = [&] {
        for (int j = 0; j < hc; ++j) {
          float sum = 0;
          for (int k = 0; k < hc; ++k) sum += comb[j * hc + k];
          for (int k = 0; k < hc; ++k) comb[j * hc + k] /= (sum + hc_eps);
        }
      };
      col_norm();
      for (int it = 0; it + 1 < sinkhorn_iters; ++it) {
        row_norm();
        col_norm();
      }
      std::memcpy(o + 2 * hc, comb.data(), hc * hc * 4);
    }
  });
  return out;
}

Tensor CpuBackend::hc_pre(const Tensor& x, const Tensor& mix, int hc) {
  int64_t s = x.rows(), d = x.row_size() / hc, mw = mix.row_size();
  Tensor y = alloc(TType::kF32, {s, d});
  parallel_for(s, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const float* pre = mix.f32() + r * mw;
      for (int64_t i = 0; i < d; ++i) {
        float acc = 0;
        for (int k = 0; k < hc; ++k) acc += pre[k] * x.f32()[(r * hc + k) * d + i];
        y.f32()[r * d + i] = quant::round_bf16(acc);
      }
    }
  });
  return y;
}

Tensor CpuBackend::hc_post(const Tensor& y, const Tensor& residual, const Tensor& mix, int hc) {
  int64_t s = y.rows(), d = y.row_size(), mw = mix.row_size();
  Tensor out = alloc(TType::kF32, {s, hc * d});
  parallel_for(s, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const float* post = mix.f32() + r * mw + hc;
      const float* comb = mix.f32() + r * mw + 2 * hc;
      const float* res = residual.f32() + r * hc * d;
      for (int k = 0; k < hc; ++k)
        for (int64_t i = 0; i < d; ++i) {
          float acc = 0;
          for (int j = 0; j < hc; ++j) acc += comb[j * hc + k] * res[j * d + i];
          out.f32()[(r * hc + k) * d + i] = quant::round_bf16(post[k] * y.f32()[r * d + i] + acc);
        }
    }
  });
  return out;
}

Tensor CpuBackend::stream_mean(const Tensor& x, int hc) {
  int64_t s = x.rows(), d = x.row_size() / hc;
  Tensor y = alloc(TType::kF32, {s, d});
  for (int64_t r = 0; r < s; ++r)
    for (int64_t i = 0; i < d; ++i) {
      float acc = 0;
      for (int k = 0; k < hc; ++k) acc += x.f32()[(r * hc + k) * d + i];
      y.f32()[r * d + i] = quant::round_bf16(acc / static_cast<float>(hc));
    }
  return y;
}

}  // namespace di
