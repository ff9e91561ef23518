// DDP features beyond the basics, with ranks as threads (tcp groups over one HashStore):
// staticGraph (one graph search, the errors when the graph changes), Join (uneven inputs against
// a reference computed without DDP), gradientAsBucketView (bitwise equal to the copying path),
// and overlap of bucket all-reduces with backward measured with the real backend.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>

#include "ddp_test_util.h"
#include "ddp_thread_ranks.h"
#include "loom/common/error.h"
#include "loom/ddp/distributed_data_parallel.h"
#include "loom/ddp/join.h"
#include "loom/process_group/diagnostics.h"
#include "loom/process_group/factory.h"
#include "loom/store/hash_store.h"
#include "loom/testing/ranks.h"

namespace loom::ddp {
namespace {

using namespace loom::ddp::testing;
using ::testing::HasSubstr;

// Two heads; the second one takes part only when useB is set.
class TwoHeads : public nn::Module {
 public:
  TwoHeads() {
    nn::LinearOptions lo;
    lo.seed = 11;
    a_ = std::make_shared<nn::Linear>(6, 3, lo);
    lo.seed = 12;
    b_ = std::make_shared<nn::Linear>(6, 3, lo);
    registerModule("a", a_);
    registerModule("b", b_);
  }
  ag::Tensor forward(const ag::Tensor& x) override {
    ag::Tensor out = a_->forward(x);
    return useB ? out + b_->forward(x) : out;
  }
  std::string describe() const override { return "TwoHeads"; }
  bool useB = false;

 private:
  std::shared_ptr<nn::Linear> a_, b_;
};

// staticGraph with a parameter unused throughout: one graph search in 5 iterations (where
// findUnusedParameters searches every time), the same parameters as findUnusedParameters, the
// bucket order fixed after the rebuild.
TEST(StaticGraph, SearchesOnceAndTrainsLikeFindUnused) {
  const int world = 2, steps = 5;
  const int64_t batch = 3;
  const Dataset d = makeData(world * batch * steps, 6, 3);
  std::vector<nn::NamedTensors> results(2);
  for (bool staticGraph : {false, true}) {
    runGroups(world, [&](std::shared_ptr<ProcessGroup> pg) {
      auto model = std::make_shared<TwoHeads>();
      DdpOptions o;
      o.staticGraph = staticGraph;
      o.findUnusedParameters = !staticGraph;
      o.bucketCapMb = 0;
      o.firstBucketCapMb = 0;
      DistributedDataParallel ddp(model, pg, o);
      ag::optim::SGD opt(model->parameters(), 0.1, {0.9});
      std::vector<std::vector<std::string>> layoutAfter2;
      for (int s = 0; s < steps; ++s) {
        opt.zeroGrad(true);
        const int64_t begin = s * world * batch + pg->rank() * batch;
        ag::crossEntropy(ddp.forward(rowsOf(d.x, begin, batch)), rowsOf(d.labels, begin, batch))
            .backward();
        EXPECT_FALSE(model->namedParameters()[2].second.grad().defined()) << s;
        opt.step();
        if (s == 1) {
          for (size_t b = 0; b < ddp.reducer().numBuckets(); ++b) {
            layoutAfter2.push_back(ddp.reducer().bucketParameterNames(b));
          }
        }
      }
      EXPECT_EQ(ddp.reducer().graphSearches(), staticGraph ? 1 : steps);
      EXPECT_EQ(ddp.reducer().iterations(), steps);
      ASSERT_EQ(ddp.reducer().numBuckets(), layoutAfter2.size());
      for (size_t b = 0; b < layoutAfter2.size(); ++b) {
        EXPECT_EQ(ddp.reducer().bucketParameterNames(b), layoutAfter2[b]);
      }
      if (pg->rank() == 0) results[staticGraph] = cloneState(*model);
    });
  }
  expectClose(results[1], results[0], 1e-6, "staticGraph vs findUnusedParameters");
}

TEST(StaticGraph, AParameterThatStartsTakingPartIsNamed) {
  const Dataset d = makeData(8, 6, 3);
  runGroups(2, [&](std::shared_ptr<ProcessGroup> pg) {
    auto model = std::make_shared<TwoHeads>();
    DdpOptions o;
    o.staticGraph = true;
    DistributedDataParallel ddp(model, pg, o);
    auto step = [&] {
      ag::crossEntropy(ddp.forward(rowsOf(d.x, pg->rank() * 4, 4)),
                       rowsOf(d.labels, pg->rank() * 4, 4))
          .backward();
    };
    step();
    step();
    model->useB = true;
    try {
      step();
      ADD_FAILURE() << "no error";
    } catch (const InvalidArgumentError& e) {
      EXPECT_THAT(e.what(), HasSubstr("staticGraph: parameter 'b."));
      EXPECT_THAT(e.what(), HasSubstr("unused in the first iteration but got a gradient in "
                                      "iteration 3"));
    }
  });
}

TEST(StaticGraph, AParameterThatStopsTakingPartIsNamed) {
  const Dataset d = makeData(8, 6, 3);
  runGroups(2, [&](std::shared_ptr<ProcessGroup> pg) {
    auto model = std::make_shared<TwoHeads>();
    model->useB = true;
    DdpOptions o;
    o.staticGraph = true;
    DistributedDataParallel ddp(model, pg, o);
    auto step = [&] {
      ag::crossEntropy(ddp.forward(rowsOf(d.x, pg->rank() * 4, 4)),
                       rowsOf(d.labels, pg->rank() * 4, 4))
          .backward();
    };
    step();
    model->useB = false;
    try {
      step();
      ADD_FAILURE() << "no error";
    } catch (const InvalidArgumentError& e) {
      EXPECT_THAT(e.what(), HasSubstr("staticGraph: 2 of 4 parameters took part in the first "
                                      "iteration but got no gradient in iteration 2: b.weight, "
                                      "b.bias"));
    }
  });
}

// Join: ranks hold batches[r] batches. The reference trains one model without DDP: in iteration
// s the gradient is the sum of the gradients of the ranks that still have a batch, divided by
// the world size (divideByInitialWorldSize) or by the number of those ranks. Every rank must end
// with the reference model (those that ran out early get it from the last rank with data).
void checkJoin(const std::vector<int>& batches, bool byWorld, bool findUnused,
               bool staticGraph = false) {
  const int world = static_cast<int>(batches.size());
  const int steps = *std::max_element(batches.begin(), batches.end());
  const int64_t batch = 4;
  const Dataset d = makeData(world * batch * steps, 6, 3);
  auto rowsFor = [&](int rank, int s) { return (s * world + rank) * batch; };
  auto activeAt = [&](int s) {
    return static_cast<int>(
        std::count_if(batches.begin(), batches.end(), [&](int b) { return s < b; }));
  };
  auto ref = makeMlp({6, 8, 8, 3});
  ag::optim::SGD refOpt(ref->parameters(), 0.1, {0.9});
  for (int s = 0; s < steps; ++s) {
    refOpt.zeroGrad();
    for (int r = 0; r < world; ++r) {
      if (s >= batches[r]) continue;
      ag::crossEntropy(ref->forward(rowsOf(d.x, rowsFor(r, s), batch)),
                       rowsOf(d.labels, rowsFor(r, s), batch))
          .backward();
    }
    const float divisor = static_cast<float>(byWorld ? world : activeAt(s));
    for (auto& p : ref->parameters()) {
      float* g = p.grad().data<float>();
      for (int64_t i = 0; i < p.numel(); ++i) g[i] /= divisor;
    }
    refOpt.step();
  }
  const nn::NamedTensors expected = cloneState(*ref);
  runGroups(world, [&](std::shared_ptr<ProcessGroup> pg) {
    auto model = makeMlp({6, 8, 8, 3}, 7 + 100 * pg->rank());  // fixed by the broadcast
    DdpOptions o;
    o.bucketCapMb = 0.0003;  // a few buckets
    o.firstBucketCapMb = 0.0001;
    o.findUnusedParameters = findUnused;
    o.staticGraph = staticGraph;
    DistributedDataParallel ddp(model, pg, o);
    ag::optim::SGD opt(model->parameters(), 0.1, {0.9});
    JoinOptions jo;
    jo.divideByInitialWorldSize = byWorld;
    {
      Join join(ddp, jo);
      for (int s = 0; s < batches[pg->rank()]; ++s) {
        opt.zeroGrad();
        ag::crossEntropy(ddp.forward(rowsOf(d.x, rowsFor(pg->rank(), s), batch)),
                         rowsOf(d.labels, rowsFor(pg->rank(), s), batch))
            .backward();
        EXPECT_EQ(ddp.activeRanks(), activeAt(s)) << s;
        opt.step();
      }
      join.finish();
    }
    EXPECT_FALSE(ddp.joining());
    expectClose(cloneState(*model), expected, 1e-5, "rank " + std::to_string(pg->rank()));
    EXPECT_EQ(ddp.reducer().iterations(), steps);
  });
}

TEST(Join, UnevenInputsMatchAReferenceWithoutDdp) {
  for (bool byWorld : {true, false}) {
    SCOPED_TRACE(byWorld ? "divideByInitialWorldSize" : "average over ranks with data");
    checkJoin({10, 9, 7}, byWorld, false);
  }
}

// With findUnusedParameters (the joined ranks shadow the used-flags all-reduce too), and with a
// rank that never has a batch while rank 0 runs out first (the rebuild and the final model
// then come from other ranks' runs), also under staticGraph.
TEST(Join, FindUnusedAndARankWithoutData) {
  checkJoin({10, 9, 7}, false, true);
  checkJoin({3, 0, 5}, false, false);
  checkJoin({3, 0, 5}, true, true);
  checkJoin({3, 0, 5}, false, false, true);  // staticGraph: the rank without data learns the set
}

TEST(Join, RanksMustAgreeOnNoSync) {
  const Dataset d = makeData(8, 6, 3);
  runGroups(2, [&](std::shared_ptr<ProcessGroup> pg) {
    auto model = makeMlp({6, 4, 3});
    DistributedDataParallel ddp(model, pg);
    Join join(ddp);
    auto run = [&] {
      ag::crossEntropy(ddp.forward(rowsOf(d.x, 0, 4)), rowsOf(d.labels, 0, 4)).backward();
    };
    try {
      if (pg->rank() == 0) {
        auto guard = ddp.noSync();
        run();
      } else {
        run();
      }
      ADD_FAILURE() << "no error";
    } catch (const InvalidArgumentError& e) {
      EXPECT_THAT(e.what(), HasSubstr("1 of 2 ranks with data ran this iteration under noSync()"));
    }
  });
}

// gradientAsBucketView (the default) against the copying path: bitwise the same parameters for
// 2 and 3 ranks x SGD momentum and Adam x noSync accumulation over 1 and 3 micro-batches x bucket
// caps 0, 0.0003 and 25 MiB (rebuild included); and with views on, every gradient's storage lies
// inside a bucket after every step (nothing was copied out), also after zeroGrad(setToNone).
TEST(GradientAsBucketView, EqualsTheCopyingPathBitwiseAndLivesInTheBuckets) {
  const int steps = 4;
  const int64_t batch = 3;
  for (int world : {2, 3}) {
    for (OptKind kind : {OptKind::kSGD, OptKind::kAdam}) {
      for (int accumulate : {1, 3}) {
        for (double cap : {0.0, 0.0003, 25.0}) {
          const std::string what = "world " + std::to_string(world) + " accumulate " +
                                   std::to_string(accumulate) + " cap " + std::to_string(cap) +
                                   (kind == OptKind::kSGD ? " sgd" : " adam");
          SCOPED_TRACE(what);
          const Dataset d = makeData(world * batch * steps * accumulate, 10, 4);
          std::vector<nn::NamedTensors> finals(2);
          for (bool views : {false, true}) {
            runGroups(world, [&](std::shared_ptr<ProcessGroup> pg) {
              auto model = makeMlp({10, 12, 7, 4});
              DdpOptions o;
              o.gradientAsBucketView = views;
              o.bucketCapMb = cap;
              o.firstBucketCapMb = std::min(cap, 1.0);
              DistributedDataParallel ddp(model, pg, o);
              auto opt = makeOptimizer(kind, model->parameters());
              for (int s = 0; s < steps; ++s) {
                opt->zeroGrad(s == 2);  // once with setToNone: the views must come back
                for (int k = 0; k < accumulate; ++k) {
                  const int64_t begin = ((s * accumulate + k) * world + pg->rank()) * batch;
                  auto run = [&] {
                    ag::crossEntropy(ddp.forward(rowsOf(d.x, begin, batch)),
                                     rowsOf(d.labels, begin, batch))
                        .backward();
                  };
                  if (k + 1 < accumulate) {
                    auto guard = ddp.noSync();
                    run();
                  } else {
                    run();
                  }
                }
                if (views) {
                  for (const auto& [name, p] : model->namedParameters()) {
                    const float* g = p.grad().data<float>();
                    bool inside = false;
                    for (size_t b = 0; b < ddp.reducer().numBuckets(); ++b) {
                      const float* lo = ddp.reducer().bucketData(b);
                      inside |= g >= lo && g + p.numel() <= lo + ddp.reducer().bucketSize(b);
                    }
                    EXPECT_TRUE(inside) << name << " step " << s << ": grad() is not a bucket view";
                  }
                }
                opt->step();
              }
              if (pg->rank() == 0) finals[views] = cloneState(*model);
            });
          }
          for (size_t i = 0; i < finals[0].size(); ++i) {
            EXPECT_EQ(0, std::memcmp(finals[0][i].second.rawData(), finals[1][i].second.rawData(),
                                     finals[0][i].second.nbytes()))
                << finals[0][i].first << " differs between views and copies";
          }
        }
      }
    }
  }
}

// Whether [p, p + bytes) lies in a mapping of a Loom window (/proc/self/maps).
bool inWindowMapping(const void* p, size_t bytes) {
  const auto lo = reinterpret_cast<uintptr_t>(p);
  std::FILE* maps = std::fopen("/proc/self/maps", "r");
  char line[512];
  bool inside = false;
  while (maps != nullptr && std::fgets(line, sizeof(line), maps) != nullptr) {
    unsigned long start = 0, end = 0;
    if (std::strstr(line, "/memfd:loom-window-") == nullptr ||
        std::sscanf(line, "%lx-%lx", &start, &end) != 2) {
      continue;
    }
    inside |= lo >= start && lo + bytes <= end;
  }
  if (maps != nullptr) std::fclose(maps);
  return inside;
}

// Buckets in Loom windows (the default) against ordinary memory, with the window path taken at
// every size (shmWindowMinBytes = 1): bitwise the same parameters, 2 and 3 thread ranks, with
// and without gradient views; the buckets really are windows.
TEST(WindowBuckets, EqualOrdinaryBucketsBitwiseAndAreWindows) {
  const int steps = 4;
  const int64_t batch = 3;
  for (int world : {2, 3}) {
    for (bool views : {true, false}) {
      SCOPED_TRACE("world " + std::to_string(world) + (views ? " views" : " copies"));
      const Dataset d = makeData(world * batch * steps, 10, 4);
      std::vector<nn::NamedTensors> finals(2);
      for (bool windows : {false, true}) {
        auto store = std::make_shared<HashStore>();
        loom::testing::runThreadRanks(world, [&](int rank) {
          ProcessGroupOptions po;
          po.timeout = std::chrono::seconds(30);
          po.debug = DebugLevel::kOff;
          po.comm.context.shmWindowMinBytes = 1;
          auto pg = createProcessGroup("tcp", store, rank, world, po);
          auto model = makeMlp({10, 12, 7, 4});
          DdpOptions o;
          o.gradientAsBucketView = views;
          o.windowBuckets = windows;
          o.bucketCapMb = 0.0003;  // several buckets
          o.firstBucketCapMb = 0.0003;
          DistributedDataParallel ddp(model, pg, o);
          auto opt = makeOptimizer(OptKind::kAdam, model->parameters());
          for (int s = 0; s < steps; ++s) {
            opt->zeroGrad();
            const int64_t begin = (s * world + pg->rank()) * batch;
            ag::crossEntropy(ddp.forward(rowsOf(d.x, begin, batch)), rowsOf(d.labels, begin, batch))
                .backward();
            opt->step();
          }
          for (size_t b = 0; b < ddp.reducer().numBuckets(); ++b) {
            EXPECT_EQ(inWindowMapping(ddp.reducer().bucketData(b),
                                      ddp.reducer().bucketSize(b) * sizeof(float)),
                      windows)
                << "bucket " << b;
          }
          if (pg->rank() == 0) finals[windows] = cloneState(*model);
        });
      }
      ASSERT_EQ(finals[0].size(), finals[1].size());
      for (size_t i = 0; i < finals[0].size(); ++i) {
        EXPECT_EQ(0, std::memcmp(finals[0][i].second.rawData(), finals[1][i].second.rawData(),
                                 finals[0][i].second.nbytes()))
            << finals[0][i].first << " differs between window and ordinary buckets";
      }
    }
  }
}

int64_t systemUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Overlap, measured with the real tcp backend and the default all-reduce hook: the group's
// flight recorder gives each bucket all-reduce's start and end, a gradient-ready hook on every
// parameter gives the moment backward finished it (those hooks are registered before DDP's, so
// each time is taken before DDP reacts). The first layer's weight (1024 -> 512 on 256 rows) is
// the costliest gradient and comes last in backward; the last layer's bucket (its own, at a cap
// of 0) must have finished its all-reduce before that gradient was ready (a reducer that
// launched only once every gradient was ready fails this). The assertion is on the order of
// events; the best of 8 iterations counts (the first one, before
// the bucket rebuild, is left out), so a descheduled thread does not make it fail.
TEST(Overlap, BucketAllreducesRunWhileBackwardComputesEarlierLayers) {
  const int world = 2;
  const int64_t batch = 256;
  const Dataset d = makeData(world * batch, 1024, 10);
  auto store = std::make_shared<HashStore>();
  loom::testing::runThreadRanks(world, [&](int rank) {
    ProcessGroupOptions po;
    po.timeout = std::chrono::seconds(30);
    po.debug = DebugLevel::kOff;
    po.flightRecorderEntries = 4096;
    po.flightRecorderPreciseEvery = 1;  // the end times below are read to the microsecond
    auto pg = createProcessGroup("tcp", store, rank, world, po);
    auto model = makeMlp({1024, 512, 64, 10});
    // Registered before DDP's own hooks, so each time is taken before DDP reacts to it.
    std::map<std::string, int64_t> readyUs;
    for (auto& [name, p] : model->namedParameters()) {
      const std::string n = name;
      p.registerGradReadyHook([&readyUs, n](ag::Tensor&) { readyUs[n] = systemUs(); });
    }
    DdpOptions o;
    o.bucketCapMb = 0;
    o.firstBucketCapMb = 0;
    DistributedDataParallel ddp(model, pg, o);
    const ag::Tensor x = rowsOf(d.x, rank * batch, batch),
                     y = rowsOf(d.labels, rank * batch, batch);
    int overlapped = 0;
    int64_t bestLeadUs = INT64_MIN;
    for (int it = 0; it < 9; ++it) {
      model->zeroGrad();
      ag::Tensor loss = ag::crossEntropy(ddp.forward(x), y);
      // Both ranks start backward together, so neither waits in bucket 0 for a peer that is
      // still in forward (the machine may be loaded).
      pg->barrier()->wait();
      const uint64_t before = pg->lastSeq();
      loss.backward();
      if (it == 0) continue;
      // This iteration's all-reduces: one per bucket, bucket 0 first (the last layer's bias or
      // weight, after the rebuild).
      const diag::RankDump dump = diag::parseDump(pg->dumpFlightRecord(), "flight record");
      std::vector<diag::OpRecord> buckets;
      for (const auto& e : dump.entries) {
        if (e.type == OpType::kAllreduce && e.seq > before) buckets.push_back(e);
      }
      ASSERT_EQ(buckets.size(), ddp.reducer().numBuckets());
      ASSERT_THAT(ddp.reducer().bucketParameterNames(0)[0], ::testing::StartsWith("4."));
      const diag::OpRecord& first = buckets.front();
      ASSERT_GT(first.endUs, 0);
      ASSERT_GE(first.endUs, first.startUs);
      const int64_t firstLayerReady = readyUs.at("0.weight");
      bestLeadUs = std::max(bestLeadUs, firstLayerReady - first.endUs);
      if (first.endUs < firstLayerReady) ++overlapped;
    }
    EXPECT_GT(overlapped, 0) << "rank " << rank
                             << ": bucket 0's all-reduce never finished before backward had the "
                                "first layer's weight gradient (best lead "
                             << bestLeadUs << " us)";
    if (rank == 0) {
      std::printf(
          "overlap: bucket 0 all-reduce done before 0.weight's gradient in %d of 8 "
          "iterations (best lead %lld us)\n",
          overlapped, static_cast<long long>(bestLeadUs));
    }
  });
}

}  // namespace
}  // namespace loom::ddp
