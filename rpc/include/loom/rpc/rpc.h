// The RPC module's process-wide face, as torch.distributed.rpc: one agent per process.
//
//   loom::rpc::functions().add("add", [](int a, int b) { return a + b; });
//   loom::rpc::initRpc("trainer1", rank, worldSize, store);
//   int sum = loom::rpc::rpcSync("ps", "add", loom::rpc::args(1, 2)).get<int>();
//   loom::rpc::shutdown();
//
// functions() is the registry initRpc hands to the agent: fill it before initRpc. initRpc
// throws InvalidArgumentError when an agent already runs; every other call throws
// InvalidArgumentError when none does. shutdown() is graceful (see agent.h) and destroys the
// agent; initRpc may then be called again. Thread-safe apart from filling functions().
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "loom/rpc/agent.h"
#include "loom/rpc/future.h"
#include "loom/rpc/registry.h"
#include "loom/rpc/rref.h"
#include "loom/rpc/value.h"
#include "loom/store/store.h"

namespace loom::rpc {

Registry& functions();

void initRpc(const std::string& name, int rank, int worldSize, std::shared_ptr<Store> store,
             const RpcOptions& options = {});
void shutdown(bool graceful = true);
// The running agent (InvalidArgumentError when none).
RpcAgent& agent();

Value rpcSync(const std::string& to, const std::string& function, Value args = Value::array(),
              std::chrono::milliseconds timeout = std::chrono::milliseconds(0));
Future rpcAsync(const std::string& to, const std::string& function, Value args = Value::array(),
                std::chrono::milliseconds timeout = std::chrono::milliseconds(0));
RRef remote(const std::string& to, const std::string& function, Value args = Value::array(),
            std::chrono::milliseconds timeout = std::chrono::milliseconds(0));
const WorkerInfo& workerInfo(const std::string& name);

}  // namespace loom::rpc
