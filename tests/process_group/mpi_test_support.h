// Shared by the mpi backend's tests, which run under mpirun (every rank is one process running
// the same gtest binary, so every rank runs the same tests in the same order): the world group,
// made once per process and destroyed before MPI is finalized, raw buffers as BufferViews, and
// element checks that record the first mismatch of a case (ADD_FAILURE, naming the rank) and
// let the rank go on with the next collective so that the ranks stay in step.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "fill.h"
#include "loom/process_group/factory.h"
#include "loom/process_group/mpi.h"
#include "loom/process_group/process_group.h"

namespace loom::mpi_testing {

using comm::testing::getElem;
using comm::testing::setElem;
using Bytes = std::vector<uint8_t>;

inline std::shared_ptr<ProcessGroup>& worldSlot() {
  static std::shared_ptr<ProcessGroup> pg;
  return pg;
}

// The world group (60 s deadline), created on first use.
inline ProcessGroup& world() {
  auto& pg = worldSlot();
  if (!pg) {
    const MpiWorld w = mpiWorld();
    ProcessGroupOptions options;
    options.timeout = std::chrono::seconds(60);
    pg = createProcessGroup("mpi", nullptr, w.rank, w.size, options);
  }
  return *pg;
}

inline Bytes makeBytes(size_t count, DType dtype) {
  return Bytes(std::max<size_t>(count, 1) * dtypeSize(dtype), 0xAB);
}

inline BufferView bv(void* data, size_t count, DType dtype) {
  return BufferView{data, count, dtype, Device::cpu()};
}

inline void* at(Bytes& b, size_t elements, DType dtype) {
  return b.data() + elements * dtypeSize(dtype);
}

// What rank `rank` contributes at element i of a data-movement collective (stored in the dtype).
inline int64_t value(int rank, size_t i) {
  return static_cast<int64_t>((rank * 31 + i) % 101);
}
inline double wrapped(DType dtype, int64_t v) {
  uint8_t tmp[8];
  setElem(tmp, 0, dtype, v);
  return getElem(tmp, 0, dtype);
}

// Compares elements [0, n) of buf with want(i); records the first mismatch. Returns whether all
// matched.
inline bool expectElems(const std::string& what, const void* buf, size_t n, DType dtype,
                        const std::function<double(size_t)>& want, double tol = 0) {
  for (size_t i = 0; i < n; ++i) {
    const double got = getElem(buf, i, dtype);
    const double w = want(i);
    if (!comm::testing::close(got, w, tol)) {
      ADD_FAILURE() << "rank " << world().rank() << ": " << what << ": element " << i << " is "
                    << got << ", expected " << w << " (tolerance " << tol << ")";
      return false;
    }
  }
  return true;
}

}  // namespace loom::mpi_testing
