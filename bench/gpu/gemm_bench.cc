// The bf16 model's matrix products in isolation, on the device: for each (shape, epilogue) the
// time of Matmul's choice and of every algorithm cuBLASLt's heuristic offers (best shown), in
// TFLOP/s. Tells whether a slow product is the shape's limit or a poor algorithm choice. Then the
// same linear layers' products in FP8 (Fp8Matmul: E4M3, E5M2 gradients as Megatron's hybrid
// format) and what the casts feeding them cost (a scaled cast of the input with its transpose).
//   bench_gemm [tokens hidden ffn vocab_rows vocab]   (defaults: GPT-2 774M, micro-batch 32)
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench/gpu/gpu_timing.h"
#include "trainer/cuda/cuda_util.h"
#include "trainer/cuda/fp8_matmul.h"
#include "trainer/cuda/kernels/fp8.h"
#include "trainer/cuda/matmul.h"

using leantron::trainer::cuda::bf16;
using leantron::trainer::cuda::CastSourceToFp8;
using leantron::trainer::cuda::CastToFp8;
using leantron::trainer::cuda::Fp8Activation;
using leantron::trainer::cuda::Fp8BiasWorkspace;
using leantron::trainer::cuda::Fp8Format;
using leantron::trainer::cuda::Fp8Matmul;
using leantron::trainer::cuda::Fp8Source;
using leantron::trainer::cuda::MainStream;
using leantron::trainer::cuda::Matmul;

namespace {

using leantron::bench::TimeMs;
void* Buffer(size_t bytes) { return leantron::bench::DeviceZeros<char>(bytes); }

}  // namespace

int main(int argc, char** argv) {
  const int64_t m = argc > 1 ? std::atoll(argv[1]) : 32768;
  const int64_t h = argc > 2 ? std::atoll(argv[2]) : 1280;
  const int64_t ffn = argc > 3 ? std::atoll(argv[3]) : 4 * h;
  const int64_t vrows = argc > 4 ? std::atoll(argv[4]) : 16384;
  const int64_t vocab = argc > 5 ? std::atoll(argv[5]) : 50304;
  Matmul mm;
  // SwiGLU's casts read [m, 2·ffn].
  const size_t big = static_cast<size_t>(std::max(2 * m * ffn, vrows * vocab));
  auto* x = static_cast<bf16*>(Buffer(big * 2));
  auto* y = static_cast<bf16*>(Buffer(big * 2));
  auto* aux = static_cast<bf16*>(Buffer(big * 2));
  auto* w = static_cast<bf16*>(Buffer(static_cast<size_t>(std::max(ffn, vocab)) * h * 2 * 3));
  auto* bias = static_cast<bf16*>(Buffer(static_cast<size_t>(std::max(ffn, 3 * h)) * 2));
  auto* dw = static_cast<float*>(Buffer(static_cast<size_t>(std::max(ffn, vocab)) * h * 4 * 3));
  auto* db = static_cast<float*>(Buffer(static_cast<size_t>(std::max(ffn, 3 * h)) * 4));
  struct Row {
    std::string name;
    double flops;  // 0: a memory-bound pass of `bytes`
    float ms;
    double bytes = 0;
  };
  std::vector<Row> rows;
  auto add = [&](const std::string& name, int64_t mm_, int64_t kk, int64_t nn, auto f) {
    rows.push_back({name, 2.0 * mm_ * kk * nn, TimeMs(f)});
  };
  struct Lin {
    const char* name;
    int64_t k, n;
  };
  for (const Lin& l :
       {Lin{"qkv", h, 3 * h}, Lin{"proj", h, h}, Lin{"fc1", h, ffn}, Lin{"fc2", ffn, h}}) {
    const std::string n = l.name;
    add(n + " fwd +bias", m, l.k, l.n, [&] { mm.Forward(y, x, w, bias, m, l.k, l.n); });
    add(n + " fwd", m, l.k, l.n, [&] { mm.Forward(y, x, w, nullptr, m, l.k, l.n); });
    add(n + " dgrad", m, l.k, l.n, [&] { mm.BackwardData(y, x, w, m, l.k, l.n); });
    add(n + " wgrad", m, l.k, l.n, [&] { mm.BackwardWeight(dw, x, y, m, l.k, l.n); });
    add(n + " wgrad +bgrad", m, l.k, l.n,
        [&] { mm.BackwardWeightBias(dw, db, x, y, m, l.k, l.n); });
  }
  add("fc1 fwd +gelu", m, h, ffn, [&] { mm.ForwardGelu(y, aux, x, w, bias, m, h, ffn); });
  add("fc2 dgrad +dgelu", m, ffn, h, [&] { mm.BackwardDataGelu(y, x, w, aux, m, ffn, h); });
  add("head fwd", vrows, h, vocab, [&] { mm.Forward(y, x, w, nullptr, vrows, h, vocab); });
  add("head dgrad", vrows, h, vocab, [&] { mm.BackwardData(y, x, w, vrows, h, vocab); });
  add("head wgrad", vrows, h, vocab, [&] { mm.BackwardWeight(dw, x, y, vrows, h, vocab); });
  // FP8: operands K-contiguous (fwd: in, W; dgrad: dout, Wᵀ; wgrad: inᵀ, doutᵀ), unit scales.
  Fp8Matmul f8;
  auto* q1 = static_cast<uint8_t*>(Buffer(big));
  auto* q2 = static_cast<uint8_t*>(Buffer(big));
  auto* qt = static_cast<uint8_t*>(Buffer(big));
  auto* one = static_cast<float*>(Buffer(sizeof(float)));
  auto* amax = static_cast<float*>(Buffer(sizeof(float)));
  {
    const float v = 1.0f;
    LT_CUDA_CHECK(cudaMemcpy(one, &v, sizeof(v), cudaMemcpyHostToDevice));
  }
  const Fp8Format e4 = Fp8Format::kE4M3, e5 = Fp8Format::kE5M2;
  for (const Lin& l : {Lin{"qkv", h, 3 * h}, Lin{"fc1", h, ffn}, Lin{"fc2", ffn, h}}) {
    const std::string n = std::string(l.name) + " fp8";
    add(n + " fwd", m, l.k, l.n, [&] {
      f8.Gemm(l.n, m, l.k, {q1, e4, one}, {q2, e4, one}, y, CUDA_R_16BF, l.n, false, true);
    });
    add(n + " dgrad", m, l.k, l.n, [&] {
      f8.Gemm(l.k, m, l.n, {q1, e4, one}, {q2, e5, one}, y, CUDA_R_16BF, l.k, false, false);
    });
    add(n + " wgrad", m, l.k, l.n, [&] {
      f8.Gemm(l.k, l.n, m, {q1, e4, one}, {q2, e5, one}, dw, CUDA_R_32F, l.k, true, false);
    });
    // The cast of the product's input [m, k] with its transpose (for the weight gradient): bf16
    // read once, FP8 written twice.
    rows.push_back({n + " cast+T in", 0.0, TimeMs([&] {
                      CastToFp8<bf16>(q1, qt, amax, x, m, l.k, one, e4,
                                      leantron::trainer::cuda::MainStream());
                    }),
                    4.0 * m * l.k});
  }
  // The casts that compute what they cast (fp8.h's Fp8Source), both layouts: fc2's input from
  // fc1's output through tanh GELU or SwiGLU ([m, 2·ffn] read); fc1's output gradient from the
  // activation's gradient and fc1's output, the bias gradient summed; a plain output gradient
  // with its bias gradient.
  const int64_t widest = std::max(2 * ffn, 3 * h);
  auto* dbias = static_cast<float*>(Buffer(static_cast<size_t>(widest) * 4));
  auto* ws = static_cast<float*>(Buffer(Fp8BiasWorkspace(m, widest) * 4));
  auto cast = [&](const char* name, double bytes, Fp8Source src, int64_t cols, Fp8Format f,
                  bool bias) {
    rows.push_back({name, 0.0, TimeMs([&] {
                      CastSourceToFp8(q1, qt, amax, src, m, cols, one, f, bias ? dbias : nullptr,
                                      ws, MainStream());
                    }),
                    bytes});
  };
  const double mf = static_cast<double>(m) * ffn;
  cast("gelu cast+T", 4 * mf, {x, Fp8Activation::kGeluTanh}, ffn, e4, false);
  cast("dgelu cast+T+db", 6 * mf, {x, Fp8Activation::kGeluTanh, y}, ffn, e5, true);
  cast("swiglu cast+T", 6 * mf, {x, Fp8Activation::kSwiglu}, ffn, e4, false);
  cast("dswiglu cast+T", 10 * mf, {x, Fp8Activation::kSwiglu, y}, 2 * ffn, e5, false);
  cast("grad cast+T+db", 4.0 * m * 3 * h, {x}, 3 * h, e5, true);
  std::printf("tokens %ld hidden %ld ffn %ld (head: %ld rows x vocab %ld)\n", long(m), long(h),
              long(ffn), long(vrows), long(vocab));
  for (const Row& r : rows) {
    if (r.flops == 0) {
      std::printf("  %-18s %8.3f ms  %6.0f GB/s\n", r.name.c_str(), r.ms,
                  r.bytes / (r.ms * 1e-3) / 1e9);
    } else {
      std::printf("  %-18s %8.3f ms  %6.1f TFLOP/s\n", r.name.c_str(), r.ms,
                  r.flops / (r.ms * 1e-3) / 1e12);
    }
  }
  return 0;
}
