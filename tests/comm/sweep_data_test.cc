// Thread-rank sweep of the data-movement collectives: broadcast, all-gather, gather,
// scatter, all-to-all, barrier and send/recv over world sizes {1, 2, 3, 4, 7, 8} x counts
// {0, 1, size-1, 1000} x every dtype, one test per case (`Sweep/Data.Gather/ws3_count2_int8`),
// each in-place and out-of-place and from every root; partly overlapping buffers refused; and a
// rank that skips a collective named at once.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "loom/common/error.h"
#include "sweep_world.h"

namespace loom::comm::testing {
namespace {

using Data = SweepTest;

Case dataCase(const char* what, const SweepCase& p, bool inPlace, int root) {
  return {what, p.dtype, ReduceOp::kSum, p.count, inPlace, root};
}

TEST_P(Data, Broadcast) {
  check([&](Checker& check) {
    for (int root = 0; root < param().size; ++root) {
      check.broadcast(dataCase("broadcast", param(), true, root));
    }
  });
}

TEST_P(Data, Gather) {
  check([&](Checker& check) {
    for (int root = 0; root < param().size; ++root) {
      for (bool inPlace : {false, true}) check.gather(dataCase("gather", param(), inPlace, root));
    }
  });
}

TEST_P(Data, Scatter) {
  check([&](Checker& check) {
    for (int root = 0; root < param().size; ++root) {
      for (bool inPlace : {false, true}) check.scatter(dataCase("scatter", param(), inPlace, root));
    }
  });
}

TEST_P(Data, Allgather) {
  check([&](Checker& check) {
    for (bool inPlace : {false, true}) check.allgather(dataCase("allgather", param(), inPlace, 0));
  });
}

TEST_P(Data, Alltoall) {
  check([&](Checker& check) {
    for (bool inPlace : {false, true}) check.alltoall(dataCase("alltoall", param(), inPlace, 0));
  });
}

TEST_P(Data, SendRecvAndBarrier) {
  check([&](Checker& check) {
    check.sendRecv(dataCase("send/recv", param(), false, 0));
    check.barrier();
  });
}

// Buffers that overlap without being the in-place form (one buffer, or this rank's block of the
// larger one) are refused on every rank before any message, naming both ranges and the form;
// windows would have peers read what is being overwritten. The Context stays usable, and the
// in-place forms still run (the sweeps check their results).
TEST(Aliasing, PartlyOverlappingBuffersAreRefused) {
  const int n = 3;
  const size_t count = 64;
  runWorld(n, [&](Context& ctx) {
    const int r = ctx.rank();
    std::vector<float> buf(count * n * 2 + 8, 1.0f);
    float* b = buf.data();
    CollectiveOptions opts;
    uint64_t seq = 0;
    const auto refused = [&](const std::function<void()>& call, const char* form) {
      opts.seq = ++seq;
      try {
        call();
        ADD_FAILURE() << "rank " << r << ": no error for " << form;
      } catch (const InvalidArgumentError& e) {
        EXPECT_NE(std::string(e.what()).find("without being its in-place form"), std::string::npos)
            << e.what();
        EXPECT_NE(std::string(e.what()).find(form), std::string::npos) << e.what();
      }
    };
    const DType f = DType::kFloat32;
    refused([&] { allreduce(ctx, b, b + 1, count, f, ReduceOp::kSum, opts); }, "out == in");
    refused([&] { reduce(ctx, b + 1, b, count, f, ReduceOp::kSum, r, opts); }, "out == in");
    refused([&] { alltoall(ctx, b, b + 4, count, f, opts); }, "out == in");
    // All-gather: the input inside the output but not at this rank's block.
    refused([&] { allgather(ctx, b + ((r + 1) % n) * count, b, count, f, opts); }, "in == out + ");
    refused([&] { reduceScatter(ctx, b, b + r * count + 1, count, f, ReduceOp::kSum, opts); },
            "out == in + ");
    refused([&] { gather(ctx, b + 1, b, count, f, r, opts); }, "in == out + ");
    refused([&] { scatter(ctx, b, b + 2, count, f, r, opts); }, "out == in + ");
    const std::vector<size_t> counts{count, count + 1, count + 2};
    const size_t before = r * count + (r * (r - 1)) / 2;  // counts[0] + ... + counts[r - 1]
    refused([&] { allgatherv(ctx, b + before + 1, b, counts, f, opts); }, "in == out + ");
    refused([&] { reduceScatterv(ctx, b, b + before + 1, counts, f, ReduceOp::kSum, opts); },
            "out == in + ");
    // Still usable; the in-place forms run.
    opts.seq = ++seq;
    allreduce(ctx, b, b, count, f, ReduceOp::kSum, opts);
    EXPECT_EQ(b[0], static_cast<float>(n));
    opts.seq = ++seq;
    reduceScatter(ctx, b, b + r * count, count, f, ReduceOp::kSum, opts);
    opts.seq = ++seq;
    allgather(ctx, b + r * count, b, count, f, opts);
  });
}

// A rank that skips a collective the others run fails at once on every rank, naming both
// collectives, in every mode of this binary: the shared-memory arena compares the slot's
// posts; tcp (striped and healing too) learns it from the first message of another sequence
// number on a connection where a receive of this collective waits (tag_matcher.h), instead
// of every rank waiting out its timeout.
TEST(Mismatch, ARankThatSkipsACollectiveFailsAtOnceOnEveryRank) {
  using namespace std::chrono_literals;
  const int n = 3;
  const size_t count = 64;
  const auto timeout = 30s;
  const auto bound = 10s;  // a third of the timeout: a mismatch found at the deadline fails
  std::mutex mu;
  std::vector<std::string> failures;
  runWorld(n, [&](Context& ctx) {
    const int r = ctx.rank();
    std::vector<float> in(count * n, 1.0f), out(count * n, 0.0f);
    CollectiveOptions opts;
    opts.timeout = timeout;
    opts.seq = 1;
    allreduce(ctx, in.data(), in.data(), count, DType::kFloat32, ReduceOp::kSum, opts);
    const auto start = std::chrono::steady_clock::now();
    std::string failure;
    try {
      if (r != n - 1) {
        opts.seq = 2;
        allgather(ctx, in.data(), out.data(), count, DType::kFloat32, opts);
      }
      opts.seq = 3;
      reduceScatter(ctx, out.data(), in.data(), count, DType::kFloat32, ReduceOp::kSum, opts);
      failure = "no error";
    } catch (const InvalidArgumentError& e) {
      const std::string what = e.what();
      if (std::chrono::steady_clock::now() - start > bound) failure = "too late: " + what;
      for (const char* part : {"mismatched collectives", "allgather#2", "reduce_scatter#3"}) {
        if (what.find(part) == std::string::npos)
          failure = "no \"" + std::string(part) + "\" in " + what;
      }
    } catch (const std::exception& e) {
      failure = std::string("not an InvalidArgumentError: ") + e.what();
    }
    std::lock_guard<std::mutex> lock(mu);
    if (!failure.empty()) failures.push_back(detail::str("rank ", r, ": ", failure));
  });
  for (const auto& f : failures) ADD_FAILURE() << f;
}

INSTANTIATE_TEST_SUITE_P(Sweep, Data,
                         ::testing::ValuesIn(sweepCases(worldSizes(), smallCounts, false)),
                         sweepCaseName);

}  // namespace
}  // namespace loom::comm::testing
