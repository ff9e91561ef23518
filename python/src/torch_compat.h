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
// - kTorchVersion ("2.15.0") names the torch in error messages.
#pragma once

#include <torch/version.h>

#define LOOM_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||       \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

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
