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
// - optimizer state: autograd_lite's optimizers do not expose their state yet, so callers pass
//   what they want saved in `extra` (loaded back into the same tensors, in place).
#pragma once

#include <cstdint>
#include <string>

#include "loom/autograd/nn.h"
#include "loom/process_group/process_group.h"

namespace loom::ddp {

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

}  // namespace loom::ddp
