// Which kernel set computes the matrix products (loom/autograd/parallel.h): a generic OpenBLAS
// set on a CPU with AVX2 or AVX-512 is upgraded (kUpgrade) or warned about once (kWarn, the
// default). The kernel set is fixed once per process, so the two cases that need a generic set
// run in processes of their own with OPENBLAS_CORETYPE=Prescott (tests/autograd/CMakeLists.txt:
// autograd_kernels_upgrade, autograd_kernels_warning); in the whole suite they skip, saying why.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "loom/autograd/autograd.h"
#include "loom/autograd/parallel.h"

namespace loom::ag {
namespace {

bool contains(const std::string& s, const std::string& what) {
  return s.find(what) != std::string::npos;
}

// The set an upgrade goes to on this CPU, "" if none (as blas_kernels.cc decides).
std::string bestCore() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vl")) {
    return "SkylakeX";
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
#endif
  return {};
}

// A product big enough to be tiled, against a float64 reference, at 1 and 3 threads (bitwise
// equal across counts).
void checkProduct() {
  Generator gen(3);
  const int64_t m = 150, k = 130, n = 90;
  Tensor a = randn({m, k}, gen);
  Tensor b = randn({k, n}, gen);
  const std::vector<float> av = a.toVector<float>(), bv = b.toVector<float>();
  std::vector<std::vector<float>> results;
  for (int threads : {1, 3}) {
    setNumThreads(threads);
    results.push_back(matmul(a, b).toVector<float>());
  }
  setNumThreads(0);
  EXPECT_EQ(results[0], results[1]) << "the bits depend on the thread count";
  double worst = 0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double ref = 0;
      for (int64_t p = 0; p < k; ++p) ref += double(av[i * k + p]) * bv[p * n + j];
      worst = std::max(worst, std::abs(ref - results[0][i * n + j]));
    }
  }
  EXPECT_LT(worst, 1e-3) << "max |difference| to the float64 product";
}

TEST(MatmulKernels, GenericCoreTypesAreTheOnesWithoutAvx) {
  for (const char* core : {"Prescott", "Core2", "Nehalem", "Penryn", "Atom", "Barcelona", "NANO"}) {
    EXPECT_TRUE(isGenericCoreType(core)) << core;
  }
  for (const char* core : {"Sandybridge", "Haswell", "Zen", "SkylakeX", "Cooperlake", "", "Pre"}) {
    EXPECT_FALSE(isGenericCoreType(core)) << core;
  }
}

// Run by autograd_kernels_upgrade with OPENBLAS_CORETYPE=Prescott: the policy switches to the best
// set this CPU runs, matmulBackend says so, and the products are right and thread-count
// independent on the new set.
TEST(MatmulKernels, UpgradeSwitchesAGenericSet) {
  setGenericKernels(GenericKernels::kUpgrade);
  ::testing::internal::CaptureStderr();
  const std::string backend = matmulBackend();
  const std::string logged = ::testing::internal::GetCapturedStderr();
  std::printf("matrix products on %s\n", backend.c_str());
  if (!contains(backend, "OpenBLAS") || bestCore().empty()) {
    GTEST_SKIP() << "no OpenBLAS, or a CPU without AVX2: nothing to upgrade (" << backend << ")";
  }
  if (!contains(backend, "picked Prescott")) {
    if (contains(backend, "core Prescott")) FAIL() << "kUpgrade kept Prescott: " << backend;
    GTEST_SKIP() << "OpenBLAS did not pick a generic set in this process (run with "
                    "OPENBLAS_CORETYPE=Prescott in a fresh process): "
                 << backend;
  }
  EXPECT_TRUE(contains(backend, "core " + bestCore() + " (OpenBLAS picked Prescott; switched"))
      << backend;
  EXPECT_EQ(logged, "") << "an upgrade needs no warning";
  checkProduct();
}

// Run by autograd_kernels_warning with OPENBLAS_CORETYPE=Prescott: the default keeps the set and
// says once what it costs and the exact fix.
TEST(MatmulKernels, DefaultWarnsOnceWithTheFix) {
  ::testing::internal::CaptureStderr();
  const std::string backend = matmulBackend();
  const std::string again = matmulBackend();
  const std::string logged = ::testing::internal::GetCapturedStderr();
  if (!contains(backend, "core Prescott") || bestCore().empty()) {
    GTEST_SKIP() << "OpenBLAS is not on Prescott kernels in a fresh process here, or the CPU has "
                    "no AVX2 (run with OPENBLAS_CORETYPE=Prescott): "
                 << backend;
  }
  EXPECT_EQ(backend, again);
  EXPECT_TRUE(contains(logged, "OpenBLAS runs its generic Prescott kernels")) << logged;
  EXPECT_TRUE(contains(logged, "Fix: set OPENBLAS_CORETYPE=" + bestCore())) << logged;
  size_t warnings = 0;
  for (size_t at = logged.find("loom autograd_lite:"); at != std::string::npos;
       at = logged.find("loom autograd_lite:", at + 1)) {
    ++warnings;
  }
  EXPECT_EQ(warnings, 1u) << logged;
  checkProduct();
}

}  // namespace
}  // namespace loom::ag
