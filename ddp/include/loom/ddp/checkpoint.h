// Checkpoints for data-parallel training: one safetensors file holding the model's state dict
// (names prefixed "model."), optional extra state such as optimizer moments (prefixed
// "optim."), and the step in the metadata.
//
// Contract
// - saveCheckpoint is collective: rank 0 writes, then every rank waits at a barrier, so when it
//   returns the file is complete on every rank's view of the filesystem.
// - Atomic: rank 0 writes a temporary file in the same directory, fsyncs it, renames it over
//   `path` and fsyncs the directory. A crash (even SIGKILL) at any moment leaves either the
//   previous checkpoint or the new one at `path`, never a torn file; a stale temporary file may
//   remain and is overwritten by the next save.
// - loadCheckpoint is collective: with `broadcastFromRank0` only rank 0 reads the file and the
//   values (and the step) are broadcast; otherwise every rank reads it (a shared filesystem).
//   Names, shapes and dtypes are checked; a mismatch is an InvalidArgumentError naming the
//   tensor and the file.
// - Optimizer state: the overloads taking an ag::optim::Optimizer save its stateDict() (momentum
//   buffers, Adam moments and step counts, hyper-parameters such as lr; see
//   loom/autograd/optim.h) as "optim.<name>", and load it back with loadStateDict, so a resumed
//   run continues exactly as the uninterrupted one. Lazily created state that did not exist yet
//   is absent from the file and stays uncreated after loading. With `broadcastFromRank0`, rank 0
//   sends the optimizer entries' names, dtypes and shapes, then the values, so the other ranks
//   need not know in advance which state exists. An optimizer whose state does not match the
//   file (other kind, other parameters, missing entries) is an InvalidArgumentError naming the
//   entry and the file.
// - Learning-rate scheduler: the overloads taking an ag::optim::LRScheduler also save its epoch
//   and base lr ("sched.epoch", "sched.base_lr"); loading checks the base lr and steps a fresh
//   scheduler forward to the saved epoch (lrAt is a closed form, so the lr is exactly the saved
//   one), with the optimizer state restored as above.
// - ZeRO-1 (zero_optimizer.h): saving gathers the sharded optimizer state into one file
//   (collective), its sharded entries as full float32 [N] tensors; loading has every rank read
//   the file (a shared filesystem) and take its own slice, at any world size.
// - The older overloads save/load what callers pass in `extra` (as "optim.<name>", loaded back
//   into the same tensors, in place); they ignore optimizer entries in the file when loading.
#pragma once

#include <cstdint>
#include <string>

#include "loom/autograd/nn.h"
#include "loom/autograd/optim.h"
#include "loom/process_group/process_group.h"

namespace loom::ddp {

class ZeroRedundancyOptimizer;

struct Checkpoint {
  int64_t step = 0;
};

void saveCheckpoint(ProcessGroup& pg, const std::string& path, const ag::nn::Module& model,
                    int64_t step, const ag::nn::NamedTensors& extra = {});

// Returns the saved step. Throws InvalidArgumentError when the file does not exist.
Checkpoint loadCheckpoint(ProcessGroup& pg, const std::string& path, ag::nn::Module& model,
                          ag::nn::NamedTensors extra = {}, bool broadcastFromRank0 = false);

// Rank 0's write alone (what saveCheckpoint does on rank 0, without the barrier).
void writeCheckpointFile(const std::string& path, const ag::nn::Module& model, int64_t step,
                         const ag::nn::NamedTensors& extra = {});

// With the optimizer's state (see the contract above).
void saveCheckpoint(ProcessGroup& pg, const std::string& path, const ag::nn::Module& model,
                    int64_t step, const ag::optim::Optimizer& optimizer);
Checkpoint loadCheckpoint(ProcessGroup& pg, const std::string& path, ag::nn::Module& model,
                          ag::optim::Optimizer& optimizer, bool broadcastFromRank0 = false);
void writeCheckpointFile(const std::string& path, const ag::nn::Module& model, int64_t step,
                         const ag::optim::Optimizer& optimizer);

// With a learning-rate scheduler (see the contract above).
void saveCheckpoint(ProcessGroup& pg, const std::string& path, const ag::nn::Module& model,
                    int64_t step, const ag::optim::Optimizer& optimizer,
                    const ag::optim::LRScheduler& scheduler);
Checkpoint loadCheckpoint(ProcessGroup& pg, const std::string& path, ag::nn::Module& model,
                          ag::optim::Optimizer& optimizer, ag::optim::LRScheduler& scheduler,
                          bool broadcastFromRank0 = false);

// ZeRO-1: one file with the consolidated optimizer state (see the contract above).
void saveCheckpoint(ProcessGroup& pg, const std::string& path, const ag::nn::Module& model,
                    int64_t step, ZeroRedundancyOptimizer& optimizer,
                    const ag::optim::LRScheduler* scheduler = nullptr);
Checkpoint loadCheckpoint(ProcessGroup& pg, const std::string& path, ag::nn::Module& model,
                          ZeroRedundancyOptimizer& optimizer,
                          ag::optim::LRScheduler* scheduler = nullptr);

}  // namespace loom::ddp
