#include "pg_failure.h"

#include <cctype>
#include <map>

namespace loom::pg_failure {

namespace {

// True when `text` mentions `name` as a whole token ("allreduce#1" is not in
// "allreduce#17").
bool mentions(const std::string& text, const std::string& name) {
  for (size_t pos = text.find(name); pos != std::string::npos; pos = text.find(name, pos + 1)) {
    const size_t end = pos + name.size();
    if (end >= text.size() || !std::isdigit(static_cast<unsigned char>(text[end]))) return true;
  }
  return false;
}

}  // namespace

std::string joinRanks(const std::vector<int>& ranks) {
  std::string out;
  for (int r : ranks) out += (out.empty() ? "" : ", ") + std::to_string(r);
  return out;
}

void checkSignatureInStore(const ProcessGroup& pg, const OpDesc& op, uint64_t& lastSignatureSeq) {
  Store& store = *pg.store();
  store.set(signatureKey(op.seq, pg.rank()), op.signature());
  std::vector<std::string> keys;
  for (int r = 0; r < pg.size(); ++r) keys.push_back(signatureKey(op.seq, r));
  try {
    store.wait(keys, op.timeout);
  } catch (const TimeoutError&) {
    std::vector<int> missing;
    for (int r = 0; r < pg.size(); ++r) {
      if (!store.check({keys[r]})) missing.push_back(r);
    }
    throw TimeoutError(pg.who() + ": " + op.describe() +
                       " (LOOM_DEBUG=DETAIL signature check): ranks [" + joinRanks(missing) +
                       "] did not reach collective #" + std::to_string(op.seq) + " within " +
                       std::to_string(op.timeout.count()) + " ms");
  }
  const std::vector<Bytes> values = store.multiGet(keys);
  // Every rank has written signature seq, so it has finished reading seq - 1: ours can go.
  if (lastSignatureSeq != 0) store.deleteKey(signatureKey(lastSignatureSeq, pg.rank()));
  lastSignatureSeq = op.seq;
  std::vector<std::string> signatures;
  for (const Bytes& v : values) signatures.push_back(toString(v));
  compareSignatures(pg, op, signatures);
}

void compareSignatures(const ProcessGroup& pg, const OpDesc& op,
                       const std::vector<std::string>& signatures) {
  std::map<std::string, std::vector<int>> byValue;
  for (int r = 0; r < static_cast<int>(signatures.size()); ++r) {
    byValue[signatures[static_cast<size_t>(r)]].push_back(r);
  }
  if (byValue.size() <= 1) return;
  std::string detail;
  for (const auto& [signature, ranks] : byValue) {
    detail += "\n  " + signature + " on ranks [" + joinRanks(ranks) + "]";
  }
  throw InvalidArgumentError(pg.who() + ": collective #" + std::to_string(op.seq) +
                             " does not match across ranks (LOOM_DEBUG=DETAIL); this rank called " +
                             op.signature() + ":" + detail);
}

FailureCause classify(std::exception_ptr error) {
  FailureCause cause;
  try {
    std::rethrow_exception(error);
  } catch (const TimeoutError& e) {
    cause.what = e.what();
    cause.timedOut = true;
  } catch (const InvalidArgumentError& e) {
    cause.what = e.what();
    cause.invalid = true;
  } catch (const std::exception& e) {
    cause.what = e.what();
  } catch (...) {
  }
  return cause;
}

std::string ownMessage(const ProcessGroup& pg, const OpDesc& op, const std::string& what) {
  if (!mentions(what, op.describe().substr(0, op.describe().find(' ')))) {
    return pg.who() + ": " + op.describe() + ": " + what;
  }
  if (what.find("rank " + std::to_string(pg.rank())) == std::string::npos) {
    return pg.who() + ": " + what;
  }
  return what;
}

std::exception_ptr FailureOutcome::error() const {
  // The exception's type names the root cause on every rank: ranks whose arguments disagree
  // (a count that differs from what a peer sends) are a caller's mistake even where this rank
  // only saw its peer close the connection.
  if (anyInvalid) return std::make_exception_ptr(InvalidArgumentError(message));
  if (anyTimeout) return std::make_exception_ptr(TimeoutError(message));
  return std::make_exception_ptr(IoError(message));
}

FailureOutcome exchangeReports(const ProcessGroup& pg, const OpDesc& op, const FailureCause& cause,
                               const std::string& own, const std::string& ring,
                               const std::function<void()>& afterPublish) {
  // Publish, then let the caller cut its peers loose, then collect the other ranks' reports;
  // every step bounded by the window.
  const milliseconds window = std::min(pg.options().failureReportWindow, op.timeout / 2);
  const auto start = Clock::now();
  const char* kind = cause.invalid ? "invalid" : cause.timedOut ? "timeout" : "io";
  auto exchange = FailureExchange::start(pg.store(), pg.rank(), pg.size(),
                                         std::string(kind) + "\n" + own, ring, window, true);
  if (exchange) exchange->waitFor(exchange->published, start + window);
  if (afterPublish) afterPublish();

  FailureOutcome out;
  out.message = own;
  out.anyTimeout = cause.timedOut;
  out.anyInvalid = cause.invalid;
  // Who hosts the store, for a store that died or stopped answering.
  const int host = pg.options().storeHostRank;
  // Unknown (-1: a store the caller made, torch's rendezvous store): no claim either way.
  const std::string storeHost = host >= 0 && host != pg.rank()
                                    ? "rank " + std::to_string(host) + ", which hosts the store,"
                                : host == pg.rank() ? std::string("the store's host (this process)")
                                                    : std::string("the store's host");
  if (exchange && exchange->waitFor(exchange->done, start + window + storeSlack(window))) {
    std::lock_guard<std::mutex> lock(exchange->mu);
    if (!exchange->storeGone.empty()) {
      out.message += "\n  diagnosis: the store host died: " + storeHost +
                     " is gone (the store closed its connection or cannot be reached), so no "
                     "rank can report or be analysed: " +
                     exchange->storeGone;
    } else if (!exchange->explanation.empty()) {
      std::string text = exchange->explanation;
      for (size_t at = text.find('\n'); at != std::string::npos; at = text.find('\n', at + 1)) {
        text.insert(at + 1, "  ");
      }
      out.message += "\n  diagnosis: " + text;
    }
    if (!exchange->silent.empty()) {
      out.message +=
          "\n  ranks that sent no failure report within " + std::to_string(window.count()) +
          " ms (dead, stopped, or not at this operation): " + joinRanks(exchange->silent);
    }
    out.message += exchange->reports;
    if (!exchange->storeError.empty()) {
      out.message +=
          "\n  (the failure reports could not be read from the store: " + exchange->storeError +
          ")";
    }
    out.anyTimeout = out.anyTimeout || exchange->anyTimeout;
    out.anyInvalid = out.anyInvalid || exchange->anyInvalid;
  } else {
    out.message += "\n  diagnosis: the store did not answer within " +
                   std::to_string((window + storeSlack(window)).count()) + " ms: " + storeHost +
                   " is stopped, overloaded or cut off (no failure reports, no analysis)";
  }
  return out;
}

}  // namespace loom::pg_failure
