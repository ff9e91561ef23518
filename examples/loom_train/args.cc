#include "args.h"

#include <CLI/CLI.hpp>
#include <cstdio>

#include "loom/cli/checks.h"

namespace loom::train {

int parseArgs(int argc, char** argv, Args& a) {
  CLI::App app{"loom-train: trains an MLP with DistributedDataParallel (run under loom-run)"};
  app.add_option("--in", a.in, "input features")
      ->check(cli::wholeAtLeast(1))
      ->capture_default_str();
  app.add_option("--classes", a.classes, "output classes")
      ->check(cli::wholeAtLeast(2))
      ->capture_default_str();
  app.add_option("--hidden", a.hidden, "hidden layer sizes, comma-separated")
      ->capture_default_str();
  app.add_option("--batch", a.batch, "batch size per rank")
      ->check(cli::wholeAtLeast(1))
      ->capture_default_str();
  app.add_option("--optimizer", a.optimizer, "sgd, adam or adamw")
      ->check(CLI::IsMember({"sgd", "adam", "adamw"}))
      ->capture_default_str();
  app.add_option("--lr", a.lr, "learning rate")
      ->check(cli::numberAtLeast(0))
      ->capture_default_str();
  app.add_option("--momentum", a.momentum, "SGD momentum")
      ->check(cli::numberAtLeast(0))
      ->capture_default_str();
  app.add_flag("--nesterov", a.nesterov, "SGD with Nesterov momentum");
  app.add_option("--weight-decay", a.weightDecay,
                 "weight decay (SGD, Adam: added to the gradient; AdamW: decoupled)")
      ->check(cli::numberAtLeast(0))
      ->capture_default_str();
  app.add_option("--steps", a.steps, "optimizer steps")
      ->check(cli::wholeAtLeast(0))
      ->capture_default_str();
  app.add_option("--seed", a.seed, "seed of the weights, synthetic data and shuffling")
      ->capture_default_str();
  app.add_option("--bucket-cap-mb", a.bucketCapMb, "DDP gradient bucket size (MiB)")
      ->check(cli::numberAbove(0))
      ->capture_default_str();
  app.add_option("--accumulate", a.accumulate,
                 "micro-batches per step (noSync for all but the last)")
      ->check(cli::wholeAtLeast(1))
      ->capture_default_str();
  app.add_option("--comm-hook", a.commHook, "none, fp16, bf16 or powersgd")
      ->check(CLI::IsMember({"none", "fp16", "bf16", "powersgd"}))
      ->capture_default_str();
  app.add_option("--powersgd-rank", a.powerSgdRank, "PowerSGD matrix approximation rank")
      ->check(cli::wholeAtLeast(1))
      ->capture_default_str();
  app.add_option("--powersgd-start", a.powerSgdStart,
                 "PowerSGD: plain all-reduce before this iteration (> 1)")
      ->check(cli::wholeAtLeast(2))
      ->capture_default_str();
  app.add_option("--lr-schedule", a.lrSchedule,
                 "none, step:SIZE:GAMMA (StepLR) or cosine:TMAX[:ETA_MIN], stepped once per "
                 "optimizer step; its state is in the checkpoints")
      ->capture_default_str();
  app.add_flag("--static-graph", a.staticGraph, "DDP staticGraph (the same graph every step)");
  app.add_flag("--plain-buckets", a.plainBuckets,
               "DDP's buckets in ordinary memory instead of Loom windows (zero-copy shared "
               "memory, docs/shm.md)");
  app.add_flag("--copy-grads", a.copyGrads,
               "copy gradients into DDP's buckets and back (gradientAsBucketView off)");
  app.add_flag("--reproducible", a.reproducible,
               "reproducible gradient reductions: correctly rounded sums, so the weights are "
               "bitwise the same whatever the algorithm, transport, bucket size, tuning or "
               "overlap (LOOM_REPRODUCIBLE=1 does the same; docs/reproducible.md)");
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
      ->check(cli::wholeAtLeast(0))
      ->capture_default_str();
  app.add_flag("--resume", a.resume,
               "continue from the checkpoint in --checkpoint-dir (model, optimizer state, step)");
  app.add_flag("--keep-checkpoints", a.keepCheckpoints,
               "also keep every checkpoint as checkpoint-<step>.safetensors in --checkpoint-dir");
  app.add_flag("--shrink-on-failure", a.shrinkOnFailure,
               "when a rank dies, the survivors shrink the group and go on in place from the last "
               "step they all finished (run under loom-run --on-worker-failure continue; the "
               "store must survive: under env:// rank 0 hosts it). See docs/elastic.md")
      ->group("Shrink in place");
  app.add_option("--min-ranks", a.minRanks,
                 "--shrink-on-failure: fail as without it when fewer ranks would remain")
      ->check(cli::wholeAtLeast(1))
      ->capture_default_str()
      ->group("Shrink in place");
  app.add_option("--shrink-window-s", a.shrinkWindowS,
                 "--shrink-on-failure: how long the survivors wait for ranks whose state is "
                 "unknown (ranks found dead are not waited for)")
      ->check(cli::numberAtLeast(0))
      ->capture_default_str()
      ->group("Shrink in place");
  app.add_option("--test-kill", a.testKill,
                 "TEST ONLY: RANK:STEP, the process of launch rank RANK SIGKILLs itself in step "
                 "STEP (1-based), after its optimizer step; repeatable")
      ->group("Testing");
  app.add_option("--test-step-delay-ms", a.testStepDelayMs,
                 "TEST ONLY: sleep this long after every step (keeps a short job running while a "
                 "test acts on it)")
      ->check(cli::wholeAtLeast(0))
      ->group("Testing");
  app.add_option("--amp", a.amp,
                 "mixed precision: none (float32), bf16 (the training forward pass and loss "
                 "under autocast to bfloat16) or fp16 (autocast to float16, with dynamic loss "
                 "scaling: a GradScaler multiplies the loss before the backward pass, unscales "
                 "the gradients, skips a step whose gradients hold an inf or NaN and halves the "
                 "scale, and doubles it after --amp-growth-interval clean steps; its state is in "
                 "the checkpoints). Weights, gradients and optimizer state stay float32")
      ->check(CLI::IsMember({"none", "bf16", "fp16"}))
      ->capture_default_str()
      ->group("Mixed precision");
  app.add_option("--amp-init-scale", a.ampInitScale, "--amp fp16: the initial loss scale")
      ->check(cli::numberAbove(0))
      ->capture_default_str()
      ->group("Mixed precision");
  app.add_option("--amp-growth-interval", a.ampGrowthInterval,
                 "--amp fp16: clean steps before the loss scale doubles")
      ->check(cli::wholeAtLeast(1))
      ->capture_default_str()
      ->group("Mixed precision");
  app.add_option("--samples", a.samples, "rows of synthetic data")
      ->check(cli::wholeAtLeast(1))
      ->capture_default_str();
  app.add_option("--model", a.model,
                 "mlp (synthetic or --data), gpt (a character-level transformer on --text) or cnn "
                 "(a conv net on the 8x8 digits in --data-dir); gpt and cnn default to "
                 "--optimizer adamw --lr 3e-3 and --batch 16 (gpt) or 32 (cnn) when not given")
      ->check(CLI::IsMember({"mlp", "gpt", "cnn"}))
      ->capture_default_str();
  addModelOptions(app, a.modelArgs);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return cli::exitFor(app, e, "loom-train");  // a usage error: 2 (kUsageError)
  }
  for (const char* flag : {"--min-ranks", "--shrink-window-s"}) {
    if (app.count(flag) > 0 && !a.shrinkOnFailure) {
      std::fprintf(stderr, "loom-train: error: %s is for --shrink-on-failure\n", flag);
      return kUsageError;
    }
  }
  for (const char* flag : {"--powersgd-rank", "--powersgd-start"}) {
    if (app.count(flag) > 0 && a.commHook != "powersgd") {
      std::fprintf(stderr, "loom-train: error: %s is for --comm-hook powersgd\n", flag);
      return kUsageError;
    }
  }
  for (const char* flag : {"--amp-init-scale", "--amp-growth-interval"}) {
    if (app.count(flag) > 0 && a.amp != "fp16") {
      std::fprintf(stderr, "loom-train: error: %s is for --amp fp16 (the loss scaling)\n", flag);
      return kUsageError;
    }
  }
  if (const std::string wrong = misplacedFlag(app, a.model); !wrong.empty()) {
    std::fprintf(stderr, "loom-train: error: %s\n", wrong.c_str());
    return kUsageError;
  }
  if (a.model != "mlp") {
    const ModelDefaults defaults = modelDefaults(a.model);
    if (app.count("--optimizer") == 0) a.optimizer = defaults.optimizer;
    if (app.count("--lr") == 0) a.lr = defaults.lr;
    if (app.count("--batch") == 0) a.batch = defaults.batch;
  }
  return kParsed;
}

}  // namespace loom::train
