// DistributedDataParallel with ranks as threads (tcp groups over one HashStore): N ranks on
// batch B end with the parameters of one process on batch N*B, gradients bitwise equal across
// ranks after every step, noSync accumulation, bucket sizes, unused parameters, comm hooks,
// SyncBatchNorm, evaluation helpers, and overlap of communication with backward.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "ddp_test_util.h"
#include "loom/common/error.h"
#include "loom/ddp/distributed_data_parallel.h"
#include "loom/ddp/eval.h"
#include "loom/ddp/sampler.h"
#include "loom/ddp/sync_batch_norm.h"
#include "loom/process_group/factory.h"
#include "loom/store/hash_store.h"
#include "loom/testing/ranks.h"

namespace loom::ddp {
namespace {

using namespace loom::ddp::testing;
using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

void runGroups(int size, const std::function<void(std::shared_ptr<ProcessGroup>)>& fn) {
  auto store = std::make_shared<HashStore>();
  ProcessGroupOptions options;
  options.timeout = std::chrono::seconds(30);
  options.debug = DebugLevel::kOff;
  loom::testing::runThreadRanks(
      size, [&](int rank) { fn(createProcessGroup("tcp", store, rank, size, options)); });
}

nn::NamedTensors cloneState(const nn::Module& m) {
  nn::NamedTensors out;
  for (const auto& [name, t] : m.stateDict()) out.emplace_back(name, t.detach().clone());
  return out;
}

// Every rank's flattened gradients, compared bit for bit with every other rank's.
void expectGradsBitwiseEqual(ProcessGroup& pg, const nn::Module& model, int step) {
  std::vector<float> mine;
  for (const auto& [name, p] : model.namedParameters()) {
    ag::Tensor g = p.grad();
    if (!g.defined()) continue;
    mine.insert(mine.end(), g.data<float>(), g.data<float>() + g.numel());
  }
  std::vector<float> all(mine.size() * pg.size());
  pg.allgather(view(mine.data(), mine.size()), view(all.data(), all.size()))->wait();
  for (int r = 0; r < pg.size(); ++r) {
    EXPECT_EQ(0,
              std::memcmp(all.data() + r * mine.size(), mine.data(), mine.size() * sizeof(float)))
        << "rank " << pg.rank() << " step " << step << ": gradients differ from rank " << r;
  }
}

struct Config {
  int world = 2;
  int64_t batch = 4;
  int steps = 3;
  int accumulate = 1;
  OptKind opt = OptKind::kSGD;
  double bucketCapMb = 25;
  std::string hook = "none";
  std::vector<int64_t> sizes{10, 12, 12, 4};
};

std::string describe(const Config& c) {
  return "world=" + std::to_string(c.world) + " accumulate=" + std::to_string(c.accumulate) +
         " opt=" + (c.opt == OptKind::kSGD ? "sgd" : "adam") +
         " bucketCapMb=" + std::to_string(c.bucketCapMb) + " hook=" + c.hook;
}

Dataset dataFor(const Config& c) {
  return makeData(c.world * c.batch * c.steps * c.accumulate, c.sizes.front(), c.sizes.back());
}

nn::NamedTensors trainReference(const Config& c, const Dataset& d) {
  auto model = makeMlp(c.sizes);
  auto opt = makeOptimizer(c.opt, model->parameters());
  const int64_t global = c.world * c.batch;
  for (int s = 0; s < c.steps; ++s) {
    opt->zeroGrad();
    for (int k = 0; k < c.accumulate; ++k) {
      const int64_t begin = (s * c.accumulate + k) * global;
      ag::Tensor loss = ag::crossEntropy(model->forward(rowsOf(d.x, begin, global)),
                                         rowsOf(d.labels, begin, global));
      loss.backward();
    }
    opt->step();
  }
  return cloneState(*model);
}

nn::NamedTensors trainRank(const Config& c, const Dataset& d, std::shared_ptr<ProcessGroup> pg) {
  // Other ranks start from different weights: DDP's broadcast from rank 0 must fix that.
  auto model = makeMlp(c.sizes, 7 + 1000 * pg->rank());
  DdpOptions options;
  options.bucketCapMb = c.bucketCapMb;
  options.firstBucketCapMb = std::min(1.0, c.bucketCapMb);
  options.commHook = commHookByName(c.hook);
  DistributedDataParallel ddp(model, pg, options);
  auto opt = makeOptimizer(c.opt, model->parameters());
  const int64_t global = c.world * c.batch;
  for (int s = 0; s < c.steps; ++s) {
    opt->zeroGrad();
    for (int k = 0; k < c.accumulate; ++k) {
      const int64_t begin = (s * c.accumulate + k) * global + pg->rank() * c.batch;
      auto run = [&] {
        ag::Tensor loss = ag::crossEntropy(ddp.forward(rowsOf(d.x, begin, c.batch)),
                                           rowsOf(d.labels, begin, c.batch));
        loss.backward();
      };
      if (k + 1 < c.accumulate) {
        auto guard = ddp.noSync();
        run();
      } else {
        run();
        ddp.finalize();
      }
    }
    expectGradsBitwiseEqual(*pg, *model, s);
    opt->step();
  }
  EXPECT_TRUE(c.steps < 2 || ddp.reducer().rebuilt()) << "buckets never rebuilt";
  return cloneState(*model);
}

void checkMatchesReference(const Config& c, double tol) {
  const Dataset d = dataFor(c);
  const nn::NamedTensors expected = trainReference(c, d);
  runGroups(c.world, [&](std::shared_ptr<ProcessGroup> pg) {
    expectClose(trainRank(c, d, pg), expected, tol, describe(c));
  });
}

TEST(DdpThreads, MatchesOneProcessOnTheWholeBatch) {
  for (int world : {2, 4}) {
    for (OptKind opt : {OptKind::kSGD, OptKind::kAdam}) {
      for (int accumulate : {1, 3}) {
        for (double cap : {0.0, 0.0003, 25.0}) {  // one bucket per parameter, a few, one
          Config c;
          c.world = world;
          c.opt = opt;
          c.accumulate = accumulate;
          c.bucketCapMb = cap;
          SCOPED_TRACE(describe(c));
          checkMatchesReference(c, 1e-5);
        }
      }
    }
  }
}

TEST(DdpThreads, CompressionHooksStayCloseAndAgreeBitwise) {
  for (const char* hook : {"fp16", "bf16"}) {
    Config c;
    c.hook = hook;
    c.bucketCapMb = 0.0003;
    SCOPED_TRACE(hook);
    checkMatchesReference(c, std::string(hook) == "fp16" ? 5e-3 : 3e-2);
  }
}

TEST(DdpThreads, BucketsFollowReverseOrderThenTheObservedOrder) {
  runGroups(2, [](std::shared_ptr<ProcessGroup> pg) {
    auto model = makeMlp({4, 5, 3});
    DdpOptions o;
    o.bucketCapMb = 0;
    o.firstBucketCapMb = 0;
    DistributedDataParallel ddp(model, pg, o);
    ASSERT_EQ(ddp.reducer().numBuckets(), 4u);
    EXPECT_EQ(ddp.reducer().bucketParameterNames(0), std::vector<std::string>{"2.bias"});
    EXPECT_EQ(ddp.reducer().bucketParameterNames(3), std::vector<std::string>{"0.weight"});
    // One iteration, then the layout follows the observed ready order (the last layer's
    // gradients first, the first layer's last), the same on both ranks.
    const Dataset d = makeData(4, 4, 3);
    ag::crossEntropy(ddp.forward(d.x), d.labels).backward();
    EXPECT_FALSE(ddp.reducer().rebuilt());
    ddp.forward(d.x);
    EXPECT_TRUE(ddp.reducer().rebuilt());
    ASSERT_EQ(ddp.reducer().numBuckets(), 4u);
    EXPECT_THAT(ddp.reducer().bucketParameterNames(0)[0], ::testing::StartsWith("2."));
    EXPECT_THAT(ddp.reducer().bucketParameterNames(3)[0], ::testing::StartsWith("0."));
    o.bucketCapMb = 25;
    o.firstBucketCapMb = 1;
    DistributedDataParallel one(makeMlp({4, 5, 3}), pg, o);
    ASSERT_EQ(one.reducer().numBuckets(), 1u);
    EXPECT_EQ(one.reducer().bucketParameterNames(0),
              (std::vector<std::string>{"2.bias", "2.weight", "0.bias", "0.weight"}));
  });
}

TEST(DdpThreads, DifferentModelsAreNamedAtConstruction) {
  runGroups(3, [](std::shared_ptr<ProcessGroup> pg) {
    auto model = makeMlp({4, pg->rank() == 2 ? 6 : 5, 3});
    try {
      DistributedDataParallel ddp(model, pg);
      ADD_FAILURE() << "no error";
    } catch (const InvalidArgumentError& e) {
      EXPECT_THAT(e.what(), HasSubstr("rank 2"));
      EXPECT_THAT(e.what(), HasSubstr("0.weight [6, 4]"));
      EXPECT_THAT(e.what(), HasSubstr("0.weight [5, 4]"));
    }
  });
}

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

TEST(DdpThreads, UnusedParameterErrorNamesTheParameters) {
  const Dataset d = makeData(8, 6, 3);
  runGroups(2, [&](std::shared_ptr<ProcessGroup> pg) {
    auto model = std::make_shared<TwoHeads>();
    DistributedDataParallel ddp(model, pg);
    auto step = [&] {
      ag::crossEntropy(ddp.forward(rowsOf(d.x, pg->rank() * 4, 4)),
                       rowsOf(d.labels, pg->rank() * 4, 4))
          .backward();
    };
    // The error leaves backward itself (the reducer finalizes at the end of the pass).
    try {
      step();
      ADD_FAILURE() << "no error";
    } catch (const InvalidArgumentError& e) {
      EXPECT_THAT(e.what(), HasSubstr("2 of 4 parameters got no gradient"));
      EXPECT_THAT(e.what(), HasSubstr("b.weight, b.bias"));
      EXPECT_THAT(e.what(), HasSubstr("findUnusedParameters"));
    }
    // A forward whose backward never ran is reported at the next forward.
    ddp.forward(rowsOf(d.x, 0, 4));
    try {
      ddp.forward(rowsOf(d.x, 0, 4));
      ADD_FAILURE() << "no error";
    } catch (const InvalidArgumentError& e) {
      EXPECT_THAT(e.what(), HasSubstr("was backward run after forward?"));
    }
    // With both heads used, training proceeds.
    model->useB = true;
    step();
    EXPECT_NO_THROW(ddp.finalize());
    EXPECT_TRUE(model->namedParameters()[2].second.grad().defined());
  });
}

TEST(DdpThreads, FindUnusedParametersMatchesOneProcess) {
  const int world = 2, steps = 4;
  const int64_t batch = 3;
  const Dataset d = makeData(world * batch * steps, 6, 3);
  auto useBAt = [](int s) { return s % 2 == 1; };
  auto ref = std::make_shared<TwoHeads>();
  ag::optim::SGD refOpt(ref->parameters(), 0.1, {0.9});
  for (int s = 0; s < steps; ++s) {
    refOpt.zeroGrad(true);
    ref->useB = useBAt(s);
    ag::crossEntropy(ref->forward(rowsOf(d.x, s * world * batch, world * batch)),
                     rowsOf(d.labels, s * world * batch, world * batch))
        .backward();
    refOpt.step();
  }
  const nn::NamedTensors expected = cloneState(*ref);
  for (double cap : {0.0, 25.0}) {
    runGroups(world, [&](std::shared_ptr<ProcessGroup> pg) {
      auto model = std::make_shared<TwoHeads>();
      DdpOptions o;
      o.findUnusedParameters = true;
      o.bucketCapMb = cap;
      DistributedDataParallel ddp(model, pg, o);
      ag::optim::SGD opt(model->parameters(), 0.1, {0.9});
      for (int s = 0; s < steps; ++s) {
        opt.zeroGrad(true);
        model->useB = useBAt(s);
        const int64_t begin = s * world * batch + pg->rank() * batch;
        ag::crossEntropy(ddp.forward(rowsOf(d.x, begin, batch)), rowsOf(d.labels, begin, batch))
            .backward();
        ddp.finalize();
        // Nobody used b: its gradient stays undefined, as in the single process.
        EXPECT_EQ(model->namedParameters()[2].second.grad().defined(), useBAt(s)) << s;
        expectGradsBitwiseEqual(*pg, *model, s);
        opt.step();
      }
      expectClose(cloneState(*model), expected, 1e-5,
                  "findUnusedParameters cap " + std::to_string(cap));
    });
  }
}

TEST(DdpThreads, SyncBatchNormMatchesBatchNormOnTheConcatenatedBatch) {
  const int world = 2, steps = 3;
  const int64_t batch = 5;
  const Dataset d = makeData(world * batch * steps, 6, 3);
  auto build = [] {
    auto m = std::make_shared<nn::Sequential>();
    nn::LinearOptions lo;
    lo.seed = 5;
    m->append(std::make_shared<nn::Linear>(6, 8, lo));
    m->append(std::make_shared<nn::BatchNorm1d>(8));
    m->append(std::make_shared<nn::ReLU>());
    lo.seed = 6;
    m->append(std::make_shared<nn::Linear>(8, 3, lo));
    return m;
  };
  auto ref = build();
  ag::optim::SGD refOpt(ref->parameters(), 0.1);
  std::vector<ag::Tensor> refInputGrads;
  for (int s = 0; s < steps; ++s) {
    refOpt.zeroGrad();
    ag::Tensor x = rowsOf(d.x, s * world * batch, world * batch);
    x.setRequiresGrad(true);
    ag::crossEntropy(ref->forward(x), rowsOf(d.labels, s * world * batch, world * batch))
        .backward();
    refInputGrads.push_back(x.grad().detach().clone());
    refOpt.step();
  }
  const nn::NamedTensors expected = cloneState(*ref);
  runGroups(world, [&](std::shared_ptr<ProcessGroup> pg) {
    auto model = convertSyncBatchNorm(build(), pg);
    ASSERT_NE(std::dynamic_pointer_cast<SyncBatchNorm>(
                  std::static_pointer_cast<nn::Sequential>(model)->at(1)),
              nullptr);
    DistributedDataParallel ddp(model, pg);
    ag::optim::SGD opt(model->parameters(), 0.1);
    for (int s = 0; s < steps; ++s) {
      opt.zeroGrad();
      const int64_t begin = s * world * batch + pg->rank() * batch;
      ag::Tensor x = rowsOf(d.x, begin, batch);
      x.setRequiresGrad(true);
      ag::crossEntropy(ddp.forward(x), rowsOf(d.labels, begin, batch)).backward();
      ddp.finalize();
      // This rank's loss is a mean over batch rows, the reference's over world * batch: the
      // input gradient is world times the reference's rows.
      const float* g = x.grad().data<float>();
      const float* r = refInputGrads[s].data<float>() + pg->rank() * batch * 6;
      for (int64_t i = 0; i < batch * 6; ++i) {
        EXPECT_NEAR(g[i], world * r[i], 1e-5 + 1e-4 * std::fabs(world * r[i])) << s << " " << i;
      }
      opt.step();
    }
    expectClose(cloneState(*model), expected, 1e-5, "SyncBatchNorm");
    EXPECT_EQ(model->stateDict()[6].first, "1.num_batches_tracked");
    EXPECT_EQ(model->stateDict()[6].second.item(), steps);
  });
}

TEST(DdpThreads, GatherInOrderAndReduceMean) {
  for (int world : {1, 3}) {
    runGroups(world, [&](std::shared_ptr<ProcessGroup> pg) {
      const int64_t size = 10;
      SequentialDistributedSampler sampler(size, pg->size(), pg->rank());
      std::vector<float> local;
      for (int64_t i : sampler.indices()) local.push_back(static_cast<float>(2 * i));
      ag::Tensor all = gatherInOrder(*pg, ag::fromVector(local, {sampler.numSamples(), 1}), size);
      ASSERT_EQ(all.shape(), (ag::Shape{size, 1}));
      for (int64_t i = 0; i < size; ++i) EXPECT_EQ(all.data<float>()[i], 2 * i);
      EXPECT_DOUBLE_EQ(reduceMean(*pg, pg->rank() + 1.0), (world + 1) / 2.0);
    });
  }
}

// Every float dtype averages in place (16-bit ones through ReduceOp::kAvg); rank r holds
// r + 1 and a fraction that 16-bit types represent exactly, so the mean is exact everywhere.
TEST(DdpThreads, ReduceMeanInPlaceEveryFloatDtypeAndRejectsIntegers) {
  for (int world : {2, 3}) {
    runGroups(world, [&](std::shared_ptr<ProcessGroup> pg) {
      const float mine = static_cast<float>(pg->rank() + 1);
      const float want = static_cast<float>(world + 1) / 2.0f;
      for (ag::DType dtype :
           {ag::DType::kFloat32, ag::DType::kFloat64, ag::DType::kBFloat16, ag::DType::kFloat16}) {
        ag::Tensor t =
            ag::cast(ag::fromVector(std::vector<float>{mine, 0.5f * mine, -mine}, {3}), dtype);
        reduceMeanInPlace(*pg, t);
        ASSERT_EQ(t.dtype(), dtype);
        const std::vector<float> got = ag::cast(t, ag::DType::kFloat32).toVector<float>();
        EXPECT_EQ(got, (std::vector<float>{want, 0.5f * want, -want})) << ag::dtypeName(dtype);
      }
      ag::Tensor ints = ag::fromVector(std::vector<int64_t>{1, 2}, {2});
      try {
        reduceMeanInPlace(*pg, ints);
        ADD_FAILURE() << "an int64 tensor was averaged";
      } catch (const InvalidArgumentError& e) {
        EXPECT_THAT(e.what(), ::testing::HasSubstr("floating-point"));
      }
    });
  }
}

class FailingHook : public CommHook {
 public:
  std::string name() const override { return "failing"; }
  std::unique_ptr<HookFuture> start(ProcessGroup&, GradBucket& bucket) override {
    LOOM_THROW(IoError, "injected failure in bucket ", bucket.index);
  }
};

TEST(DdpThreads, HookErrorLeavesBackwardAndTheNextIterationWorks) {
  const Dataset d = makeData(8, 6, 3);
  runGroups(2, [&](std::shared_ptr<ProcessGroup> pg) {
    auto model = makeMlp({6, 5, 3});
    DdpOptions o;
    o.commHook = std::make_shared<FailingHook>();
    DistributedDataParallel ddp(model, pg, o);
    ag::Tensor x = rowsOf(d.x, pg->rank() * 4, 4), y = rowsOf(d.labels, pg->rank() * 4, 4);
    try {
      ag::crossEntropy(ddp.forward(x), y).backward();
      ADD_FAILURE() << "no error";
    } catch (const IoError& e) {
      EXPECT_THAT(e.what(), HasSubstr("injected failure in bucket 0"));
    }
    ddp.registerCommHook(nullptr);  // back to the default
    model->zeroGrad();
    ag::crossEntropy(ddp.forward(x), y).backward();
    ddp.finalize();
    expectGradsBitwiseEqual(*pg, *model, 1);
  });
}

// The "artificially slow transport": a comm hook that runs each bucket's all-reduce on its own
// worker thread after a fixed delay, and a model whose backward is slowed by a fixed delay per
// layer. Serial execution would take backward + communication; DDP must overlap them.
class SlowHook : public CommHook {
 public:
  explicit SlowHook(std::chrono::milliseconds delay) : delay_(delay) {
    worker_ = std::thread([this] { run(); });
  }
  ~SlowHook() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }
  std::string name() const override { return "slow"; }
  std::unique_ptr<HookFuture> start(ProcessGroup& pg, GradBucket& bucket) override {
    auto work = std::make_shared<Work>("slow_allreduce", bucket.index, pg.rank());
    {
      std::lock_guard<std::mutex> lock(mu_);
      jobs_.push_back({&pg, bucket.data, bucket.count, work});
    }
    cv_.notify_all();
    return std::make_unique<WorkFuture>(work);
  }
  std::chrono::nanoseconds busy() const { return std::chrono::nanoseconds(busyNs_.load()); }
  void resetBusy() { busyNs_ = 0; }

 private:
  struct Job {
    ProcessGroup* pg;
    float* data;
    size_t count;
    std::shared_ptr<Work> work;
  };
  void run() {
    for (;;) {
      Job job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
        if (jobs_.empty()) return;
        job = jobs_.front();
        jobs_.pop_front();
      }
      const auto t0 = Clock::now();
      try {
        std::this_thread::sleep_for(delay_);  // simulated slow communication
        job.pg->allreduce(view(job.data, job.count))->wait();
        for (size_t i = 0; i < job.count; ++i) job.data[i] /= job.pg->size();
        job.work->markCompleted();
      } catch (...) {
        job.work->markFailed(std::current_exception());
      }
      busyNs_ += (Clock::now() - t0).count();
    }
  }

  std::chrono::milliseconds delay_;
  std::thread worker_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  bool stop_ = false;
  std::atomic<int64_t> busyNs_{0};
};

TEST(DdpThreads, CommunicationOverlapsBackward) {
  using std::chrono::milliseconds;
  const milliseconds computeDelay(25), commDelay(12);
  const Dataset d = makeData(8, 16, 4);
  runGroups(2, [&](std::shared_ptr<ProcessGroup> pg) {
    auto model = makeMlp({16, 16, 16, 16, 16, 4});
    // Slow "compute": each weight's gradient takes computeDelay longer to appear.
    for (auto& [name, p] : model->namedParameters()) {
      if (name.find("weight") != std::string::npos) {
        // Simulated compute time: the behaviour under test.
        p.registerGradReadyHook([=](ag::Tensor&) { std::this_thread::sleep_for(computeDelay); });
      }
    }
    auto hook = std::make_shared<SlowHook>(commDelay);
    DdpOptions o;
    o.bucketCapMb = 0;  // one bucket per parameter: 10 buckets
    o.firstBucketCapMb = 0;
    o.commHook = hook;
    DistributedDataParallel ddp(model, pg, o);
    ag::Tensor x = rowsOf(d.x, pg->rank() * 4, 4), y = rowsOf(d.labels, pg->rank() * 4, 4);
    // Backward alone (no synced iteration: the DDP hooks do nothing).
    double backwardOnly = 1e9;
    for (int i = 0; i < 3; ++i) {
      auto guard = ddp.noSync();
      ag::Tensor loss = ag::crossEntropy(ddp.forward(x), y);
      const auto t0 = Clock::now();
      loss.backward();
      backwardOnly =
          std::min(backwardOnly, std::chrono::duration<double>(Clock::now() - t0).count());
    }
    double bestRatio = 1e9, step = 0, comm = 0;
    for (int i = 0; i < 4; ++i) {
      ag::Tensor loss = ag::crossEntropy(ddp.forward(x), y);
      hook->resetBusy();
      const auto t0 = Clock::now();
      loss.backward();
      ddp.finalize();
      const double s = std::chrono::duration<double>(Clock::now() - t0).count();
      const double c = std::chrono::duration<double>(hook->busy()).count();
      if (i > 0 && s / (backwardOnly + c) < bestRatio) {  // i == 0 is the pre-rebuild layout
        bestRatio = s / (backwardOnly + c);
        step = s;
        comm = c;
      }
    }
    // Serial would be ratio >= 1; perfect overlap here is about (5*25 + 2*12) / (125 + 120).
    EXPECT_LT(bestRatio, 0.8) << "step " << step * 1e3 << " ms, backward " << backwardOnly * 1e3
                              << " ms, communication " << comm * 1e3 << " ms";
    if (pg->rank() == 0) {
      std::printf("overlap: step %.1f ms, backward alone %.1f ms, communication %.1f ms\n",
                  step * 1e3, backwardOnly * 1e3, comm * 1e3);
    }
  });
}

}  // namespace
}  // namespace loom::ddp
