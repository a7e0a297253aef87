// CPU kernels for swift_fast.kernels (built by setup.py as swift_fast.kernels._native; optional).
//
// Shipped only for the ops where they measurably beat the torch reference on the 2-core CI
// machine (bench/RESULTS.md). Each op reads its inputs once, in their own dtype (fp32, bf16,
// fp16), converting to float32 in registers; torch's OpenMP pool (at::parallel_for) splits the
// work over rows, and every row is reduced by one thread in a fixed order, so results are
// bit-identical run to run and independent of the thread count.
//
// Hot loops are compiled for x86-64-v4 (AVX-512), x86-64-v3 (AVX2+FMA) and baseline, chosen at
// load time (GCC target_clones), so the extension runs on any x86-64 CPU.

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define SWIFT_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define SWIFT_CLONES
#endif

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

inline float bits_to_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t f32_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// ---- element types: load as float32, and round a float32 sum to the type (nearest even) ----

struct F32 {
  using T = float;
  static inline float load(const T* p, int64_t i) { return p[i]; }
  static inline float round(float x) { return x; }
};

struct BF16 {
  using T = uint16_t;
  static inline float load(const T* p, int64_t i) { return bits_to_f32(static_cast<uint32_t>(p[i]) << 16); }
  static inline float round(float x) {
    uint32_t u = f32_to_bits(x);
    uint32_t r = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
    return x != x ? x : bits_to_f32(r);
  }
};

struct F16 {
  using T = uint16_t;
  static inline float load(const T* p, int64_t i) {
    // branch-free half -> float (normal, subnormal, inf/NaN), so the loop vectorises
    const uint32_t h = p[i];
    const uint32_t mag = (h & 0x7FFFu) << 13;
    const uint32_t exp = mag & (0x7C00u << 13);
    const uint32_t normal = mag + ((127u - 15u) << 23);
    const uint32_t special = normal + ((128u - 16u) << 23);
    const float sub = bits_to_f32(mag + (113u << 23)) - bits_to_f32(113u << 23);
    uint32_t out = exp == (0x7C00u << 13) ? special : normal;
    out = exp == 0 ? f32_to_bits(sub) : out;
    return bits_to_f32(out | ((h & 0x8000u) << 16));
  }
  static inline float round(float x) {
    // float32 -> nearest-even float16 -> float32 without branches (c10::Half's conversion
    // branches and stops vectorisation)
    const uint32_t u = f32_to_bits(x);
    const uint32_t sign = u & 0x80000000u;
    const float ax = bits_to_f32(u & 0x7FFFFFFFu);
    // normal halves: drop 13 mantissa bits, nearest even
    const float normal = bits_to_f32(sign | (((u & 0x7FFFFFFFu) + 0xFFFu + ((u >> 13) & 1u)) & 0x7FFFE000u));
    // subnormal halves are multiples of 2^-24, the float32 spacing in [0.5, 1)
    const float sub = bits_to_f32(sign | f32_to_bits((ax + 0.5f) - 0.5f));
    float out = ax < 6.103515625e-05f ? sub : normal;
    out = ax >= 65520.0f ? bits_to_f32(sign | 0x7F800000u) : out;
    return x != x ? x : out;
  }
};

// exp(x) for x <= 0 (or NaN), the only arguments a logsumexp shifted by its max produces:
// Cephes-style polynomial, ~1 ulp, branch-free so the loop vectorises; exp(-inf) = 0 exactly;
// NaN propagates through the arithmetic.
inline float exp_nonpositive(float x) {
  // NOTE: ternaries, not std::fmax: that is a libm call (NaN rules) and stops vectorisation
  const float xc = x < -87.3f ? -87.3f : x;
  // round to nearest with the 1.5 * 2^23 trick (floor would be a libm call too)
  const float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float y = 1.9875691500e-4f;
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * r * r + r + 1.0f;
  const float scale = bits_to_f32(static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23);
  return x < -87.3f ? 0.0f : y * scale;
}

// ---- SWIFT projection: z[t] (+)= scale[t] * sum_d stream[t, d] * w[j, d] ----
//
// scale[t] = 1 without the state norm; with it (NORM), 1 / sqrt(mean_d stream[t, d]^2 + eps),
// the sum of squares taken in the same read of the row as the dot products.

template <class E, bool HAS_RES, int ROWS, bool NORM>
SWIFT_CLONES void project_rows(const typename E::T* h, const typename E::T* r, int64_t sh, int64_t sr,
                               const float* w0, const float* w1, int64_t d, int64_t t0, int64_t t1,
                               float eps, float* z, int64_t sz) {
  for (int64_t t = t0; t < t1; ++t) {
    const typename E::T* hr = h + t * sh;
    const typename E::T* rr = HAS_RES ? r + t * sr : nullptr;
    float a0 = 0.0f, a1 = 0.0f;
    if (NORM) {
      float ss = 0.0f;
#pragma omp simd reduction(+ : a0, a1, ss)
      for (int64_t i = 0; i < d; ++i) {
        float x = E::load(hr, i);
        if (HAS_RES) x = E::round(x + E::load(rr, i));
        a0 += x * w0[i];
        if (ROWS == 2) a1 += x * w1[i];
        ss += x * x;
      }
      // NOTE: eps = 0 and an all-zero row give 0 * inf = NaN, as the RMSNorm itself would
      const float s = 1.0f / std::sqrt(ss / static_cast<float>(d) + eps);
      a0 *= s;
      a1 *= s;
    } else {
      // the loop of heads without state norm, kept apart so its sums stay exactly as before
#pragma omp simd reduction(+ : a0, a1)
      for (int64_t i = 0; i < d; ++i) {
        float x = E::load(hr, i);
        if (HAS_RES) x = E::round(x + E::load(rr, i));
        a0 += x * w0[i];
        if (ROWS == 2) a1 += x * w1[i];
      }
    }
    z[t * sz] += a0;
    if (ROWS == 2) z[t * sz + 1] += a1;
  }
}

template <class E, bool NORM>
void project_layer_typed(const at::Tensor& h, const c10::optional<at::Tensor>& r, const float* w, int64_t sw,
                         int rows, float eps, at::Tensor& z) {
  const int64_t t = h.size(0), d = h.size(1);
  const auto* hp = reinterpret_cast<const typename E::T*>(h.data_ptr());
  const bool has_res = r.has_value();
  const auto* rp = has_res ? reinterpret_cast<const typename E::T*>(r->data_ptr()) : hp;
  const int64_t sh = h.stride(0), sr = has_res ? r->stride(0) : 0, sz = z.stride(0);
  float* zp = z.data_ptr<float>();
  const float* w1 = rows == 2 ? w + sw : w;
  // rows are independent: any split over threads gives the same bits
  at::parallel_for(0, t, std::max<int64_t>(1, 16384 / std::max<int64_t>(d, 1)), [&](int64_t a, int64_t b) {
    if (has_res && rows == 2) project_rows<E, true, 2, NORM>(hp, rp, sh, sr, w, w1, d, a, b, eps, zp, sz);
    else if (has_res) project_rows<E, true, 1, NORM>(hp, rp, sh, sr, w, w1, d, a, b, eps, zp, sz);
    else if (rows == 2) project_rows<E, false, 2, NORM>(hp, rp, sh, sr, w, w1, d, a, b, eps, zp, sz);
    else project_rows<E, false, 1, NORM>(hp, rp, sh, sr, w, w1, d, a, b, eps, zp, sz);
  });
}

template <class E>
void project_layer_eps(const at::Tensor& h, const c10::optional<at::Tensor>& r, const float* w, int64_t sw,
                       int rows, double norm_eps, at::Tensor& z) {
  if (norm_eps < 0) project_layer_typed<E, false>(h, r, w, sw, rows, 0.0f, z);
  else project_layer_typed<E, true>(h, r, w, sw, rows, static_cast<float>(norm_eps), z);
}

void check_rows(const at::Tensor& x, const char* what) {
  TORCH_CHECK(x.device().is_cpu(), what, " must be a CPU tensor");
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1, what, " must be 2-D with unit column stride");
}

// norm_eps < 0: no state norm (heads without one); else each row's partial is scaled by
// 1 / sqrt(mean(stream^2) + norm_eps)
void project_layer_into(at::Tensor& z, const at::Tensor& h, const c10::optional<at::Tensor>& r,
                        const at::Tensor& w, int64_t col0, double norm_eps) {
  check_rows(h, "hidden");
  if (r.has_value()) {
    check_rows(*r, "residual");
    TORCH_CHECK(r->scalar_type() == h.scalar_type(), "hidden and residual must share a dtype");
  }
  TORCH_CHECK(w.scalar_type() == at::kFloat && w.is_contiguous(), "weight must be contiguous float32");
  const int rows = static_cast<int>(w.size(0));
  const float* wp = w.data_ptr<float>() + col0;
  switch (h.scalar_type()) {
    case at::kFloat: project_layer_eps<F32>(h, r, wp, w.stride(0), rows, norm_eps, z); break;
    case at::kBFloat16: project_layer_eps<BF16>(h, r, wp, w.stride(0), rows, norm_eps, z); break;
    case at::kHalf: project_layer_eps<F16>(h, r, wp, w.stride(0), rows, norm_eps, z); break;
    default: TORCH_CHECK(false, "hidden states must be float32, bfloat16 or float16, got ", h.scalar_type());
  }
}

// project_layer_(acc, hidden, residual, weight_l, norm_eps): acc[:T, :rows] += scale * stream @ weight_l^T
void project_layer(at::Tensor acc, const at::Tensor& hidden, const c10::optional<at::Tensor>& residual,
                   const at::Tensor& weight_l, double norm_eps) {
  TORCH_CHECK(acc.scalar_type() == at::kFloat && acc.stride(1) == 1, "acc must be float32 with unit column stride");
  at::Tensor w = weight_l.to(at::kFloat).contiguous();
  project_layer_into(acc, hidden, residual, w, 0, norm_eps);
}

// deterministic per-segment sums, in double, in token order
std::vector<at::Tensor> gated_segment_sums(const at::Tensor& z, const at::Tensor& bias, const at::Tensor& cu) {
  const int64_t b = cu.numel() - 1;
  const int rows = static_cast<int>(bias.numel());
  auto opts = at::TensorOptions().dtype(at::kFloat);
  at::Tensor score = at::empty({b}, opts), gsum = at::empty({b}, opts), wsum = at::empty({b}, opts);
  const float* zp = z.data_ptr<float>();
  const float* bp = bias.data_ptr<float>();
  const int64_t* cp = cu.data_ptr<int64_t>();
  float *sp = score.data_ptr<float>(), *gp = gsum.data_ptr<float>(), *wp = wsum.data_ptr<float>();
  at::parallel_for(0, b, 1, [&](int64_t s0, int64_t s1) {
    for (int64_t s = s0; s < s1; ++s) {
      double g_acc = 0.0, w_acc = 0.0;
      for (int64_t t = cp[s]; t < cp[s + 1]; ++t) {
        const float z0 = zp[t * 2] + bp[0];
        float g = 1.0f, r = z0;
        if (rows == 2) {
          g = 1.0f / (1.0f + std::exp(-z0));
          r = zp[t * 2 + 1] + bp[1];
        }
        g_acc += g;
        w_acc += static_cast<double>(g) * r;
      }
      gp[s] = static_cast<float>(g_acc);
      wp[s] = static_cast<float>(w_acc);
      const float den = gp[s] < 1e-8f ? 1e-8f : gp[s];  // NaN stays NaN
      sp[s] = wp[s] / den;
    }
  });
  return {score, gsum, wsum};
}

std::vector<at::Tensor> swift_reduce(const std::vector<at::Tensor>& hs, const std::vector<c10::optional<at::Tensor>>& rs,
                                     const at::Tensor& weight, const at::Tensor& bias, const at::Tensor& cu_seqlens,
                                     double norm_eps) {
  TORCH_CHECK(!hs.empty() && hs.size() == rs.size(), "one residual (or None) per layer");
  const int64_t t = hs[0].size(0), d = hs[0].size(1);
  at::Tensor w = weight.to(at::kFloat).contiguous();
  at::Tensor z = at::zeros({t, 2}, at::TensorOptions().dtype(at::kFloat));
  for (size_t l = 0; l < hs.size(); ++l) project_layer_into(z, hs[l], rs[l], w, static_cast<int64_t>(l) * d, norm_eps);
  at::Tensor cu = cu_seqlens.to(at::kLong).contiguous();
  return gated_segment_sums(z, bias.to(at::kFloat).contiguous(), cu);
}

// ---- log-probs: per row, max pass then sum pass (the row stays in L2 between them) ----

struct RowLse {
  float m, s, c;  // logsumexp = m + log1p(s + c - 1): s excludes the terms equal to the max
};

template <class E, bool SCALE>
SWIFT_CLONES RowLse row_lse(const typename E::T* x, int64_t v, float inv_temp) {
  // pass 1: the max (a NaN is skipped here and poisons the sum in pass 2)
  float m = -kInf;
#pragma omp simd reduction(max : m)
  for (int64_t i = 0; i < v; ++i) {
    const float xi = SCALE ? E::load(x, i) * inv_temp : E::load(x, i);
    m = xi > m ? xi : m;
  }
  const float shift = m == -kInf ? 0.0f : m;
  // pass 2 (the row is still in L2): the sum of exp(x - m) without the max's own term
  float s = 0.0f, c = 0.0f;
#pragma omp simd reduction(+ : s, c)
  for (int64_t i = 0; i < v; ++i) {
    const float xi = SCALE ? E::load(x, i) * inv_temp : E::load(x, i);
    const bool top = xi == m;
    s += top ? 0.0f : exp_nonpositive(xi - shift);
    c += top ? 1.0f : 0.0f;
  }
  return {m, s, c};
}

template <class E>
float row_logprob(const typename E::T* x, int64_t v, int64_t target, float inv_temp) {
  if (target < 0 || target >= v) return kNaN;
  const RowLse r = inv_temp == 1.0f ? row_lse<E, false>(x, v, inv_temp) : row_lse<E, true>(x, v, inv_temp);
  // max subtracted before the log, and log1p: near-certain tokens keep their precision
  return (E::load(x, target) * inv_temp - r.m) - std::log1p(r.s + (r.c - 1.0f));
}

template <class E>
void logprobs_typed(const at::Tensor& logits, const at::Tensor& targets, float inv_temp, float* out,
                    int64_t r0, int64_t r1) {
  const auto* xp = reinterpret_cast<const typename E::T*>(logits.data_ptr());
  const int64_t v = logits.size(1), sx = logits.stride(0);
  const int64_t* tp = targets.data_ptr<int64_t>();
  at::parallel_for(r0, r1, 1, [&](int64_t a, int64_t b) {
    for (int64_t t = a; t < b; ++t) out[t] = row_logprob<E>(xp + t * sx, v, tp[t], inv_temp);
  });
}

void logprobs_rows(const at::Tensor& logits, const at::Tensor& targets, double temperature, float* out, int64_t r0,
                   int64_t r1) {
  check_rows(logits, "logits");
  TORCH_CHECK(targets.scalar_type() == at::kLong && targets.is_contiguous(), "targets must be contiguous int64");
  const float inv_temp = static_cast<float>(1.0 / temperature);
  switch (logits.scalar_type()) {
    case at::kFloat: logprobs_typed<F32>(logits, targets, inv_temp, out, r0, r1); break;
    case at::kBFloat16: logprobs_typed<BF16>(logits, targets, inv_temp, out, r0, r1); break;
    case at::kHalf: logprobs_typed<F16>(logits, targets, inv_temp, out, r0, r1); break;
    default: TORCH_CHECK(false, "logits must be float32, bfloat16 or float16, got ", logits.scalar_type());
  }
}

at::Tensor token_logprobs(const at::Tensor& logits, const at::Tensor& targets, double temperature) {
  at::Tensor out = at::empty({logits.size(0)}, at::TensorOptions().dtype(at::kFloat));
  logprobs_rows(logits, targets, temperature, out.data_ptr<float>(), 0, logits.size(0));
  return out;
}

at::Tensor sar_from_logits(const at::Tensor& xq, const at::Tensor& x0, const at::Tensor& targets,
                           const at::Tensor& cu_seqlens, double temperature) {
  const int64_t t = xq.size(0);
  at::Tensor cu = cu_seqlens.to(at::kLong).contiguous();
  const int64_t* cp = cu.data_ptr<int64_t>();
  const int64_t b = cu.numel() - 1;
  at::Tensor lp = at::zeros({2, t}, at::TensorOptions().dtype(at::kFloat));
  float* lq = lp.data_ptr<float>();
  float* l0 = lq + t;
  if (b > 0 && cp[b] > cp[0]) {  // rows outside the answers are never read
    logprobs_rows(xq, targets, temperature, lq, cp[0], cp[b]);
    logprobs_rows(x0, targets, temperature, l0, cp[0], cp[b]);
  }
  at::Tensor out = at::empty({b}, at::TensorOptions().dtype(at::kFloat));
  float* op = out.data_ptr<float>();
  for (int64_t s = 0; s < b; ++s) {
    double sq = 0.0, s0 = 0.0;
    for (int64_t j = cp[s]; j < cp[s + 1]; ++j) {
      sq += lq[j];
      s0 += l0[j];
    }
    const double n = static_cast<double>(std::max<int64_t>(cp[s + 1] - cp[s], 1));
    const double r = -std::expm1(s0 / n - sq / n);
    op[s] = static_cast<float>(r > 1.0 ? 1.0 : (r < -1.0 ? -1.0 : r));  // NaN stays NaN
  }
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "swift_fast CPU kernels (see swift_fast/kernels/csrc/native.cpp)";
  // norm_eps < 0 (the default): no state norm
  m.def("project_layer", &project_layer, "acc[:T, :rows] += scale * stream @ weight_l^T, in place",
        py::arg("acc"), py::arg("hidden"), py::arg("residual"), py::arg("weight_l"), py::arg("norm_eps") = -1.0);
  m.def("swift_reduce", &swift_reduce, "SWIFT projection (each state scaled by its rms with norm_eps >= 0), gate "
        "and per-segment sums", py::arg("hidden"), py::arg("residual"), py::arg("weight"), py::arg("bias"),
        py::arg("cu_seqlens"), py::arg("norm_eps") = -1.0);
  m.def("token_logprobs", &token_logprobs, "per-token log-probs, one read of the logits");
  m.def("sar_from_logits", &sar_from_logits, "self-aligned reward from both passes' logits");
}
