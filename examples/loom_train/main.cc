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
// had not stopped (the shuffled order is a function of the seed and epoch).
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>

#include "loom/autograd/autograd.h"
#include "loom/autograd/engine.h"
#include "loom/autograd/npy.h"
#include "loom/autograd/ops.h"
#include "loom/autograd/optim.h"
#include "loom/autograd/parallel.h"
#include "loom/autograd/serialize.h"
#include "loom/common/error.h"
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
#include "models.h"

namespace {

using namespace loom;
namespace nn = ag::nn;
using Clock = std::chrono::steady_clock;

struct Args {
  int64_t in = 784;
  int64_t classes = 10;
  std::string hidden = "1024,1024";
  int64_t batch = 64;
  double lr = 0.01;
  double momentum = 0.0;
  double weightDecay = 0.0;
  bool nesterov = false;
  std::string optimizer = "sgd";
  int64_t steps = 100;
  uint64_t seed = 0;
  double bucketCapMb = 25;
  int accumulate = 1;
  std::string commHook = "none";
  int powerSgdRank = 1;
  int64_t powerSgdStart = 10;
  std::string lrSchedule = "none";
  bool staticGraph = false;
  bool copyGrads = false;
  bool zero = false;
  std::string initWeights, data, labels, log, checkpointDir;
  bool noShuffle = false;
  bool resume = false;
  int64_t checkpointEvery = 0;
  int64_t samples = 8192;
  std::string model = "mlp";
  train::ModelArgs modelArgs;
};

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

// "none", "step:SIZE:GAMMA" (StepLR) or "cosine:TMAX[:ETA_MIN]" (CosineAnnealingLR).
std::unique_ptr<ag::optim::LRScheduler> makeScheduler(const std::string& spec,
                                                      ag::optim::Optimizer& optimizer) {
  if (spec == "none") return nullptr;
  std::vector<std::string> parts;
  std::stringstream in(spec);
  for (std::string item; std::getline(in, item, ':');) parts.push_back(item);
  auto number = [&](size_t i) {
    size_t used = 0;
    double v = 0;
    try {
      v = std::stod(parts[i], &used);
    } catch (const std::exception&) {
      used = 0;
    }
    LOOM_CHECK(used == parts[i].size() && used > 0, "--lr-schedule ", spec, ": '", parts[i],
               "' is not a number");
    return v;
  };
  if (!parts.empty() && parts[0] == "step" && parts.size() == 3) {
    const double size = number(1);
    LOOM_CHECK(size >= 1 && size == static_cast<int64_t>(size), "--lr-schedule ", spec,
               ": the step size must be an integer >= 1");
    return std::make_unique<ag::optim::StepLR>(optimizer, static_cast<int64_t>(size), number(2));
  }
  if (!parts.empty() && parts[0] == "cosine" && (parts.size() == 2 || parts.size() == 3)) {
    const double tMax = number(1);
    LOOM_CHECK(tMax >= 1 && tMax == static_cast<int64_t>(tMax), "--lr-schedule ", spec,
               ": TMAX must be an integer >= 1");
    return std::make_unique<ag::optim::CosineAnnealingLR>(optimizer, static_cast<int64_t>(tMax),
                                                          parts.size() == 3 ? number(2) : 0.0);
  }
  LOOM_THROW(InvalidArgumentError, "--lr-schedule: '", spec,
             "' is not one of none, step:SIZE:GAMMA, cosine:TMAX[:ETA_MIN]");
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
// prints the slowest rank, as loom-bench does). Skipped when the recorder is off. The barrier
// keeps rank 0, which may host the store, alive until every rank has read the exchange.
void printSlowestRank(ProcessGroup& pg) {
  if (pg.size() < 2) return;
  try {
    const diag::StragglerTable table = pg.stragglers(std::chrono::seconds(30));
    pg.barrier()->wait();
    if (pg.rank() != 0 || table.slowest() < 0) return;
    const std::string text = table.format();
    std::printf("loom-train: %s\n", text.substr(text.rfind('\n') + 1).c_str());
  } catch (const InvalidArgumentError&) {
    // LOOM_FLIGHT_RECORDER_ENTRIES=0
  }
}

int run(const Args& a) {
  ag::setNumThreads(static_cast<int>(settings::integer("LOOM_AUTOGRAD_THREADS").value_or(0)));
  LOOM_CHECK(a.batch > 0 && a.steps >= 0 && a.accumulate >= 1 && a.in > 0 && a.classes > 1,
             "--batch, --in must be > 0, --classes > 1, --steps >= 0, --accumulate >= 1");
  std::shared_ptr<ProcessGroup> pg;
  std::shared_ptr<Store> store;
  if (launchedByLauncher()) {
    InitResult init = initProcessGroup();
    pg = init.pg;
    store = init.store;
  } else {
    store = std::make_shared<HashStore>();
    pg = createProcessGroup("tcp", store, 0, 1);
  }
  const int rank = pg->rank(), world = pg->size();
  const bool leader = rank == 0;

  // --model gpt|cnn: the task owns the model and data; the MLP keeps its own path below.
  const std::unique_ptr<train::Task> task =
      a.model == "mlp" ? nullptr : train::makeTask(a.model, a.modelArgs, a.seed);
  const Data data = task ? Data{} : loadData(a);
  const std::shared_ptr<nn::Module> model = task ? task->model() : buildModel(a);
  if (!a.initWeights.empty()) ag::loadStateDict(*model, a.initWeights);

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
  ddp::DistributedDataParallel ddpModel(model, pg, options);
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
  const std::unique_ptr<ag::optim::LRScheduler> scheduler = makeScheduler(a.lrSchedule, optimizer);
  auto save = [&](int64_t step) {
    if (zero) {
      ddp::saveCheckpoint(*pg, ckptPathOf(a), *model, step, *zero, scheduler.get());
    } else if (scheduler) {
      ddp::saveCheckpoint(*pg, ckptPathOf(a), *model, step, optimizer, *scheduler);
    } else {
      ddp::saveCheckpoint(*pg, ckptPathOf(a), *model, step, optimizer);
    }
  };
  auto load = [&](const std::string& path) {
    if (zero) return ddp::loadCheckpoint(*pg, path, *model, *zero, scheduler.get()).step;
    if (scheduler) return ddp::loadCheckpoint(*pg, path, *model, optimizer, *scheduler, true).step;
    return ddp::loadCheckpoint(*pg, path, *model, optimizer, true).step;
  };

  const std::string ckptPath = ckptPathOf(a);
  int64_t startStep = 0;
  if (a.resume) {
    LOOM_CHECK(!ckptPath.empty(), "--resume needs --checkpoint-dir");
    if (std::filesystem::exists(ckptPath)) {
      startStep = load(ckptPath);
      if (leader)
        std::fprintf(stderr, "loom-train: resumed from %s at step %lld\n", ckptPath.c_str(),
                     static_cast<long long>(startStep));
    }
  }
  if (!ckptPath.empty() && leader) std::filesystem::create_directories(a.checkpointDir);

  const int64_t rows = task ? task->trainRows() : data.rows();
  ddp::DistributedSampler sampler(rows, world, rank, !a.noShuffle, a.seed, true);
  const int64_t batchesPerEpoch = sampler.numSamples() / a.batch;
  LOOM_CHECK(batchesPerEpoch >= 1, "the data set has ", rows, " rows: too few for ", world,
             " ranks with --batch ", a.batch);
  std::vector<int64_t> indices;
  int64_t currentEpoch = -1;

  std::ofstream log;
  if (leader && !a.log.empty()) {
    log.open(a.log, startStep > 0 ? std::ios::app : std::ios::trunc);
    LOOM_CHECK(static_cast<bool>(log), "--log: cannot open ", a.log, " for writing");
    log.precision(9);
    if (startStep == 0) log << "step,loss\n";
  }
  const bool tty = leader && ::isatty(STDERR_FILENO);
  const int64_t plainEvery = std::max<int64_t>(1, a.steps / 20);

  ag::Tensor x = task ? task->makeInputs(a.batch) : ag::empty({a.batch, a.in});
  ag::Tensor y = task ? task->makeTargets(a.batch) : ag::empty({a.batch}, ag::DType::kInt64);
  auto evaluate = [&](int64_t step) {
    const train::EvalResult r = task->evaluate(*pg);
    if (leader) {
      std::printf("loom-train: step %lld %s\n", static_cast<long long>(step),
                  task->describe(r).c_str());
      std::fflush(stdout);
    }
  };
  const auto t0 = Clock::now();
  auto tSteady = t0;
  int64_t steadySteps = 0;
  double lastLoss = 0;
  for (int64_t step = startStep; step < a.steps; ++step) {
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
        sampler.setEpoch(epoch);
        indices = sampler.indices();
        currentEpoch = epoch;
      }
      const int64_t pos = (micro % batchesPerEpoch) * a.batch;
      const std::vector<int64_t> rows(indices.begin() + pos, indices.begin() + pos + a.batch);
      if (task) {
        task->fillBatch(rows, x, y);
      } else {
        gatherRows(data.x, rows, x);
        gatherRows(data.y, rows, y);
      }
      auto forwardBackward = [&] {
        const ag::Tensor out = ddpModel.forward(x);
        ag::Tensor loss = task ? task->loss(out, y) : ag::crossEntropy(out, y);
        if (a.accumulate > 1) loss = loss / static_cast<double>(a.accumulate);
        trace::Span span("backward", "train", stepArgs(step));
        loss.backward();
        lossSum += loss.item();
      };
      if (k + 1 < a.accumulate || zero) {
        auto guard = ddpModel.noSync();
        forwardBackward();
      } else {
        forwardBackward();
        ddpModel.finalize();
      }
    }
    {
      trace::Span span("optimizer step", "train", stepArgs(step));
      if (zero) {
        zero->step();
      } else {
        optimizer.step();
      }
    }
    if (scheduler) scheduler->step();
    lastLoss = ddp::reduceMean(*pg, lossSum);
    if (step == startStep) {
      tSteady = Clock::now();  // the first step warms up; rates count from here
    } else {
      ++steadySteps;
    }
    if (!ckptPath.empty() && a.checkpointEvery > 0 && (step + 1) % a.checkpointEvery == 0) {
      save(step + 1);
    }
    if (task && a.modelArgs.evalEvery > 0 && (step + 1) % a.modelArgs.evalEvery == 0 &&
        step + 1 < a.steps) {
      evaluate(step + 1);
    }
    if (!leader) continue;
    if (log.is_open()) log << step + 1 << "," << lastLoss << "\n";
    const double elapsed = std::chrono::duration<double>(Clock::now() - tSteady).count();
    const double rate =
        steadySteps > 0 ? steadySteps * a.batch * a.accumulate * world / elapsed : 0.0;
    if (tty) {
      const int width = 30;
      const int filled = static_cast<int>(width * (step + 1) / std::max<int64_t>(1, a.steps));
      std::fprintf(stderr, "\r[%s%s] %lld/%lld loss %.4f %.0f samples/s ",
                   std::string(filled, '#').c_str(), std::string(width - filled, '.').c_str(),
                   static_cast<long long>(step + 1), static_cast<long long>(a.steps), lastLoss,
                   rate);
      std::fflush(stderr);
    } else if ((step + 1) % plainEvery == 0 || step + 1 == a.steps) {
      std::printf("step %lld/%lld loss %.4f samples/s %.0f\n", static_cast<long long>(step + 1),
                  static_cast<long long>(a.steps), lastLoss, rate);
      std::fflush(stdout);
    }
  }
  const double elapsed = std::chrono::duration<double>(Clock::now() - tSteady).count();
  if (!ckptPath.empty() && a.steps > startStep) {
    save(a.steps);
  }
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
    std::printf("loom-train: autograd_lite kernels: %d threads (LOOM_AUTOGRAD_THREADS)\n",
                ag::numThreads());
    std::printf("loom-train: optimizer state %zu bytes on rank 0%s\n", stateBytes,
                zero ? " (ZeRO-1: this rank's shard)" : "");
    const double rate =
        steadySteps > 0 ? steadySteps * a.batch * a.accumulate * world / elapsed : 0.0;
    std::printf(
        "loom-train: world %d, batch %lld per rank, %lld steps, final loss %.4f, "
        "%.0f samples/s (steps after the first)\n",
        world, static_cast<long long>(a.batch), static_cast<long long>(a.steps - startStep),
        lastLoss, rate);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app{"loom-train: trains an MLP with DistributedDataParallel (run under loom-run)"};
  app.add_option("--in", a.in, "input features")->capture_default_str();
  app.add_option("--classes", a.classes, "output classes")->capture_default_str();
  app.add_option("--hidden", a.hidden, "hidden layer sizes, comma-separated")
      ->capture_default_str();
  app.add_option("--batch", a.batch, "batch size per rank")->capture_default_str();
  app.add_option("--optimizer", a.optimizer, "sgd, adam or adamw")
      ->check(CLI::IsMember({"sgd", "adam", "adamw"}))
      ->capture_default_str();
  app.add_option("--lr", a.lr, "learning rate")->capture_default_str();
  app.add_option("--momentum", a.momentum, "SGD momentum")->capture_default_str();
  app.add_flag("--nesterov", a.nesterov, "SGD with Nesterov momentum");
  app.add_option("--weight-decay", a.weightDecay,
                 "weight decay (SGD, Adam: added to the gradient; AdamW: decoupled)")
      ->capture_default_str();
  app.add_option("--steps", a.steps, "optimizer steps")->capture_default_str();
  app.add_option("--seed", a.seed, "seed of the weights, synthetic data and shuffling")
      ->capture_default_str();
  app.add_option("--bucket-cap-mb", a.bucketCapMb, "DDP gradient bucket size (MiB)")
      ->capture_default_str();
  app.add_option("--accumulate", a.accumulate,
                 "micro-batches per step (noSync for all but the last)")
      ->capture_default_str();
  app.add_option("--comm-hook", a.commHook, "none, fp16, bf16 or powersgd")
      ->check(CLI::IsMember({"none", "fp16", "bf16", "powersgd"}))
      ->capture_default_str();
  app.add_option("--powersgd-rank", a.powerSgdRank, "PowerSGD matrix approximation rank")
      ->capture_default_str();
  app.add_option("--powersgd-start", a.powerSgdStart,
                 "PowerSGD: plain all-reduce before this iteration (> 1)")
      ->capture_default_str();
  app.add_option("--lr-schedule", a.lrSchedule,
                 "none, step:SIZE:GAMMA (StepLR) or cosine:TMAX[:ETA_MIN], stepped once per "
                 "optimizer step; its state is in the checkpoints")
      ->capture_default_str();
  app.add_flag("--static-graph", a.staticGraph, "DDP staticGraph (the same graph every step)");
  app.add_flag("--copy-grads", a.copyGrads,
               "copy gradients into DDP's buckets and back (gradientAsBucketView off)");
  app.add_flag("--zero", a.zero,
               "ZeRO-1: optimizer state sharded over the ranks (reduce-scatter, step the shard, "
               "all-gather); prints the optimizer-state bytes per rank");
  app.add_option("--init-weights", a.initWeights, "initial weights (.safetensors)")
      ->check(CLI::ExistingFile);
  app.add_option("--data", a.data, "inputs, float32 [N, in] (.npy)")->check(CLI::ExistingFile);
  app.add_option("--labels", a.labels, "labels, int64 [N] (.npy)")->check(CLI::ExistingFile);
  app.add_flag("--no-shuffle", a.noShuffle, "keep the data order (no per-epoch shuffle)");
  app.add_option("--log", a.log, "CSV of step,loss (loss: the mean over ranks), written by rank 0");
  app.add_option("--checkpoint-dir", a.checkpointDir,
                 "directory of checkpoint.safetensors (written at the end, and every "
                 "--checkpoint-every steps)");
  app.add_option("--checkpoint-every", a.checkpointEvery, "steps between checkpoints (0: end only)")
      ->capture_default_str();
  app.add_flag("--resume", a.resume,
               "continue from the checkpoint in --checkpoint-dir (model, optimizer state, step)");
  app.add_option("--samples", a.samples, "rows of synthetic data")->capture_default_str();
  app.add_option("--model", a.model,
                 "mlp (synthetic or --data), gpt (a character-level transformer on --text) or cnn "
                 "(a conv net on the 8x8 digits in --data-dir); gpt and cnn default to "
                 "--optimizer adamw --lr 3e-3 and --batch 16 (gpt) or 32 (cnn) when not given")
      ->check(CLI::IsMember({"mlp", "gpt", "cnn"}))
      ->capture_default_str();
  train::addModelOptions(app, a.modelArgs);
  CLI11_PARSE(app, argc, argv);
  if (const std::string wrong = train::misplacedFlag(app, a.model); !wrong.empty()) {
    std::fprintf(stderr, "loom-train: error: %s\n", wrong.c_str());
    return 1;
  }
  if (a.model != "mlp") {
    const train::ModelDefaults defaults = train::modelDefaults(a.model);
    if (app.count("--optimizer") == 0) a.optimizer = defaults.optimizer;
    if (app.count("--lr") == 0) a.lr = defaults.lr;
    if (app.count("--batch") == 0) a.batch = defaults.batch;
  }
  try {
    return run(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loom-train: error: %s\n", e.what());
    return 1;
  }
}
