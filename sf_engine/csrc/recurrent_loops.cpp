// The per-step loops of sf_engine/recurrent.py's GRU and LSTM, compiled, for CPU float32/float64.
//
// Same maths, layouts and weight copies as the Python loops there (see its docstring): sigmoid rows
// come halved, so a sigmoid is 0.5 + 0.5 tanh(a). Each step is one matrix product and one or two
// fused element-wise passes over raw pointers; the backward passes also compute the recursion's
// factors inline. keep: [T, B] (0 where the state is zeroed before the step) or None.
//
// - Matrix products, with no operator dispatch per step: float32 through torch's brgemm (oneDNN's
//   small-matrix kernel, JIT-compiled for the CPU; torch falls back to its BLAS where oneDNN cannot):
//   the forward loop of a GRU minibatch of 32 x 32 steps, 64 units, takes 0.19 ms with it here and
//   0.47 ms with MKL's sgemm, which runs its AVX2 kernels on this AMD CPU; float64 (and
//   torch builds without brgemm) through the BLAS torch itself calls (sgemm_/dgemm_, which the CPU
//   builds of torch export) when setup.py finds it (SF_DIRECT_BLAS), at::mm otherwise.
// - tanh: with SF_VECTOR_TANH (setup.py sets it on x86-64 with glibc >= 2.35, and links libmvec)
//   and GCC, the passes call glibc's vector tanh (libmvec, within 4 ulp), and every pass is built for
//   AVX-512, AVX2 and SSE and picked for the CPU at load time (target_clones); otherwise tanh is
//   scalar, and `vector_tanh()` says so (the Python side then runs its torch loops instead: a scalar
//   tanh per gate value costs more than the compiled loops save).
// - Every op checks the shapes and devices of its arguments: the loops read raw memory.
#include <ATen/ATen.h>
#include <torch/library.h>
#include <ATen/native/CPUBlas.h>

#include <cmath>
#include <cstdint>
#include <tuple>
#include <type_traits>
#include <vector>

#if SF_VECTOR_TANH && defined(__GNUC__) && !defined(__clang__)
extern "C" {
__attribute__((simd("notinbranch"))) float tanhf(float) noexcept;
__attribute__((simd("notinbranch"))) double tanh(double) noexcept;
}
#define SF_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#define SF_VECTORIZED 1
#else
#define SF_CLONES
#define SF_VECTORIZED 0
#endif

#if SF_DIRECT_BLAS
extern "C" {
void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k, const float* alpha,
            const float* a, const int* lda, const float* b, const int* ldb, const float* beta, float* c,
            const int* ldc);
void dgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k, const double* alpha,
            const double* a, const int* lda, const double* b, const int* ldb, const double* beta, double* c,
            const int* ldc);
}
#endif

namespace {

using at::Tensor;
using i64 = int64_t;

inline float tanh_of(float v) { return tanhf(v); }
inline double tanh_of(double v) { return tanh(v); }

// Row-major c [m, n] (row stride ldc) = a [m, k] (lda) @ b [k, n] (ldb), added to c if `add`.
template <typename T>
void matmul(i64 m, i64 n, i64 k, const T* a, i64 lda, const T* b, i64 ldb, bool add, T* c, i64 ldc) {
#ifdef CPUBLAS_BRGEMM_F32F32F32
  if constexpr (std::is_same_v<T, float>) {
    at::native::cpublas::brgemm(m, n, k, lda, ldb, ldc, add, a, b, c, false);
    return;
  }
#endif
#if SF_DIRECT_BLAS
  // column-major BLAS: c^T = b^T a^T
  const int mi = int(m), ni = int(n), ki = int(k), la = int(lda), lb = int(ldb), lc = int(ldc);
  const T one = 1, beta = add ? 1 : 0;
  if constexpr (std::is_same_v<T, float>)
    sgemm_("N", "N", &ni, &mi, &ki, &one, b, &lb, a, &la, &beta, c, &lc);
  else
    dgemm_("N", "N", &ni, &mi, &ki, &one, b, &lb, a, &la, &beta, c, &lc);
#else
  auto options = at::TensorOptions().dtype(c10::CppTypeToScalarType<T>::value);
  Tensor ta = at::from_blob(const_cast<T*>(a), {m, k}, {lda, 1}, options);
  Tensor tb = at::from_blob(const_cast<T*>(b), {k, n}, {ldb, 1}, options);
  Tensor tc = at::from_blob(c, {m, n}, {ldc, 1}, options);
  if (add)
    tc.add_(at::mm(ta, tb));
  else
    at::mm_out(tc, ta, tb);
#endif
}

// The element-wise passes of one step, per row b of the batch; B rows, H units. Written once as
// templates, compiled per ISA through the SF_CLONES wrappers below.
template <typename T>
inline __attribute__((always_inline)) void gru_forward_pass(
    i64 batch, i64 size, const T* __restrict__ gi, const T* __restrict__ b_hh, T* __restrict__ gh,
    const T* __restrict__ h, T* __restrict__ rz, T* __restrict__ n, T* __restrict__ out) {
  for (i64 b = 0; b < batch; ++b) {
    const T* gi_b = gi + b * 3 * size;
    T* gh_b = gh + b * 3 * size;
    T* rz_b = rz + b * 2 * size;
    for (i64 j = 0; j < 2 * size; ++j)  // r, z
      rz_b[j] = T(0.5) + T(0.5) * tanh_of(gi_b[j] + gh_b[j] + b_hh[j]);
    for (i64 j = 0; j < size; ++j) {  // n, then h' = n + z (h - n)
      const T ghn = gh_b[2 * size + j] + b_hh[2 * size + j];
      gh_b[2 * size + j] = ghn;
      const T nv = tanh_of(gi_b[2 * size + j] + rz_b[j] * ghn);
      n[b * size + j] = nv;
      out[b * size + j] = nv + rz_b[size + j] * (h[b * size + j] - nv);
    }
  }
}

template <typename T>
inline __attribute__((always_inline)) void gru_backward_pass(
    i64 batch, i64 size, const T* __restrict__ grad, const T* __restrict__ hp, const T* __restrict__ keep,
    const T* __restrict__ gh, const T* __restrict__ rz, const T* __restrict__ n, T* __restrict__ d,
    T* __restrict__ dh) {
  for (i64 b = 0; b < batch; ++b) {
    const T kb = keep ? keep[b] : T(1);
    const T* rz_b = rz + b * 2 * size;
    const T* ghn_b = gh + b * 3 * size + 2 * size;
    T* d_b = d + b * 4 * size;
    for (i64 j = 0; j < size; ++j) {
      const i64 i = b * size + j;
      const T dv = dh[i] + grad[i];
      const T r = rz_b[j], z = rz_b[size + j], nv = n[i];
      const T d_an = dv * (1 - nv * nv) * (1 - z);
      d_b[2 * size + j] = dv * (hp[i] * kb - nv) * z * (1 - z);  // d a_z
      d_b[3 * size + j] = d_an;                                   // d a_n
      d_b[j] = d_an * r;                                          // d gh_n
      d_b[size + j] = d_an * (r - r * r) * ghn_b[j];              // d a_r
      dh[i] = dv * z;  // the matrix product adds d gh w_hh
    }
  }
}

template <typename T>
inline __attribute__((always_inline)) void lstm_forward_pass(
    i64 batch, i64 size, const T* __restrict__ gi, T* __restrict__ gates, const T* __restrict__ c_prev,
    i64 c_stride, T* __restrict__ out, T* __restrict__ tanh_c) {
  for (i64 b = 0; b < batch; ++b) {
    const T* gi_b = gi + b * 4 * size;
    T* g = gates + b * 4 * size;
    for (i64 j = 0; j < 3 * size; ++j) g[j] = T(0.5) + T(0.5) * tanh_of(gi_b[j] + g[j]);  // i, f, o
    for (i64 j = 0; j < size; ++j) {
      const T gg = tanh_of(gi_b[3 * size + j] + g[3 * size + j]);
      g[3 * size + j] = gg;
      const T c = g[j] * gg + g[size + j] * c_prev[b * c_stride + j];  // c' = i g + f c
      const T tc = tanh_of(c);
      out[b * 2 * size + size + j] = c;
      tanh_c[b * size + j] = tc;
      out[b * 2 * size + j] = g[2 * size + j] * tc;  // h' = o tanh(c')
    }
  }
}

template <typename T>
inline __attribute__((always_inline)) void lstm_backward_pass(
    i64 batch, i64 size, const T* __restrict__ grad, const T* __restrict__ c_prev, const T* __restrict__ keep,
    const T* __restrict__ gates, const T* __restrict__ tanh_c, T* __restrict__ d, T* __restrict__ dh,
    T* __restrict__ dc) {
  for (i64 b = 0; b < batch; ++b) {
    const T kb = keep ? keep[b] : T(1);
    const T* a = gates + b * 4 * size;
    T* d_b = d + b * 4 * size;
    for (i64 j = 0; j < size; ++j) {
      const i64 i = b * size + j;
      const T ig = a[j], fg = a[size + j], og = a[2 * size + j], gg = a[3 * size + j], tc = tanh_c[i];
      const T h = dh[i] + grad[b * 2 * size + j];
      const T c = dc[i] + grad[b * 2 * size + size + j] + h * og * (1 - tc * tc);
      d_b[j] = c * gg * (ig - ig * ig);                                  // d a_i
      d_b[size + j] = c * c_prev[b * 2 * size + size + j] * kb * (fg - fg * fg);  // d a_f
      d_b[2 * size + j] = c * ig * (1 - gg * gg);                       // d a_g
      d_b[3 * size + j] = h * tc * (og - og * og);                      // d a_o
      dc[i] = c * fg * kb;
    }
  }
}

template <typename T>
inline __attribute__((always_inline)) void scale_rows_pass(i64 batch, i64 width, i64 stride, const T* src,
                                                           const T* keep, T* dst, i64 dst_stride) {  // may be in place
  for (i64 b = 0; b < batch; ++b)
    for (i64 j = 0; j < width; ++j) dst[b * dst_stride + j] = src[b * stride + j] * keep[b];
}

#define SF_INSTANTIATE(T)                                                                                           \
  SF_CLONES void gru_forward_step(i64 batch, i64 size, const T* gi, const T* b_hh, T* gh, const T* h, T* rz, T* n, \
                                  T* out) {                                                                         \
    gru_forward_pass<T>(batch, size, gi, b_hh, gh, h, rz, n, out);                                                  \
  }                                                                                                                 \
  SF_CLONES void gru_backward_step(i64 batch, i64 size, const T* grad, const T* hp, const T* keep, const T* gh,    \
                                   const T* rz, const T* n, T* d, T* dh) {                                          \
    gru_backward_pass<T>(batch, size, grad, hp, keep, gh, rz, n, d, dh);                                            \
  }                                                                                                                 \
  SF_CLONES void lstm_forward_step(i64 batch, i64 size, const T* gi, T* gates, const T* c_prev, i64 c_stride,      \
                                   T* out, T* tanh_c) {                                                             \
    lstm_forward_pass<T>(batch, size, gi, gates, c_prev, c_stride, out, tanh_c);                                    \
  }                                                                                                                 \
  SF_CLONES void lstm_backward_step(i64 batch, i64 size, const T* grad, const T* c_prev, const T* keep,            \
                                    const T* gates, const T* tanh_c, T* d, T* dh, T* dc) {                          \
    lstm_backward_pass<T>(batch, size, grad, c_prev, keep, gates, tanh_c, d, dh, dc);                               \
  }                                                                                                                 \
  SF_CLONES void scale_rows(i64 batch, i64 width, i64 stride, const T* src, const T* keep, T* dst, i64 dst_stride) { \
    scale_rows_pass<T>(batch, width, stride, src, keep, dst, dst_stride);                                           \
  }

SF_INSTANTIATE(float)
SF_INSTANTIATE(double)

bool vector_tanh() { return SF_VECTORIZED; }

// Bumped with every change of the ops' signatures or outputs: recurrent.py loads only this one.
int64_t version() { return 2; }

// Per step: the keep row if some state is zeroed before it, else nullptr.
template <typename T>
std::vector<const T*> reset_rows(const Tensor& keep, i64 steps, i64 batch) {
  std::vector<const T*> rows(steps, nullptr);
  if (!keep.defined()) return rows;
  const T* k = keep.data_ptr<T>();
  for (i64 t = 0; t < steps; ++t)
    for (i64 b = 0; b < batch; ++b)
      if (k[t * batch + b] == T(0)) {
        rows[t] = k + t * batch;
        break;
      }
  return rows;
}


void check_cpu(const Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be a CPU tensor");
  TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble, name, " must be float32 or float64");
}

// A CPU tensor of exactly this shape (the loops read raw memory).
void check_shape(const Tensor& t, const char* name, c10::IntArrayRef shape) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be a CPU tensor");
  TORCH_CHECK(t.sizes() == shape, name, " must have shape ", shape, ", not ", t.sizes());
}

// keep [T, B] in `like`'s dtype, contiguous; undefined for None.
Tensor keep_of(const c10::optional<Tensor>& keep, const Tensor& like, i64 steps, i64 batch) {
  if (!keep.has_value() || !keep->defined()) return Tensor();
  check_shape(*keep, "keep", {steps, batch});
  return keep->to(like.scalar_type()).contiguous();
}

Tensor like(const Tensor& t, const Tensor& reference) { return t.contiguous().to(reference.scalar_type()); }

// gi [T, B, 3H]: x w_ih^T + b_ih (r, z rows halved); h0 [B, H]; w_hh_t [H, 3H], b_hh [3H] (halved
// likewise). Returns out [T, B, H], gh [T, B, 3H] (h w_hh^T; b_hh added to its n part only, the only
// part the backward pass reads: the Python loops' gh also has it in the r and z parts), rz [T, B, 2H]
// (sigmoids), n [T, B, H].
std::tuple<Tensor, Tensor, Tensor, Tensor> gru_forward(const Tensor& gi_in, const Tensor& h0_in,
                                                       const c10::optional<Tensor>& keep_in,
                                                       const Tensor& w_hh_t_in, const Tensor& b_hh_in) {
  check_cpu(gi_in, "gi");
  at::NoGradGuard no_grad;
  const Tensor gi = gi_in.contiguous(), h0 = like(h0_in, gi), w_hh_t = like(w_hh_t_in, gi), b_hh = like(b_hh_in, gi);
  TORCH_CHECK(gi.dim() == 3 && gi.size(2) % 3 == 0, "gi must be [T, B, 3H]");
  const i64 steps = gi.size(0), batch = gi.size(1), size = gi.size(2) / 3;
  check_shape(h0, "h0", {batch, size});
  check_shape(w_hh_t, "w_hh_t", {size, 3 * size});
  check_shape(b_hh, "b_hh", {3 * size});
  const Tensor keep = keep_of(keep_in, gi, steps, batch);
  Tensor out = at::empty({steps, batch, size}, gi.options()), gh = at::empty({steps, batch, 3 * size}, gi.options());
  Tensor rz = at::empty({steps, batch, 2 * size}, gi.options()), n = at::empty({steps, batch, size}, gi.options());
  Tensor reset_state = at::empty({batch, size}, gi.options());
  AT_DISPATCH_FLOATING_TYPES(gi.scalar_type(), "gru_forward", [&] {
    using T = scalar_t;
    const auto resets = reset_rows<T>(keep, steps, batch);
    const T* h = h0.data_ptr<T>();
    for (i64 t = 0; t < steps; ++t) {
      if (resets[t]) {
        scale_rows(batch, size, size, h, resets[t], reset_state.data_ptr<T>(), size);
        h = reset_state.data_ptr<T>();
      }
      T* gh_t = gh.data_ptr<T>() + t * batch * 3 * size;
      T* out_t = out.data_ptr<T>() + t * batch * size;
      matmul<T>(batch, 3 * size, size, h, size, w_hh_t.data_ptr<T>(), 3 * size, false, gh_t, 3 * size);
      gru_forward_step(batch, size, gi.data_ptr<T>() + t * batch * 3 * size, b_hh.data_ptr<T>(), gh_t, h,
                       rz.data_ptr<T>() + t * batch * 2 * size, n.data_ptr<T>() + t * batch * size, out_t);
      h = out_t;
    }
  });
  return {out, gh, rz, n};
}

// grad_out [T, B, H]; h0, keep, out, gh, rz, n as gru_forward took and gave them; w_nrz [3H, H]:
// w_hh's rows in (n, r, z) order. Returns d_all [T, B, 4H] = [d gh_n | d a_r | d a_z | d a_n] (so
// [..., :3H] is d gh in (n, r, z) order and [..., H:] is d gi in (r, z, n) order) and d h0 [B, H].
std::tuple<Tensor, Tensor> gru_backward(const Tensor& grad_in, const Tensor& h0_in,
                                        const c10::optional<Tensor>& keep_in,
                                        const Tensor& out_in, const Tensor& gh_in, const Tensor& rz_in,
                                        const Tensor& n_in, const Tensor& w_nrz_in) {
  check_cpu(out_in, "out");
  at::NoGradGuard no_grad;
  const Tensor out = out_in.contiguous(), gh = like(gh_in, out), rz = like(rz_in, out), n = like(n_in, out);
  const Tensor grad = like(grad_in, out), h0 = like(h0_in, out), w_nrz = like(w_nrz_in, out);
  TORCH_CHECK(out.dim() == 3, "out must be [T, B, H]");
  const i64 steps = out.size(0), batch = out.size(1), size = out.size(2);
  check_shape(grad, "grad_out", {steps, batch, size});
  check_shape(h0, "h0", {batch, size});
  check_shape(gh, "gh", {steps, batch, 3 * size});
  check_shape(rz, "rz", {steps, batch, 2 * size});
  check_shape(n, "n", {steps, batch, size});
  check_shape(w_nrz, "w_nrz", {3 * size, size});
  const Tensor keep = keep_of(keep_in, out, steps, batch);
  Tensor d_all = at::empty({steps, batch, 4 * size}, out.options());
  Tensor dh = at::zeros({batch, size}, out.options());
  AT_DISPATCH_FLOATING_TYPES(out.scalar_type(), "gru_backward", [&] {
    using T = scalar_t;
    const auto resets = reset_rows<T>(keep, steps, batch);
    T* dh_p = dh.data_ptr<T>();
    for (i64 t = steps - 1; t >= 0; --t) {
      const T* hp = t > 0 ? out.data_ptr<T>() + (t - 1) * batch * size : h0.data_ptr<T>();
      T* d_t = d_all.data_ptr<T>() + t * batch * 4 * size;
      gru_backward_step(batch, size, grad.data_ptr<T>() + t * batch * size, hp, resets[t],
                        gh.data_ptr<T>() + t * batch * 3 * size, rz.data_ptr<T>() + t * batch * 2 * size,
                        n.data_ptr<T>() + t * batch * size, d_t, dh_p);
      matmul<T>(batch, size, 3 * size, d_t, 4 * size, w_nrz.data_ptr<T>(), size, true, dh_p, size);
      if (resets[t]) scale_rows(batch, size, size, dh_p, resets[t], dh_p, size);
    }
  });
  return {d_all, dh};
}

// gi [T, B, 4H]: x w_ih^T + b_ih + b_hh in (i, f, o, g) row order, sigmoid rows halved; s0 [B, 2H]
// (h, c); w_hh_t [H, 4H] likewise. Returns out [T, B, 2H] (h, c), gates [T, B, 4H] (activated, in
// (i, f, o, g) order), tanh_c [T, B, H].
std::tuple<Tensor, Tensor, Tensor> lstm_forward(const Tensor& gi_in, const Tensor& s0_in,
                                                const c10::optional<Tensor>& keep_in, const Tensor& w_hh_t_in) {
  check_cpu(gi_in, "gi");
  at::NoGradGuard no_grad;
  const Tensor gi = gi_in.contiguous(), s0 = like(s0_in, gi), w_hh_t = like(w_hh_t_in, gi);
  TORCH_CHECK(gi.dim() == 3 && gi.size(2) % 4 == 0, "gi must be [T, B, 4H]");
  const i64 steps = gi.size(0), batch = gi.size(1), size = gi.size(2) / 4;
  check_shape(s0, "s0", {batch, 2 * size});
  check_shape(w_hh_t, "w_hh_t", {size, 4 * size});
  const Tensor keep = keep_of(keep_in, gi, steps, batch);
  Tensor out = at::empty({steps, batch, 2 * size}, gi.options());
  Tensor gates = at::empty({steps, batch, 4 * size}, gi.options());
  Tensor tanh_c = at::empty({steps, batch, size}, gi.options());
  Tensor reset_state = at::empty({batch, 2 * size}, gi.options());
  AT_DISPATCH_FLOATING_TYPES(gi.scalar_type(), "lstm_forward", [&] {
    using T = scalar_t;
    const auto resets = reset_rows<T>(keep, steps, batch);
    const T* state = s0.data_ptr<T>();  // [B, 2H]: h then c
    for (i64 t = 0; t < steps; ++t) {
      if (resets[t]) {
        scale_rows(batch, 2 * size, 2 * size, state, resets[t], reset_state.data_ptr<T>(), 2 * size);
        state = reset_state.data_ptr<T>();
      }
      T* gates_t = gates.data_ptr<T>() + t * batch * 4 * size;
      T* out_t = out.data_ptr<T>() + t * batch * 2 * size;
      matmul<T>(batch, 4 * size, size, state, 2 * size, w_hh_t.data_ptr<T>(), 4 * size, false, gates_t, 4 * size);
      lstm_forward_step(batch, size, gi.data_ptr<T>() + t * batch * 4 * size, gates_t, state + size, 2 * size, out_t,
                        tanh_c.data_ptr<T>() + t * batch * size);
      state = out_t;
    }
  });
  return {out, gates, tanh_c};
}

// grad_out [T, B, 2H]; s0, keep, out, gates, tanh_c as lstm_forward took and gave them; w_hh [4H, H]
// in nn.LSTM's (i, f, g, o) row order. Returns d_all [T, B, 4H] (d of the pre-activations in
// (i, f, g, o) order) and d s0 [B, 2H].
std::tuple<Tensor, Tensor> lstm_backward(const Tensor& grad_in, const Tensor& s0_in,
                                         const c10::optional<Tensor>& keep_in,
                                         const Tensor& out_in, const Tensor& gates_in, const Tensor& tanh_c_in,
                                         const Tensor& w_hh_in) {
  check_cpu(out_in, "out");
  at::NoGradGuard no_grad;
  const Tensor out = out_in.contiguous(), gates = like(gates_in, out), tanh_c = like(tanh_c_in, out);
  const Tensor grad = like(grad_in, out), s0 = like(s0_in, out), w_hh = like(w_hh_in, out);
  TORCH_CHECK(out.dim() == 3 && out.size(2) % 2 == 0, "out must be [T, B, 2H]");
  const i64 steps = out.size(0), batch = out.size(1), size = out.size(2) / 2;
  check_shape(grad, "grad_out", {steps, batch, 2 * size});
  check_shape(s0, "s0", {batch, 2 * size});
  check_shape(gates, "gates", {steps, batch, 4 * size});
  check_shape(tanh_c, "tanh_c", {steps, batch, size});
  check_shape(w_hh, "w_hh", {4 * size, size});
  const Tensor keep = keep_of(keep_in, out, steps, batch);
  Tensor d_all = at::empty({steps, batch, 4 * size}, out.options());
  Tensor dh = at::zeros({batch, size}, out.options()), dc = at::zeros({batch, size}, out.options());
  AT_DISPATCH_FLOATING_TYPES(out.scalar_type(), "lstm_backward", [&] {
    using T = scalar_t;
    const auto resets = reset_rows<T>(keep, steps, batch);
    T* dh_p = dh.data_ptr<T>();
    for (i64 t = steps - 1; t >= 0; --t) {
      const T* sp = t > 0 ? out.data_ptr<T>() + (t - 1) * batch * 2 * size : s0.data_ptr<T>();
      T* d_t = d_all.data_ptr<T>() + t * batch * 4 * size;
      lstm_backward_step(batch, size, grad.data_ptr<T>() + t * batch * 2 * size, sp, resets[t],
                         gates.data_ptr<T>() + t * batch * 4 * size, tanh_c.data_ptr<T>() + t * batch * size, d_t, dh_p,
                         dc.data_ptr<T>());
      matmul<T>(batch, size, 4 * size, d_t, 4 * size, w_hh.data_ptr<T>(), size, false, dh_p, size);
      if (resets[t]) scale_rows(batch, size, size, dh_p, resets[t], dh_p, size);
    }
  });
  return {d_all, at::cat({dh, dc}, 1)};
}

}  // namespace

TORCH_LIBRARY(sf_engine_recurrent, m) {
  m.def("vector_tanh() -> bool", vector_tanh);
  m.def("version() -> int", version);
  m.def("gru_forward(Tensor gi, Tensor h0, Tensor? keep, Tensor w_hh_t, Tensor b_hh) -> "
        "(Tensor, Tensor, Tensor, Tensor)");
  m.def("gru_backward(Tensor grad_out, Tensor h0, Tensor? keep, Tensor out, Tensor gh, Tensor rz, Tensor n, "
        "Tensor w_nrz) -> (Tensor, Tensor)");
  m.def("lstm_forward(Tensor gi, Tensor s0, Tensor? keep, Tensor w_hh_t) -> (Tensor, Tensor, Tensor)");
  m.def("lstm_backward(Tensor grad_out, Tensor s0, Tensor? keep, Tensor out, Tensor gates, Tensor tanh_c, "
        "Tensor w_hh) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(sf_engine_recurrent, CPU, m) {
  m.impl("gru_forward", gru_forward);
  m.impl("gru_backward", gru_backward);
  m.impl("lstm_forward", lstm_forward);
  m.impl("lstm_backward", lstm_backward);
}
