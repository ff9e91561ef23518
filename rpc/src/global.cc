// The process-wide agent behind rpc.h's free functions.
#include <mutex>

#include "loom/rpc/rpc.h"

namespace loom::rpc {

namespace {

std::mutex& globalMu() {
  static std::mutex mu;
  return mu;
}

std::unique_ptr<RpcAgent>& globalAgent() {
  static std::unique_ptr<RpcAgent> agent;
  return agent;
}

}  // namespace

Registry& functions() {
  static Registry registry;
  return registry;
}

void initRpc(const std::string& name, int rank, int worldSize, std::shared_ptr<Store> store,
             const RpcOptions& options) {
  std::lock_guard<std::mutex> lock(globalMu());
  LOOM_CHECK(globalAgent() == nullptr, "initRpc: an RPC agent ('", globalAgent()->self().name,
             "') already runs in this process; call rpc::shutdown() first");
  globalAgent() =
      std::make_unique<RpcAgent>(name, rank, worldSize, std::move(store), functions(), options);
}

RpcAgent& agent() {
  std::lock_guard<std::mutex> lock(globalMu());
  LOOM_CHECK(globalAgent() != nullptr,
             "no RPC agent runs in this process; call rpc::initRpc first");
  return *globalAgent();
}

void shutdown(bool graceful) {
  std::unique_ptr<RpcAgent> agent;
  {
    std::lock_guard<std::mutex> lock(globalMu());
    LOOM_CHECK(globalAgent() != nullptr, "rpc::shutdown: no RPC agent runs in this process");
    agent = std::move(globalAgent());
  }
  agent->shutdown(graceful);
}

Value rpcSync(const std::string& to, const std::string& function, Value args,
              std::chrono::milliseconds timeout) {
  return agent().rpcSync(to, function, std::move(args), timeout);
}

Future rpcAsync(const std::string& to, const std::string& function, Value args,
                std::chrono::milliseconds timeout) {
  return agent().rpcAsync(to, function, std::move(args), timeout);
}

RRef remote(const std::string& to, const std::string& function, Value args,
            std::chrono::milliseconds timeout) {
  return agent().remote(to, function, std::move(args), timeout);
}

const WorkerInfo& workerInfo(const std::string& name) {
  return agent().worker(name);
}

}  // namespace loom::rpc
