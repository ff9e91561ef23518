#include "parameter_server.h"

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <fstream>
#include <iterator>
#include <mutex>
#include <optional>

#include "loom/common/settings.h"
#include "loom/rpc/agent.h"
#include "loom/spawn/spawn.h"
#include "loom/store/tcp_store.h"

namespace loom::examples {

namespace {

using rpc::Value;

struct Sample {
  std::vector<int> tokens;
  int label = 0;
};

// The rows and dense layer a trainer pulled; `rows` holds ids.size() rows of D, in ids' order.
struct Pulled {
  std::vector<int> ids;
  std::vector<float> rows;
  std::vector<float> weight, bias;
};

// Summed (not averaged) gradients of one trainer's batch.
struct ShardGrads {
  std::vector<int> ids;
  std::vector<float> rows;  // (ids.size(), D)
  std::vector<float> weight, bias;
  double lossSum = 0;
};

// splitmix64: a deterministic stream that any process reproduces from (seed, round, trainer).
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

float uniform(uint64_t& state) {  // in [-1, 1)
  state = mix(state);
  return static_cast<float>((state >> 40) * (1.0 / (1ull << 24)) * 2.0 - 1.0);
}

PsParams initParams(const PsConfig& c) {
  PsParams p;
  uint64_t s = mix(c.seed);
  p.embedding.resize(static_cast<size_t>(c.vocab) * c.dim);
  for (float& x : p.embedding) x = 0.5f * uniform(s);
  p.weight.resize(static_cast<size_t>(c.dim) * c.classes);
  for (float& x : p.weight) x = 0.5f * uniform(s);
  p.bias.assign(static_cast<size_t>(c.classes), 0.0f);
  return p;
}

// The label depends on the first token, which the embedding can learn to separate.
std::vector<Sample> batchFor(const PsConfig& c, int round, int trainer) {
  uint64_t s = mix(c.seed * 1000003u + static_cast<uint64_t>(round) * 7919u +
                   static_cast<uint64_t>(trainer) * 104729u + 17u);
  std::vector<Sample> batch(static_cast<size_t>(c.perTrainerBatch));
  for (Sample& x : batch) {
    for (int j = 0; j < c.tokensPerSample; ++j) {
      s = mix(s);
      x.tokens.push_back(static_cast<int>(s % static_cast<uint64_t>(c.vocab)));
    }
    x.label = x.tokens[0] % c.classes;
  }
  return batch;
}

std::vector<int> uniqueIds(const std::vector<Sample>& batch) {
  std::vector<int> ids;
  for (const Sample& x : batch) ids.insert(ids.end(), x.tokens.begin(), x.tokens.end());
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

Pulled pullLocal(const PsConfig& c, const PsParams& p, std::vector<int> ids) {
  Pulled out;
  out.ids = std::move(ids);
  for (int id : out.ids) {
    const float* row = p.embedding.data() + static_cast<size_t>(id) * c.dim;
    out.rows.insert(out.rows.end(), row, row + c.dim);
  }
  out.weight = p.weight;
  out.bias = p.bias;
  return out;
}

ShardGrads computeGrads(const PsConfig& c, const std::vector<Sample>& batch, const Pulled& p) {
  const size_t D = static_cast<size_t>(c.dim), C = static_cast<size_t>(c.classes);
  ShardGrads g;
  g.ids = p.ids;
  g.rows.assign(p.ids.size() * D, 0.0f);
  g.weight.assign(D * C, 0.0f);
  g.bias.assign(C, 0.0f);
  auto slot = [&](int id) {
    return static_cast<size_t>(std::lower_bound(p.ids.begin(), p.ids.end(), id) - p.ids.begin());
  };
  std::vector<float> h(D), logits(C), dlogits(C), dh(D);
  const float invL = 1.0f / static_cast<float>(c.tokensPerSample);
  for (const Sample& x : batch) {
    // h = mean_j E[t_j]
    std::fill(h.begin(), h.end(), 0.0f);
    for (int t : x.tokens) {
      const float* row = p.rows.data() + slot(t) * D;
      for (size_t d = 0; d < D; ++d) h[d] += row[d];
    }
    for (float& v : h) v *= invL;
    // logits = h W + b; softmax; loss = -log p[label]
    float maxLogit = -INFINITY;
    for (size_t k = 0; k < C; ++k) {
      float z = p.bias[k];
      for (size_t d = 0; d < D; ++d) z += h[d] * p.weight[d * C + k];
      logits[k] = z;
      maxLogit = std::max(maxLogit, z);
    }
    float denom = 0;
    for (size_t k = 0; k < C; ++k) denom += std::exp(logits[k] - maxLogit);
    const size_t y = static_cast<size_t>(x.label);
    g.lossSum += static_cast<double>(std::log(denom) - (logits[y] - maxLogit));
    for (size_t k = 0; k < C; ++k) {
      dlogits[k] = std::exp(logits[k] - maxLogit) / denom - (k == y ? 1.0f : 0.0f);
    }
    // dW = h^T dlogits, db = dlogits, dh = W dlogits, dE[t_j] += dh / L
    for (size_t d = 0; d < D; ++d) {
      float acc = 0;
      for (size_t k = 0; k < C; ++k) {
        g.weight[d * C + k] += h[d] * dlogits[k];
        acc += p.weight[d * C + k] * dlogits[k];
      }
      dh[d] = acc * invL;
    }
    for (size_t k = 0; k < C; ++k) g.bias[k] += dlogits[k];
    for (int t : x.tokens) {
      float* row = g.rows.data() + slot(t) * D;
      for (size_t d = 0; d < D; ++d) row[d] += dh[d];
    }
  }
  return g;
}

// Sums the trainers' gradients in trainer order and applies SGD on the global-batch mean.
// Returns the round's mean loss.
double applyRound(const PsConfig& c, PsParams& p, const std::vector<ShardGrads>& shards) {
  const size_t D = static_cast<size_t>(c.dim);
  const float scale = c.lr / static_cast<float>(c.trainers * c.perTrainerBatch);
  std::vector<float> rowSum(p.embedding.size(), 0.0f), weightSum(p.weight.size(), 0.0f),
      biasSum(p.bias.size(), 0.0f);
  std::vector<char> touched(static_cast<size_t>(c.vocab), 0);
  double loss = 0;
  for (const ShardGrads& g : shards) {
    for (size_t i = 0; i < g.ids.size(); ++i) {
      const size_t id = static_cast<size_t>(g.ids[i]);
      touched[id] = 1;
      for (size_t d = 0; d < D; ++d) rowSum[id * D + d] += g.rows[i * D + d];
    }
    for (size_t i = 0; i < weightSum.size(); ++i) weightSum[i] += g.weight[i];
    for (size_t i = 0; i < biasSum.size(); ++i) biasSum[i] += g.bias[i];
    loss += g.lossSum;
  }
  for (size_t id = 0; id < touched.size(); ++id) {
    if (!touched[id]) continue;
    for (size_t d = 0; d < D; ++d) p.embedding[id * D + d] -= scale * rowSum[id * D + d];
  }
  for (size_t i = 0; i < p.weight.size(); ++i) p.weight[i] -= scale * weightSum[i];
  for (size_t i = 0; i < p.bias.size(); ++i) p.bias[i] -= scale * biasSum[i];
  return loss / (c.trainers * c.perTrainerBatch);
}

Value toValue(const ShardGrads& g) {
  return Value{{"ids", g.ids},
               {"rows", rpc::floats(g.rows)},
               {"weight", rpc::floats(g.weight)},
               {"bias", rpc::floats(g.bias)},
               {"loss", g.lossSum}};
}

ShardGrads shardFrom(const Value& v) {
  return ShardGrads{v.at("ids").get<std::vector<int>>(), rpc::toFloats(v.at("rows")),
                    rpc::toFloats(v.at("weight")), rpc::toFloats(v.at("bias")),
                    v.at("loss").get<double>()};
}

// The server's state and its three functions: pull, push, snapshot.
class Server {
 public:
  explicit Server(const PsConfig& c) : c_(c), params_(initParams(c)) {
    pushed_.resize(static_cast<size_t>(c.trainers));
  }

  void registerOn(rpc::Registry& f) {
    f.add("pull", [this](int round, const std::vector<int>& ids) { return pull(round, ids); });
    f.add("push",
          [this](int trainer, int round, const Value& grads) { push(trainer, round, grads); });
    f.add("snapshot", [this] { return snapshot(); });
  }

 private:
  // Waits until `round` updates are applied (bounded), under mu_.
  void waitForVersion(std::unique_lock<std::mutex>& lock, int round, const char* what) {
    const bool ok = cv_.wait_for(lock, c_.timeout, [&] { return version_ >= round; });
    LOOM_CHECK_T(TimeoutError, ok, what, " for round ", round, ": the server is still at round ",
                 version_, " after ", c_.timeout.count(), " ms (a trainer did not push?)");
  }

  Value pull(int round, const std::vector<int>& ids) {
    std::unique_lock<std::mutex> lock(mu_);
    waitForVersion(lock, round, "pull");
    LOOM_CHECK_EQ(version_, round, "pull of a round already applied");
    for (int id : ids) {
      LOOM_CHECK(id >= 0 && id < c_.vocab, "row ", id, " is out of range [0, ", c_.vocab, ")");
    }
    const Pulled p = pullLocal(c_, params_, ids);
    return Value{{"rows", rpc::floats(p.rows)},
                 {"weight", rpc::floats(p.weight)},
                 {"bias", rpc::floats(p.bias)}};
  }

  void push(int trainer, int round, const Value& grads) {
    std::lock_guard<std::mutex> lock(mu_);
    LOOM_CHECK(trainer >= 0 && trainer < c_.trainers, "no trainer ", trainer);
    LOOM_CHECK_EQ(round, version_, "trainer ", trainer, " pushed for the wrong round");
    auto& slot = pushed_[static_cast<size_t>(trainer)];
    LOOM_CHECK(!slot.has_value(), "trainer ", trainer, " pushed twice in round ", round);
    slot = shardFrom(grads);
    for (const auto& s : pushed_) {
      if (!s) return;
    }
    std::vector<ShardGrads> inOrder;
    for (auto& s : pushed_) inOrder.push_back(std::move(*s));
    losses_.push_back(applyRound(c_, params_, inOrder));
    for (auto& s : pushed_) s.reset();
    ++version_;
    cv_.notify_all();
  }

  Value snapshot() {
    std::unique_lock<std::mutex> lock(mu_);
    waitForVersion(lock, c_.rounds, "snapshot");
    return Value{{"embedding", rpc::floats(params_.embedding)},
                 {"weight", rpc::floats(params_.weight)},
                 {"bias", rpc::floats(params_.bias)},
                 {"losses", losses_}};
  }

  const PsConfig c_;
  std::mutex mu_;
  std::condition_variable cv_;
  PsParams params_;
  int version_ = 0;  // rounds applied
  std::vector<std::optional<ShardGrads>> pushed_;
  std::vector<double> losses_;
};

PsResult resultFrom(const Value& v) {
  return PsResult{PsParams{rpc::toFloats(v.at("embedding")), rpc::toFloats(v.at("weight")),
                           rpc::toFloats(v.at("bias"))},
                  v.at("losses").get<std::vector<double>>()};
}

}  // namespace

PsResult trainOneProcess(const PsConfig& c) {
  PsResult r;
  r.params = initParams(c);
  for (int round = 0; round < c.rounds; ++round) {
    std::vector<ShardGrads> shards;
    for (int t = 0; t < c.trainers; ++t) {
      const std::vector<Sample> batch = batchFor(c, round, t);
      shards.push_back(computeGrads(c, batch, pullLocal(c, r.params, uniqueIds(batch))));
    }
    r.losses.push_back(applyRound(c, r.params, shards));
  }
  return r;
}

void runParameterServerRank(const PsConfig& c, int rank, const std::string& resultPath) {
  const int world = c.trainers + 1;
  TCPStoreOptions so;
  so.isServer = rank == 0;
  so.numWorkers = world;
  so.timeout = c.timeout;
  const std::optional<long long> port = settings::integer("MASTER_PORT");
  LOOM_CHECK(port.has_value(),
             "MASTER_PORT is not set; expected the port of the job's TCPStore "
             "(spawn and loom-run set it)");
  auto store = std::make_shared<TCPStore>(settings::text("MASTER_ADDR").value_or("127.0.0.1"),
                                          static_cast<int>(*port), so);
  rpc::RpcOptions options;
  options.timeout = c.timeout;
  // Every trainer's pull may wait on the server at once; pushes need threads of their own.
  options.numThreads = c.trainers + 2;
  rpc::Registry functions;
  std::unique_ptr<Server> server;
  if (rank == 0) {
    server = std::make_unique<Server>(c);
    server->registerOn(functions);
  }
  const int trainer = rank - 1;
  rpc::RpcAgent agent(rank == 0 ? "ps" : "trainer" + std::to_string(trainer), rank, world, store,
                      functions, options);
  if (rank > 0) {
    for (int round = 0; round < c.rounds; ++round) {
      const std::vector<Sample> batch = batchFor(c, round, trainer);
      Pulled pulled;
      pulled.ids = uniqueIds(batch);
      const Value v = agent.rpcSync("ps", "pull", rpc::args(round, pulled.ids));
      pulled.rows = rpc::toFloats(v.at("rows"));
      pulled.weight = rpc::toFloats(v.at("weight"));
      pulled.bias = rpc::toFloats(v.at("bias"));
      agent.rpcSync("ps", "push",
                    rpc::args(trainer, round, toValue(computeGrads(c, batch, pulled))));
    }
    if (trainer == 0) {
      // The final parameters stay on the server until fetched.
      rpc::RRef finalParams = agent.remote("ps", "snapshot");
      const std::vector<uint8_t> bytes = rpc::encode(finalParams.toHere());
      std::ofstream out(resultPath, std::ios::binary);
      out.write(reinterpret_cast<const char*>(bytes.data()),
                static_cast<std::streamsize>(bytes.size()));
      LOOM_CHECK(out.good(), "cannot write the result to ", resultPath);
    }
  }
  agent.shutdown();
  // Rank 0 serves the store: it leaves last.
  store->set("ps/left/" + std::to_string(rank), "1");
  if (rank == 0) {
    std::vector<std::string> keys;
    for (int r = 0; r < world; ++r) keys.push_back("ps/left/" + std::to_string(r));
    store->wait(keys, c.timeout);
  }
}

PsResult trainDistributed(const PsConfig& c, const std::string& scratchDir) {
  const std::string path = scratchDir + "/ps_result.msgpack";
  SpawnOptions options;
  options.timeout = c.timeout;
  spawn(
      c.trainers + 1, [&](int rank) { runParameterServerRank(c, rank, path); }, options);
  std::ifstream in(path, std::ios::binary);
  LOOM_CHECK(in.good(), "the first trainer wrote no result to ", path);
  const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                                   std::istreambuf_iterator<char>());
  return resultFrom(rpc::decode(bytes.data(), bytes.size()));
}

}  // namespace loom::examples
