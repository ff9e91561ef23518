// The one place that knows which torch the backend is built against.
//
// Contract
// - LOOM_TORCH_AT_LEAST(major, minor) is true when the torch headers are version major.minor or
//   newer (<torch/version.h>), comparing the major version first: 3.0 is at least 2.1. Every
//   version test in python/src goes through it.
// - Supported: torch 1.13 (Debian's), and 2.1 to 2.15 (PyPI). Older 2.x fail to compile here
//   with the reason; 1.x older than 1.13 are not tried.
// - C10dBase is what ProcessGroupLoom derives from: c10d::ProcessGroup on 1.13 (a group was
//   one backend then), c10d::Backend from 2.0 on (a ProcessGroup dispatches to one Backend
//   per device type, and "loom" is the one for "cpu").
// - What a 2.x version's c10d::Backend offers, read from each version's Backend.hpp (PyPI's
//   wheels, 2.1.2 to 2.15.0), is named here once:
//   - LOOM_TORCH_HAS_SUPPORTS_COALESCING (2.7): supportsCoalescing(). Where it is true,
//     batch_isend_irecv wraps its operations in _coalescing_manager (start/endCoalescing);
//     before, it issues them one by one.
//   - LOOM_TORCH_HAS_BACKEND_SPLIT (2.9): split(store, ranks, opts), supportsSplitting() and
//     getBackendOptions(), which split_group uses. 2.3 to 2.8 have a supportsSplitting() whose
//     callers reach NCCL-only calls (perform_nocolor_split), so it stays false there.
// - kTorchVersion ("2.15.0") names the torch in error messages.
#pragma once

#include <torch/version.h>

#define LOOM_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||       \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))
#define LOOM_TORCH_HAS_SUPPORTS_COALESCING LOOM_TORCH_AT_LEAST(2, 7)
#define LOOM_TORCH_HAS_BACKEND_SPLIT LOOM_TORCH_AT_LEAST(2, 9)

#if LOOM_TORCH_AT_LEAST(2, 0)
#if !LOOM_TORCH_AT_LEAST(2, 1)
#error \
    "loom_torch: torch 2.0 is not supported (its Backend's endCoalescing takes a request list); use 1.13 or 2.1+"
#endif
#include <torch/csrc/distributed/c10d/Backend.hpp>
namespace loom::torch_backend {
using C10dBase = c10d::Backend;
}  // namespace loom::torch_backend
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
namespace loom::torch_backend {
using C10dBase = c10d::ProcessGroup;
}  // namespace loom::torch_backend
#endif

namespace loom::torch_backend {
inline constexpr const char* kTorchVersion = TORCH_VERSION;
}  // namespace loom::torch_backend
