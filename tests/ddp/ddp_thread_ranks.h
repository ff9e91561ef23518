// Thread ranks for the DDP feature tests: tcp groups over one HashStore, and a copy of a
// module's state.
#pragma once

#include <functional>
#include <memory>

#include "loom/autograd/nn.h"
#include "loom/process_group/factory.h"
#include "loom/store/hash_store.h"
#include "loom/testing/ranks.h"

namespace loom::ddp::testing {

inline void runGroups(int size, const std::function<void(std::shared_ptr<ProcessGroup>)>& fn) {
  auto store = std::make_shared<HashStore>();
  ProcessGroupOptions options;
  options.timeout = std::chrono::seconds(30);
  options.debug = DebugLevel::kOff;
  loom::testing::runThreadRanks(
      size, [&](int rank) { fn(createProcessGroup("tcp", store, rank, size, options)); });
}

inline ag::nn::NamedTensors cloneState(const ag::nn::Module& m) {
  ag::nn::NamedTensors out;
  for (const auto& [name, t] : m.stateDict()) out.emplace_back(name, t.detach().clone());
  return out;
}

}  // namespace loom::ddp::testing
