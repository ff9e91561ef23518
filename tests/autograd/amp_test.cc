// Mixed precision: bfloat16/float16 conversions (exact cases, ties, inf/NaN, subnormals, and
// sweeps against a reference rounding), low-precision tensors through the ops, the autocast
// scope's op dtypes, gradients reaching float32 master weights, and an MLP trained in bf16
// autocast and in fp16 with a GradScaler against the same MLP in float32.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <thread>

#include "loom/autograd/autocast.h"
#include "loom/autograd/grad_scaler.h"
#include "test_util.h"

namespace loom::ag {
namespace {

uint16_t bf(float f) {
  return toBFloat16(f).bits;
}
uint16_t hf(float f) {
  return toFloat16(f).bits;
}
float fromBits(uint32_t b) {
  return std::bit_cast<float>(b);
}

TEST(Half, BFloat16ExactAndTies) {
  EXPECT_EQ(bf(1.0f), 0x3F80);
  EXPECT_EQ(bf(-2.0f), 0xC000);
  EXPECT_EQ(bf(0.0f), 0x0000);
  EXPECT_EQ(bf(-0.0f), 0x8000);
  // 1 + 2^-8 lies halfway between 1 (0x3F80, even) and 1 + 2^-7 (0x3F81): to even.
  EXPECT_EQ(bf(fromBits(0x3F808000)), 0x3F80);
  // 1 + 3 * 2^-8 lies halfway between 0x3F81 (odd) and 0x3F82: to even, up.
  EXPECT_EQ(bf(fromBits(0x3F818000)), 0x3F82);
  EXPECT_EQ(bf(fromBits(0x3F808001)), 0x3F81);  // just above half
  EXPECT_EQ(bf(fromBits(0x3F807FFF)), 0x3F80);  // just below half
  EXPECT_EQ(toFloat(BFloat16{0x4049}), 3.140625f);
}

TEST(Half, BFloat16InfNanOverflowSubnormal) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(bf(inf), 0x7F80);
  EXPECT_EQ(bf(-inf), 0xFF80);
  EXPECT_EQ(bf(std::numeric_limits<float>::max()), 0x7F80);  // rounds past the largest finite
  EXPECT_EQ(bf(fromBits(0x7F7F0000)), 0x7F7F);               // the largest finite bf16
  // NaNs stay NaN (a signaling NaN whose payload is all below bit 16 must not become inf).
  for (uint32_t nan : {0x7FC00000u, 0x7F800001u, 0xFF800001u, 0x7FFFFFFFu}) {
    const uint16_t b = bf(fromBits(nan));
    EXPECT_TRUE(std::isnan(toFloat(BFloat16{b}))) << std::hex << nan;
    EXPECT_EQ(b & 0x8000, (nan >> 16) & 0x8000) << "sign kept";
  }
  // float32 subnormals: bf16 has the same exponent range, so they round on the mantissa.
  EXPECT_EQ(bf(fromBits(0x00010000)), 0x0001);
  EXPECT_EQ(toFloat(BFloat16{0x0001}), fromBits(0x00010000));
  EXPECT_EQ(bf(fromBits(0x00008000)), 0x0000);  // tie -> even 0
  EXPECT_EQ(bf(fromBits(0x00018000)), 0x0002);  // tie -> even 2
  EXPECT_EQ(bf(fromBits(0x00000001)), 0x0000);
}

TEST(Half, Float16ExactTiesAndRange) {
  EXPECT_EQ(hf(1.0f), 0x3C00);
  EXPECT_EQ(hf(-2.0f), 0xC000);
  EXPECT_EQ(hf(65504.0f), 0x7BFF);              // the largest finite half
  EXPECT_EQ(hf(65519.99f), 0x7BFF);             // below the halfway point to 65536
  EXPECT_EQ(hf(65520.0f), 0x7C00);              // halfway: to even, which is infinity
  EXPECT_EQ(hf(1.0f + 0x1p-11f), 0x3C00);       // tie -> even
  EXPECT_EQ(hf(1.0f + 3 * 0x1p-11f), 0x3C02);   // tie -> even (up)
  EXPECT_EQ(hf(0x1p-14f), 0x0400);              // smallest normal
  EXPECT_EQ(hf(0x1p-24f), 0x0001);              // smallest subnormal
  EXPECT_EQ(hf(1023 * 0x1p-24f), 0x03FF);       // largest subnormal
  EXPECT_EQ(hf(0x1p-25f), 0x0000);              // half the smallest subnormal: tie -> 0
  EXPECT_EQ(hf(0x1.000002p-25f), 0x0001);       // just above it
  EXPECT_EQ(hf(3 * 0x1p-25f), 0x0002);          // 1.5 units: tie -> even 2
  EXPECT_EQ(hf(-0x1p-30f), 0x8000);             // underflow keeps the sign
  EXPECT_EQ(hf((1023.5f) * 0x1p-24f), 0x0400);  // rounds up into the normals
  EXPECT_EQ(toFloat(Float16{0x0001}), 0x1p-24f);
  EXPECT_EQ(toFloat(Float16{0x7BFF}), 65504.0f);
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(hf(inf), 0x7C00);
  EXPECT_EQ(hf(-inf), 0xFC00);
  EXPECT_EQ(hf(1e10f), 0x7C00);
  for (uint32_t nan : {0x7FC00000u, 0x7F800001u, 0xFFC00000u}) {
    EXPECT_TRUE(std::isnan(toFloat(Float16{hf(fromBits(nan))}))) << std::hex << nan;
  }
  EXPECT_TRUE(std::isinf(toFloat(Float16{0x7C00})));
}

// Every non-NaN 16-bit pattern survives toFloat and back unchanged.
TEST(Half, RoundTripEveryPattern) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const auto bits = static_cast<uint16_t>(b);
    const float fb = toFloat(BFloat16{bits});
    if (!std::isnan(fb)) {
      ASSERT_EQ(toBFloat16(fb).bits, bits) << std::hex << b;
    }
    const float fh = toFloat(Float16{bits});
    if (!std::isnan(fh)) {
      ASSERT_EQ(toFloat16(fh).bits, bits) << std::hex << b;
    }
  }
}

// A sweep of float32 bit patterns (every 389th) against reference roundings: bf16 against the
// nearest-even choice between its two neighbours computed in double; fp16 against the
// compiler's _Float16 conversion where it exists (IEEE round to nearest even).
TEST(Half, SweepAgainstReference) {
  int64_t checked = 0;
  for (uint64_t u = 0; u <= 0xFFFFFFFFull; u += 389) {
    const float f = fromBits(static_cast<uint32_t>(u));
    if (std::isnan(f) || std::isinf(f)) continue;
    const uint32_t x = static_cast<uint32_t>(u);
    const uint16_t lo = static_cast<uint16_t>(x >> 16);  // truncation (toward zero)
    const uint16_t hi = static_cast<uint16_t>(lo + 1);   // next away from zero
    const double dl = std::abs(static_cast<double>(f) - toFloat(BFloat16{lo}));
    // Past the largest finite value the upper neighbour is 2^128 (which rounds to infinity).
    const double hiValue = (hi & 0x7FFF) == 0x7F80 ? std::copysign(0x1p128, static_cast<double>(f))
                                                   : static_cast<double>(toFloat(BFloat16{hi}));
    const double dh = std::abs(hiValue - static_cast<double>(f));
    const uint16_t want = dl < dh ? lo : dh < dl ? hi : ((lo & 1) ? hi : lo);
    ASSERT_EQ(bf(f), want) << std::hex << x;
#ifdef __FLT16_MAX__
    const _Float16 ref = static_cast<_Float16>(f);
    ASSERT_EQ(hf(f), std::bit_cast<uint16_t>(ref)) << std::hex << x;
#endif
    ++checked;
  }
  EXPECT_GT(checked, 10000000);
}

// Tensor::to converts float32 <-> float16 arrays with F16C where built with it: bitwise the
// scalar conversions, NaNs included, over every half pattern and a sweep of float32 patterns
// (lengths that are not multiples of the vector width reach the scalar tail too).
TEST(LowPrecision, ArrayConversionsMatchScalar) {
  Tensor h = empty({0x10000 + 3}, DType::kFloat16);
  for (uint32_t b = 0; b < 0x10003; ++b) h.data<Float16>()[b] = Float16{static_cast<uint16_t>(b)};
  const std::vector<float> f = h.to(DType::kFloat32).toVector<float>();
  for (uint32_t b = 0; b < 0x10003; ++b) {
    ASSERT_EQ(std::bit_cast<uint32_t>(f[b]),
              std::bit_cast<uint32_t>(toFloat(Float16{static_cast<uint16_t>(b)})))
        << std::hex << b;
  }
  std::vector<float> src;
  for (uint64_t u = 0; u <= 0xFFFFFFFFull; u += 65537)
    src.push_back(fromBits(static_cast<uint32_t>(u)));
  src.push_back(fromBits(0x7F800001u));  // a signaling NaN
  const Tensor back = fromVector(src).to(DType::kFloat16);
  for (size_t i = 0; i < src.size(); ++i) {
    ASSERT_EQ(back.data<Float16>()[i].bits, hf(src[i]))
        << std::hex << std::bit_cast<uint32_t>(src[i]);
  }
}

TEST(LowPrecision, TensorStorageAndConversions) {
  Tensor x = fromVector(std::vector<float>{1.0f, 1.0f + 0x1p-8f, 65520.0f, -0.1f});
  Tensor b = x.to(DType::kBFloat16);
  Tensor h = x.to(DType::kFloat16);
  EXPECT_EQ(b.dtype(), DType::kBFloat16);
  EXPECT_EQ(b.nbytes(), 8u);
  EXPECT_EQ(b.data<BFloat16>()[1].bits, 0x3F80);
  EXPECT_EQ(h.data<Float16>()[2].bits, 0x7C00);
  EXPECT_EQ(b.to(DType::kFloat32).toVector<float>()[3], toFloat(toBFloat16(-0.1f)));
  EXPECT_EQ(h.to(DType::kFloat64).toVector<double>()[0], 1.0);
  EXPECT_EQ(b.to(DType::kFloat16).data<Float16>()[0].bits, 0x3C00);
  EXPECT_EQ(scalarTensor(2.5, DType::kFloat16).item(), 2.5);
  EXPECT_EQ(full({3}, 0.1, DType::kBFloat16).data<BFloat16>()[2].bits, bf(0.1f));
  EXPECT_THROW(b.data<float>(), std::invalid_argument);
  Generator g1(3), g2(3);
  Tensor r = randn({5}, g1, DType::kBFloat16);
  EXPECT_EQ(r.to(DType::kFloat32).toVector<float>(),
            randn({5}, g2).to(DType::kBFloat16).to(DType::kFloat32).toVector<float>());
}

TEST(LowPrecision, ShapeOpsMoveBitsAndGradients) {
  Generator gen(1);
  Tensor x = randn({2, 3, 4}, gen).to(DType::kBFloat16).setRequiresGrad(true);
  Tensor y = cat({permute(x, {2, 0, 1}), slice(permute(x, {2, 0, 1}), 1, 0, 1)}, 1);
  EXPECT_EQ(y.dtype(), DType::kBFloat16);
  EXPECT_EQ(y.shape(), (Shape{4, 3, 3}));
  // y[k, i, j] = x[i, j, k]; the extra rows repeat i = 0.
  EXPECT_EQ(y.data<BFloat16>()[(1 * 3 + 0) * 3 + 2].bits,
            x.data<BFloat16>()[(0 * 3 + 2) * 4 + 1].bits);
  sum(y).backward();
  ASSERT_EQ(x.grad().dtype(), DType::kBFloat16);
  Tensor gx = x.grad().to(DType::kFloat32);
  EXPECT_EQ(gx.toVector<float>()[0], 2.0f);   // x[0, 0, 0] used twice
  EXPECT_EQ(gx.toVector<float>()[23], 1.0f);  // x[1, 2, 3] once
}

TEST(LowPrecision, OpsComputeInFloat32AndRoundOnce) {
  Tensor a = fromVector(std::vector<float>{1.0f, 3.0f}).to(DType::kBFloat16);
  Tensor b = fromVector(std::vector<float>{0x1p-9f, 0x1p-9f}).to(DType::kBFloat16);
  // 1 + 2^-9 rounds back to 1, 3 + 2^-9 to 3: one rounding of the float32 sum.
  Tensor s = add(a, b);
  EXPECT_EQ(s.dtype(), DType::kBFloat16);
  EXPECT_EQ(s.to(DType::kFloat32).toVector<float>(), (std::vector<float>{1.0f, 3.0f}));
  EXPECT_EQ(relu(a).dtype(), DType::kBFloat16);
  EXPECT_EQ((a * 2.0).dtype(), DType::kBFloat16);  // a scalar never widens a tensor
  EXPECT_EQ((a * 2.0).to(DType::kFloat32).toVector<float>(), (std::vector<float>{2.0f, 6.0f}));
  EXPECT_EQ(add(a, a.to(DType::kFloat32)).dtype(), DType::kFloat32);
  EXPECT_EQ(add(a, a.to(DType::kFloat16)).dtype(), DType::kFloat32);
  EXPECT_EQ(add(a, a.to(DType::kFloat64)).dtype(), DType::kFloat64);
  // Outside autocast the fp32-list ops return their input's dtype.
  EXPECT_EQ(softmax(a, 0).dtype(), DType::kBFloat16);
  EXPECT_EQ(sum(a).dtype(), DType::kBFloat16);
  EXPECT_EQ(matmul(a.reshape({1, 2}), a.reshape({2, 1})).dtype(), DType::kBFloat16);
  EXPECT_EQ(matmul(a.reshape({1, 2}), a.reshape({2, 1})).item(), 10.0);
  EXPECT_THROW(matmul(a.reshape({1, 2}), a.to(DType::kFloat16).reshape({2, 1})),
               std::invalid_argument);
}

// Under autocast: matmul, linear and conv2d give the low dtype; the fp32 list gives float32;
// other ops keep their input's dtype; float64 is never cast.
TEST(Autocast, OpDtypes) {
  for (DType low : {DType::kBFloat16, DType::kFloat16}) {
    Generator gen(2);
    Tensor x = randn({4, 8}, gen), w = randn({3, 8}, gen), bias = randn({3}, gen);
    Tensor img = randn({1, 2, 5, 5}, gen), k = randn({3, 2, 3, 3}, gen);
    Tensor labels = fromVector(std::vector<int64_t>{0, 1, 2, 0});
    AutocastGuard guard(low);
    ASSERT_EQ(autocastDType(), low);
    Tensor y = linear(x, w, bias);
    EXPECT_EQ(y.dtype(), low);
    EXPECT_EQ(matmul(x, transpose(w)).dtype(), low);
    EXPECT_EQ(conv2d(img, k, Tensor(), {.padH = 1, .padW = 1}).dtype(), low);
    EXPECT_EQ(relu(y).dtype(), low);
    EXPECT_EQ(gelu(y).dtype(), low);
    EXPECT_EQ(add(y, bias).dtype(), DType::kFloat32);  // promotion, as in PyTorch
    EXPECT_EQ(softmax(y, 1).dtype(), DType::kFloat32);
    EXPECT_EQ(logSoftmax(y, 1).dtype(), DType::kFloat32);
    EXPECT_EQ(sum(y).dtype(), DType::kFloat32);
    EXPECT_EQ(mean(y, 0).dtype(), DType::kFloat32);
    EXPECT_EQ(exp(y).dtype(), DType::kFloat32);
    EXPECT_EQ(layerNorm(y, {3}, Tensor(), Tensor()).dtype(), DType::kFloat32);
    EXPECT_EQ(crossEntropy(y, labels).dtype(), DType::kFloat32);
    EXPECT_EQ(mseLoss(y, zeros({4, 3})).dtype(), DType::kFloat32);
    EXPECT_EQ(linear(x.to(DType::kFloat64), w.to(DType::kFloat64)).dtype(), DType::kFloat64);
    {
      AutocastGuard off(low, false);
      EXPECT_FALSE(autocastDType().has_value());
      EXPECT_EQ(linear(x, w).dtype(), DType::kFloat32);
    }
    EXPECT_EQ(autocastDType(), low);
    std::optional<DType> other = low;
    std::thread([&] { other = autocastDType(); }).join();
    EXPECT_FALSE(other.has_value()) << "autocast is thread-local";
  }
  EXPECT_FALSE(autocastDType().has_value());
  EXPECT_THROW(AutocastGuard(DType::kFloat32), std::invalid_argument);
}

// linear under bf16 autocast = the bf16 rounding of the float32-accumulated product of the
// bf16-rounded operands, within one bf16 ulp of a double-precision reference.
TEST(Autocast, LinearValuesAndMasterGradients) {
  Generator gen(5);
  Tensor x = randn({16, 32}, gen).setRequiresGrad(true);
  Tensor w = randn({8, 32}, gen).setRequiresGrad(true);
  Tensor bias = randn({8}, gen).setRequiresGrad(true);
  Tensor y;
  {
    AutocastGuard guard(DType::kBFloat16);
    y = linear(x, w, bias);
  }
  ASSERT_EQ(y.dtype(), DType::kBFloat16);
  auto r = [](float v) { return static_cast<double>(toFloat(toBFloat16(v))); };
  const float* px = x.data<float>();
  const float* pw = w.data<float>();
  const float* pb = bias.data<float>();
  const std::vector<float> got = y.to(DType::kFloat32).toVector<float>();
  for (int i = 0; i < 16; ++i) {
    for (int o = 0; o < 8; ++o) {
      double ref = r(pb[o]);
      for (int k = 0; k < 32; ++k) ref += r(px[i * 32 + k]) * r(pw[o * 32 + k]);
      ASSERT_LE(std::abs(got[i * 8 + o] - ref), std::abs(ref) * 0x1p-8 + 1e-6) << i << "," << o;
    }
  }
  // Gradients reach the float32 leaves as float32, close to the float32 computation's.
  Tensor g = randn({16, 8}, gen);
  sum(mul(y, g)).backward();
  ASSERT_EQ(w.grad().dtype(), DType::kFloat32);
  ASSERT_EQ(x.grad().dtype(), DType::kFloat32);
  ASSERT_EQ(bias.grad().dtype(), DType::kFloat32);
  Tensor x2 = x.detach().clone().setRequiresGrad(true),
         w2 = w.detach().clone().setRequiresGrad(true);
  sum(mul(linear(x2, w2, bias.detach()), g)).backward();
  auto relErr = [](const Tensor& a, const Tensor& b) {
    double num = 0, den = 0;
    const auto va = a.toVector<float>(), vb = b.toVector<float>();
    for (size_t i = 0; i < va.size(); ++i) {
      num = std::max(num, static_cast<double>(std::abs(va[i] - vb[i])));
      den = std::max(den, static_cast<double>(std::abs(vb[i])));
    }
    return num / den;
  };
  EXPECT_LT(relErr(w.grad(), w2.grad()), 2e-2);
  EXPECT_LT(relErr(x.grad(), x2.grad()), 2e-2);
  EXPECT_GT(relErr(w.grad(), w2.grad()), 0.0) << "bf16 rounding should show";
}

// A transformer block's pieces and a conv net under bf16 autocast: forward close to float32
// (within bf16's precision), float32 gradients on every parameter, close to float32's.
TEST(Autocast, AttentionAndConvModulesCloseToFloat32) {
  Generator gen(11);
  auto attn = std::make_shared<nn::CausalSelfAttention>(32, 4);
  auto ln = std::make_shared<nn::LayerNorm>(Shape{32});
  auto conv = std::make_shared<nn::Conv2d>(3, 8, 3, nn::Conv2dOptions{.padding = 1});
  Tensor x = randn({2, 16, 32}, gen);
  Tensor img = randn({2, 3, 8, 8}, gen);
  auto run = [&](bool autocast) {
    for (auto* m : std::initializer_list<nn::Module*>{attn.get(), ln.get(), conv.get()}) {
      for (Tensor& p : m->parameters()) p.zeroGrad(true);
    }
    std::optional<AutocastGuard> ac;
    if (autocast) ac.emplace(DType::kBFloat16);
    Tensor y = (*ln)(add(x, (*attn)(x)));
    Tensor c = (*conv)(img);
    EXPECT_EQ(y.dtype(), DType::kFloat32);  // layerNorm is fp32-list
    EXPECT_EQ(c.dtype(), autocast ? DType::kBFloat16 : DType::kFloat32);
    Tensor loss = add(sum(mul(y, y)), sum(cast(c, DType::kFloat32)));
    ac.reset();
    loss.backward();
    std::vector<Tensor> grads;
    for (auto* m : std::initializer_list<nn::Module*>{attn.get(), ln.get(), conv.get()}) {
      for (Tensor& p : m->parameters()) {
        EXPECT_EQ(p.grad().dtype(), DType::kFloat32);
        grads.push_back(p.grad().clone());
      }
    }
    return std::make_pair(loss.item(), grads);
  };
  const auto [l32, g32] = run(false);
  const auto [l16, g16] = run(true);
  EXPECT_NEAR(l16, l32, 1e-2 * std::abs(l32));
  EXPECT_NE(l16, l32);
  ASSERT_EQ(g16.size(), g32.size());
  for (size_t i = 0; i < g32.size(); ++i) {
    const auto a = g16[i].toVector<float>(), b = g32[i].toVector<float>();
    double diff = 0, scale = 0;
    for (size_t k = 0; k < a.size(); ++k) {
      diff = std::max(diff, static_cast<double>(std::abs(a[k] - b[k])));
      scale = std::max(scale, static_cast<double>(std::abs(b[k])));
    }
    EXPECT_LE(diff, 5e-2 * scale) << "parameter " << i;
  }
}

TEST(Autocast, CastBackwardCastsTheGradientBack) {
  Tensor x = fromVector(std::vector<float>{1.0f, 2.0f, 3.0f}).setRequiresGrad(true);
  Tensor h = cast(x, DType::kFloat16);
  EXPECT_TRUE(cast(h, DType::kFloat16).is(h));
  Tensor g = fromVector(std::vector<float>{0.5f, 1.0f + 0x1p-12f, 70000.0f}).to(DType::kFloat16);
  h.backward(g);
  ASSERT_EQ(x.grad().dtype(), DType::kFloat32);
  const auto gx = x.grad().toVector<float>();
  EXPECT_EQ(gx[0], 0.5f);
  EXPECT_EQ(gx[1], 1.0f);          // the fp16 gradient was already rounded
  EXPECT_TRUE(std::isinf(gx[2]));  // an fp16 overflow reaches the master gradient as inf
}

// float64 gradient check through the low-precision entry points: with float64 operands
// autocast must stay out of the way, so the analytic gradients match finite differences.
TEST(Autocast, Float64GradCheckUnderAutocast) {
  AutocastGuard guard(DType::kBFloat16);
  Generator gen(9);
  test_util::gradCheck(
      "linear+softmax under autocast",
      [](const std::vector<Tensor>& in) { return softmax(linear(in[0], in[1], in[2]), 1); },
      {randn({3, 4}, gen, DType::kFloat64), randn({2, 4}, gen, DType::kFloat64),
       randn({2}, gen, DType::kFloat64)});
}

// float64 gradient checks through the promotion paths: a bfloat16 constant operand is widened
// to float64, and the gradient of the float64 input is exact.
TEST(LowPrecision, Float64GradCheckThroughPromotion) {
  Generator gen(13);
  const Tensor c = randn({3, 4}, gen).to(DType::kBFloat16);
  const Tensor r = randn({4}, gen).to(DType::kFloat16);
  test_util::gradCheck("mul/add/div with low-precision constants",
                       [c, r](const std::vector<Tensor>& in) {
                         Tensor y = add(mul(in[0], c), div(in[0], r + 3.0));
                         EXPECT_EQ(y.dtype(), DType::kFloat64);
                         return y;
                       },
                       {randn({3, 4}, gen, DType::kFloat64)});
}

TEST(LowPrecision, ClearErrors) {
  Tensor p = zeros({2}, DType::kBFloat16).setRequiresGrad(true);
  try {
    optim::SGD sgd({p}, 0.1);
    p.setGrad(zeros({2}, DType::kBFloat16));
    sgd.step();
    FAIL() << "expected a throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("bfloat16"), std::string::npos) << e.what();
  }
  EXPECT_THROW(saveNpy("/tmp/loom_amp_never_written.npy", p), std::invalid_argument);
}

TEST(LowPrecision, SafetensorsRoundTrip) {
  const std::string path = ::testing::TempDir() + "loom_amp_test.safetensors";
  Tensor b = fromVector(std::vector<float>{1.5f, -0.1f}).to(DType::kBFloat16);
  Tensor h = fromVector(std::vector<float>{65504.0f, 0x1p-24f}).to(DType::kFloat16);
  saveSafetensors(path, {{"b", b}, {"h", h}});
  const auto loaded = loadSafetensors(path);
  ASSERT_EQ(loaded.size(), 2u);
  for (const auto& [name, t] : loaded) {
    const Tensor& want = name == "b" ? b : h;
    ASSERT_EQ(t.dtype(), want.dtype()) << name;
    EXPECT_EQ(std::memcmp(t.rawData(), want.rawData(), want.nbytes()), 0) << name;
  }
  std::remove(path.c_str());
}

// ---- training: the same MLP from the same weights, three ways ----

enum class Mode { kFloat32, kBFloat16Autocast, kFloat16Scaled };

struct TrainResult {
  double firstLoss = 0, lastLoss = 0;
  int skipped = 0;
  double finalScale = 0;
};

constexpr double kLabelNoise = 1.0 / 3.0;

// A 32-32-32-4 MLP (GELU) on 2048 points labelled by a fixed random linear teacher (a third of
// the labels replaced by noise), full batch, AdamW lr 3e-3 for `steps` steps.
TrainResult train(Mode mode, int steps, double initScale = 65536.0) {
  Generator gen(42);
  const int64_t n = 2048, d = 32, h = 32, c = 4;
  Tensor xs = randn({n, d}, gen);
  Tensor teacher = randn({d, c}, gen);
  Tensor scores = matmul(xs, teacher);
  std::vector<int64_t> labels(n);
  for (int64_t i = 0; i < n; ++i) {
    const float* row = scores.data<float>() + i * c;
    labels[i] = std::max_element(row, row + c) - row;
    // A third of the labels are noise, so the loss settles well above zero.
    if (gen.uniform() < kLabelNoise) labels[i] = static_cast<int64_t>(gen.nextU64() % c);
  }
  Tensor ys = fromVector(labels);
  auto param = [&](Shape s, double std) {
    return (randn(s, gen) * std).detach().setRequiresGrad(true);
  };
  std::vector<Tensor> ps = {param({h, d}, 1 / std::sqrt(d)), param({h}, 0.0),
                            param({h, h}, 1 / std::sqrt(h)), param({h}, 0.0),
                            param({c, h}, 1 / std::sqrt(h)), param({c}, 0.0)};
  optim::AdamW opt(ps, 3e-3);
  optim::GradScaler scaler(
      {.initScale = initScale, .growthInterval = 20, .enabled = mode == Mode::kFloat16Scaled});
  TrainResult r;
  for (int s = 0; s < steps; ++s) {
    opt.zeroGrad(true);
    Tensor loss;
    {
      std::optional<AutocastGuard> ac;
      if (mode == Mode::kBFloat16Autocast) ac.emplace(DType::kBFloat16);
      if (mode == Mode::kFloat16Scaled) ac.emplace(DType::kFloat16);
      Tensor a = gelu(linear(xs, ps[0], ps[1]));
      a = gelu(linear(a, ps[2], ps[3]));
      loss = crossEntropy(linear(a, ps[4], ps[5]), ys);
    }
    EXPECT_EQ(loss.dtype(), DType::kFloat32);
    if (s == 0) r.firstLoss = loss.item();
    r.lastLoss = loss.item();
    scaler.scale(loss).backward();
    for (const Tensor& p : ps) EXPECT_EQ(p.grad().dtype(), DType::kFloat32);
    if (!scaler.step(opt)) ++r.skipped;
    scaler.update();
  }
  r.finalScale = scaler.scaleValue();
  return r;
}

// Tolerance: after 150 steps the low-precision runs' losses are within 5e-3 (absolute, about 1%)
// of the float32 run's, which itself falls below a third of where it started (measured: float32
// 0.47705, bf16 autocast 0.47737, fp16 + GradScaler 0.47705, from 1.43562).
TEST(MixedPrecisionTraining, MlpLossMatchesFloat32) {
  constexpr int kSteps = 150;
  const TrainResult f32 = train(Mode::kFloat32, kSteps);
  const TrainResult b16 = train(Mode::kBFloat16Autocast, kSteps);
  const TrainResult f16 = train(Mode::kFloat16Scaled, kSteps);
  std::printf(
      "loss after %d steps: float32 %.5f, bf16 autocast %.5f, fp16+GradScaler %.5f "
      "(start %.5f; fp16 skipped %d steps, final scale %g)\n",
      kSteps, f32.lastLoss, b16.lastLoss, f16.lastLoss, f32.firstLoss, f16.skipped, f16.finalScale);
  EXPECT_LT(f32.lastLoss, f32.firstLoss / 3);
  EXPECT_NEAR(b16.lastLoss, f32.lastLoss, 5e-3);
  EXPECT_NEAR(f16.lastLoss, f32.lastLoss, 5e-3);
  EXPECT_NE(b16.lastLoss, f32.lastLoss) << "bf16 autocast changed nothing";
  EXPECT_NE(f16.lastLoss, f32.lastLoss) << "fp16 autocast changed nothing";
}

// A scale far too large overflows the fp16 gradients: the scaler skips those steps (the
// optimizer does not move, Adam's state is not created) and backs off until they fit; the run
// then matches a float32 run of the steps actually taken.
TEST(MixedPrecisionTraining, Fp16OverflowIsSkippedAndBackedOff) {
  const TrainResult f16 = train(Mode::kFloat16Scaled, 150, 0x1p40);
  const TrainResult f32 = train(Mode::kFloat32, 150 - f16.skipped);
  std::printf("fp16 from scale 2^40: skipped %d steps, final scale %g, loss %.5f (float32 %.5f)\n",
              f16.skipped, f16.finalScale, f16.lastLoss, f32.lastLoss);
  EXPECT_GE(f16.skipped, 10);
  EXPECT_LT(f16.finalScale, 0x1p40);
  EXPECT_NEAR(f16.lastLoss, f32.lastLoss, 5e-3);
}

}  // namespace
}  // namespace loom::ag
