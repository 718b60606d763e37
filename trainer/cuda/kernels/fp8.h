// FP8 (OCP E4M3 and E5M2) casts for FP8 matrix products: scaled, saturating casts of activations,
// gradients and weights, with the transposed copy Hopper's FP8 products need for the backward, and
// the absolute maxima and scales of Megatron's (TransformerEngine's) scaling recipes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "trainer/core/adamw.h"
#include "trainer/cuda/cuda_util.h"

namespace leantron::trainer::cuda {

// E4M3: 4 exponent bits (bias 7), 3 mantissa bits, largest finite 448, no infinity. E5M2: 5
// exponent bits (bias 15), 2 mantissa bits, largest finite 57344. Megatron's --fp8-format e4m3
// uses E4M3 everywhere; hybrid uses E5M2 for gradients.
enum class Fp8Format { kE4M3, kE5M2 };
float Fp8Max(Fp8Format f);

// q = fp8(scale · x), rounded to nearest even, saturating to ±the largest finite value (infinities
// too); NaN stays NaN. out [rows, cols] row-major; out_t [cols, rows], its transpose (either may
// be null); amax (may be null) = max(amax, max |x|), NaN ignored. `scale` is a device pointer
// (one float), so scales computed on the device need no host round trip.
template <typename T>
void CastToFp8(uint8_t* out, uint8_t* out_t, float* amax, const T* x, int64_t rows, int64_t cols,
               const float* scale, Fp8Format format, cudaStream_t s);

// The MLP's activation (fc1's output to fc2's input).
enum class Fp8Activation { kNone, kGeluTanh, kGeluErf, kSwiglu };

// What a cast of an MLP tensor reads, the activation computed on the way in fp32 (its value is
// not rounded to bf16 before the cast):
//   dact null: act(x), x being fc1's output [rows, cols] (GELU) or [rows, 2·cols] (SwiGLU, gate
//     then up); with kNone x itself [rows, cols].
//   dact given: fc1's output gradient from the activation's output gradient dact [rows, w] and
//     fc1's output x: GELU dact·gelu'(x), cols = w; SwiGLU cols = 2w, the gate's gradient in
//     columns [0, w) and the up projection's in [w, 2w).
struct Fp8Source {
  const bf16* x = nullptr;
  Fp8Activation act = Fp8Activation::kNone;
  const bf16* dact = nullptr;
};

// CastToFp8 of a source's [rows, cols] values; rows and cols multiples of 4, pointers 8-byte
// aligned. With neither out nor out_t only the amax (current scaling's first pass). With `dbias`
// also dbias[c] += Σ_r value[r, c] in fp32, in a fixed order: `workspace` holds
// Fp8BiasWorkspace(rows, cols) floats.
void CastSourceToFp8(uint8_t* out, uint8_t* out_t, float* amax, const Fp8Source& src, int64_t rows,
                     int64_t cols, const float* scale, Fp8Format format, float* dbias,
                     float* workspace, cudaStream_t s);
int64_t Fp8BiasWorkspace(int64_t rows, int64_t cols);

// AdamW (core/adamw.h's update, bit for bit the AdamW kernel's) of a weight W [rows, cols] whose
// fp32 values, gradient and moments are contiguous, writing its bf16 copy `w16` and that copy cast
// with `scale` (CastToFp8's bytes of w16) into `out` and its transpose `out_t`, with amax =
// max(amax, max |w16|) when amax is given: one pass where the vector kernel runs (rows and cols
// multiples of 4, the float tensors 16-byte aligned), else AdamW then CastToFp8.
void AdamWToFp8(float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                const AdamWConstants& c, bf16* w16, int64_t rows, int64_t cols, uint8_t* out,
                uint8_t* out_t, float* amax, const float* scale, Fp8Format format, cudaStream_t s);

// Where a producing kernel (a norm, kernels.h) writes its output cast to FP8 as it computes it:
// q = fp8(scale · y) [rows, cols], y rounded to the type it would have been stored in (so the
// bytes are CastToFp8's of the stored output), and amax = max(amax, max |y|) when amax is given.
struct Fp8Out {
  uint8_t* q = nullptr;
  const float* scale = nullptr;
  float* amax = nullptr;
  Fp8Format format = Fp8Format::kE4M3;
};

// out_t [cols, rows] = the transpose of the FP8 bytes q [rows, cols]; rows and cols multiples of 4,
// pointers 4-byte aligned.
void TransposeFp8(uint8_t* out_t, const uint8_t* q, int64_t rows, int64_t cols, cudaStream_t s);

// amax = max(amax, max |x|) (NaN ignored). Deterministic: a maximum does not depend on order.
template <typename T>
void AbsMax(float* amax, const T* x, size_t n, cudaStream_t s);

// x = dequantised q (value / scale) as T, for tests and debugging.
template <typename T>
void CastFromFp8(T* x, const uint8_t* q, size_t n, const float* scale_inv, Fp8Format format,
                 cudaStream_t s);

// TransformerEngine's scale update from an absolute maximum: scale = largest finite / amax /
// 2^margin and scale_inv = 1 / scale; an amax of 0 or not finite keeps the previous scale.
void ComputeFp8Scale(float* scale, float* scale_inv, const float* amax, Fp8Format format,
                     float margin, cudaStream_t s);

// TransformerEngine's delayed scaling (Megatron's --fp8-recipe delayed) of `count` tensors, after
// a step whose casts recorded their amax into history[0] of their rows (CastToFp8's amax): each
// scale from max(its row) (--fp8-amax-compute-algo max) or row[0] (most_recent), as
// ComputeFp8Scale; each row rolls one place towards its start, the newest amax moving to its end,
// and row[0] is cleared for the next step. `histories` holds count rows of `len` floats
// (--fp8-amax-history-len); tensor t's scale and inverse are scales[t·stride] and
// scale_invs[t·stride]; all on the device.
void UpdateFp8DelayedScales(float* histories, int count, int len, bool most_recent, float* scales,
                            float* scale_invs, int stride, Fp8Format format, float margin,
                            cudaStream_t s);

}  // namespace leantron::trainer::cuda
