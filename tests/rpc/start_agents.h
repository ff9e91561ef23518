// Test helper: `n` RPC agents named w0..w{n-1}, started on threads over one HashStore (each
// constructor waits for the others); an agent that fails to start rethrows its error here.
#pragma once

#include <chrono>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "loom/rpc/agent.h"
#include "loom/store/hash_store.h"

namespace loom::rpc::test_support {

inline std::vector<std::unique_ptr<RpcAgent>> startAgents(int n, const Registry& functions,
                                                          RpcOptions options = {}) {
  auto store = std::make_shared<HashStore>();
  if (options.timeout.count() == 0) options.timeout = std::chrono::milliseconds(20000);
  std::vector<std::unique_ptr<RpcAgent>> agents(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        agents[static_cast<size_t>(r)] =
            std::make_unique<RpcAgent>("w" + std::to_string(r), r, n, store, functions, options);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  return agents;
}

}  // namespace loom::rpc::test_support
