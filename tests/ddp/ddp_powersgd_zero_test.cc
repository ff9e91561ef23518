// PowerSGD (against torch 1.13's hook on fixed buckets, and inside DDP) and ZeRO-1 (against
// plain DDP after every step, state bytes per rank, consolidated checkpoints), with ranks as
// threads.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>

#include "ddp_test_util.h"
#include "ddp_thread_ranks.h"
#include "loom/common/error.h"
#include "loom/ddp/checkpoint.h"
#include "loom/ddp/distributed_data_parallel.h"
#include "loom/ddp/powersgd_hook.h"
#include "loom/ddp/zero_optimizer.h"
#include "loom/store/hash_store.h"
#include "loom/testing/ranks.h"

namespace loom::ddp {
namespace {

using namespace loom::ddp::testing;
using ::testing::HasSubstr;

// PowerSGD against torch 1.13's powerSGD_hook on the same buckets (fixtures/
// make_powersgd_reference.py): 2 ranks, 5 iterations of 2 buckets, vanilla all-reduce for the
// first 2, then compression from the same installed Q; ranks 1, 2 and 3, error feedback on and
// off. The output of every bucket in every iteration must match torch's.
TEST(PowerSgd, MatchesTorchOnFixedBuckets) {
  std::ifstream in(std::string(LOOM_DDP_FIXTURES) + "/powersgd_reference.json");
  ASSERT_TRUE(in) << "missing fixture";
  const auto ref = nlohmann::json::parse(in);
  const int world = ref["world"].get<int>();
  const int iterations = ref["iterations"].get<int>();
  const int start = ref["start"].get<int>();
  const auto shapes = ref["buckets"].get<std::vector<std::vector<std::vector<int64_t>>>>();
  const auto inputs =
      ref["inputs"].get<std::vector<std::vector<std::vector<std::vector<float>>>>>();
  const auto initialQ = ref["initial_q"].get<std::vector<std::vector<std::vector<float>>>>();
  for (size_t ci = 0; ci < ref["cases"].size(); ++ci) {
    const auto& c = ref["cases"][ci];
    SCOPED_TRACE("rank " + std::to_string(c["rank"].get<int>()) + " error feedback " +
                 std::to_string(c["error_feedback"].get<bool>()));
    const auto expected = c["outputs"].get<std::vector<std::vector<std::vector<float>>>>();
    runGroups(world, [&](std::shared_ptr<ProcessGroup> pg) {
      PowerSgdOptions o;
      o.matrixApproximationRank = c["rank"].get<int>();
      o.startPowerSgdIter = start;
      o.useErrorFeedback = c["error_feedback"].get<bool>();
      PowerSgdHook hook(o);
      double worst = 0;
      for (int it = 0; it < iterations; ++it) {
        if (it == start) {
          for (size_t b = 0; b < shapes.size(); ++b) hook.state()[b].q = initialQ[ci][b];
        }
        std::vector<std::vector<float>> data(shapes.size());
        std::vector<GradBucket> buckets(shapes.size());
        std::vector<std::unique_ptr<HookFuture>> futures;
        for (size_t b = 0; b < shapes.size(); ++b) {
          data[b] = inputs[pg->rank()][it][b];
          GradBucket& g = buckets[b];
          g.index = static_cast<int>(b);
          g.isLast = b + 1 == shapes.size();
          g.data = data[b].data();
          g.count = data[b].size();
          size_t offset = 0;
          for (const auto& s : shapes[b]) {
            g.offsets.push_back(offset);
            g.shapes.push_back(s);
            g.parameterNames.push_back("p" + std::to_string(g.offsets.size()));
            int64_t n = 1;
            for (int64_t d : s) n *= d;
            offset += static_cast<size_t>(n);
          }
          futures.push_back(hook.start(*pg, g));
        }
        for (size_t b = 0; b < shapes.size(); ++b) {
          futures[b]->wait();
          ASSERT_EQ(data[b].size(), expected[it][b].size());
          for (size_t i = 0; i < data[b].size(); ++i) {
            const double ref = expected[it][b][i];
            const double diff = std::fabs(data[b][i] - ref);
            worst = std::max(worst, diff);
            ASSERT_LE(diff, 2e-5 * std::max(1.0, std::fabs(ref)))
                << "iteration " << it << " bucket " << b << " element " << i << ": " << data[b][i]
                << " vs torch " << ref;
          }
        }
      }
      EXPECT_EQ(hook.iteration(), iterations);
      EXPECT_LT(hook.floatsSent(), hook.floatsUncompressed());
      if (pg->rank() == 0)
        std::printf("powersgd rank %d: max |loom - torch| %.3g\n", o.matrixApproximationRank,
                    worst);
    });
  }
}

// A gradient that is zero on every rank (a dead layer, an unused parameter's zeros) compresses
// to zeros: its P column has norm 0, and dividing by it (epsilon 0, the default) made NaN,
// which the warm-started Q and the error feedback then carried into every later step.
TEST(PowerSgd, AZeroGradientStaysZeroAndLeavesNoNaNBehind) {
  runGroups(2, [&](std::shared_ptr<ProcessGroup> pg) {
    PowerSgdOptions o;
    o.matrixApproximationRank = 1;
    o.startPowerSgdIter = 2;  // iterations 2 and 3 compress zeros
    PowerSgdHook hook(o);
    for (int it = 0; it < 5; ++it) {
      // Zero for iterations 0-3, then a real gradient.
      const float value = it < 4 ? 0.0f : 1.0f + static_cast<float>(pg->rank());
      std::vector<float> data(32 * 24, value);
      GradBucket g;
      g.index = 0;
      g.isLast = true;
      g.data = data.data();
      g.count = data.size();
      g.offsets = {0};
      g.shapes = {{32, 24}};
      g.parameterNames = {"weight"};
      hook.start(*pg, g)->wait();
      for (size_t i = 0; i < data.size(); ++i) {
        ASSERT_TRUE(std::isfinite(data[i])) << "iteration " << it << " element " << i;
        if (it < 4) {
          ASSERT_EQ(data[i], 0.0f) << "iteration " << it << " element " << i;
        }
      }
      // The mean of 1 and 2 everywhere: a rank-1 matrix, which rank 1 recovers, from a Q drawn
      // afresh (the zero steps left it zero).
      if (it == 4) {
        EXPECT_NEAR(data[0], 1.5f, 1e-4);
      }
    }
  });
}

TEST(PowerSgd, BadOptionsAreNamed) {
  PowerSgdOptions o;
  o.startPowerSgdIter = 1;
  try {
    PowerSgdHook hook(o);
    FAIL();
  } catch (const InvalidArgumentError& e) {
    EXPECT_THAT(e.what(), HasSubstr("startPowerSgdIter must be > 1 when useErrorFeedback"));
  }
  o = {};
  o.matrixApproximationRank = 0;
  EXPECT_THROW(PowerSgdHook{o}, InvalidArgumentError);
}

// In DDP: trains, the compressed gradients stay bitwise equal across ranks, and the loss falls.
TEST(PowerSgd, TrainsInsideDdp) {
  const int world = 2, steps = 12;
  const int64_t batch = 8;
  const Dataset d = makeData(world * batch * steps, 16, 4);
  runGroups(world, [&](std::shared_ptr<ProcessGroup> pg) {
    auto model = makeMlp({16, 32, 32, 4});
    PowerSgdOptions po;
    po.startPowerSgdIter = 2;
    auto hook = std::make_shared<PowerSgdHook>(po);
    DdpOptions o;
    o.commHook = hook;
    DistributedDataParallel ddp(model, pg, o);
    ag::optim::SGD opt(model->parameters(), 0.1, {0.9});
    double first = 0, last = 0;
    for (int s = 0; s < steps; ++s) {
      opt.zeroGrad();
      const int64_t begin = s * world * batch + pg->rank() * batch;
      ag::Tensor loss =
          ag::crossEntropy(ddp.forward(rowsOf(d.x, begin, batch)), rowsOf(d.labels, begin, batch));
      loss.backward();
      std::vector<float> mine, all;
      for (auto& p : model->parameters()) {
        mine.insert(mine.end(), p.grad().data<float>(), p.grad().data<float>() + p.numel());
      }
      all.resize(mine.size() * world);
      pg->allgather(view(mine.data(), mine.size()), view(all.data(), all.size()))->wait();
      EXPECT_EQ(0, std::memcmp(all.data(), all.data() + mine.size(), mine.size() * 4)) << s;
      opt.step();
      if (s < 2) first += loss.item();
      if (s >= steps - 2) last += loss.item();
    }
    EXPECT_EQ(hook->iteration(), steps);
    EXPECT_LT(last, first);
  });
}

ZeroRedundancyOptimizer::OptimizerFactory factoryFor(OptKind kind) {
  return [kind](std::vector<ag::Tensor> params) { return makeOptimizer(kind, std::move(params)); };
}

// ZeRO-1 against plain DDP, step by step: the same initial weights and batches; one model trained
// by DDP + the plain optimizer, the other by local backward + ZeroRedundancyOptimizer::step.
// World 3 leaves padding in the last shard.
TEST(Zero, SameParametersAsPlainDdpAfterEveryStep) {
  const int steps = 5;
  const int64_t batch = 4;
  for (int world : {2, 3}) {
    for (OptKind kind : {OptKind::kSGD, OptKind::kAdam}) {
      SCOPED_TRACE("world " + std::to_string(world) + (kind == OptKind::kSGD ? " sgd" : " adam"));
      const Dataset d = makeData(world * batch * steps, 10, 4);
      runGroups(world, [&](std::shared_ptr<ProcessGroup> pg) {
        auto plain = makeMlp({10, 12, 7, 4});
        DistributedDataParallel ddp(plain, pg);
        auto plainOpt = makeOptimizer(kind, plain->parameters());
        auto sharded = makeMlp({10, 12, 7, 4}, 7 + 100 * pg->rank());  // fixed by the broadcast
        ZeroRedundancyOptimizer zero(sharded->namedParameters(), pg, factoryFor(kind));
        EXPECT_EQ(zero.numel(), 10 * 12 + 12 + 12 * 7 + 7 + 7 * 4 + 4);
        EXPECT_EQ(zero.shardSize(), (zero.numel() + world - 1) / world);
        int bitwiseSteps = 0;
        for (int s = 0; s < steps; ++s) {
          const int64_t begin = (s * world + pg->rank()) * batch;
          const ag::Tensor x = rowsOf(d.x, begin, batch), y = rowsOf(d.labels, begin, batch);
          plainOpt->zeroGrad();
          ag::crossEntropy(ddp.forward(x), y).backward();
          plainOpt->step();
          zero.zeroGrad();
          ag::crossEntropy(sharded->forward(x), y).backward();
          zero.step();
          const auto a = cloneState(*sharded), b = cloneState(*plain);
          expectClose(a, b, 1e-6, "step " + std::to_string(s));
          bool same = true;
          for (size_t i = 0; i < a.size(); ++i) {
            same &= std::memcmp(a[i].second.rawData(), b[i].second.rawData(),
                                a[i].second.numel() * 4) == 0;
          }
          bitwiseSteps += same;
        }
        if (pg->rank() == 0) {
          std::printf("zero world %d: bitwise equal to plain DDP after %d of %d steps\n", world,
                      bitwiseSteps, steps);
        }
      });
    }
  }
}

// Optimizer-state bytes per rank for Adam on loom-train's MLP (784-1024-1024-10) at 1, 2 and 4
// ranks: the moments are 2 * 4 * ceil(N / world) bytes, plus the same few scalars everywhere.
TEST(Zero, OptimizerStateIsShardedAcrossRanks) {
  std::map<int, size_t> bytes;
  int64_t n = 0;
  for (int world : {1, 2, 4}) {
    runGroups(world, [&](std::shared_ptr<ProcessGroup> pg) {
      auto model = makeMlp({784, 1024, 1024, 10});
      ZeroRedundancyOptimizer zero(model->namedParameters(), pg, factoryFor(OptKind::kAdam));
      for (auto& p : model->parameters()) p.mutableGrad();  // zeros: creates the state
      zero.step();
      if (pg->rank() == world - 1) {
        bytes[world] = zero.stateBytes();
        n = zero.numel();
      }
    });
  }
  const size_t scalars = bytes[1] - 2 * 4 * static_cast<size_t>(n);
  for (int world : {2, 4}) {
    EXPECT_EQ(bytes[world], 2 * 4 * static_cast<size_t>((n + world - 1) / world) + scalars);
  }
  std::printf("zero adam state bytes per rank, N = %lld: 1 rank %zu, 2 ranks %zu, 4 ranks %zu\n",
              static_cast<long long>(n), bytes[1], bytes[2], bytes[4]);
}

// A ZeRO checkpoint (one file, consolidated) with a StepLR scheduler: 2 ranks train 3 steps,
// save, and train 3 more; a new group of 2 loads and trains the same 3 (bitwise the same
// parameters and lr), and a single process loads it too (resharded; the same batches
// concatenated) and ends close.
TEST(Zero, CheckpointResumesExactlyAndReshards) {
  const int world = 2, steps = 6, saveAt = 3;
  const int64_t batch = 4;
  const Dataset d = makeData(world * batch * steps, 10, 4);
  const std::string path =
      ::testing::TempDir() + "/zero_ckpt_" + std::to_string(::getpid()) + ".safetensors";
  auto train = [&](ProcessGroup& pg, nn::Module& model, ZeroRedundancyOptimizer& zero,
                   ag::optim::LRScheduler& sched, int from, int to) {
    for (int s = from; s < to; ++s) {
      const int64_t rows = batch * world / pg.size();
      const int64_t begin = s * world * batch + pg.rank() * rows;
      zero.zeroGrad();
      ag::crossEntropy(model.forward(rowsOf(d.x, begin, rows)), rowsOf(d.labels, begin, rows))
          .backward();
      zero.step();
      sched.step();
    }
  };
  nn::NamedTensors straight;
  double straightLr = 0;
  runGroups(world, [&](std::shared_ptr<ProcessGroup> pg) {
    auto model = makeMlp({10, 12, 4});
    ZeroRedundancyOptimizer zero(model->namedParameters(), pg, factoryFor(OptKind::kAdam));
    ag::optim::StepLR sched(zero.localOptimizer(), 2, 0.5);
    train(*pg, *model, zero, sched, 0, saveAt);
    saveCheckpoint(*pg, path, *model, saveAt, zero, &sched);
    train(*pg, *model, zero, sched, saveAt, steps);
    if (pg->rank() == 0) straight = cloneState(*model), straightLr = zero.localOptimizer().lr();
  });
  for (int resumeWorld : {2, 1}) {
    SCOPED_TRACE("resumed on " + std::to_string(resumeWorld) + " ranks");
    runGroups(resumeWorld, [&](std::shared_ptr<ProcessGroup> pg) {
      auto model = makeMlp({10, 12, 4}, 99);
      ZeroRedundancyOptimizer zero(model->namedParameters(), pg, factoryFor(OptKind::kAdam));
      ag::optim::StepLR sched(zero.localOptimizer(), 2, 0.5);
      const Checkpoint c = loadCheckpoint(*pg, path, *model, zero, &sched);
      EXPECT_EQ(c.step, saveAt);
      EXPECT_EQ(sched.epoch(), saveAt);
      train(*pg, *model, zero, sched, saveAt, steps);
      EXPECT_EQ(zero.localOptimizer().lr(), straightLr);
      const auto got = cloneState(*model);
      if (resumeWorld == world) {
        for (size_t i = 0; i < got.size(); ++i) {
          EXPECT_EQ(0, std::memcmp(got[i].second.rawData(), straight[i].second.rawData(),
                                   got[i].second.numel() * 4))
              << got[i].first;
        }
      } else {
        expectClose(got, straight, 1e-5, "resharded");
      }
    });
  }
  std::remove(path.c_str());
}

// The flat vector in a Loom window (the default) against ordinary memory, with the window path
// taken at every size (shmWindowMinBytes = 1): bitwise the same parameters after every step, 2
// and 3 ranks (3 leaves padding in the last shard). Then rank 0's flat vector in a window and
// rank 1's not: ZeRO's reduce-scatter would take the zero-copy path on rank 0 only, and every
// rank fails naming both paths, which shows the window path is the one taken.
TEST(Zero, FlatVectorInAWindowTakesTheZeroCopyPathWithTheSameBits) {
  const int steps = 3;
  const int64_t batch = 4;
  auto group = [](int size, const std::function<void(std::shared_ptr<ProcessGroup>)>& fn) {
    auto store = std::make_shared<HashStore>();
    ProcessGroupOptions po;
    po.timeout = std::chrono::seconds(30);
    po.debug = DebugLevel::kOff;
    po.comm.context.shmWindowMinBytes = 1;
    loom::testing::runThreadRanks(
        size, [&](int rank) { fn(createProcessGroup("tcp", store, rank, size, po)); });
  };
  for (int world : {2, 3}) {
    SCOPED_TRACE("world " + std::to_string(world));
    const Dataset d = makeData(world * batch * steps, 10, 4);
    std::vector<std::vector<nn::NamedTensors>> finals(2);
    for (bool window : {false, true}) {
      group(world, [&](std::shared_ptr<ProcessGroup> pg) {
        auto model = makeMlp({10, 12, 7, 4});
        ZeroOptions zo;
        zo.windowBuffer = window;
        ZeroRedundancyOptimizer zero(model->namedParameters(), pg, factoryFor(OptKind::kAdam), zo);
        std::vector<nn::NamedTensors> states;
        for (int s = 0; s < steps; ++s) {
          const int64_t begin = (s * world + pg->rank()) * batch;
          zero.zeroGrad();
          ag::crossEntropy(model->forward(rowsOf(d.x, begin, batch)),
                           rowsOf(d.labels, begin, batch))
              .backward();
          zero.step();
          states.push_back(cloneState(*model));
        }
        if (pg->rank() == world - 1) finals[window] = std::move(states);
      });
    }
    ASSERT_EQ(finals[0].size(), static_cast<size_t>(steps));
    ASSERT_EQ(finals[1].size(), static_cast<size_t>(steps));
    for (int s = 0; s < steps; ++s) {
      for (size_t i = 0; i < finals[0][s].size(); ++i) {
        const ag::Tensor& a = finals[0][s][i].second;
        const ag::Tensor& b = finals[1][s][i].second;
        EXPECT_EQ(0, std::memcmp(a.rawData(), b.rawData(), a.nbytes()))
            << "step " << s << ": " << finals[0][s][i].first
            << " differs between a window and an ordinary flat vector";
      }
    }
  }
  std::vector<std::string> errors(2);
  group(2, [&](std::shared_ptr<ProcessGroup> pg) {
    auto model = makeMlp({10, 12, 4});
    ZeroOptions zo;
    zo.windowBuffer = pg->rank() == 0;
    ZeroRedundancyOptimizer zero(model->namedParameters(), pg, factoryFor(OptKind::kSGD), zo);
    for (auto& p : model->parameters()) p.mutableGrad();
    try {
      zero.step();
    } catch (const std::exception& e) {
      errors[pg->rank()] = e.what();
    }
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_THAT(errors[r], HasSubstr("zero-copy window")) << "rank " << r;
    EXPECT_THAT(errors[r], HasSubstr("staged")) << "rank " << r;
  }
}

}  // namespace
}  // namespace loom::ddp
