// Which kernel set computes the matrix products (loom/autograd/parallel.h): a generic OpenBLAS
// set on a CPU with AVX2 or AVX-512 is upgraded (kUpgrade) or warned about once (kWarn, the
// default). The kernel set is fixed once per process, so the two cases that need a generic set
// run in processes of their own with OPENBLAS_CORETYPE=Prescott (tests/autograd/CMakeLists.txt:
// autograd_kernels_upgrade, autograd_kernels_warning); in the whole suite they skip, saying why.
#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <initializer_list>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "loom/autograd/autograd.h"
#include "loom/autograd/parallel.h"

namespace loom::ag {
namespace {

bool contains(const std::string& s, const std::string& what) {
  return s.find(what) != std::string::npos;
}

// The OpenBLAS kernel sets an upgrade may rightly go to on this CPU, derived from the flags the
// kernel reports in /proc/cpuinfo (it lists a vector extension only when the OS saves its
// state), not from the library's own __builtin_cpu_supports check, so that a mistake there
// shows: AVX-512 F, BW, VL and DQ run SkylakeX's kernels (or a newer AVX-512 set: Cooperlake,
// SapphireRapids); AVX2 and FMA without them run Haswell's (or Zen's, the same instructions, which
// OpenBLAS may name on AMD). Empty `cores`: none (no AVX2 and FMA). `known` is false where
// /proc/cpuinfo has no x86 flags line; the tests then accept the set the library names.
struct ExpectedCores {
  bool known = false;
  std::set<std::string> cores;
  std::string reason;  // which flags decided, for the logs and skip messages
};

ExpectedCores expectedCores() {
  ExpectedCores e;
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line) && line.rfind("flags", 0) != 0) {
  }
  if (line.rfind("flags", 0) != 0) {
    e.reason = "/proc/cpuinfo has no x86 flags line";
    return e;
  }
  std::set<std::string> flags;
  std::istringstream words(line.substr(line.find(':') + 1));
  for (std::string w; words >> w;) flags.insert(w);
  auto has = [&](std::initializer_list<const char*> names) {
    for (const char* n : names) {
      if (flags.count(n) == 0) return false;
    }
    return true;
  };
  e.known = true;
  if (has({"avx512f", "avx512bw", "avx512vl", "avx512dq"})) {
    e.cores = {"SkylakeX", "Cooperlake", "SapphireRapids"};
    e.reason = "/proc/cpuinfo: avx512f, avx512bw, avx512vl, avx512dq";
  } else if (has({"avx2", "fma"})) {
    e.cores = {"Haswell", "Zen"};
    e.reason = "/proc/cpuinfo: avx2 and fma, no AVX-512 (F, BW, VL, DQ)";
  } else {
    e.reason = "/proc/cpuinfo: no avx2 and fma";
  }
  return e;
}

std::string describe(const ExpectedCores& e) {
  std::string s = e.reason + " -> expected one of {";
  for (const auto& c : e.cores) s += (s.back() == '{' ? "" : ", ") + c;
  return s + "}";
}

// The word after `prefix` in `s` (letters and digits), "" when `prefix` is absent.
std::string wordAfter(const std::string& s, const std::string& prefix) {
  const size_t at = s.find(prefix);
  if (at == std::string::npos) return {};
  size_t end = at + prefix.size();
  while (end < s.size() && std::isalnum(static_cast<unsigned char>(s[end]))) ++end;
  return s.substr(at + prefix.size(), end - at - prefix.size());
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

// The kernel set is fixed by the first product in a process, so the two cases below only mean
// something when they run alone in a fresh process (their ctest entries run one test each).
// Run with the rest of autograd_test, an earlier test has fixed it already, under the default
// policy: with OPENBLAS_CORETYPE=Prescott in the machine's environment that is Prescott, kept
// and warned about, which these cases would otherwise take for a failure of their own.
bool aloneInProcess() {
  return ::testing::UnitTest::GetInstance()->test_to_run_count() == 1;
}

// Run by autograd_kernels_upgrade with OPENBLAS_CORETYPE=Prescott: the policy switches to the best
// set this CPU runs, matmulBackend says so, and the products are right and thread-count
// independent on the new set.
TEST(MatmulKernels, UpgradeSwitchesAGenericSet) {
  if (!aloneInProcess()) {
    GTEST_SKIP() << "runs alone in a fresh process (ctest: autograd_kernels_upgrade): the kernel "
                    "set is fixed by this process's first product";
  }
  setGenericKernels(GenericKernels::kUpgrade);
  ::testing::internal::CaptureStderr();
  const std::string backend = matmulBackend();
  const std::string logged = ::testing::internal::GetCapturedStderr();
  std::printf("matrix products on %s\n", backend.c_str());
  const ExpectedCores expected = expectedCores();
  std::printf("kernel sets for this CPU: %s\n", describe(expected).c_str());
  if (!contains(backend, "OpenBLAS") || (expected.known && expected.cores.empty())) {
    GTEST_SKIP() << "no OpenBLAS, or a CPU without AVX2 and FMA: nothing to upgrade (" << backend
                 << "; " << expected.reason << ")";
  }
  if (!contains(backend, "picked Prescott")) {
    if (contains(backend, "core Prescott") && expected.known) {
      FAIL() << "kUpgrade kept Prescott: " << backend << "; " << describe(expected);
    }
    GTEST_SKIP() << "OpenBLAS did not pick a generic set in this process (run with "
                    "OPENBLAS_CORETYPE=Prescott in a fresh process), or this CPU has none to "
                    "switch to: "
                 << backend << "; " << expected.reason;
  }
  EXPECT_TRUE(contains(backend, " (OpenBLAS picked Prescott; switched")) << backend;
  const std::string now = wordAfter(backend, ", core ");
  if (expected.known) {
    EXPECT_EQ(expected.cores.count(now), 1u) << backend << "; " << describe(expected);
  } else {
    std::printf("accepting core %s as the library says: %s\n", now.c_str(),
                expected.reason.c_str());
    EXPECT_FALSE(isGenericCoreType(now)) << backend;
  }
  EXPECT_EQ(logged, "") << "an upgrade needs no warning";
  checkProduct();
}

// Run by autograd_kernels_warning with OPENBLAS_CORETYPE=Prescott: the default keeps the set and
// says once what it costs and the exact fix.
TEST(MatmulKernels, DefaultWarnsOnceWithTheFix) {
  if (!aloneInProcess()) {
    GTEST_SKIP() << "runs alone in a fresh process (ctest: autograd_kernels_warning): the kernel "
                    "set and its one warning come with this process's first product";
  }
  ::testing::internal::CaptureStderr();
  const std::string backend = matmulBackend();
  const std::string again = matmulBackend();
  const std::string logged = ::testing::internal::GetCapturedStderr();
  const ExpectedCores expected = expectedCores();
  std::printf("kernel sets for this CPU: %s\n", describe(expected).c_str());
  if (!contains(backend, "core Prescott") || (expected.known && expected.cores.empty())) {
    GTEST_SKIP() << "OpenBLAS is not on Prescott kernels in a fresh process here, or the CPU has "
                    "no AVX2 and FMA (run with OPENBLAS_CORETYPE=Prescott): "
                 << backend << "; " << expected.reason;
  }
  EXPECT_EQ(backend, again);
  EXPECT_TRUE(contains(logged, "OpenBLAS runs its generic Prescott kernels")) << logged;
  const std::string fix = wordAfter(logged, "Fix: set OPENBLAS_CORETYPE=");
  if (expected.known) {
    EXPECT_EQ(expected.cores.count(fix), 1u) << logged << "\n" << describe(expected);
  } else {
    std::printf("accepting OPENBLAS_CORETYPE=%s as the library says: %s\n", fix.c_str(),
                expected.reason.c_str());
    EXPECT_FALSE(fix.empty() || isGenericCoreType(fix)) << logged;
  }
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
