// Which kernel set computes the matrix products (parallel.h: matmulBackend, setGenericKernels).
//
// How it works: OpenBLAS built with DYNAMIC_ARCH (Debian's) picks a kernel set when it loads, from
// the CPU's model, or from OPENBLAS_CORETYPE. A model it does not know may get a generic set:
// Debian's 0.3.21 gave a 16-vCPU Xeon "Prescott" (SSE3), and loom-train ran 7.5x slower than with
// OPENBLAS_CORETYPE=SkylakeX (issue 41). Once, before the first product (and before
// matmulBackend answers), prepareKernels() turns OpenBLAS's own threads off and compares the set
// OpenBLAS picked with what the CPU runs (__builtin_cpu_supports, which checks the OS saves the
// vector state too): a generic set on a CPU with AVX2 and FMA is upgraded to Haswell, or to
// SkylakeX with AVX-512 (F, CD, BW, DQ, VL), when the policy says so. The upgrade is OpenBLAS's
// own start-up path run again: gotoblas_dynamic_quit() forgets the set, and
// gotoblas_dynamic_init() picks the one OPENBLAS_CORETYPE names and initializes its blocking
// parameters, exactly as at load time; OPENBLAS_CORETYPE is set for that call and removed after
// (the policy is only kUpgrade when it was unset). Both functions are exported by DYNAMIC_ARCH
// builds only, so they are looked up with dlsym: without them (a build for one CPU) the set
// stays and the policy falls back to the warning. No product is running at that point: the once
// runs before autograd_lite's first cblas call, and autograd_lite is OpenBLAS's only caller in
// Loom's programs.
//
// Verified on the AVX-512 dev VM (Debian's OpenBLAS 0.3.21, OPENBLAS_CORETYPE=Prescott to
// simulate an unknown model): a 512^3 sgemm on one thread ran 4.3 GFLOP/s loaded, 25 after the
// upgrade to SkylakeX in the same process, as with SkylakeX picked at load time.
#include <cctype>
#include <cstdio>
#include <mutex>
#include <string>

#include "gemm.h"
#include "loom/autograd/parallel.h"

#ifdef LOOM_AUTOGRAD_OPENBLAS
#include <dlfcn.h>

#include <cstdlib>

extern "C" {
void openblas_set_num_threads(int);
char* openblas_get_config();
char* openblas_get_corename();
}
#else
#include <Eigen/Core>
#endif

namespace loom::ag {

namespace {

std::mutex policyMu;
GenericKernels policy = GenericKernels::kWarn;
std::string backend;  // matmulBackend(), fixed by prepareKernels

#ifdef LOOM_AUTOGRAD_OPENBLAS
// The best OpenBLAS kernel set this CPU runs, among the ones worth switching to; "" if none.
std::string bestCoreType() {
#if defined(__x86_64__) || defined(__i386__)
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

const char* vectorUnits(const std::string& core) {
  return core == "SkylakeX" ? "AVX-512" : "AVX2 and FMA";
}

void prepare() {
  openblas_set_num_threads(1);  // gemm.cc says why
  const std::string picked = openblas_get_corename();
  backend = std::string(openblas_get_config()) + ", core " + picked;
  const std::string best = bestCoreType();
  if (best.empty() || !isGenericCoreType(picked)) return;
  GenericKernels chosen;
  {
    std::lock_guard<std::mutex> lock(policyMu);
    chosen = policy;
  }
  if (chosen == GenericKernels::kKeep) return;
  if (chosen == GenericKernels::kUpgrade) {
    auto quit = reinterpret_cast<void (*)()>(dlsym(RTLD_DEFAULT, "gotoblas_dynamic_quit"));
    auto init = reinterpret_cast<void (*)()>(dlsym(RTLD_DEFAULT, "gotoblas_dynamic_init"));
    if (quit != nullptr && init != nullptr) {
      ::setenv("OPENBLAS_CORETYPE", best.c_str(), 1);
      quit();
      init();
      ::unsetenv("OPENBLAS_CORETYPE");
      const std::string now = openblas_get_corename();
      backend = std::string(openblas_get_config()) + ", core " + now + " (OpenBLAS picked " +
                picked + "; switched: this CPU has " + vectorUnits(best) + ")";
      if (now == best) return;
    }
  }
  std::fprintf(
      stderr,
      "loom autograd_lite: OpenBLAS runs its generic %s kernels on a CPU with %s (it picks "
      "them for CPU models it does not know, or OPENBLAS_CORETYPE named them), so matrix "
      "products run several times slower than they can. Fix: set OPENBLAS_CORETYPE=%s, or call "
      "loom::ag::setGenericKernels(loom::ag::GenericKernels::kUpgrade) before the first "
      "product (Loom's programs do when OPENBLAS_CORETYPE is unset).\n",
      picked.c_str(), vectorUnits(best), best.c_str());
}
#else
void prepare() {
  backend = "Eigen " + std::to_string(EIGEN_WORLD_VERSION) + "." +
            std::to_string(EIGEN_MAJOR_VERSION) + "." + std::to_string(EIGEN_MINOR_VERSION);
}
#endif

}  // namespace

bool isGenericCoreType(const std::string& core) {
  // OpenBLAS's x86 kernel sets without AVX (corename spellings of 0.3.21's dynamic.c).
  for (const char* generic : {"Katmai", "Coppermine", "Northwood", "Prescott", "Banias", "Atom",
                              "Core2", "Penryn", "Dunnington", "Nehalem", "Athlon", "Opteron",
                              "Opteron_SSE3", "Barcelona", "Nano", "Bobcat", "Unknown"}) {
    if (core.size() == std::string(generic).size()) {
      bool same = true;
      for (size_t i = 0; i < core.size(); ++i) {
        same = same && std::tolower(static_cast<unsigned char>(core[i])) ==
                           std::tolower(static_cast<unsigned char>(generic[i]));
      }
      if (same) return true;
    }
  }
  return false;
}

void setGenericKernels(GenericKernels p) {
  std::lock_guard<std::mutex> lock(policyMu);
  policy = p;
}

std::string matmulBackend() {
  detail::prepareKernels();
  return backend;
}

namespace detail {

void prepareKernels() {
  static std::once_flag once;
  std::call_once(once, prepare);
}

}  // namespace detail

}  // namespace loom::ag
