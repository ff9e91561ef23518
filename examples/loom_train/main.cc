// loom-train: trains an MLP (or, with --model gpt|cnn, the models of models.h) with
// DistributedDataParallel, one process per rank.
//
//   loom-run --nproc-per-node 2 loom-train --hidden 1024,1024 --batch 64 --steps 200
//
// The model is Sequential(Linear, ReLU, ..., Linear) with --in inputs and --classes outputs,
// so its parameter names are PyTorch's for the same nn.Sequential (0.weight, 0.bias, 2.weight,
// ...) and --init-weights can take a safetensors file saved from PyTorch. Data comes from
// --data X.npy (float32 [N, in]) and --labels Y.npy (int64 [N]), or is synthetic (normal
// inputs labelled by a random linear teacher, from --seed). Each rank reads its share through a
// DistributedSampler; --batch is per rank. Rank and world size come from the launcher's
// environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, as loom-run and torchrun set them);
// without it, loom-train runs as a single process. --optimizer picks SGD (--momentum,
// --nesterov), Adam or AdamW, --lr-schedule a learning-rate schedule; checkpoints hold the model,
// the optimizer and scheduler state and the step, so --resume continues a run exactly as if it
// had not stopped (the shuffled order is a function of the seed and epoch). With
// --shrink-on-failure (run under loom-run --on-worker-failure continue), the survivors of a dead
// rank shrink the group and go on in place from the last step they all finished (shrink.h).
// --amp bf16|fp16 trains in mixed precision (amp.h); fp16's loss scaler is in the checkpoints.
// --reproducible makes every gradient reduction correctly rounded (docs/reproducible.md): the
// weights then do not depend on the algorithm, transport, bucket size, tuning or overlap.
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <thread>

#include "amp.h"
#include "args.h"
#include "loom/autograd/autocast.h"
#include "loom/autograd/autograd.h"
#include "loom/autograd/engine.h"
#include "loom/autograd/grad_scaler.h"
#include "loom/autograd/npy.h"
#include "loom/autograd/ops.h"
#include "loom/autograd/optim.h"
#include "loom/autograd/parallel.h"
#include "loom/autograd/serialize.h"
#include "loom/common/error.h"
#include "loom/common/logging.h"
#include "loom/common/settings.h"
#include "loom/ddp/checkpoint.h"
#include "loom/ddp/distributed_data_parallel.h"
#include "loom/ddp/eval.h"
#include "loom/ddp/powersgd_hook.h"
#include "loom/ddp/sampler.h"
#include "loom/ddp/zero_optimizer.h"
#include "loom/process_group/factory.h"
#include "loom/process_group/init.h"
#include "loom/process_group/trace.h"
#include "loom/store/hash_store.h"
#include "lr_schedule.h"
#include "models.h"
#include "shrink.h"

namespace {

using namespace loom;
namespace nn = ag::nn;
using Clock = std::chrono::steady_clock;
using train::Args;
using train::KillPoint;
using train::makeScheduler;
using train::parseKills;
using train::truncateLog;

std::vector<int64_t> parseHidden(const std::string& text) {
  std::vector<int64_t> sizes;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    if (item.empty()) continue;
    size_t used = 0;
    int64_t v = -1;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
    }
    LOOM_CHECK(used == item.size() && v > 0, "--hidden: '", item,
               "' is not a positive integer (expected a list like 1024,1024)");
    sizes.push_back(v);
  }
  return sizes;
}

std::shared_ptr<nn::Sequential> buildModel(const Args& a) {
  std::vector<int64_t> sizes{a.in};
  for (int64_t h : parseHidden(a.hidden)) sizes.push_back(h);
  sizes.push_back(a.classes);
  auto model = std::make_shared<nn::Sequential>();
  for (size_t i = 0; i + 1 < sizes.size(); ++i) {
    nn::LinearOptions lo;
    lo.seed = a.seed * 1000 + i;
    model->append(std::make_shared<nn::Linear>(sizes[i], sizes[i + 1], lo));
    if (i + 2 < sizes.size()) model->append(std::make_shared<nn::ReLU>());
  }
  return model;
}

struct Data {
  ag::Tensor x, y;
  int64_t rows() const { return x.size(0); }
};

Data loadData(const Args& a) {
  Data d;
  if (!a.data.empty() || !a.labels.empty()) {
    LOOM_CHECK(!a.data.empty() && !a.labels.empty(), "--data and --labels go together");
    d.x = ag::loadNpy(a.data);
    d.y = ag::loadNpy(a.labels);
    LOOM_CHECK(d.x.dtype() == ag::DType::kFloat32 && d.x.dim() == 2 && d.x.size(1) == a.in, a.data,
               ": expected float32 [N, ", a.in, "], got ", ag::dtypeName(d.x.dtype()), " ",
               ag::shapeToString(d.x.shape()));
    LOOM_CHECK(d.y.dtype() == ag::DType::kInt64 && d.y.dim() == 1 && d.y.size(0) == d.x.size(0),
               a.labels, ": expected int64 [", d.x.size(0), "], got ", ag::dtypeName(d.y.dtype()),
               " ", ag::shapeToString(d.y.shape()));
    const int64_t* labels = d.y.data<int64_t>();
    for (int64_t i = 0; i < d.y.numel(); ++i) {
      LOOM_CHECK(labels[i] >= 0 && labels[i] < a.classes, a.labels, ": label ", labels[i],
                 " at row ", i, " is outside [0, ", a.classes, ")");
    }
    return d;
  }
  // Synthetic: x ~ N(0, 1); the label is the argmax of a fixed random linear teacher.
  ag::NoGradGuard noGrad;
  ag::Generator gen(a.seed + 12345);
  d.x = ag::randn({a.samples, a.in}, gen);
  const ag::Tensor teacher = ag::randn({a.in, a.classes}, gen);
  const ag::Tensor scores = ag::matmul(d.x, teacher);
  std::vector<int64_t> labels(a.samples);
  const float* s = scores.data<float>();
  for (int64_t i = 0; i < a.samples; ++i) {
    int64_t best = 0;
    for (int64_t c = 1; c < a.classes; ++c) {
      if (s[i * a.classes + c] > s[i * a.classes + best]) best = c;
    }
    labels[i] = best;
  }
  d.y = ag::fromVector(labels);
  return d;
}

std::string ckptPathOf(const Args& a) {
  return a.checkpointDir.empty() ? "" : a.checkpointDir + "/checkpoint.safetensors";
}

void gatherRows(const ag::Tensor& src, const std::vector<int64_t>& rows, ag::Tensor& dst) {
  const size_t rowBytes = src.nbytes() / src.size(0);
  for (size_t i = 0; i < rows.size(); ++i) {
    std::memcpy(static_cast<char*>(dst.rawData()) + i * rowBytes,
                static_cast<const char*>(src.rawData()) + rows[i] * rowBytes, rowBytes);
  }
}

bool launchedByLauncher() {
  for (const char* v : {"RANK", "WORLD_SIZE", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"}) {
    if (loom::settings::value(v)) return true;
  }
  return false;
}

// LOOM_TRACE: a span's args naming the step (built only while a trace is open).
std::string stepArgs(int64_t step) {
  return trace::enabled() ? "\"step\": " + std::to_string(step) : std::string();
}

// The straggler table over the flight recorder's last operations (every rank calls it; rank 0
// prints the slowest rank, as loom-bench does, or why it was not measured). The barrier
// keeps rank 0, which may host the store, alive until every rank has read the exchange.
void printSlowestRank(ProcessGroup& pg) {
  if (pg.size() < 2) return;
  try {
    const diag::StragglerTable table = pg.stragglers(std::chrono::seconds(30));
    pg.barrier()->wait();
    if (pg.rank() != 0 || table.slowest() < 0) return;
    const std::string text = table.format();
    std::printf("loom-train: %s\n", text.substr(text.rfind('\n') + 1).c_str());
  } catch (const InvalidArgumentError& e) {
    // LOOM_FLIGHT_RECORDER_ENTRIES=0, or an mpi group without a shared store: said, not waited.
    if (pg.rank() == 0) std::printf("loom-train: slowest rank: not measured: %s\n", e.what());
  }
}

int run(const Args& a) {
  ag::setNumThreads(static_cast<int>(settings::integer("LOOM_AUTOGRAD_THREADS").value_or(0)));
  // OpenBLAS's generic kernels on a CPU it does not know: switch to the ones the CPU runs, unless
  // OPENBLAS_CORETYPE chose them (autograd_lite/include/loom/autograd/parallel.h).
  ag::setGenericKernels(settings::text("OPENBLAS_CORETYPE") ? ag::GenericKernels::kKeep
                                                            : ag::GenericKernels::kUpgrade);
  LOOM_CHECK(a.batch > 0 && a.steps >= 0 && a.accumulate >= 1 && a.in > 0 && a.classes > 1,
             "--batch, --in must be > 0, --classes > 1, --steps >= 0, --accumulate >= 1");
  LOOM_CHECK(a.minRanks >= 1, "--min-ranks must be at least 1, got ", a.minRanks);
  LOOM_CHECK(a.shrinkWindowS >= 0, "--shrink-window-s must not be negative");
  LOOM_CHECK(a.testStepDelayMs >= 0, "--test-step-delay-ms must not be negative");
  LOOM_CHECK(!(a.shrinkOnFailure && a.zero),
             "--shrink-on-failure does not work with --zero: ZeRO-1 shards the optimizer state "
             "over the ranks, and a dead rank's shard is lost with it");
  LOOM_CHECK(!(a.amp == "fp16" && a.zero),
             "--amp fp16 does not work with --zero: the loss scaler must see every gradient "
             "before the optimizer steps, and ZeRO-1 reduce-scatters them inside its step "
             "(--amp bf16 needs no scaler and works with --zero)");
  const std::optional<ag::DType> autocastDType = train::ampDType(a.amp);
  LOOM_LOG_INFO("loom-train: autograd_lite matrix products on ", ag::matmulBackend());
  std::shared_ptr<ProcessGroup> pg;
  std::shared_ptr<Store> store;
  if (launchedByLauncher()) {
    InitOptions initOptions;
    // Every reduction of the group, DDP's buckets included, is then correctly rounded
    // (comm/reproducible.h); false leaves LOOM_REPRODUCIBLE in charge.
    initOptions.pg.comm.context.reproducible = a.reproducible;
    InitResult init = initProcessGroup(initOptions);
    pg = init.pg;
    store = init.store;
  } else {
    store = std::make_shared<HashStore>();
    pg = createProcessGroup("tcp", store, 0, 1);
  }
  int rank = pg->rank(), world = pg->size();
  bool leader = rank == 0;
  // Each member's rank at launch (RANK): what --test-kill and the shrink messages name.
  const int launchRank = rank;
  std::vector<int> launchRanks(world);
  for (int r = 0; r < world; ++r) launchRanks[r] = r;
  const std::vector<KillPoint> kills = parseKills(a.testKill);
  for (const KillPoint& k : kills) {
    LOOM_CHECK(k.rank < world, "--test-kill ", k.rank, ":", k.step, ": rank ", k.rank,
               " is not in this job of ", world, " rank(s)");
  }
  if (a.shrinkOnFailure && leader &&
      settings::choice("LOOM_RUN_ON_WORKER_FAILURE").value_or("continue") != "continue") {
    std::fprintf(stderr,
                 "loom-train: warning: --shrink-on-failure under loom-run --on-worker-failure "
                 "stop: loom-run stops every worker when one fails, so the survivors cannot go "
                 "on; add --on-worker-failure continue to loom-run's flags\n");
  }

  // --model gpt|cnn: the task owns the model and data; the MLP keeps its own path below.
  const std::unique_ptr<train::Task> task =
      a.model == "mlp" ? nullptr : train::makeTask(a.model, a.modelArgs, a.seed);
  const Data data = task ? Data{} : loadData(a);
  const std::shared_ptr<nn::Module> model = task ? task->model() : buildModel(a);
  if (!a.initWeights.empty()) ag::loadStateDict(*model, a.initWeights);

  // A fresh communication hook each time DDP is built (after a shrink, a PowerSGD hook starts
  // over, as in a resumed run).
  auto ddpOptions = [&] {
    ddp::DdpOptions options;
    options.bucketCapMb = a.bucketCapMb;
    if (a.commHook == "powersgd") {
      ddp::PowerSgdOptions po;
      po.matrixApproximationRank = a.powerSgdRank;
      po.startPowerSgdIter = a.powerSgdStart;
      options.commHook = std::make_shared<ddp::PowerSgdHook>(po);
    } else {
      options.commHook = ddp::commHookByName(a.commHook);
    }
    options.staticGraph = a.staticGraph;
    options.gradientAsBucketView = !a.copyGrads;
    options.windowBuckets = !a.plainBuckets;
    return options;
  };
  auto ddpModel = std::make_unique<ddp::DistributedDataParallel>(model, pg, ddpOptions());
  auto makeOptimizer =
      [&](std::vector<ag::Tensor> params) -> std::unique_ptr<ag::optim::Optimizer> {
    if (a.optimizer == "sgd") {
      ag::optim::SGDOptions so;
      so.momentum = a.momentum;
      so.weightDecay = a.weightDecay;
      so.nesterov = a.nesterov;
      return std::make_unique<ag::optim::SGD>(std::move(params), a.lr, so);
    }
    LOOM_CHECK(a.momentum == 0.0 && !a.nesterov,
               "--momentum and --nesterov are for --optimizer sgd");
    ag::optim::AdamOptions ao;
    ao.weightDecay = a.weightDecay;
    return std::make_unique<ag::optim::Adam>(std::move(params), a.lr, ao, a.optimizer == "adamw");
  };
  // --zero: ZeRO-1 owns the optimizer (this rank's shard); DDP only broadcasts at construction
  // and every backward runs under noSync (the reduce-scatter happens in zero->step()).
  std::unique_ptr<ddp::ZeroRedundancyOptimizer> zero;
  std::unique_ptr<ag::optim::Optimizer> optimizerPtr;
  if (a.zero) {
    zero =
        std::make_unique<ddp::ZeroRedundancyOptimizer>(model->namedParameters(), pg, makeOptimizer);
  } else {
    optimizerPtr = makeOptimizer(model->parameters());
  }
  ag::optim::Optimizer& optimizer = zero ? zero->localOptimizer() : *optimizerPtr;
  std::unique_ptr<ag::optim::LRScheduler> scheduler = makeScheduler(a.lrSchedule, optimizer);
  // --amp fp16: the loss scaler, and the optimizer state as checkpoints and shrink snapshots
  // hold it (the optimizer's and the scaler's, amp.h).
  std::unique_ptr<ag::optim::GradScaler> scaler;
  std::unique_ptr<train::ScaledOptimizerState> scaledState;
  if (a.amp == "fp16") {
    ag::optim::GradScalerOptions so;
    so.initScale = a.ampInitScale;
    so.growthInterval = a.ampGrowthInterval;
    scaler = std::make_unique<ag::optim::GradScaler>(so);
    scaledState = std::make_unique<train::ScaledOptimizerState>(optimizer, *scaler);
  }
  ag::optim::Optimizer& savedOptimizer = scaledState ? *scaledState : optimizer;
  int64_t skippedSteps = 0;
  const std::string ckptPath = ckptPathOf(a);
  auto save = [&](int64_t step) {
    if (zero) {
      ddp::saveCheckpoint(*pg, ckptPath, *model, step, *zero, scheduler.get());
    } else if (scheduler) {
      ddp::saveCheckpoint(*pg, ckptPath, *model, step, savedOptimizer, *scheduler);
    } else {
      ddp::saveCheckpoint(*pg, ckptPath, *model, step, savedOptimizer);
    }
    if (a.keepCheckpoints && leader) {
      // A copy beside the latest, under its step (written whole, then renamed into place).
      const std::string kept =
          a.checkpointDir + "/checkpoint-" + std::to_string(step) + ".safetensors";
      try {
        std::filesystem::copy_file(ckptPath, kept + ".tmp",
                                   std::filesystem::copy_options::overwrite_existing);
        std::filesystem::rename(kept + ".tmp", kept);
      } catch (const std::filesystem::filesystem_error& e) {
        std::error_code ignored;
        std::filesystem::remove(kept + ".tmp", ignored);  // no partial copy left behind
        LOOM_THROW(Error, "--keep-checkpoints: cannot keep ", kept, ": ", e.what());
      }
    }
  };
  auto load = [&](const std::string& path) {
    if (zero) return ddp::loadCheckpoint(*pg, path, *model, *zero, scheduler.get()).step;
    if (scheduler) {
      return ddp::loadCheckpoint(*pg, path, *model, savedOptimizer, *scheduler, true).step;
    }
    return ddp::loadCheckpoint(*pg, path, *model, savedOptimizer, true).step;
  };

  LOOM_CHECK(!a.keepCheckpoints || !ckptPath.empty(), "--keep-checkpoints needs --checkpoint-dir");
  int64_t startStep = 0;
  if (a.resume) {
    LOOM_CHECK(!ckptPath.empty(), "--resume needs --checkpoint-dir");
    if (std::filesystem::exists(ckptPath)) {
      startStep = load(ckptPath);
      if (leader)
        std::fprintf(stderr, "loom-train: resumed from %s at step %lld\n", ckptPath.c_str(),
                     static_cast<long long>(startStep));
    } else if (leader) {
      // Not an error: the first start of a job that loom-run restarts with --resume has none.
      std::fprintf(stderr, "loom-train: --resume: no checkpoint at %s yet; starting at step 0\n",
                   ckptPath.c_str());
    }
  }
  if (!ckptPath.empty() && leader) std::filesystem::create_directories(a.checkpointDir);

  // The sampler splits the rows over the group's ranks; a shrink splits them again over the
  // survivors, the way a run of that size resumed at the same step would.
  const int64_t rows = task ? task->trainRows() : data.rows();
  std::unique_ptr<ddp::DistributedSampler> sampler;
  int64_t batchesPerEpoch = 0;
  std::vector<int64_t> indices;
  int64_t currentEpoch = -1;
  auto splitData = [&] {
    sampler =
        std::make_unique<ddp::DistributedSampler>(rows, world, rank, !a.noShuffle, a.seed, true);
    batchesPerEpoch = sampler->numSamples() / a.batch;
    LOOM_CHECK(batchesPerEpoch >= 1, "the data set has ", rows, " rows: too few for ", world,
               " ranks with --batch ", a.batch);
    currentEpoch = -1;
  };
  splitData();

  std::ofstream log;
  // A failed write of the log is an error naming it (a loom::Error, not an IoError: it is no
  // peer's failure, and --shrink-on-failure must not take it for one), never a silent loss.
  auto checkLog = [&](const char* what) {
    if (log) return;
    const int err = errno;
    LOOM_THROW(Error, "--log: cannot ", what, " ", a.log, ": ", detail::errnoText(err));
  };
  auto closeLog = [&] {
    if (!log.is_open()) return;
    log.close();
    checkLog("write");
  };
  // Rank 0 writes the log; after a resume or a shrink, the rows past the step training goes on
  // from are dropped (those steps are trained and logged again).
  auto openLog = [&](int64_t fromStep) {
    if (!leader || a.log.empty()) return;
    closeLog();
    if (fromStep > 0) truncateLog(a.log, fromStep);
    log.clear();
    log.open(a.log, fromStep > 0 ? std::ios::app : std::ios::trunc);
    LOOM_CHECK(static_cast<bool>(log), "--log: cannot open ", a.log, " for writing");
    log.precision(9);
    if (fromStep == 0) log << "step,loss\n";
    checkLog("write");
  };
  openLog(startStep);
  const bool tty = leader && ::isatty(STDERR_FILENO);
  const int64_t plainEvery = std::max<int64_t>(1, a.steps / 20);

  ag::Tensor x = task ? task->makeInputs(a.batch) : ag::empty({a.batch, a.in});
  ag::Tensor y = task ? task->makeTargets(a.batch) : ag::empty({a.batch}, ag::DType::kInt64);
  // The evaluation runs in float32 whatever --amp says (the tasks read float32 outputs).
  auto evaluate = [&](int64_t step) {
    const train::EvalResult r = task->evaluate(*pg);
    if (leader) {
      std::printf("loom-train: step %lld %s\n", static_cast<long long>(step),
                  task->describe(r).c_str());
      std::fflush(stdout);
    }
  };
  double lastLoss = 0;
  // One optimizer step with every collective it involves; a failure anywhere in it leaves the
  // step unfinished on this rank.
  auto trainStep = [&](int64_t step) {
    if (zero) {
      zero->zeroGrad();
    } else {
      optimizer.zeroGrad();
    }
    double lossSum = 0;
    for (int k = 0; k < a.accumulate; ++k) {
      const int64_t micro = step * a.accumulate + k;
      const int64_t epoch = micro / batchesPerEpoch;
      if (epoch != currentEpoch) {
        sampler->setEpoch(epoch);
        indices = sampler->indices();
        currentEpoch = epoch;
      }
      const int64_t pos = (micro % batchesPerEpoch) * a.batch;
      const std::vector<int64_t> batchRows(indices.begin() + pos, indices.begin() + pos + a.batch);
      if (task) {
        task->fillBatch(batchRows, x, y);
      } else {
        gatherRows(data.x, batchRows, x);
        gatherRows(data.y, batchRows, y);
      }
      auto forwardBackward = [&] {
        ag::Tensor loss;
        {
          // --amp: the forward pass and the loss under autocast, the backward outside it (as
          // PyTorch's recipe has it: the backward runs each op in its forward's dtype).
          std::optional<ag::AutocastGuard> autocast;
          if (autocastDType) autocast.emplace(*autocastDType);
          const ag::Tensor out = ddpModel->forward(x);
          loss = task ? task->loss(out, y) : ag::crossEntropy(out, y);
        }
        if (a.accumulate > 1) loss = loss / static_cast<double>(a.accumulate);
        trace::Span span("backward", "train", stepArgs(step));
        (scaler ? scaler->scale(loss) : loss).backward();
        lossSum += loss.item();
      };
      if (k + 1 < a.accumulate || zero) {
        auto guard = ddpModel->noSync();
        forwardBackward();
      } else {
        forwardBackward();
        ddpModel->finalize();
      }
    }
    {
      trace::Span span("optimizer step", "train", stepArgs(step));
      if (zero) {
        zero->step();
      } else if (scaler) {
        // The gradients are the same on every rank (all-reduced), so every rank skips the same
        // steps and the scale stays the same everywhere.
        if (!scaler->step(optimizer)) ++skippedSteps;
        scaler->update();
      } else {
        optimizer.step();
      }
    }
    if (scheduler) scheduler->step();
    for (const KillPoint& k : kills) {
      // Test only: after the update, before the step's last collective, so that the survivors
      // hold an update they must take back.
      if (k.rank == launchRank && k.step == step + 1) ::raise(SIGKILL);
    }
    lastLoss = ddp::reduceMean(*pg, lossSum);
    const bool checkpointNow =
        !ckptPath.empty() && a.checkpointEvery > 0 && (step + 1) % a.checkpointEvery == 0;
    if (leader && log.is_open()) {
      log << step + 1 << "," << lastLoss << "\n";
      // The log holds what a checkpoint holds: a worker stopped by a signal then loses only rows
      // past its last checkpoint, which a resume drops anyway. With --shrink-on-failure every
      // row is flushed: the survivors go on from the last step all of them finished, and rows
      // a dead leader held in its buffer would be missing from the log.
      if (checkpointNow || a.shrinkOnFailure) log.flush();
      checkLog("write");
    }
    if (checkpointNow) save(step + 1);
    if (task && a.modelArgs.evalEvery > 0 && (step + 1) % a.modelArgs.evalEvery == 0 &&
        step + 1 < a.steps) {
      evaluate(step + 1);
    }
  };

  train::SnapshotRing snapshots;
  train::ShrinkSettings shrinkSettings;
  shrinkSettings.joinWindow =
      std::chrono::milliseconds(static_cast<int64_t>(a.shrinkWindowS * 1000.0));
  shrinkSettings.minRanks = a.minRanks;
  int shrinks = 0;
  // After an IoError in a step: shrink to the survivors, take every rank back to the last step
  // all of them finished, rebuild DDP and the sampler on the new group (shrink.h). Returns that
  // step.
  auto recover = [&](int64_t step, int64_t finished, const IoError& error,
                     Clock::duration failedAfter) {
    const auto recoverStart = Clock::now();
    const std::string cause(error.what());
    LOOM_LOG_INFO("loom-train: launch rank ", launchRank, ": step ", step + 1, " failed: ", cause);
    train::ShrinkResult r = train::shrinkAfterFailure(*pg, launchRanks, finished, shrinkSettings);
    const train::StepSnapshot* snapshot = snapshots.before(r.resumeStep);
    LOOM_CHECK(snapshot != nullptr, "loom-train: shrink: no snapshot of step ", r.resumeStep,
               " on launch rank ", launchRank);
    // DDP first (its reducer takes its hooks off the parameters), then the state, then the
    // new group's DDP, whose constructor broadcasts from the new rank 0 (the same values).
    ddpModel.reset();
    model->loadStateDict(snapshot->model);
    savedOptimizer.loadStateDict(snapshot->optimizer);
    if (scheduler) {
      // No setter for the epoch: a fresh scheduler from the base lr, stepped to the snapshot's
      // (lrAt is a closed form, so the lr is exactly the one the snapshot had).
      const double baseLr = scheduler->baseLr();
      scheduler.reset();
      optimizer.setLr(baseLr);
      scheduler = makeScheduler(a.lrSchedule, optimizer);
      while (scheduler->epoch() < snapshot->schedulerEpoch) scheduler->step();
    }
    const int oldWorld = world;
    pg = r.group;  // the broken group goes (destroying it never hangs)
    rank = pg->rank();
    world = pg->size();
    leader = rank == 0;
    launchRanks = r.launchRanks;
    ddpModel = std::make_unique<ddp::DistributedDataParallel>(model, pg, ddpOptions());
    splitData();
    openLog(r.resumeStep);
    ++shrinks;
    const auto tookMs =
        std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - recoverStart).count();
    if (leader) {
      std::string lost;
      for (const auto& [who, why] : r.lost) {
        lost += (lost.empty() ? "" : "; ") + std::string("rank ") + std::to_string(who) + " (" +
                why + ")";
      }
      std::printf(
          "loom-train: shrink %d: lost %s; world %d -> %d (launch ranks %s); resuming from step "
          "%lld (the last step every survivor finished); the failure surfaced %lld ms into step "
          "%lld; shrink took %lld ms (agreement %lld ms)\n",
          shrinks, lost.c_str(), oldWorld, world, train::joinRanks(launchRanks).c_str(),
          static_cast<long long>(r.resumeStep),
          static_cast<long long>(
              std::chrono::duration_cast<std::chrono::milliseconds>(failedAfter).count()),
          static_cast<long long>(step + 1), static_cast<long long>(tookMs),
          static_cast<long long>(r.took.count()));
      std::fflush(stdout);
    }
    return r.resumeStep;
  };

  const auto t0 = Clock::now();
  auto tSteady = t0;
  int64_t steadySteps = 0;
  int64_t firstStep = startStep;  // rates count from the step after this one
  int64_t finished = startStep;   // steps this rank completed, every collective included
  for (int64_t step = startStep; step < a.steps;) {
    if (a.shrinkOnFailure) snapshots.take(step, *model, savedOptimizer, scheduler.get());
    const auto stepStart = Clock::now();
    try {
      trainStep(step);
    } catch (const IoError& e) {
      if (!a.shrinkOnFailure) throw;
      step = finished = recover(step, finished, e, Clock::now() - stepStart);
      firstStep = step;
      steadySteps = 0;
      continue;
    }
    finished = step + 1;
    if (step == firstStep) {
      tSteady = Clock::now();  // the first step warms up; rates count from here
    } else {
      ++steadySteps;
    }
    if (a.testStepDelayMs > 0) {
      // Test only: a floor on the step time, so that a test can act while training runs.
      std::this_thread::sleep_for(std::chrono::milliseconds(a.testStepDelayMs));
    }
    ++step;
    if (!leader) continue;
    const double elapsed = std::chrono::duration<double>(Clock::now() - tSteady).count();
    const double rate =
        steadySteps > 0 ? steadySteps * a.batch * a.accumulate * world / elapsed : 0.0;
    if (tty) {
      const int width = 30;
      const int filled = static_cast<int>(width * step / std::max<int64_t>(1, a.steps));
      std::fprintf(stderr, "\r[%s%s] %lld/%lld loss %.4f %.0f samples/s ",
                   std::string(filled, '#').c_str(), std::string(width - filled, '.').c_str(),
                   static_cast<long long>(step), static_cast<long long>(a.steps), lastLoss, rate);
      std::fflush(stderr);
    } else if (step % plainEvery == 0 || step == a.steps) {
      std::printf("step %lld/%lld loss %.4f samples/s %.0f\n", static_cast<long long>(step),
                  static_cast<long long>(a.steps), lastLoss, rate);
      std::fflush(stdout);
    }
  }
  const double elapsed = std::chrono::duration<double>(Clock::now() - tSteady).count();
  if (!ckptPath.empty() && a.steps > startStep) {
    save(a.steps);
  }
  closeLog();
  size_t stateBytes = 0;
  for (const auto& [name, t] : optimizer.stateDict()) {
    stateBytes += static_cast<size_t>(t.numel()) * ag::dtypeSize(t.dtype());
  }
  if (tty) std::fprintf(stderr, "\n");
  if (task) {
    evaluate(a.steps);
    task->finish(rank);
  }
  printSlowestRank(*pg);
  if (leader) {
    std::printf(
        "loom-train: autograd_lite kernels: %d threads (LOOM_AUTOGRAD_THREADS), matrix products "
        "on %s\n",
        ag::numThreads(), ag::matmulBackend().c_str());
    if (autocastDType) {
      std::printf("loom-train: mixed precision %s (autocast to %s)", a.amp.c_str(),
                  ag::dtypeName(*autocastDType));
      if (scaler) {
        std::printf("; loss scale %g at the end, %lld of %lld steps skipped (inf/NaN gradients)",
                    scaler->scaleValue(), static_cast<long long>(skippedSteps),
                    static_cast<long long>(a.steps - startStep));
      }
      std::printf("\n");
    }
    std::printf("loom-train: optimizer state %zu bytes on rank 0%s\n", stateBytes,
                zero ? " (ZeRO-1: this rank's shard)" : "");
    if (a.shrinkOnFailure) {
      std::printf(
          "loom-train: shrink snapshots: %zu bytes per step (model + optimizer + scheduler), "
          "%.3f ms per step on rank 0 (mean of %lld); %d shrink(s)\n",
          snapshots.bytesPerSnapshot(), snapshots.meanMillis(),
          static_cast<long long>(snapshots.taken()), shrinks);
    }
    const double rate =
        steadySteps > 0 ? steadySteps * a.batch * a.accumulate * world / elapsed : 0.0;
    std::printf(
        "loom-train: world %d, batch %lld per rank, %lld steps, final loss %.4f, "
        "%.0f samples/s (steps after the first%s)\n",
        world, static_cast<long long>(a.batch), static_cast<long long>(a.steps - startStep),
        lastLoss, rate, shrinks > 0 ? ", since the last shrink" : "");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  if (const int code = train::parseArgs(argc, argv, a); code != train::kParsed) return code;
  try {
    return run(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loom-train: error: %s\n", e.what());
    return 1;
  }
}
