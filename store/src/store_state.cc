#include "store_state.h"

#include "loom/common/error.h"
#include "loom/common/logging.h"

namespace loom {

using store_protocol::Message;
using store_protocol::Op;

namespace {

// Requests one connection may leave parked (a TCPStore client parks at most one).
constexpr size_t kMaxWaitersPerConnection = 1024;

}  // namespace

std::string StoreState::checkShape(const Message& m) const {
  auto want = [&](size_t keys, size_t values) -> std::string {
    if (m.keys.size() == keys && m.values.size() == values) return {};
    return detail::str(store_protocol::opName(m.op), " needs ", keys, " key(s) and ", values,
                       " value(s), got ", m.keys.size(), " and ", m.values.size());
  };
  switch (m.op) {
    case Op::kSet:
      return want(1, 1);
    case Op::kGet:
    case Op::kAdd:
    case Op::kDelete:
      return want(1, 0);
    case Op::kCompareSet:
      return want(1, 2);
    case Op::kNumKeys:
    case Op::kCancel:
      return want(0, 0);
    case Op::kCheck:
    case Op::kWait:
    case Op::kMultiGet:
      return m.values.empty() ? std::string() : want(m.keys.size(), 0);
    case Op::kMultiSet:
      return m.keys.size() == m.values.size() ? std::string() : want(m.keys.size(), m.keys.size());
    case Op::kHello:
      return "second hello on one connection";
    default:
      return detail::str("a client may not send ", store_protocol::opName(m.op));
  }
}

std::string StoreState::handle(ClientId client, Message& m) {
  if (std::string bad = checkShape(m); !bad.empty()) return bad;
  for (const auto& key : m.keys) {
    if (key.empty()) {
      replyError(client, m.id,
                 detail::str(store_protocol::opName(m.op), ": store keys must be non-empty"));
      return {};
    }
  }
  Message r{Op::kOk, m.id, 0, {}, {}};
  switch (m.op) {
    case Op::kSet:
      if (log_ && !persist(client, m.id, {{m.keys[0], m.values[0]}})) return {};
      setKey(m.keys[0], std::move(m.values[0]));
      break;
    case Op::kMultiSet: {
      std::vector<StoreLog::Change> changes;
      if (log_) {
        for (size_t i = 0; i < m.keys.size(); ++i) changes.push_back({m.keys[i], m.values[i]});
      }
      if (log_ && !persist(client, m.id, changes)) return {};
      for (size_t i = 0; i < m.keys.size(); ++i) setKey(m.keys[i], std::move(m.values[i]));
      break;
    }
    case Op::kGet:
    case Op::kWait:
    case Op::kMultiGet: {
      auto waiter = std::make_shared<Waiter>(Waiter{client, m.id, m.op, std::move(m.keys), {}});
      if (present(waiter->keys)) {
        answer(*waiter);
        return {};
      }
      auto& mine = byClient_[client];
      if (mine.size() >= kMaxWaitersPerConnection) {
        return detail::str("more than ", kMaxWaitersPerConnection,
                           " requests waiting on one connection");
      }
      mine.push_back(waiter);
      waiting_.fetch_add(1, std::memory_order_relaxed);
      park(waiter);
      return {};
    }
    case Op::kAdd: {
      int64_t current = 0;
      auto it = data_.find(m.keys[0]);
      if (it != data_.end() && !store_protocol::parseInt64(it->second, current)) {
        replyError(client, m.id,
                   detail::str("add(\"", m.keys[0],
                               "\"): the key holds a value that is not a decimal integer"));
        return {};
      }
      int64_t result = 0;
      if (__builtin_add_overflow(current, m.number, &result)) {
        replyError(client, m.id,
                   detail::str("add(\"", m.keys[0], "\", ", m.number,
                               "): overflows int64 (current ", current, ")"));
        return {};
      }
      Bytes value = toBytes(std::to_string(result));
      if (log_ && !persist(client, m.id, {{m.keys[0], value}})) return {};
      setKey(m.keys[0], std::move(value));
      r.number = result;
      break;
    }
    case Op::kCompareSet: {
      // torch.distributed semantics: see store.h.
      const std::string& key = m.keys[0];
      auto it = data_.find(key);
      if (it == data_.end()) {
        if (m.values[0].empty()) {
          if (log_ && !persist(client, m.id, {{key, m.values[1]}})) return {};
          r.values.push_back(m.values[1]);
          setKey(key, std::move(m.values[1]));
        } else {
          r.values.push_back(std::move(m.values[0]));
        }
      } else {
        if (it->second == m.values[0]) {
          if (log_ && !persist(client, m.id, {{key, m.values[1]}})) return {};
          it->second = std::move(m.values[1]);
        }
        r.values.push_back(it->second);
      }
      break;
    }
    case Op::kDelete:
      if (data_.count(m.keys[0]) != 0 && !persist(client, m.id, {{m.keys[0], std::nullopt}})) {
        return {};
      }
      r.number = data_.erase(m.keys[0]) > 0 ? 1 : 0;
      break;
    case Op::kCheck:
      r.number = present(m.keys) ? 1 : 0;
      break;
    case Op::kNumKeys:
      r.number = static_cast<int64_t>(data_.size());
      break;
    case Op::kCancel: {
      // Answer the cancelled request (if still parked) before the cancel itself, so that the
      // client reads at most one stale reply and knows it by id.
      const uint64_t target = static_cast<uint64_t>(m.number);
      auto mine = byClient_.find(client);
      if (mine == byClient_.end()) break;
      for (const auto& waiter : mine->second) {
        if (waiter->id != target) continue;
        const WaiterPtr keep = waiter;
        unpark(keep);
        forget(keep);
        replyError(client, target,
                   detail::str(store_protocol::opName(keep->op), " cancelled by the client"));
        break;
      }
      break;
    }
    default:
      break;  // checkShape refused everything else
  }
  // The writer hears back before the waiters it wakes: whoever learns of a key from a wait
  // can rely on its writer having been answered.
  sink_(client, std::move(r));
  if (log_) log_->maybeCompact(data_);
  std::vector<std::string> created = std::move(created_);
  created_.clear();
  for (const auto& key : created) keyCreated(key);
  return {};
}

void StoreState::dropClient(ClientId client) {
  auto it = byClient_.find(client);
  if (it == byClient_.end()) return;
  for (const auto& waiter : it->second) unpark(waiter);
  waiting_.fetch_sub(static_cast<int>(it->second.size()), std::memory_order_relaxed);
  byClient_.erase(it);
}

void StoreState::replyError(ClientId client, uint64_t id, const std::string& what, int64_t code) {
  sink_(client, Message{Op::kError, id, code, {what.substr(0, store_protocol::kMaxKeyBytes)}, {}});
}

const StoreLog::Loaded& StoreState::persistTo(const StoreLogOptions& options) {
  LOOM_CHECK(!log_, "StoreState: already persisting to ", log_->dir());
  log_ = std::make_unique<StoreLog>(options, data_);
  return log_->loaded();
}

bool StoreState::persist(ClientId client, uint64_t id,
                         const std::vector<StoreLog::Change>& changes) {
  if (!log_) return true;
  try {
    log_->append(changes);
    return true;
  } catch (const IoError& e) {
    LOOM_LOG_ERROR("TCPStore server: ", e.what());
    replyError(client, id, detail::str("the store server cannot persist the change: ", e.what()),
               store_protocol::kErrorIo);
    return false;
  }
}

bool StoreState::present(const std::vector<std::string>& keys) const {
  for (const auto& key : keys) {
    if (data_.count(key) == 0) return false;
  }
  return true;
}

void StoreState::answer(const Waiter& waiter) {
  Message r{Op::kOk, waiter.id, 0, {}, {}};
  if (waiter.op != Op::kWait) {
    r.values.reserve(waiter.keys.size());
    for (const auto& key : waiter.keys) r.values.push_back(data_.at(key));
  }
  sink_(waiter.client, std::move(r));
}

void StoreState::park(const WaiterPtr& waiter) {
  for (const auto& key : waiter->keys) {
    if (data_.count(key) == 0) {
      waiter->parkedOn = key;
      parked_[key].push_back(waiter);
      return;
    }
  }
}

void StoreState::unpark(const WaiterPtr& waiter) {
  auto it = parked_.find(waiter->parkedOn);
  if (it == parked_.end()) return;
  it->second.remove(waiter);
  if (it->second.empty()) parked_.erase(it);
}

void StoreState::forget(const WaiterPtr& waiter) {
  auto it = byClient_.find(waiter->client);
  if (it == byClient_.end()) return;
  it->second.remove(waiter);
  waiting_.fetch_sub(1, std::memory_order_relaxed);
  if (it->second.empty()) byClient_.erase(it);
}

void StoreState::setKey(const std::string& key, Bytes value) {
  auto [it, created] = data_.insert_or_assign(key, std::move(value));
  (void)it;
  if (created) created_.push_back(key);
}

void StoreState::keyCreated(const std::string& key) {
  auto it = parked_.find(key);
  if (it == parked_.end()) return;
  std::list<WaiterPtr> woken = std::move(it->second);
  parked_.erase(it);
  for (auto& waiter : woken) {
    if (!present(waiter->keys)) {
      park(waiter);
      continue;
    }
    forget(waiter);
    answer(*waiter);
  }
}

}  // namespace loom
