// The optimizer step's passes over the flat buffers in isolation, on the device, in GB/s of the
// bytes each must read and write: AdamW with the bf16 copy (p, g, m, v read; p, m, v and the copy
// written: 30 bytes a parameter), AdamW writing an FP8 layer's weight copies too (AdamWToFp8, both
// layouts: 32), the gradient norm's sum of squares (4) and the gradient zeroing (4). What a step
// of `train` spends outside the per-op profile (`--timing-log-level 2`) for that many parameters.
//   bench_optimizer [parameters [fp8 columns]]   (defaults: Llama-3.2-1B's 1.236e9, 2048)
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench/gpu/gpu_timing.h"
#include "trainer/core/adamw.h"
#include "trainer/cuda/cuda_util.h"
#include "trainer/cuda/kernels/fp8.h"
#include "trainer/cuda/kernels/kernels.h"

using namespace leantron::trainer;
using namespace leantron::trainer::cuda;

using leantron::bench::DeviceZeros;
using leantron::bench::TimeMs;

int main(int argc, char** argv) {
  const int64_t cols = argc > 2 ? std::atoll(argv[2]) : 2048;
  int64_t n = argc > 1 ? std::atoll(argv[1]) : 1236000000;
  n = n / (4 * cols) * (4 * cols);  // rows a multiple of 4, as the vector path needs
  float* p = DeviceZeros<float>(n);
  float* g = DeviceZeros<float>(n);
  float* m = DeviceZeros<float>(n);
  float* v = DeviceZeros<float>(n);
  bf16* low = DeviceZeros<bf16>(n);
  uint8_t* q = DeviceZeros<uint8_t>(n);
  uint8_t* qt = DeviceZeros<uint8_t>(n);
  float* scalars = DeviceZeros<float>(2);  // amax, scale (0: all casts to zero, same traffic)
  const size_t scratch_bytes = SumSquaresScratchBytes(n);
  Scratch scratch{DeviceZeros<char>(scratch_bytes), scratch_bytes};
  const AdamWConstants c = MakeAdamWConstants(1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 3, 1.0f);
  struct Row {
    std::string name;
    double bytes;
    float ms;
  };
  const double dn = static_cast<double>(n);
  std::vector<Row> rows = {
      {"AdamW + bf16 copy", 30 * dn, TimeMs([&] { AdamW(p, g, m, v, n, c, low, MainStream()); })},
      {"AdamW + bf16 + FP8 (both layouts)", 32 * dn, TimeMs([&] {
         AdamWToFp8(p, g, m, v, c, low, n / cols, cols, q, qt, scalars, scalars + 1,
                    Fp8Format::kE4M3, MainStream());
       })},
      {"gradient sum of squares", 4 * dn, TimeMs([&] { SumSquares(g, n, scratch, MainStream()); })},
      {"gradient zeroing", 4 * dn,
       TimeMs([&] { LT_CUDA_CHECK(cudaMemsetAsync(g, 0, n * sizeof(float), MainStream())); })},
  };
  std::printf("%.3fB parameters (FP8 weight as [%ld, %ld])\n", dn / 1e9, long(n / cols),
              long(cols));
  for (const Row& r : rows)
    std::printf("  %-34s %8.3f ms  %6.0f GB/s\n", r.name.c_str(), r.ms,
                r.bytes / (r.ms * 1e-3) / 1e9);
  return 0;
}
