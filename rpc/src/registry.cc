#include "loom/rpc/registry.h"

namespace loom::rpc {

void Registry::addRaw(const std::string& name, Handler handler) {
  LOOM_CHECK(!name.empty(), "an RPC function needs a name");
  LOOM_CHECK(static_cast<bool>(handler), "RPC function '", name, "' has an empty handler");
  const bool inserted = handlers_.emplace(name, std::move(handler)).second;
  LOOM_CHECK(inserted, "RPC function '", name, "' is registered twice");
}

const Handler* Registry::find(const std::string& name) const {
  auto it = handlers_.find(name);
  return it == handlers_.end() ? nullptr : &it->second;
}

std::string Registry::names() const {
  std::string out;
  for (const auto& [name, handler] : handlers_) {
    out += (out.empty() ? "" : ", ") + name;
  }
  return out.empty() ? "(none)" : out;
}

}  // namespace loom::rpc
