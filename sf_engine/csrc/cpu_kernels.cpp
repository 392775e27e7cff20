// CPU float32 kernels of acting with and training a small network, each one call where torch runs an
// op (and an autograd node) per layer and per step of the maths; sf_engine/model/kernels.py loads them (and
// sum_tree.cpp's ops for prioritized replay, built into the same library):
// - mlp_forward / mlp_backward (or mlp_backward_into the optimizer's gradients): a whole MLP (linear
//   layers, each followed by tanh, ReLU or nothing, and optionally a layer norm before that);
// - ppo_discrete_loss: the clipped PPO loss of categorical actions with its gradients;
// - categorical_sample: actions sampled from categorical logits and their log-probabilities (acting).
//
// Why: on a small MLP (CartPole's 64 x 64) each op is a few us of dispatch and a fresh tensor the
// next op reads back from memory; the matrix products here go through torch's brgemm (oneDNN's
// small-matrix kernel, JIT-compiled for the CPU: about 54 GMAC/s per core on the machine in
// docs/performance.md, where torch's mm runs MKL's AVX2 kernels at 35-47), and the bias, activation
// and gradient passes are fused loops over rows still in cache (rows are taken ROWS at a time
// through every layer).
// - elu_: ELU in place on float32 or bfloat16 (SimpleCNN's activation, Sample Factory's Doom
//   encoder): torch's CPU ELU computes a scalar expm1 per element (27 us per 128x72 frame after the
//   first conv, in bfloat16, half of what that conv costs); here one vector pass of expm1, bfloat16
//   rounded to nearest even.
// - image_affine: uint8 images to the network's input, x * scale + shift clamped to [lo, hi] per
//   pixel and channel (--normalize_input's per-pixel statistics, or 1/255), in float32 or bfloat16:
//   one pass where torch takes four (convert, multiply, add, clamp).
// - tanh, exp, expm1, log: glibc's vector versions (libmvec, within 4 ulp) when setup.py finds them
//   (SF_VECTOR_TANH), every pass built for AVX-512, AVX2 and SSE and picked at load time
//   (target_clones); else the scalar functions.
// - Shapes: x [B, I] (made contiguous), weight l [O_l, I_l] as nn.Linear keeps it, bias l [O_l]; a
//   layer norm's weight and bias [O_l] (nn.LayerNorm's), or empty tensors for a layer without one.
//   The forward returns each layer's normalized pre-activation ([B, O_l]) and reciprocal standard
//   deviation ([B]) (empty without a norm), then every layer's output ([B, O_l], the last is the
//   MLP's): what the backward needs. The backward returns the gradient of x (or an empty tensor), then
//   of each weight, of each bias, of each norm weight and of each norm bias. Every op checks shapes,
//   dtypes and devices: the loops read raw memory.
#include <ATen/ATen.h>
#include <ATen/native/CPUBlas.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if SF_VECTOR_TANH && defined(__GNUC__) && !defined(__clang__)
extern "C" {
__attribute__((simd("notinbranch"))) float tanhf(float) noexcept;
__attribute__((simd("notinbranch"))) float expf(float) noexcept;
__attribute__((simd("notinbranch"))) float expm1f(float) noexcept;
__attribute__((simd("notinbranch"))) float logf(float) noexcept;
}
#define SF_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#define SF_VECTORIZED 1
#else
#define SF_CLONES
#define SF_VECTORIZED 0
#endif

namespace {

using at::Tensor;
using i64 = int64_t;

constexpr i64 ROWS = 128;  // rows taken through every layer at a time (their activations stay in cache)
enum Activation : i64 { IDENTITY = 0, TANH = 1, RELU = 2 };

// Row-major c [m, n] (row stride ldc) = a [m, k] (lda) @ b [k, n] (ldb), added to c if `add`.
void matmul(i64 m, i64 n, i64 k, const float* a, i64 lda, const float* b, i64 ldb, bool add, float* c, i64 ldc) {
#ifdef CPUBLAS_BRGEMM_F32F32F32
  at::native::cpublas::brgemm(m, n, k, lda, ldb, ldc, add, a, b, c, false);
#else
  auto options = at::TensorOptions().dtype(at::kFloat);
  Tensor ta = at::from_blob(const_cast<float*>(a), {m, k}, {lda, 1}, options);
  Tensor tb = at::from_blob(const_cast<float*>(b), {k, n}, {ldb, 1}, options);
  Tensor tc = at::from_blob(c, {m, n}, {ldc, 1}, options);
  if (add)
    tc.add_(at::mm(ta, tb));
  else
    at::mm_out(tc, ta, tb);
#endif
}

// y [n] = act(y) in place, one row; inlined into each caller's clone, so it is vectorized for its target.
__attribute__((always_inline)) inline void activate_row(i64 n, float* __restrict__ y, i64 act) {
  if (act == TANH) {
    for (i64 j = 0; j < n; ++j) y[j] = tanhf(y[j]);
  } else if (act == RELU) {
    for (i64 j = 0; j < n; ++j) y[j] = std::max(y[j], 0.0f);
  }
}

// g [n] *= act'(y) in place, one row (y: the activation's output).
__attribute__((always_inline)) inline void activation_grad_row(i64 n, float* __restrict__ g,
                                                               const float* __restrict__ y, i64 act) {
  if (act == TANH) {
    for (i64 j = 0; j < n; ++j) g[j] *= 1.0f - y[j] * y[j];
  } else if (act == RELU) {
    for (i64 j = 0; j < n; ++j) g[j] = y[j] > 0.0f ? g[j] : 0.0f;
  }
}

// y [rows, n] = act(y + bias)
SF_CLONES void bias_activation(i64 rows, i64 n, float* __restrict__ y, const float* __restrict__ bias, i64 act) {
  for (i64 r = 0; r < rows; ++r) {
    float* y_r = y + r * n;
    for (i64 j = 0; j < n; ++j) y_r[j] += bias[j];
    activate_row(n, y_r, act);
  }
}

// g [rows, n] *= act'(y) (y: the layer's output), its column sums added to grad_bias, and g
// transposed into g_t [n, rows] (the left factor of the weight gradient's product).
SF_CLONES void activation_grad(i64 rows, i64 n, float* __restrict__ g, const float* __restrict__ y,
                               float* __restrict__ grad_bias, float* __restrict__ g_t, i64 act) {
  for (i64 r = 0; r < rows; ++r) {
    float* g_r = g + r * n;
    activation_grad_row(n, g_r, y + r * n, act);
    for (i64 j = 0; j < n; ++j) grad_bias[j] += g_r[j];
  }
  for (i64 j = 0; j < n; ++j)
    for (i64 r = 0; r < rows; ++r) g_t[j * rows + r] = g[r * n + j];
}

// x [n] = elu(x) (alpha 1). expm1 is called for every element (of min(x, 0)) so that the loop vectorizes.
SF_CLONES void elu_f32(i64 n, float* __restrict__ x) {
  for (i64 i = 0; i < n; ++i) {
    const float v = x[i];
    const float e = expm1f(std::min(v, 0.0f));
    x[i] = v > 0.0f ? v : e;
  }
}

// In blocks: bfloat16 -> float32 (a shift), elu_f32's pass, back with rounding; each loop vectorizes.
SF_CLONES void elu_bf16(i64 n, uint16_t* __restrict__ x) {
  constexpr i64 BLOCK = 1024;
  alignas(64) uint32_t bits[BLOCK];
  alignas(64) float values[BLOCK];
  for (i64 start = 0; start < n; start += BLOCK) {
    const i64 m = std::min(BLOCK, n - start);
    uint16_t* __restrict__ xs = x + start;
    for (i64 i = 0; i < m; ++i) bits[i] = uint32_t(xs[i]) << 16;
    std::memcpy(values, bits, m * sizeof(float));
    elu_f32(m, values);
    std::memcpy(bits, values, m * sizeof(float));
    for (i64 i = 0; i < m; ++i) {
      const uint32_t b = bits[i];
      const uint32_t rounded = (b + 0x7FFFu + ((b >> 16) & 1u)) >> 16;  // to nearest, ties to even
      xs[i] = uint16_t((b & 0x7FFFFFFFu) > 0x7F800000u ? 0x7FC0u : rounded);  // NaN stays NaN
    }
  }
}

Tensor elu_(Tensor x) {
  TORCH_CHECK(x.device().is_cpu() && x.is_non_overlapping_and_dense() &&
                  (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16),
              "elu_: x must be a dense CPU float32 or bfloat16 tensor");
  if (x.scalar_type() == at::kFloat)
    elu_f32(x.numel(), x.data_ptr<float>());
  else
    elu_bf16(x.numel(), reinterpret_cast<uint16_t*>(x.data_ptr<at::BFloat16>()));
  return x;
}

// out [rows, n] = clamp(x [rows, n] * scale [n] + shift [n], lo, hi); out float32 or (bf16) bfloat16.
SF_CLONES void image_affine_rows(i64 rows, i64 n, const uint8_t* __restrict__ x, const float* __restrict__ scale,
                                 const float* __restrict__ shift, float lo, float hi, float* __restrict__ out_f32,
                                 uint16_t* __restrict__ out_bf16) {
  for (i64 r = 0; r < rows; ++r) {
    const uint8_t* __restrict__ x_r = x + r * n;
    if (out_f32) {
      float* __restrict__ o = out_f32 + r * n;
      for (i64 j = 0; j < n; ++j) o[j] = std::min(std::max(float(x_r[j]) * scale[j] + shift[j], lo), hi);
    } else {
      uint16_t* __restrict__ o = out_bf16 + r * n;
      for (i64 j = 0; j < n; ++j) {
        const float v = std::min(std::max(float(x_r[j]) * scale[j] + shift[j], lo), hi);
        uint32_t b;
        __builtin_memcpy(&b, &v, 4);
        o[j] = uint16_t((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);  // finite: to nearest, ties to even
      }
    }
  }
}

Tensor image_affine(Tensor x, Tensor scale, Tensor shift, double lo, double hi, bool bf16) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kByte && x.dim() >= 2 && x.size(0) > 0,
              "image_affine: x must be a CPU uint8 tensor [B, ...] with B > 0");
  x = x.contiguous();
  const i64 n = x.numel() / x.size(0);
  TORCH_CHECK(scale.scalar_type() == at::kFloat && shift.scalar_type() == at::kFloat && scale.numel() == n &&
                  shift.numel() == n && scale.device().is_cpu() && shift.device().is_cpu(),
              "image_affine: scale and shift must be CPU float32 with one value per pixel and channel (", n, ")");
  scale = scale.contiguous();
  shift = shift.contiguous();
  Tensor out = at::empty(x.sizes(), x.options().dtype(bf16 ? at::kBFloat16 : at::kFloat));
  image_affine_rows(x.size(0), n, x.data_ptr<uint8_t>(), scale.data_ptr<float>(), shift.data_ptr<float>(), float(lo),
                    float(hi), bf16 ? nullptr : out.data_ptr<float>(),
                    bf16 ? reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>()) : nullptr);
  return out;
}

bool vector_tanh() { return SF_VECTORIZED; }
// The sum of a [n] (times b [n] where given), in LANES running sums: a float sum in one running total
// is a chain of dependent adds that the compiler may not reorder, so it would not vectorize.
constexpr i64 LANES = 16;
__attribute__((always_inline)) inline float lane_sum(i64 n, const float* __restrict__ a,
                                                     const float* __restrict__ b) {
  float lanes[LANES] = {};
  i64 j = 0;
  for (; j + LANES <= n; j += LANES)
    for (i64 k = 0; k < LANES; ++k) lanes[k] += b ? a[j + k] * b[j + k] : a[j + k];
  for (; j < n; ++j) lanes[0] += b ? a[j] * b[j] : a[j];
  float sum = 0.0f;
  for (i64 k = 0; k < LANES; ++k) sum += lanes[k];
  return sum;
}

// y [rows, n] = act(layer_norm(y + bias) * gamma + beta) per row (nn.LayerNorm's biased variance), keeping
// the normalized rows in xhat [rows, n] and 1 / std in rstd [rows] when they are given.
SF_CLONES void bias_norm_activation(i64 rows, i64 n, float* __restrict__ y, const float* __restrict__ bias,
                                    const float* __restrict__ gamma, const float* __restrict__ beta, float eps,
                                    i64 act, float* __restrict__ xhat, float* __restrict__ rstd) {
  for (i64 r = 0; r < rows; ++r) {
    float* y_r = y + r * n;
    for (i64 j = 0; j < n; ++j) y_r[j] += bias[j];
    const float mean = lane_sum(n, y_r, nullptr) / n;
    for (i64 j = 0; j < n; ++j) y_r[j] -= mean;
    const float inv = 1.0f / std::sqrt(lane_sum(n, y_r, y_r) / n + eps);
    for (i64 j = 0; j < n; ++j) y_r[j] *= inv;
    if (xhat != nullptr) {
      std::memcpy(xhat + r * n, y_r, n * sizeof(float));
      rstd[r] = inv;
    }
    for (i64 j = 0; j < n; ++j) y_r[j] = y_r[j] * gamma[j] + beta[j];
    activate_row(n, y_r, act);
  }
}

// The backward of bias_norm_activation: g [rows, n] (the gradient of its output y) becomes the gradient of
// its input (before the bias); the norm's weight and bias gradients are added into grad_gamma, grad_beta.
SF_CLONES void norm_activation_grad(i64 rows, i64 n, float* __restrict__ g, const float* __restrict__ y,
                                    const float* __restrict__ xhat, const float* __restrict__ rstd,
                                    const float* __restrict__ gamma, float* __restrict__ grad_gamma,
                                    float* __restrict__ grad_beta, i64 act) {
  for (i64 r = 0; r < rows; ++r) {
    float* g_r = g + r * n;
    const float* xhat_r = xhat + r * n;
    activation_grad_row(n, g_r, y + r * n, act);
    for (i64 j = 0; j < n; ++j) {
      grad_gamma[j] += g_r[j] * xhat_r[j];
      grad_beta[j] += g_r[j];
      g_r[j] *= gamma[j];  // the gradient of the normalized row
    }
    const float mean_g = lane_sum(n, g_r, nullptr) / n, mean_gx = lane_sum(n, g_r, xhat_r) / n;
    for (i64 j = 0; j < n; ++j) g_r[j] = rstd[r] * (g_r[j] - mean_g - xhat_r[j] * mean_gx);
  }
}

// Bumped with every change of the ops' signatures or outputs: sf_engine/model/kernels.py loads only this one.
int64_t version() { return 6; }

// Whether layer l has a layer norm: norm weights are given and l's is not empty.
bool has_norm(const std::vector<Tensor>& norm_weights, size_t l) {
  return !norm_weights.empty() && norm_weights[l].numel() > 0;
}

// Each of `vectors` a contiguous CPU float32 [O_l] of layer l (with `norms`, an empty one is a layer without).
void check_vectors(const std::vector<Tensor>& vectors, const std::vector<Tensor>& weights, bool norms,
                   const char* what) {
  for (size_t l = 0; l < vectors.size(); ++l) {
    if (norms && !(vectors[l].numel() > 0)) continue;
    TORCH_CHECK(vectors[l].dim() == 1 && vectors[l].size(0) == weights[l].size(0) && vectors[l].is_contiguous() &&
                    vectors[l].scalar_type() == at::kFloat && vectors[l].device().is_cpu(),
                "mlp: ", what, " ", l, " must be a contiguous CPU float32 [", weights[l].size(0), "]");
  }
}

void check_layers(const Tensor& x, const std::vector<Tensor>& weights, const std::vector<int64_t>& activations,
                  const std::vector<Tensor>& norm_weights) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.device().is_cpu(),
              "mlp: x must be [B, I] CPU float32");
  TORCH_CHECK(!weights.empty() && weights.size() == activations.size(), "mlp: one weight and activation per layer");
  TORCH_CHECK(norm_weights.empty() || norm_weights.size() == weights.size(),
              "mlp: no norm weights, or one per layer (empty for a layer without a norm)");
  i64 in = x.size(1);
  for (size_t l = 0; l < weights.size(); ++l) {
    const Tensor& w = weights[l];
    TORCH_CHECK(w.dim() == 2 && w.size(1) == in && w.is_contiguous() && w.scalar_type() == at::kFloat &&
                    w.device().is_cpu(), "mlp: weight ", l, " must be a contiguous CPU float32 [O, ", in, "]");
    TORCH_CHECK(activations[l] >= IDENTITY && activations[l] <= RELU, "mlp: unknown activation ", activations[l]);
    in = w.size(0);
  }
  check_vectors(norm_weights, weights, true, "norm weight");
}

// With keep_all: each layer's normalized pre-activation [B, O] and 1 / std [B] (empty tensors without a norm),
// then every layer's output (the last is the MLP's); else the MLP's output only.
std::vector<Tensor> mlp_forward(Tensor x, std::vector<Tensor> weights, std::vector<Tensor> biases,
                                std::vector<int64_t> activations, std::vector<Tensor> norm_weights,
                                std::vector<Tensor> norm_biases, double eps, bool keep_all) {
  check_layers(x, weights, activations, norm_weights);
  TORCH_CHECK(biases.size() == weights.size(), "mlp: one bias per layer");
  TORCH_CHECK(norm_biases.size() == norm_weights.size(), "mlp: one norm bias per norm weight");
  check_vectors(biases, weights, false, "bias");
  for (size_t l = 0; l < norm_biases.size(); ++l)
    TORCH_CHECK(norm_biases[l].numel() == norm_weights[l].numel(), "mlp: norm bias ", l, " must match its weight");
  check_vectors(norm_biases, weights, true, "norm bias");
  x = x.contiguous();
  const i64 batch = x.size(0), layers = weights.size();
  std::vector<Tensor> outputs, normed, rstds;
  std::vector<std::vector<float>> weights_t;  // [I, O]: b of c = a b (a loop: no tensor, no dispatch)
  for (const Tensor& w : weights) {
    const i64 out_size = w.size(0), in_size = w.size(1);
    const float* src = w.data_ptr<float>();
    std::vector<float>& t = weights_t.emplace_back(out_size * in_size);
    for (i64 o = 0; o < out_size; ++o)
      for (i64 i = 0; i < in_size; ++i) t[i * out_size + o] = src[o * in_size + i];
  }
  for (i64 l = 0; l < layers; ++l) {
    const i64 n = weights[l].size(0);
    if (keep_all || l == layers - 1) outputs.push_back(at::empty({batch, n}, x.options()));
    const bool saved = keep_all && has_norm(norm_weights, l);
    normed.push_back(saved ? at::empty({batch, n}, x.options()) : at::empty({0}, x.options()));
    rstds.push_back(saved ? at::empty({batch}, x.options()) : at::empty({0}, x.options()));
  }
  i64 widest = 0;
  for (const Tensor& w : weights) widest = std::max(widest, w.size(0));
  std::vector<float> scratch(keep_all ? 0 : 2 * ROWS * widest);  // the hidden rows, when not kept
  for (i64 r0 = 0; r0 < batch; r0 += ROWS) {
    const i64 rows = std::min(ROWS, batch - r0);
    const float* in = x.data_ptr<float>() + r0 * x.size(1);
    i64 in_size = x.size(1);
    for (i64 l = 0; l < layers; ++l) {
      const i64 n = weights[l].size(0);
      float* out = (keep_all || l == layers - 1) ? outputs[keep_all ? l : 0].data_ptr<float>() + r0 * n
                                                 : scratch.data() + (l % 2) * ROWS * widest;
      matmul(rows, n, in_size, in, in_size, weights_t[l].data(), n, false, out, n);
      if (has_norm(norm_weights, l)) {
        const bool saved = normed[l].numel() > 0;
        bias_norm_activation(rows, n, out, biases[l].data_ptr<float>(), norm_weights[l].data_ptr<float>(),
                             norm_biases[l].data_ptr<float>(), float(eps), activations[l],
                             saved ? normed[l].data_ptr<float>() + r0 * n : nullptr,
                             saved ? rstds[l].data_ptr<float>() + r0 : nullptr);
      } else {
        bias_activation(rows, n, out, biases[l].data_ptr<float>(), activations[l]);
      }
      in = out;
      in_size = n;
    }
  }
  if (!keep_all) return outputs;
  std::vector<Tensor> all(normed);
  all.insert(all.end(), rstds.begin(), rstds.end());
  all.insert(all.end(), outputs.begin(), outputs.end());
  return all;
}

// The backward of mlp_forward(keep_all) from what it returned (`saved`): the parameter gradients added into
// grad_weights / grad_biases / grad_norm_weights / grad_norm_biases (shaped as the parameters, contiguous;
// the norm lists empty without norms), the gradient of x written into grad_x when it is defined.
void backward_into(const Tensor& grad_out, const Tensor& x, const std::vector<Tensor>& saved,
                   const std::vector<Tensor>& weights, const std::vector<int64_t>& activations,
                   const std::vector<Tensor>& norm_weights, Tensor& grad_x, std::vector<Tensor>& grad_weights,
                   std::vector<Tensor>& grad_biases, std::vector<Tensor>& grad_norm_weights,
                   std::vector<Tensor>& grad_norm_biases) {
  const i64 batch = x.size(0), layers = weights.size();
  TORCH_CHECK((i64)saved.size() == 3 * layers, "mlp_backward: the forward's 3 tensors per layer");
  const std::vector<Tensor> normed(saved.begin(), saved.begin() + layers);
  const std::vector<Tensor> rstds(saved.begin() + layers, saved.begin() + 2 * layers);
  const std::vector<Tensor> outputs(saved.begin() + 2 * layers, saved.end());
  TORCH_CHECK(grad_norm_weights.size() == norm_weights.size() && grad_norm_biases.size() == norm_weights.size(),
              "mlp_backward: one norm gradient per norm weight");
  for (i64 l = 0; l < layers; ++l) {
    TORCH_CHECK(outputs[l].is_contiguous() && outputs[l].size(0) == batch && outputs[l].size(1) == weights[l].size(0),
                "mlp_backward: output ", l, " must be a contiguous [B, O]");
    TORCH_CHECK(grad_weights[l].sizes() == weights[l].sizes() && grad_weights[l].is_contiguous() &&
                    grad_weights[l].scalar_type() == at::kFloat && grad_biases[l].dim() == 1 &&
                    grad_biases[l].size(0) == weights[l].size(0) && grad_biases[l].is_contiguous() &&
                    grad_biases[l].scalar_type() == at::kFloat,
                "mlp_backward: the gradients of layer ", l, " must be contiguous float32, shaped as its parameters");
    if (has_norm(norm_weights, l))
      TORCH_CHECK(normed[l].sizes() == outputs[l].sizes() && normed[l].is_contiguous() && rstds[l].dim() == 1 &&
                      rstds[l].size(0) == batch && grad_norm_weights[l].sizes() == norm_weights[l].sizes() &&
                      grad_norm_biases[l].sizes() == norm_weights[l].sizes() && grad_norm_weights[l].is_contiguous() &&
                      grad_norm_biases[l].is_contiguous() && grad_norm_weights[l].scalar_type() == at::kFloat &&
                      grad_norm_biases[l].scalar_type() == at::kFloat,
                  "mlp_backward: the norm of layer ", l, " needs its saved rows and gradients shaped as its weight");
  }
  TORCH_CHECK(grad_out.sizes() == outputs.back().sizes() && grad_out.scalar_type() == at::kFloat,
              "mlp_backward: grad_out must be float32, shaped as the output");
  const Tensor g_out = grad_out.contiguous(), x_c = x.contiguous();
  i64 widest = x.size(1);
  for (const Tensor& w : weights) widest = std::max(widest, w.size(0));
  std::vector<float> g(ROWS * widest), g_next(ROWS * widest), g_t(ROWS * widest);
  for (i64 r0 = 0; r0 < batch; r0 += ROWS) {
    const i64 rows = std::min(ROWS, batch - r0);
    i64 n = weights[layers - 1].size(0);
    std::copy(g_out.data_ptr<float>() + r0 * n, g_out.data_ptr<float>() + (r0 + rows) * n, g.begin());
    for (i64 l = layers - 1; l >= 0; --l) {  // g: the gradient of layer l's output, rows r0..
      const i64 in_size = weights[l].size(1);
      const float* y = outputs[l].data_ptr<float>() + r0 * n;
      if (has_norm(norm_weights, l)) {
        norm_activation_grad(rows, n, g.data(), y, normed[l].data_ptr<float>() + r0 * n,
                             rstds[l].data_ptr<float>() + r0, norm_weights[l].data_ptr<float>(),
                             grad_norm_weights[l].data_ptr<float>(), grad_norm_biases[l].data_ptr<float>(),
                             activations[l]);
        activation_grad(rows, n, g.data(), y, grad_biases[l].data_ptr<float>(), g_t.data(), IDENTITY);
      } else {
        activation_grad(rows, n, g.data(), y, grad_biases[l].data_ptr<float>(), g_t.data(), activations[l]);
      }
      const float* layer_in = (l > 0 ? outputs[l - 1].data_ptr<float>() : x_c.data_ptr<float>()) + r0 * in_size;
      matmul(n, in_size, rows, g_t.data(), rows, layer_in, in_size, true, grad_weights[l].data_ptr<float>(), in_size);
      if (l > 0) {
        matmul(rows, in_size, n, g.data(), n, weights[l].data_ptr<float>(), in_size, false, g_next.data(), in_size);
        std::swap(g, g_next);
      } else if (grad_x.defined()) {
        matmul(rows, in_size, n, g.data(), n, weights[0].data_ptr<float>(), in_size, false,
               grad_x.data_ptr<float>() + r0 * in_size, in_size);
      }
      n = in_size;
    }
  }
}

// Returns the gradient of x (or an empty tensor), then of each weight, each bias, each norm weight and each
// norm bias (empty tensors for layers without a norm; none without norm weights).
std::vector<Tensor> mlp_backward(Tensor grad_out, Tensor x, std::vector<Tensor> saved, std::vector<Tensor> weights,
                                 std::vector<int64_t> activations, std::vector<Tensor> norm_weights,
                                 bool need_grad_x) {
  check_layers(x, weights, activations, norm_weights);
  std::vector<Tensor> grad_weights, grad_biases, grad_norm_weights, grad_norm_biases;
  for (const Tensor& w : weights) {
    grad_weights.push_back(at::zeros_like(w));
    grad_biases.push_back(at::zeros({w.size(0)}, w.options()));
  }
  for (const Tensor& w : norm_weights) {
    grad_norm_weights.push_back(at::zeros_like(w));
    grad_norm_biases.push_back(at::zeros_like(w));
  }
  Tensor grad_x = need_grad_x ? at::empty_like(x) : Tensor();
  backward_into(grad_out, x, saved, weights, activations, norm_weights, grad_x, grad_weights, grad_biases,
                grad_norm_weights, grad_norm_biases);
  std::vector<Tensor> grads{need_grad_x ? grad_x : at::empty({0}, x.options())};
  for (const auto* list : {&grad_weights, &grad_biases, &grad_norm_weights, &grad_norm_biases})
    grads.insert(grads.end(), list->begin(), list->end());
  return grads;
}

// The same backward, its parameter gradients added into the given tensors (the optimizer's gradient
// views: no autograd node, no temporary gradients); x gets none.
void mlp_backward_into(Tensor grad_out, Tensor x, std::vector<Tensor> saved, std::vector<Tensor> weights,
                       std::vector<int64_t> activations, std::vector<Tensor> norm_weights,
                       std::vector<Tensor> grad_weights, std::vector<Tensor> grad_biases,
                       std::vector<Tensor> grad_norm_weights, std::vector<Tensor> grad_norm_biases) {
  check_layers(x, weights, activations, norm_weights);
  TORCH_CHECK(grad_weights.size() == weights.size() && grad_biases.size() == weights.size(),
              "mlp_backward_into: one weight gradient and one bias gradient per layer");
  Tensor no_grad_x;
  backward_into(grad_out, x, saved, weights, activations, norm_weights, no_grad_x, grad_weights, grad_biases,
                grad_norm_weights, grad_norm_biases);
}

// The clipped PPO loss of categorical actions, per row: passes over the rows (vectorized across rows,
// with glibc's vector exp and log where built with SF_VECTOR_TANH), each column j of the logits at a time.
// Writes d loss / d logits [B, n] and d loss / d values [B], and per row the terms the caller sums:
// terms[0..4][b] = the taken policy objective, the squared value error, the entropy, the approx-KL term
// and 1 where the ratio left the clip range. lse [B] and d_log_prob [B] are scratch.
SF_CLONES void ppo_loss_rows(i64 batch, i64 n, const float* __restrict__ logits, const int64_t* __restrict__ actions,
                             const float* __restrict__ old_log_probs, const float* __restrict__ advantages,
                             const float* __restrict__ values, const float* __restrict__ returns, float clip_ratio,
                             float scale, float value_scale, float entropy_scale, float* __restrict__ lse,
                             float* __restrict__ d_log_prob, float* __restrict__ terms, float* __restrict__ grad_logits,
                             float* __restrict__ grad_values) {
  float* policy = terms;
  float* error2 = terms + batch;
  float* entropy = terms + 2 * batch;
  float* kl = terms + 3 * batch;
  float* clipped_out = terms + 4 * batch;
  for (i64 b = 0; b < batch; ++b) lse[b] = logits[b * n];
  for (i64 j = 1; j < n; ++j)
    for (i64 b = 0; b < batch; ++b) lse[b] = std::max(lse[b], logits[b * n + j]);
  for (i64 b = 0; b < batch; ++b) d_log_prob[b] = 0.0f;  // here: the sum of exp(logit - max)
  for (i64 j = 0; j < n; ++j)
    for (i64 b = 0; b < batch; ++b) d_log_prob[b] += expf(logits[b * n + j] - lse[b]);
  for (i64 b = 0; b < batch; ++b) lse[b] += logf(d_log_prob[b]);
  const float low = 1.0f - clip_ratio, high = 1.0f + clip_ratio;
  for (i64 b = 0; b < batch; ++b) {
    const float log_ratio = logits[b * n + actions[b]] - lse[b] - old_log_probs[b];
    const float ratio = expf(log_ratio);
    const float unclipped = ratio * advantages[b], clipped = std::min(std::max(ratio, low), high) * advantages[b];
    const bool unclipped_taken = unclipped <= clipped;  // the minimum's gradient flows through it (ties too)
    policy[b] = unclipped_taken ? unclipped : clipped;
    // d loss / d log pi(a) = -scale ratio A where the unclipped term is taken
    d_log_prob[b] = unclipped_taken ? -scale * unclipped : 0.0f;
    kl[b] = (ratio - 1.0f) - log_ratio;
    clipped_out[b] = std::abs(ratio - 1.0f) > clip_ratio ? 1.0f : 0.0f;
    const float error = values[b] - returns[b];
    error2[b] = error * error;
    grad_values[b] = value_scale * error;
    entropy[b] = 0.0f;
  }
  for (i64 j = 0; j < n; ++j)
    for (i64 b = 0; b < batch; ++b) {
      const float log_pi = logits[b * n + j] - lse[b];
      entropy[b] -= expf(log_pi) * log_pi;
    }
  // d log pi(a) / d logits = onehot(a) - pi; d entropy / d logits = -pi (log pi + entropy)
  for (i64 j = 0; j < n; ++j)
    for (i64 b = 0; b < batch; ++b) {
      const float log_pi = logits[b * n + j] - lse[b];
      const float pi = expf(log_pi);
      grad_logits[b * n + j] = -pi * d_log_prob[b] + entropy_scale * pi * (log_pi + entropy[b]);
    }
  for (i64 b = 0; b < batch; ++b) grad_logits[b * n + actions[b]] += d_log_prob[b];
}

// Categorical samples of logits [B, n] (float32) by inverse CDF, one uniform u in [0, 1) per row (Gumbel-max
// draws n): the first action whose cumulative probability exceeds u. An action of probability 0 (a masked one,
// or one underflowing to 0) is never taken, whatever the rounding of the sums. Returns the actions [B] int64
// and their log-probabilities log_softmax(logits)[b, a] [B] float32.
std::vector<Tensor> categorical_sample(Tensor logits, Tensor uniform) {
  TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == at::kFloat && logits.device().is_cpu(),
              "categorical_sample: logits must be [B, n] CPU float32");
  const i64 batch = logits.size(0), n = logits.size(1);
  TORCH_CHECK(n > 0, "categorical_sample: no action");
  TORCH_CHECK(uniform.dim() == 1 && uniform.size(0) == batch && uniform.scalar_type() == at::kFloat &&
                  uniform.device().is_cpu(), "categorical_sample: uniform must be [B] CPU float32");
  logits = logits.contiguous();
  uniform = uniform.contiguous();
  Tensor actions = at::empty({batch}, logits.options().dtype(at::kLong));
  Tensor log_probs = at::empty({batch}, logits.options());
  const float* l = logits.data_ptr<float>();
  const float* u = uniform.data_ptr<float>();
  int64_t* a = actions.data_ptr<int64_t>();
  float* lp = log_probs.data_ptr<float>();
  for (i64 b = 0; b < batch; ++b) {
    const float* row = l + b * n;
    float top = row[0];
    for (i64 j = 1; j < n; ++j) top = std::max(top, row[j]);
    float total = 0.0f;
    for (i64 j = 0; j < n; ++j) total += std::exp(row[j] - top);
    const float target = u[b] * total;  // the draw on the unnormalized CDF: no division
    float sum = 0.0f;
    i64 chosen = -1, last = 0;
    for (i64 j = 0; j < n; ++j) {
      const float weight = std::exp(row[j] - top);
      if (weight <= 0.0f) continue;
      last = j;
      sum += weight;
      if (target < sum) {
        chosen = j;
        break;
      }
    }
    a[b] = chosen >= 0 ? chosen : last;  // u * total rounded up to total: the last action that can be taken
    lp[b] = row[a[b]] - top - std::log(total);
  }
  return {actions, log_probs};
}

// The clipped PPO loss of categorical actions over a minibatch, with its gradients (those of the loss
// itself: the caller scales them by the incoming gradient). logits [B, n], values, old_log_probs,
// advantages, returns [B] float32; actions [B] int64 in [0, n). Returns the loss [], the stats [5]
// (policy loss, value loss, mean entropy, approx KL, clip fraction), d loss / d logits [B, n] and
// d loss / d values [B]: ppo.DiscretePPOLoss's maths (tests/test_ppo.py checks them against autograd).
std::vector<Tensor> ppo_discrete_loss(Tensor logits, Tensor values, Tensor actions, Tensor old_log_probs,
                                      Tensor advantages, Tensor returns, double clip_ratio, double value_loss_coeff,
                                      double entropy_coeff) {
  TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == at::kFloat && logits.device().is_cpu(),
              "ppo_discrete_loss: logits must be [B, n] CPU float32");
  const i64 batch = logits.size(0), n = logits.size(1);
  TORCH_CHECK(batch > 0 && n > 0, "ppo_discrete_loss: an empty minibatch");
  for (const Tensor* t : {&values, &old_log_probs, &advantages, &returns})
    TORCH_CHECK(t->dim() == 1 && t->size(0) == batch && t->scalar_type() == at::kFloat && t->device().is_cpu(),
                "ppo_discrete_loss: values, log-probs, advantages and returns must be [B] CPU float32");
  TORCH_CHECK(actions.dim() == 1 && actions.size(0) == batch && actions.scalar_type() == at::kLong &&
                  actions.device().is_cpu(), "ppo_discrete_loss: actions must be [B] CPU int64");
  actions = actions.contiguous();
  TORCH_CHECK(actions.min().item<int64_t>() >= 0 && actions.max().item<int64_t>() < n,
              "ppo_discrete_loss: actions outside [0, ", n, ")");
  logits = logits.contiguous();
  values = values.contiguous();
  old_log_probs = old_log_probs.contiguous();
  advantages = advantages.contiguous();
  returns = returns.contiguous();
  Tensor grad_logits = at::empty_like(logits), grad_values = at::empty_like(values);
  std::vector<float> scratch(7 * batch);  // lse, d_log_prob, then the five per-row terms
  const float scale = 1.0f / float(batch);
  ppo_loss_rows(batch, n, logits.data_ptr<float>(), actions.data_ptr<int64_t>(), old_log_probs.data_ptr<float>(),
                advantages.data_ptr<float>(), values.data_ptr<float>(), returns.data_ptr<float>(), float(clip_ratio),
                scale, float(scale * value_loss_coeff), float(scale * entropy_coeff), scratch.data(),
                scratch.data() + batch, scratch.data() + 2 * batch, grad_logits.data_ptr<float>(),
                grad_values.data_ptr<float>());
  double sums[5] = {0, 0, 0, 0, 0};
  for (int k = 0; k < 5; ++k)
    for (i64 b = 0; b < batch; ++b) sums[k] += scratch[(2 + k) * batch + b];
  const double policy_loss = -sums[0] / batch, value_loss = 0.5 * sums[1] / batch, entropy_mean = sums[2] / batch;
  Tensor stats = at::empty({5}, logits.options());
  float* st = stats.data_ptr<float>();
  st[0] = float(policy_loss);
  st[1] = float(value_loss);
  st[2] = float(entropy_mean);
  st[3] = float(sums[3] / batch);
  st[4] = float(sums[4] / batch);
  Tensor loss = at::scalar_tensor(policy_loss + value_loss_coeff * value_loss - entropy_coeff * entropy_mean,
                                  logits.options());
  return {loss, stats, grad_logits, grad_values};
}

}  // namespace

TORCH_LIBRARY(sf_engine_cpu, m) {
  m.def("vector_tanh() -> bool", vector_tanh);
  m.def("version() -> int", version);
  m.def("elu_(Tensor(a!) x) -> Tensor(a!)");
  m.def("image_affine(Tensor x, Tensor scale, Tensor shift, float lo, float hi, bool bf16) -> Tensor");
  m.def("mlp_forward(Tensor x, Tensor[] weights, Tensor[] biases, int[] activations, Tensor[] norm_weights, "
        "Tensor[] norm_biases, float eps, bool keep_all) -> Tensor[]");
  m.def("mlp_backward(Tensor grad_out, Tensor x, Tensor[] saved, Tensor[] weights, int[] activations, "
        "Tensor[] norm_weights, bool need_grad_x) -> Tensor[]");
  m.def("mlp_backward_into(Tensor grad_out, Tensor x, Tensor[] saved, Tensor[] weights, int[] activations, "
        "Tensor[] norm_weights, Tensor(a!)[] grad_weights, Tensor(b!)[] grad_biases, "
        "Tensor(c!)[] grad_norm_weights, Tensor(d!)[] grad_norm_biases) -> ()");
  m.def("ppo_discrete_loss(Tensor logits, Tensor values, Tensor actions, Tensor old_log_probs, Tensor advantages, "
        "Tensor returns, float clip_ratio, float value_loss_coeff, float entropy_coeff) -> Tensor[]");
  m.def("categorical_sample(Tensor logits, Tensor uniform) -> Tensor[]");
}

TORCH_LIBRARY_IMPL(sf_engine_cpu, CPU, m) {
  m.impl("elu_", elu_);
  m.impl("image_affine", image_affine);
  m.impl("mlp_forward", mlp_forward);
  m.impl("mlp_backward", mlp_backward);
  m.impl("mlp_backward_into", mlp_backward_into);
  m.impl("ppo_discrete_loss", ppo_discrete_loss);
  m.impl("categorical_sample", categorical_sample);
}
