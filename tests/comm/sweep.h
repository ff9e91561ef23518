// The collective sweep: each check runs one collective on every rank of a thread-rank world
// with fill-by-rank inputs and compares each output element with its closed form
// (fill.h: integers exactly, floats exactly except avg within `tolerance`). A mismatch names
// the collective, dtype, op, count, placement, root, index and both values; it throws, or,
// once recordMismatchesIn() was called, is appended there (the first one of each check) so
// that the rank goes on with the next collective and the world stays in step
// (sweep_world.h reports every one).
#pragma once

#include <chrono>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "fill.h"
#include "loom/comm/collectives.h"
#include "loom/comm/context.h"
#include "loom/common/error.h"
#include "loom/store/hash_store.h"
#include "loom/testing/ranks.h"
#include "test_paths.h"

namespace loom::comm::testing {

using Buffer = std::vector<uint8_t>;

inline Buffer makeBuffer(size_t count, DType dtype) {
  return Buffer(std::max<size_t>(count, 1) * dtypeSize(dtype), 0xAB);
}

struct Case {
  const char* what;
  DType dtype;
  ReduceOp op;
  size_t count;
  bool inPlace;
  int root;
  std::string describe() const {
    return detail::str(what, " dtype=", dtypeName(dtype), " op=", reduceOpName(op),
                       " count=", count, inPlace ? " in-place" : " out-of-place", " root=", root);
  }
};

// Runs fn(ctx) on `size` thread ranks, each with its own Context over one HashStore, made with
// `base` as testOptions (test_paths.h) adjusts it.
inline void runWorld(int size, const std::function<void(Context&)>& fn,
                     std::chrono::milliseconds timeout = std::chrono::seconds(60),
                     const ContextOptions& base = {}) {
  HashStore store;
  ContextOptions options = testOptions(base);
  options.timeout = timeout;
  loom::testing::runThreadRanks(size, [&](int rank) {
    auto ctx = Context::create(store, rank, size, options);
    fn(*ctx);
  });
}

class Checker {
 public:
  Checker(Context& ctx, Algorithm algorithm = Algorithm::kAuto) : ctx_(ctx) {
    opts_.algorithm = algorithm;
    opts_.timeout = std::chrono::seconds(60);
  }

  Context& ctx() { return ctx_; }
  // From now on a mismatch is appended to *out instead of thrown.
  void recordMismatchesIn(std::vector<std::string>* out) { mismatches_ = out; }

  void allreduce(const Case& c) {
    const int rank = ctx_.rank(), size = ctx_.size();
    Buffer in = makeBuffer(c.count, c.dtype), out = makeBuffer(c.count, c.dtype);
    for (size_t i = 0; i < c.count; ++i)
      setElem(in.data(), i, c.dtype, fillValue(rank, i, c.op, c.dtype));
    void* dst = c.inPlace ? in.data() : out.data();
    comm::allreduce(ctx_, in.data(), dst, c.count, c.dtype, c.op, next());
    for (size_t i = 0; i < c.count; ++i) {
      if (!expect(c, dst, i, expectedReduce(size, i, c.op, c.dtype), tolerance(c.op, c.dtype)))
        return;
    }
  }

  void reduce(const Case& c) {
    const int rank = ctx_.rank(), size = ctx_.size();
    Buffer in = makeBuffer(c.count, c.dtype), out = makeBuffer(c.count, c.dtype);
    for (size_t i = 0; i < c.count; ++i)
      setElem(in.data(), i, c.dtype, fillValue(rank, i, c.op, c.dtype));
    void* dst = c.inPlace ? in.data() : out.data();
    comm::reduce(ctx_, in.data(), rank == c.root ? dst : nullptr, c.count, c.dtype, c.op, c.root,
                 next());
    if (rank != c.root) return;
    for (size_t i = 0; i < c.count; ++i) {
      if (!expect(c, dst, i, expectedReduce(size, i, c.op, c.dtype), tolerance(c.op, c.dtype)))
        return;
    }
  }

  void reduceScatter(const Case& c) {
    const int rank = ctx_.rank(), size = ctx_.size();
    Buffer in = makeBuffer(c.count * size, c.dtype), out = makeBuffer(c.count, c.dtype);
    for (size_t i = 0; i < c.count * size; ++i) {
      setElem(in.data(), i, c.dtype, fillValue(rank, i, c.op, c.dtype));
    }
    void* dst = c.inPlace ? in.data() + rank * c.count * dtypeSize(c.dtype) : out.data();
    comm::reduceScatter(ctx_, in.data(), dst, c.count, c.dtype, c.op, next());
    for (size_t i = 0; i < c.count; ++i) {
      if (!expect(c, dst, i, expectedReduce(size, rank * c.count + i, c.op, c.dtype),
                  tolerance(c.op, c.dtype)))
        return;
    }
  }

  void allgather(const Case& c) {
    const int rank = ctx_.rank(), size = ctx_.size();
    const size_t es = dtypeSize(c.dtype);
    Buffer in = makeBuffer(c.count, c.dtype), out = makeBuffer(c.count * size, c.dtype);
    void* src = c.inPlace ? out.data() + rank * c.count * es : in.data();
    for (size_t i = 0; i < c.count; ++i) setElem(src, i, c.dtype, value(rank, i));
    comm::allgather(ctx_, src, out.data(), c.count, c.dtype, next());
    for (int r = 0; r < size; ++r) {
      for (size_t i = 0; i < c.count; ++i) {
        if (!expect(c, out.data(), r * c.count + i, wrapped(c.dtype, value(r, i)), 0)) return;
      }
    }
  }

  void broadcast(const Case& c) {
    const int rank = ctx_.rank();
    Buffer buf = makeBuffer(c.count, c.dtype);
    if (rank == c.root) {
      for (size_t i = 0; i < c.count; ++i) setElem(buf.data(), i, c.dtype, value(c.root, i));
    }
    comm::broadcast(ctx_, buf.data(), c.count, c.dtype, c.root, next());
    for (size_t i = 0; i < c.count; ++i) {
      if (!expect(c, buf.data(), i, wrapped(c.dtype, value(c.root, i)), 0)) return;
    }
  }

  void gather(const Case& c) {
    const int rank = ctx_.rank(), size = ctx_.size();
    const size_t es = dtypeSize(c.dtype);
    Buffer in = makeBuffer(c.count, c.dtype), out = makeBuffer(c.count * size, c.dtype);
    void* src = c.inPlace && rank == c.root ? out.data() + rank * c.count * es : in.data();
    for (size_t i = 0; i < c.count; ++i) setElem(src, i, c.dtype, value(rank, i));
    comm::gather(ctx_, src, rank == c.root ? out.data() : nullptr, c.count, c.dtype, c.root,
                 next());
    if (rank != c.root) return;
    for (int r = 0; r < size; ++r) {
      for (size_t i = 0; i < c.count; ++i) {
        if (!expect(c, out.data(), r * c.count + i, wrapped(c.dtype, value(r, i)), 0)) return;
      }
    }
  }

  void scatter(const Case& c) {
    const int rank = ctx_.rank(), size = ctx_.size();
    const size_t es = dtypeSize(c.dtype);
    Buffer in = makeBuffer(c.count * size, c.dtype), out = makeBuffer(c.count, c.dtype);
    if (rank == c.root) {
      for (size_t i = 0; i < c.count * size; ++i) setElem(in.data(), i, c.dtype, value(c.root, i));
    }
    void* dst = c.inPlace && rank == c.root ? in.data() + rank * c.count * es : out.data();
    comm::scatter(ctx_, rank == c.root ? in.data() : nullptr, dst, c.count, c.dtype, c.root,
                  next());
    for (size_t i = 0; i < c.count; ++i) {
      if (!expect(c, dst, i, wrapped(c.dtype, value(c.root, rank * c.count + i)), 0)) return;
    }
  }

  void alltoall(const Case& c) {
    const int rank = ctx_.rank(), size = ctx_.size();
    Buffer in = makeBuffer(c.count * size, c.dtype), out = makeBuffer(c.count * size, c.dtype);
    for (size_t i = 0; i < c.count * size; ++i) setElem(in.data(), i, c.dtype, value(rank, i));
    void* dst = c.inPlace ? in.data() : out.data();
    comm::alltoall(ctx_, in.data(), dst, c.count, c.dtype, next());
    for (int r = 0; r < size; ++r) {
      for (size_t i = 0; i < c.count; ++i) {
        if (!expect(c, dst, r * c.count + i, wrapped(c.dtype, value(r, rank * c.count + i)), 0)) {
          return;
        }
      }
    }
  }

  void barrier() { comm::barrier(ctx_, next()); }

  // Ring exchange: rank r sends to r + 1 and receives from r - 1 (tag = count).
  void sendRecv(const Case& c) {
    const int rank = ctx_.rank(), size = ctx_.size();
    if (size == 1) return;
    Buffer in = makeBuffer(c.count, c.dtype), out = makeBuffer(c.count, c.dtype);
    for (size_t i = 0; i < c.count; ++i) setElem(in.data(), i, c.dtype, value(rank, i));
    const int prev = (rank - 1 + size) % size;
    // Even ranks send first, odd ranks receive first (sends of any size complete without a
    // matching receive here, but this also checks that ordering does not matter).
    if (rank % 2 == 0) {
      comm::send(ctx_, in.data(), c.count, c.dtype, (rank + 1) % size, c.count, opts_);
      comm::recv(ctx_, out.data(), c.count, c.dtype, prev, c.count, opts_);
    } else {
      comm::recv(ctx_, out.data(), c.count, c.dtype, prev, c.count, opts_);
      comm::send(ctx_, in.data(), c.count, c.dtype, (rank + 1) % size, c.count, opts_);
    }
    for (size_t i = 0; i < c.count; ++i) {
      if (!expect(c, out.data(), i, wrapped(c.dtype, value(prev, i)), 0)) return;
    }
  }

  uint64_t seq() const { return opts_.seq; }
  // For checks written outside this class (the uneven sweep): the options of the next
  // collective (its sequence number), and one element against its closed form.
  const CollectiveOptions& nextOptions() { return next(); }
  bool expectElem(const Case& c, const void* buf, size_t i, double want, double tol) {
    return expect(c, buf, i, want, tol);
  }

 private:
  // Element i of buf against its closed form; false (and the mismatch thrown or recorded)
  // when it differs.
  bool expect(const Case& c, const void* buf, size_t i, double want, double tol) {
    const double got = getElem(buf, i, c.dtype);
    if (close(got, want, tol)) return true;
    std::string what = detail::str("rank ", ctx_.rank(), ": ", c.describe(), ": element ", i,
                                   " is ", got, ", expected ", want, " (tolerance ", tol, ")");
    if (mismatches_ == nullptr) throw std::runtime_error(what);
    mismatches_->push_back(std::move(what));
    return false;
  }
  static int64_t value(int rank, size_t i) { return static_cast<int64_t>((rank * 31 + i) % 101); }
  static double wrapped(DType dtype, int64_t v) {
    uint8_t tmp[8];
    setElem(tmp, 0, dtype, v);
    return getElem(tmp, 0, dtype);
  }
  const CollectiveOptions& next() {
    ++opts_.seq;
    return opts_;
  }

  Context& ctx_;
  CollectiveOptions opts_;
  std::vector<std::string>* mismatches_ = nullptr;
};

inline std::vector<size_t> smallCounts(int size) {
  std::vector<size_t> counts = {0, 1, 1000};
  if (size - 1 > 1) counts.push_back(static_cast<size_t>(size - 1));
  return counts;
}

inline const std::vector<int>& worldSizes() {
  static const std::vector<int> v = {1, 2, 3, 4, 7, 8};
  return v;
}

}  // namespace loom::comm::testing
