// FP8 (OCP E4M3 and E5M2) casts for FP8 matrix products: scaled, saturating casts of activations,
// gradients and weights, with the transposed copy Hopper's FP8 products need for the backward, and
// the absolute maxima and scales of Megatron's (TransformerEngine's) scaling recipes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "trainer/cuda/cuda_util.h"

namespace leantron::trainer::cuda {

// E4M3: 4 exponent bits (bias 7), 3 mantissa bits, largest finite 448, no infinity. E5M2: 5
// exponent bits (bias 15), 2 mantissa bits, largest finite 57344. Megatron's --fp8-format e4m3
// uses E4M3 everywhere; hybrid uses E5M2 for gradients.
enum class Fp8Format { kE4M3, kE5M2 };
float Fp8Max(Fp8Format f);

// q = fp8(scale · x), rounded to nearest even, saturating to ±the largest finite value (infinities
// too); NaN stays NaN. out [rows, cols] row-major; out_t (may be null) [cols, rows], its
// transpose; amax (may be null) = max(amax, max |x|), NaN ignored. `scale` is a device pointer
// (one float), so scales computed on the device need no host round trip.
template <typename T>
void CastToFp8(uint8_t* out, uint8_t* out_t, float* amax, const T* x, int64_t rows, int64_t cols,
               const float* scale, Fp8Format format, cudaStream_t s);

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

// TransformerEngine's delayed scaling (Megatron's --fp8-recipe delayed), after a step whose casts
// recorded their amax into history[0] (CastToFp8's amax): the scale from max(history)
// (--fp8-amax-compute-algo max) or history[0] (most_recent), as ComputeFp8Scale; the history rolls
// one place towards its start, the newest amax moving to its end, and history[0] is cleared for
// the next step. `history` holds `len` floats on the device (--fp8-amax-history-len).
void UpdateFp8DelayedScale(float* history, int len, bool most_recent, float* scale,
                           float* scale_inv, Fp8Format format, float margin, cudaStream_t s);

}  // namespace leantron::trainer::cuda
