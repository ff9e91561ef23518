#include "loom/rpc/agent.h"

#include <cxxabi.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <typeinfo>

#include "channel.h"
#include "core.h"
#include "loom/common/logging.h"
#include "loom/common/settings.h"
#include "loom/common/socket.h"
#include "loom/store/barrier.h"
#include "loom/store/peer_auth.h"
#include "loom/store/tcp_store.h"
#include "server.h"

namespace loom::rpc {

// ---- errors across the wire ----

namespace detail {

std::vector<uint8_t> encodeError(const std::string& type, const std::string& message) {
  return encode(Value{{"type", type}, {"message", message}});
}

std::exception_ptr decodeError(const std::vector<uint8_t>& payload, const std::string& callee,
                               const std::string& function) {
  std::string type = "unknown", message = "(no message)";
  try {
    const Value v = decode(payload.data(), payload.size());
    type = v.at("type").get<std::string>();
    message = v.at("message").get<std::string>();
  } catch (const std::exception& e) {
    message = std::string("(the error could not be decoded: ") + e.what() + ")";
  }
  const std::string where = function.empty() ? "" : "'" + function + "' ";
  return std::make_exception_ptr(
      RemoteError("rpc: " + where + "on worker '" + callee + "' raised " + type + ": " + message,
                  callee, function, type, message));
}

void describeCurrentException(std::string& type, std::string& message) {
  auto demangle = [](const char* name) {
    int status = 0;
    char* out = abi::__cxa_demangle(name, nullptr, nullptr, &status);
    std::string s = status == 0 && out != nullptr ? out : name;
    std::free(out);
    return s;
  };
  try {
    throw;
  } catch (const std::exception& e) {
    type = demangle(typeid(e).name());
    message = e.what();
  } catch (...) {
    const std::type_info* t = abi::__cxa_current_exception_type();
    type = t != nullptr ? demangle(t->name()) : "unknown";
    message = "(not a std::exception)";
  }
}

struct RRefState {
  std::weak_ptr<RpcAgent::Impl> agent;
  WorkerInfo owner;
  uint64_t id = 0;
  std::string function;
  Future created;
  ~RRefState();
};

}  // namespace detail

// ---- the agent ----

class RpcAgent::Impl : public std::enable_shared_from_this<RpcAgent::Impl> {
 public:
  Impl(const std::string& name, int rank, int worldSize, std::shared_ptr<Store> store,
       const Registry& functions, const RpcOptions& options);

  std::shared_ptr<detail::CallState> call(wire::Kind kind, const std::string& to,
                                          const std::string& function, uint64_t aux,
                                          const Value& args, milliseconds timeout,
                                          const std::string& what);
  void post(int rank, wire::Kind kind, uint64_t aux) {
    // An RRef's destructor sends this: it must not block for a whole call timeout.
    if (running_) {
      channels_[static_cast<size_t>(rank)]->post(kind, aux,
                                                 std::min(core_->timeout, milliseconds(5000)));
    }
  }
  RRef remote(const std::string& to, const std::string& function, const Value& args,
              milliseconds timeout);
  Value fetch(const detail::RRefState& ref, milliseconds timeout);
  void shutdown(bool graceful);
  int rankOf(const std::string& name) const;
  size_t ownedValues() const { return server_->ownedValues(); }

  std::shared_ptr<detail::Core> core_;

 private:
  void stop(const std::string& why, milliseconds bound);

  std::shared_ptr<Store> store_;
  std::string prefix_;
  std::unique_ptr<detail::Server> server_;
  std::vector<std::unique_ptr<detail::Channel>> channels_;
  std::map<std::string, int> ranks_;
  std::atomic<uint64_t> nextCallId_{1};
  std::atomic<uint64_t> nextRRef_{1};
  std::atomic<bool> running_{false};
  std::mutex shutdownMu_;
};

namespace {

std::string publishedHost(const RpcOptions& options, Store& store) {
  if (!options.host.empty()) return options.host;
  if (auto host = settings::text("LOOM_RPC_HOST")) return *host;
  if (auto* tcp = dynamic_cast<TCPStore*>(&store)) {
    const std::string local = net::localAddressTowards(tcp->host());
    if (!local.empty()) return local;
  }
  const std::string name = net::hostname();
  return net::localAddressTowards(name).empty() ? "127.0.0.1" : name;
}

void checkName(const std::string& name) {
  LOOM_CHECK(!name.empty() && name.size() <= 128,
             "an RPC worker name must be 1 to 128 characters, got '", name, "'");
  for (char c : name) {
    LOOM_CHECK(
        std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.' || c == ':',
        "RPC worker name '", name,
        "' has a character outside [A-Za-z0-9_.:-]; expected a name like 'trainer3'");
  }
}

}  // namespace

RpcAgent::Impl::Impl(const std::string& name, int rank, int worldSize, std::shared_ptr<Store> store,
                     const Registry& functions, const RpcOptions& options)
    : core_(std::make_shared<detail::Core>()), store_(std::move(store)), prefix_(options.prefix) {
  checkName(name);
  LOOM_CHECK(worldSize >= 1, "RPC worldSize must be at least 1, got ", worldSize);
  LOOM_CHECK(rank >= 0 && rank < worldSize, "RPC rank ", rank, " is outside [0, ", worldSize, ")");
  LOOM_CHECK(store_ != nullptr, "RpcAgent needs a store for the rendezvous, got nullptr");
  LOOM_CHECK(options.timeout.count() >= 0, "RpcOptions::timeout must not be negative");
  LOOM_CHECK(options.numThreads >= 0, "RpcOptions::numThreads must not be negative");
  detail::Core& core = *core_;
  core.timeout = options.timeout;
  settings::fillDefault(core.timeout, milliseconds(0), settings::integer("LOOM_RPC_TIMEOUT"));
  if (core.timeout.count() == 0) core.timeout = milliseconds(60000);
  core.numThreads = options.numThreads;
  settings::fillDefault(core.numThreads, 0, settings::integer("LOOM_RPC_THREADS"));
  if (core.numThreads == 0) core.numThreads = 8;
  core.maxMessageBytes = options.maxMessageBytes;
  LOOM_CHECK(options.maxConnections >= 0, "RpcOptions::maxConnections must not be negative");
  core.maxConnections = options.maxConnections;
  settings::fillDefault(core.maxConnections, 0, settings::integer("LOOM_RPC_MAX_CONNECTIONS"));
  if (core.maxConnections == 0) core.maxConnections = 1024;
  // The job's key, before the server listens: every connection must prove it holds it.
  core.key = auth::sharedKey(*store_, prefix_ + "/auth-key");
  core.functions = std::make_shared<const Registry>(functions);
  core.worldSize = worldSize;
  core.self = WorkerInfo{name, rank, publishedHost(options, *store_), 0};

  server_ = std::make_unique<detail::Server>(core_);
  core.self.port = server_->port();
  server_->start();

  // Rendezvous: publish "name host port", read everyone's.
  const Value me{{"name", name}, {"host", core.self.host}, {"port", core.self.port}};
  store_->set(prefix_ + "/worker/" + std::to_string(rank), me.dump());
  std::vector<std::string> keys;
  for (int r = 0; r < worldSize; ++r) keys.push_back(prefix_ + "/worker/" + std::to_string(r));
  try {
    store_->wait(keys, core.timeout);
  } catch (const TimeoutError& e) {
    std::string missing;
    for (int r = 0; r < worldSize; ++r) {
      if (!store_->check({keys[static_cast<size_t>(r)]})) {
        missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      }
    }
    server_->stop(milliseconds(0));
    LOOM_THROW(TimeoutError, "rpc: worker '", name, "' (rank ", rank, ") waited ",
               core.timeout.count(),
               " ms for the other workers to start; missing ranks: ", missing);
  }
  const std::vector<Bytes> values = store_->multiGet(keys);
  for (int r = 0; r < worldSize; ++r) {
    const Value v = Value::parse(toString(values[static_cast<size_t>(r)]));
    WorkerInfo info{v.at("name").get<std::string>(), r, v.at("host").get<std::string>(),
                    v.at("port").get<int>()};
    auto [it, inserted] = ranks_.emplace(info.name, r);
    if (!inserted) {
      server_->stop(milliseconds(0));
      LOOM_THROW(InvalidArgumentError, "rpc: worker name '", info.name, "' is used by ranks ",
                 it->second, " and ", r, "; names must be unique");
    }
    core.workers.push_back(std::move(info));
  }
  for (int r = 0; r < worldSize; ++r) {
    channels_.push_back(std::make_unique<detail::Channel>(core, r));
  }
  running_ = true;
}

int RpcAgent::Impl::rankOf(const std::string& name) const {
  auto it = ranks_.find(name);
  if (it != ranks_.end()) return it->second;
  std::string known;
  for (const auto& [n, r] : ranks_) known += (known.empty() ? "" : ", ") + n;
  LOOM_THROW(InvalidArgumentError, "rpc: no worker named '", name, "'; the workers are: ", known);
}

std::shared_ptr<detail::CallState> RpcAgent::Impl::call(wire::Kind kind, const std::string& to,
                                                        const std::string& function, uint64_t aux,
                                                        const Value& args, milliseconds timeout,
                                                        const std::string& what) {
  const int rank = rankOf(to);
  LOOM_CHECK(timeout.count() >= 0, "rpc: a call's timeout must not be negative, got ",
             timeout.count(), " ms");
  if (timeout.count() == 0) timeout = core_->timeout;
  const uint64_t id = nextCallId_.fetch_add(1);
  const std::string description =
      what + " #" + std::to_string(id) + " '" + function + "' to " + core_->describe(rank);
  if (!running_) LOOM_THROW(IoError, "rpc: ", description, ": the agent is shut down");
  std::vector<uint8_t> payload;
  if (kind != wire::Kind::kFetch) {
    LOOM_CHECK(args.is_array(), "rpc: the arguments of ", description,
               " must be an array (rpc::args(...)), got ", args.type_name());
    payload = encode(args);
    LOOM_CHECK(payload.size() <= core_->maxMessageBytes, "rpc: the arguments of ", description,
               " take ", payload.size(), " bytes; at most ", core_->maxMessageBytes,
               " allowed (RpcOptions::maxMessageBytes)");
  }
  return channels_[static_cast<size_t>(rank)]->call(kind, id, function, aux, payload, timeout,
                                                    description);
}

RRef RpcAgent::Impl::remote(const std::string& to, const std::string& function, const Value& args,
                            milliseconds timeout) {
  const int owner = rankOf(to);
  auto state = std::make_shared<detail::RRefState>();
  state->agent = weak_from_this();
  state->owner = core_->workers[static_cast<size_t>(owner)];
  // Unique on the owner: the creator's rank in the high bits, its own counter below.
  state->id = (static_cast<uint64_t>(core_->self.rank) << 40) | nextRRef_.fetch_add(1);
  state->function = function;
  state->created =
      Future(call(wire::Kind::kRemote, to, function, state->id, args, timeout, "remote"));
  return RRef(state);
}

Value RpcAgent::Impl::fetch(const detail::RRefState& ref, milliseconds timeout) {
  // The fetch frame carries no function; name the one that made the value for messages.
  auto state = call(wire::Kind::kFetch, ref.owner.name, ref.function, ref.id, Value(), timeout,
                    "toHere (RRef " + std::to_string(ref.id) + ")");
  return Future(state).wait();
}

void RpcAgent::Impl::stop(const std::string& why, milliseconds bound) {
  running_ = false;
  for (auto& channel : channels_) channel->close(why);
  server_->stop(bound);
}

void RpcAgent::Impl::shutdown(bool graceful) {
  std::lock_guard<std::mutex> lock(shutdownMu_);
  if (!running_) return;
  const std::string name = core_->self.name;
  if (!graceful) {
    stop("worker '" + name + "' shut down (not graceful)", milliseconds(0));
    return;
  }
  Deadline deadline(core_->timeout);
  size_t outstanding = 0;
  {
    std::unique_lock<std::mutex> plock(core_->pendingMu);
    core_->pendingCv.wait_until(plock, deadline.end(), [&] { return core_->pendingCalls == 0; });
    outstanding = core_->pendingCalls;
  }
  try {
    // Everyone's own calls are answered once everyone arrives: no one serves a call after it.
    // A full timeout of its own: a worker that spent its wait on its own calls still gives
    // the others a whole timeout to arrive.
    storeBarrier(*store_, prefix_ + "/shutdown", core_->self.rank, core_->worldSize,
                 core_->timeout);
  } catch (const std::exception& e) {
    stop("worker '" + name + "' shut down (its barrier failed)", milliseconds(0));
    LOOM_THROW(TimeoutError, "rpc: shutdown of worker '", name, "': ", e.what(),
               outstanding > 0 ? " (and " + std::to_string(outstanding) +
                                     " of its own call(s) were still pending)"
                               : std::string());
  }
  // After the barrier no caller waits on this worker: running requests get a short grace.
  stop("worker '" + name + "' shut down", std::min(core_->timeout, milliseconds(5000)));
  if (outstanding > 0) {
    LOOM_THROW(TimeoutError, "rpc: shutdown of worker '", name, "': ", outstanding,
               " call(s) were still pending after ", core_->timeout.count(),
               " ms; they failed with IoError");
  }
}

detail::RRefState::~RRefState() {
  try {
    if (auto impl = agent.lock()) impl->post(owner.rank, wire::Kind::kDelete, id);
  } catch (...) {
  }
}

// ---- the public faces ----

RpcAgent::RpcAgent(const std::string& name, int rank, int worldSize, std::shared_ptr<Store> store,
                   const Registry& functions, const RpcOptions& options)
    : impl_(std::make_shared<Impl>(name, rank, worldSize, std::move(store), functions, options)) {}

RpcAgent::~RpcAgent() {
  try {
    impl_->shutdown(false);
  } catch (const std::exception& e) {
    LOOM_LOG_WARNING("rpc: shutting down worker '", impl_->core_->self.name, "': ", e.what());
  }
}

Value RpcAgent::rpcSync(const std::string& to, const std::string& function, Value args,
                        milliseconds timeout) {
  return rpcAsync(to, function, std::move(args), timeout).wait();
}

Future RpcAgent::rpcAsync(const std::string& to, const std::string& function, Value args,
                          milliseconds timeout) {
  return Future(impl_->call(wire::Kind::kRequest, to, function, 0, args, timeout, "call"));
}

RRef RpcAgent::remote(const std::string& to, const std::string& function, Value args,
                      milliseconds timeout) {
  return impl_->remote(to, function, args, timeout);
}

void RpcAgent::shutdown(bool graceful) {
  impl_->shutdown(graceful);
}

const WorkerInfo& RpcAgent::self() const {
  return impl_->core_->self;
}

const WorkerInfo& RpcAgent::worker(const std::string& name) const {
  return impl_->core_->workers[static_cast<size_t>(impl_->rankOf(name))];
}

const WorkerInfo& RpcAgent::worker(int rank) const {
  LOOM_CHECK(rank >= 0 && rank < impl_->core_->worldSize, "rpc: no worker of rank ", rank,
             "; ranks are [0, ", impl_->core_->worldSize, ")");
  return impl_->core_->workers[static_cast<size_t>(rank)];
}

const std::vector<WorkerInfo>& RpcAgent::workers() const {
  return impl_->core_->workers;
}

milliseconds RpcAgent::timeout() const {
  return impl_->core_->timeout;
}

size_t RpcAgent::ownedValues() const {
  return impl_->ownedValues();
}

const std::string& RRef::owner() const {
  LOOM_CHECK(state_ != nullptr, "an empty RRef has no owner");
  return state_->owner.name;
}

int RRef::ownerRank() const {
  LOOM_CHECK(state_ != nullptr, "an empty RRef has no owner");
  return state_->owner.rank;
}

uint64_t RRef::id() const {
  LOOM_CHECK(state_ != nullptr, "an empty RRef has no id");
  return state_->id;
}

const Future& RRef::created() const {
  LOOM_CHECK(state_ != nullptr, "an empty RRef was never created");
  return state_->created;
}

Value RRef::toHere(milliseconds timeout) const {
  LOOM_CHECK(state_ != nullptr, "toHere() on an empty RRef");
  auto impl = state_->agent.lock();
  if (impl == nullptr) {
    LOOM_THROW(IoError, "rpc: toHere of RRef ", state_->id, " ('", state_->function,
               "' on worker '", state_->owner.name, "'): the agent that made it is gone");
  }
  return impl->fetch(*state_, timeout);
}

}  // namespace loom::rpc
