// The fused residual + dropout + LayerNorm / RMSNorm kernels, forward and backward (float and
// bf16), against CpuOps on the T-rounded inputs, on row shapes that reach every code path.
#include "tests/gpu/gpu_test_util.h"
#include "trainer/cuda/kernels/kernels.h"

namespace leantron::trainer::cuda {
namespace {

using namespace testutil;
TYPED_TEST_SUITE(KernelTest, KernelTypes);

// Unaligned (loop), 1/2/4/8 vectors per thread in bf16 (float: 1/4/8/loop), and beyond.
const std::vector<std::pair<int64_t, int64_t>> kFusedShapes = {
    {37, 129}, {1000, 1280}, {1000, 1283}, {16, 6144}, {16, 12288}, {5, 20480}, {2, 70000}};

// x = residual + Dropout(branch), LayerNorm(x) (or RMSNorm), against CpuOps on the T-rounded
// inputs, with x rounded to T as the kernel stores it. With `two_branches` (LayerNorm) the branch
// comes in two addends, summed and rounded to T first.
template <typename T>
void CheckFusedNormForward(Ops* cpu, bool rms, int64_t rows, int64_t cols, bool residual, float p,
                           bool two_branches = false) {
  SCOPED_TRACE(testing::Message() << TypeName<T>() << (rms ? " rms " : " ln ") << rows << "x"
                                  << cols << " residual " << residual << " p " << p
                                  << " two branches " << two_branches);
  const HiddenDropout drop = TestDropout(p);
  const auto res = RoundT<T>(Rand(rows * cols, 140, 2.0f, 0.3f));
  const auto br = RoundT<T>(Rand(rows * cols, 141));
  const auto br2 = RoundT<T>(Rand(rows * cols, 144));
  const auto w = Rand(cols, 142, 0.5f, 1.0f), b = Rand(cols, 143);
  std::vector<float> x = br;
  if (two_branches) {
    cpu->AddInPlace(x.data(), br2.data(), x.size());
    x = RoundT<T>(x);
  }
  if (residual) {
    cpu->Dropout(x.data(), rows, cols, drop);
    cpu->AddInPlace(x.data(), res.data(), x.size());
    x = RoundT<T>(x);
  }
  std::vector<float> out(rows * cols), mean(rows), rstd(rows);
  if (rms) {
    cpu->RmsNormForward(out.data(), rstd.data(), x.data(), w.data(), rows, cols, 1e-5f);
  } else {
    cpu->LayerNormForward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), rows,
                          cols, 1e-5f);
  }

  auto d_res = DevT<T>(res);
  auto d_br = DevT<T>(br);
  auto d_br2 = DevT<T>(br2);
  Dev<float> d_w(w), d_b(b), d_mean(rows), d_rstd(rows);
  Dev<T> d_x(rows * cols), d_out(rows * cols);
  if (rms) {
    AddRmsNormForward<T>(residual ? d_x.get() : nullptr, d_out.get(), d_rstd.get(),
                         residual ? d_res->get() : nullptr, d_br->get(), d_w.get(), rows, cols,
                         1e-5f, drop, MainStream());
  } else {
    AddLayerNormForward<T>(residual ? d_x.get() : nullptr, d_out.get(), d_mean.get(), d_rstd.get(),
                           residual ? d_res->get() : nullptr, d_br->get(), d_w.get(), d_b.get(),
                           rows, cols, 1e-5f, drop, MainStream(),
                           two_branches ? d_br2->get() : nullptr);
  }
  if (residual) {
    EXPECT_TRUE(Close(DownF(d_x), x, Tol<T>())) << "x_out";
  }
  EXPECT_TRUE(Close(DownF(d_out), out, Tol<T>())) << "out";
  if (!rms) {
    EXPECT_TRUE(Close(d_mean.Download(), mean, Tol<T>())) << "mean";
  }
  EXPECT_TRUE(Close(d_rstd.Download(), rstd, Tol<T>())) << "rstd";
}

TYPED_TEST(KernelTest, AddLayerNormForward) {
  for (auto [rows, cols] : kFusedShapes) {
    CheckFusedNormForward<TypeParam>(this->cpu_.get(), false, rows, cols, false, 0.0f);
    CheckFusedNormForward<TypeParam>(this->cpu_.get(), false, rows, cols, true, 0.0f);
    CheckFusedNormForward<TypeParam>(this->cpu_.get(), false, rows, cols, true, 0.1f);
    CheckFusedNormForward<TypeParam>(this->cpu_.get(), false, rows, cols, true, 0.1f, true);
  }
}

TYPED_TEST(KernelTest, AddRmsNormForward) {
  for (auto [rows, cols] : kFusedShapes) {
    CheckFusedNormForward<TypeParam>(this->cpu_.get(), true, rows, cols, false, 0.0f);
    CheckFusedNormForward<TypeParam>(this->cpu_.get(), true, rows, cols, true, 0.1f);
  }
}

// dx = dresidual + ∂norm, dbranch = Dropout(dx), dw/db +=, against CpuOps on rounded inputs.
// `in_place` makes dx alias dresidual.
template <typename T>
void CheckNormBackward(Ops* cpu, bool rms, int64_t rows, int64_t cols, bool with_residual,
                       bool with_branch, bool in_place, float p) {
  SCOPED_TRACE(testing::Message() << TypeName<T>() << (rms ? " rms " : " ln ") << rows << "x"
                                  << cols << " dresidual " << with_residual << " dbranch "
                                  << with_branch << " in_place " << in_place << " p " << p);
  const HiddenDropout drop = TestDropout(p);
  const auto x = RoundT<T>(Rand(rows * cols, 150, 2.0f, 0.3f));
  const auto w = Rand(cols, 151, 0.5f, 1.0f), b = Rand(cols, 152);
  std::vector<float> out(rows * cols), mean(rows), rstd(rows);
  if (rms) {
    cpu->RmsNormForward(out.data(), rstd.data(), x.data(), w.data(), rows, cols, 1e-5f);
  } else {
    cpu->LayerNormForward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), rows,
                          cols, 1e-5f);
  }
  const auto dout = RoundT<T>(Rand(rows * cols, 153));
  const auto dres =
      with_residual ? RoundT<T>(Rand(rows * cols, 154)) : std::vector<float>(rows * cols, 0.0f);
  const auto dw0 = Rand(cols, 155), db0 = Rand(cols, 156);
  auto dx = dres, dw = dw0, db = db0;
  if (rms) {
    cpu->RmsNormBackward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), rstd.data(), rows,
                         cols);
  } else {
    cpu->LayerNormBackward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(),
                           mean.data(), rstd.data(), rows, cols);
  }
  auto dbranch = dx;
  cpu->Dropout(dbranch.data(), rows, cols, drop);

  auto d_x = DevT<T>(x);
  auto d_dout = DevT<T>(dout);
  auto d_dres = DevT<T>(dres);
  Dev<T> d_dx_own(rows * cols), d_dbranch(rows * cols);
  T* d_dx = in_place ? d_dres->get() : d_dx_own.get();
  Dev<float> d_w(w), d_mean(mean), d_rstd(rstd), d_dw(dw0), d_db(db0);
  const size_t bytes =
      rms ? RmsNormBackwardScratchBytes(rows, cols) : LayerNormBackwardScratchBytes(rows, cols);
  DevScratch scratch(bytes);
  if (rms) {
    RmsNormBackward<T>(d_dx, with_branch ? d_dbranch.get() : nullptr, d_dw.get(), d_dout->get(),
                       with_residual ? d_dres->get() : nullptr, d_x->get(), d_w.get(), d_rstd.get(),
                       rows, cols, drop, scratch.get(), MainStream());
  } else {
    LayerNormBackward<T>(d_dx, with_branch ? d_dbranch.get() : nullptr, d_dw.get(), d_db.get(),
                         d_dout->get(), with_residual ? d_dres->get() : nullptr, d_x->get(),
                         d_w.get(), d_mean.get(), d_rstd.get(), rows, cols, drop, scratch.get(),
                         MainStream());
  }
  EXPECT_TRUE(Close(FromT<T>(in_place ? d_dres->Download() : d_dx_own.Download()), dx, Tol<T>()))
      << "dx";
  if (with_branch) {
    EXPECT_TRUE(Close(DownF(d_dbranch), dbranch, Tol<T>())) << "dbranch";
  }
  EXPECT_TRUE(Close(d_dw.Download(), dw, 1e-4)) << "dw";
  if (!rms) {
    EXPECT_TRUE(Close(d_db.Download(), db, 1e-4)) << "db";
  }
}

TYPED_TEST(KernelTest, LayerNormBackward) {
  using T = TypeParam;
  for (auto [rows, cols] : kFusedShapes) {
    CheckNormBackward<T>(this->cpu_.get(), false, rows, cols, false, false, false, 0.0f);
    CheckNormBackward<T>(this->cpu_.get(), false, rows, cols, true, true, false, 0.1f);
    CheckNormBackward<T>(this->cpu_.get(), false, rows, cols, true, true, true, 0.1f);
  }
  CheckNormBackward<T>(this->cpu_.get(), false, 3000, 64, true, true, false, 0.0f);
}

TYPED_TEST(KernelTest, RmsNormBackward) {
  using T = TypeParam;
  for (auto [rows, cols] : kFusedShapes) {
    CheckNormBackward<T>(this->cpu_.get(), true, rows, cols, false, false, false, 0.0f);
    CheckNormBackward<T>(this->cpu_.get(), true, rows, cols, true, true, true, 0.1f);
  }
}

}  // namespace
}  // namespace leantron::trainer::cuda
