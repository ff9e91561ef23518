// A parameter server over RPC: one server ("ps", rank 0) holds an embedding table and a dense
// layer; trainers ("trainer0".."trainerT-1", ranks 1..T) pull the rows their batch uses and the
// dense layer, compute gradients, and push them back.
//
// The model, per sample of L token ids and a label in [0, C):
//   h = mean_j E[t_j]            E: (V, D) embedding table, h: (D)
//   logits = h W + b             W: (D, C), b: (C)
//   loss = cross_entropy(logits, label)
// Training runs in synchronous rounds: in round r every trainer pulls (the server answers once
// round r-1's update is applied), computes the summed gradients of its own batch, and pushes
// them; when all T pushes of the round are in, the server adds them up in trainer order and
// applies SGD with the mean over the global batch (T x perTrainerBatch samples). Because the
// order of every float operation is fixed, trainOneProcess() (the same rounds and the same
// gradient code, no RPC) gives the same parameters bit for bit; the test allows 1e-6.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace loom::examples {

struct PsConfig {
  int trainers = 3;
  int rounds = 30;
  int perTrainerBatch = 16;
  int vocab = 32;   // V
  int dim = 8;      // D
  int classes = 4;  // C
  int tokensPerSample = 3;
  float lr = 4.0f;
  uint64_t seed = 1;
  std::chrono::milliseconds timeout{120000};  // every RPC, and the whole run's barriers
};

struct PsParams {
  std::vector<float> embedding;  // (V, D)
  std::vector<float> weight;     // (D, C)
  std::vector<float> bias;       // (C)
};

struct PsResult {
  PsParams params;
  std::vector<double> losses;  // mean loss of each round's global batch, before its update
};

// The single-process reference: the same rounds, batches and update order, no RPC.
PsResult trainOneProcess(const PsConfig& config);

// Spawns 1 + config.trainers processes (loom::spawn; a TCPStore on rank 0), trains, and returns
// what the server holds at the end. `scratchDir` receives the result file.
PsResult trainDistributed(const PsConfig& config, const std::string& scratchDir);

// One rank of the distributed run (what trainDistributed spawns; the program calls it through
// spawnMain). The first trainer writes the final parameters to `resultPath`.
void runParameterServerRank(const PsConfig& config, int rank, const std::string& resultPath);

}  // namespace loom::examples
