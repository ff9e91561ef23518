// Each ProcessGroup operation as MPI's non-blocking calls (the mapping mpi_backend.h states),
// posted by the group's worker thread.
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "loom/comm/reduce.h"
#include "loom/common/error.h"
#include "monitored_barrier.h"
#include "mpi/mpi_group.h"
#include "mpi/mpi_runtime.h"

namespace loom {

using mpi_detail::CallGuard;

namespace {

// Counts as MPI's ints (checkOp checked they fit), kept in r until the operation completes.
const std::vector<int>& toInts(ProcessGroupMpi::Running& r, const std::vector<size_t>& counts) {
  r.arrays.emplace_back(counts.begin(), counts.end());
  return r.arrays.back();
}

const std::vector<int>& displacements(ProcessGroupMpi::Running& r, const std::vector<int>& counts) {
  std::vector<int> displs(counts.size(), 0);
  for (size_t i = 1; i < counts.size(); ++i) displs[i] = displs[i - 1] + counts[i - 1];
  r.arrays.push_back(std::move(displs));
  return r.arrays.back();
}

char* bytesAt(void* base, size_t elements, DType dtype) {
  return static_cast<char*>(base) + elements * dtypeSize(dtype);
}

// True when `inner` starts inside the `count` elements at `outer`.
bool inside(const void* inner, const void* outer, size_t count, DType dtype) {
  const char* i = static_cast<const char*>(inner);
  const char* o = static_cast<const char*>(outer);
  return i >= o && i < o + count * dtypeSize(dtype);
}

// float16 / bfloat16 AVG divides every input by the group's size before the sum (as comm's
// collectives and NCCL's ncclAvg): the 16-bit sum overflows where the average fits.
bool prescalesAvg(const OpDesc& op) {
  return op.reduceOp == ReduceOp::kAvg &&
         (op.dtype == DType::kFloat16 || op.dtype == DType::kBFloat16);
}

// The input of a prescaled AVG: `count` elements of `in` divided by `size`, in `in` itself when
// the call reduces in place (the buffer is overwritten anyway), else in `copy`.
const void* prescaled(const OpDesc& op, const void* in, bool inPlace, size_t count, int size,
                      std::vector<uint8_t>& copy) {
  if (!prescalesAvg(op) || count == 0) return in;
  void* data = const_cast<void*>(in);
  if (!inPlace) {
    copy.assign(static_cast<const uint8_t*>(in),
                static_cast<const uint8_t*>(in) + count * dtypeSize(op.dtype));
    data = copy.data();
  }
  comm::divideBy(data, count, op.dtype, size);
  return data;
}

// avg: the sum divided once by the group's size, on a rank that holds a result (not for the
// 16-bit floats, whose inputs were divided: prescaled()).
std::function<void()> averageOf(const OpDesc& op, void* data, size_t count, int size) {
  if (op.reduceOp != ReduceOp::kAvg || count == 0 || prescalesAvg(op)) return nullptr;
  const DType dtype = op.dtype;
  return [=] { comm::divideBy(data, count, dtype, size); };
}

}  // namespace

void ProcessGroupMpi::start(Running& r) {
  const OpDesc& op = r.op;
  if (op.type == OpType::kMonitoredBarrier) {
    runMonitoredBarrier(*store(), rank(), size(), op, who());
    return;  // no request: complete
  }
  // Every rank passes the same count to these: nothing to move at 0 (as comm/ answers them).
  switch (op.type) {
    case OpType::kAllreduce:
    case OpType::kBroadcast:
    case OpType::kReduce:
    case OpType::kAllgather:
    case OpType::kReduceScatter:
    case OpType::kGather:
    case OpType::kScatter:
    case OpType::kAlltoall:
      if (op.count == 0) return;
      break;
    default:
      break;
  }

  const MPI_Datatype dt = mpi_detail::datatype(op.dtype);
  const MPI_Op mop = mpi_detail::reduceOp(op.reduceOp, op.dtype);
  const int n = static_cast<int>(op.count);
  const bool isRoot = rank() == op.root;
  const size_t esize = dtypeSize(op.dtype);
  r.requests.assign(1, MPI_REQUEST_NULL);
  r.arrays.reserve(4);  // toInts and displacements hand out references into it
  MPI_Request* req = &r.requests[0];
  const std::string what = op.describe();
  CallGuard guard;
  int rc = MPI_SUCCESS;
  switch (op.type) {
    case OpType::kAllreduce: {
      const bool inPlace = op.in.data == op.out.data;
      const void* in = prescaled(op, op.in.data, inPlace, op.count, size(), r.prescaled);
      rc = MPI_Iallreduce(inPlace ? MPI_IN_PLACE : in, op.out.data, n, dt, mop, comm_, req);
      r.finish = averageOf(op, op.out.data, op.count, size());
      break;
    }
    case OpType::kBroadcast:
      if (isRoot && op.in.data != op.out.data)
        std::memcpy(op.out.data, op.in.data, op.count * esize);
      rc = MPI_Ibcast(op.out.data, n, dt, op.root, comm_, req);
      break;
    case OpType::kReduce: {
      const bool inPlace = isRoot && op.in.data == op.out.data;
      const void* in = prescaled(op, op.in.data, inPlace, op.count, size(), r.prescaled);
      rc = MPI_Ireduce(inPlace ? MPI_IN_PLACE : in, isRoot ? op.out.data : nullptr, n, dt, mop,
                       op.root, comm_, req);
      if (isRoot) r.finish = averageOf(op, op.out.data, op.count, size());
      break;
    }
    case OpType::kAllgather: {
      const bool inPlace = op.in.data == bytesAt(op.out.data, op.count * rank(), op.dtype);
      rc = MPI_Iallgather(inPlace ? MPI_IN_PLACE : op.in.data, n, dt, op.out.data, n, dt, comm_,
                          req);
      break;
    }
    case OpType::kReduceScatter:
    case OpType::kReduceScatterv: {
      // reduce-scatter's count is the block; reduceScatterv's the total, its blocks inCounts.
      const bool v = op.type == OpType::kReduceScatterv;
      const size_t mine = v ? op.inCounts[rank()] : op.count;
      const size_t total = v ? op.count : op.count * size();
      void* dst = op.out.data;
      if (mine > 0 && inside(op.out.data, op.in.data, total, op.dtype)) {
        r.staging.resize(mine * esize);
        dst = r.staging.data();
        void* out = op.out.data;
        r.finish = [&r, dst, out, mine, esize, this] {
          std::memcpy(out, dst, mine * esize);
          if (auto avg = averageOf(r.op, out, mine, size())) avg();
        };
      } else {
        r.finish = averageOf(op, op.out.data, mine, size());
      }
      const void* in = prescaled(op, op.in.data, false, total, size(), r.prescaled);
      if (v) {
        const std::vector<int>& counts = toInts(r, op.inCounts);
        rc = MPI_Ireduce_scatter(in, dst, counts.data(), dt, mop, comm_, req);
      } else {
        rc = MPI_Ireduce_scatter_block(in, dst, n, dt, mop, comm_, req);
      }
      break;
    }
    case OpType::kGather: {
      const bool inPlace =
          isRoot && op.in.data == bytesAt(op.out.data, op.count * rank(), op.dtype);
      rc = MPI_Igather(inPlace ? MPI_IN_PLACE : op.in.data, n, dt, isRoot ? op.out.data : nullptr,
                       n, dt, op.root, comm_, req);
      break;
    }
    case OpType::kScatter: {
      const bool inPlace =
          isRoot && op.out.data == bytesAt(op.in.data, op.count * rank(), op.dtype);
      rc = MPI_Iscatter(isRoot ? op.in.data : nullptr, n, dt, inPlace ? MPI_IN_PLACE : op.out.data,
                        n, dt, op.root, comm_, req);
      break;
    }
    case OpType::kAlltoall: {
      const bool inPlace = op.in.data == op.out.data;
      rc =
          MPI_Ialltoall(inPlace ? MPI_IN_PLACE : op.in.data, n, dt, op.out.data, n, dt, comm_, req);
      break;
    }
    case OpType::kBarrier:
      rc = MPI_Ibarrier(comm_, req);
      break;
    case OpType::kSend:
      rc = MPI_Isend(op.in.data, n, dt, op.root, static_cast<int>(op.tag), comm_, req);
      break;
    case OpType::kRecv:
      rc = MPI_Irecv(op.out.data, n, dt, op.root == kAnySource ? MPI_ANY_SOURCE : op.root,
                     static_cast<int>(op.tag), comm_, req);
      break;
    case OpType::kAlltoallv: {
      const std::vector<int>& sendCounts = toInts(r, op.inCounts);
      const std::vector<int>& recvCounts = toInts(r, op.outCounts);
      const std::vector<int>& sendDispls = displacements(r, sendCounts);
      const std::vector<int>& recvDispls = displacements(r, recvCounts);
      const void* send = op.in.data;
      if (op.in.data == op.out.data) {
        if (sendCounts == recvCounts) {
          send = MPI_IN_PLACE;
        } else {
          // MPI's in-place alltoallv sends what recvcounts say; uneven splits send from a copy.
          r.staging.assign(static_cast<const uint8_t*>(op.in.data),
                           static_cast<const uint8_t*>(op.in.data) + op.in.count * esize);
          send = r.staging.data();
        }
      }
      rc = MPI_Ialltoallv(send, sendCounts.data(), sendDispls.data(), dt, op.out.data,
                          recvCounts.data(), recvDispls.data(), dt, comm_, req);
      break;
    }
    case OpType::kAllgatherv:
    case OpType::kGatherv: {
      const bool all = op.type == OpType::kAllgatherv;
      const std::vector<int>& counts = toInts(r, op.inCounts);
      const std::vector<int>& displs = displacements(r, counts);
      const bool receives = all || isRoot;
      const bool inPlace =
          receives && counts[rank()] > 0 &&
          op.in.data == bytesAt(op.out.data, static_cast<size_t>(displs[rank()]), op.dtype);
      const void* send = inPlace ? MPI_IN_PLACE : op.in.data;
      if (all) {
        rc = MPI_Iallgatherv(send, counts[rank()], dt, op.out.data, counts.data(), displs.data(),
                             dt, comm_, req);
      } else {
        rc = MPI_Igatherv(send, counts[rank()], dt, isRoot ? op.out.data : nullptr, counts.data(),
                          displs.data(), dt, op.root, comm_, req);
      }
      break;
    }
    case OpType::kAllreduceCoalesced: {
      // One all-reduce over the packed buffers (as the comm backend does); a single buffer in
      // place.
      if (op.buffers.size() == 1) {
        prescaled(op, op.buffers[0].data, true, op.count, size(), r.prescaled);
        rc = MPI_Iallreduce(MPI_IN_PLACE, op.buffers[0].data, n, dt, mop, comm_, req);
        r.finish = averageOf(op, op.buffers[0].data, op.count, size());
        break;
      }
      r.staging.resize(op.count * esize);
      size_t offset = 0;
      for (const BufferView& b : op.buffers) {
        if (b.count > 0) std::memcpy(r.staging.data() + offset, b.data, b.bytes());
        offset += b.bytes();
      }
      prescaled(op, r.staging.data(), true, op.count, size(), r.prescaled);
      rc = MPI_Iallreduce(MPI_IN_PLACE, r.staging.data(), n, dt, mop, comm_, req);
      r.finish = [&r, this] {
        if (auto avg = averageOf(r.op, r.staging.data(), r.op.count, size())) avg();
        size_t at = 0;
        for (const BufferView& b : r.op.buffers) {
          if (b.count > 0) std::memcpy(b.data, r.staging.data() + at, b.bytes());
          at += b.bytes();
        }
      };
      break;
    }
    case OpType::kMonitoredBarrier:
      break;  // handled above
  }
  mpi_detail::check(rc, who(), what);
}

}  // namespace loom
