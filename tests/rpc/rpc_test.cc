// RPC with workers as threads of one process over a HashStore: calls by name, typed and raw
// handlers, errors from the callee, unknown names, timeouts, concurrency on the callee, RRefs,
// and shutdown (graceful waits for outstanding calls; the barrier names who never came).
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <future>
#include <mutex>
#include <thread>

#include "loom/common/socket.h"
#include "loom/rpc/agent.h"
#include "loom/store/hash_store.h"
#include "loom/testing/errors.h"
#include "start_agents.h"

namespace loom::rpc {
namespace {

using std::chrono::milliseconds;
using testing::messageOf;

// A flag threads wait on with a deadline.
class Gate {
 public:
  void open() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }
  bool waitOpen(milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return open_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

using test_support::startAgents;

Registry basicFunctions() {
  Registry f;
  f.add("add", [](int a, int b) { return a + b; });
  f.add("concat", [](const std::string& a, const std::string& b) { return a + b; });
  f.add("sum", [](const std::vector<double>& v) {
    double s = 0;
    for (double x : v) s += x;
    return s;
  });
  f.add("nothing", [] {});
  f.addRaw("whoami", [](const Value& args, const CallContext& ctx) {
    return Value{
        {"caller", ctx.caller}, {"rank", ctx.callerRank}, {"fn", ctx.function}, {"args", args}};
  });
  f.add("scale", [](const Value& blob, float k) {
    std::vector<float> v = toFloats(blob);
    for (float& x : v) x *= k;
    return floats(v);
  });
  f.add("fail", [](int row) -> int {
    LOOM_THROW(InvalidArgumentError, "row ", row, " is out of range [0, 64)");
  });
  return f;
}

TEST(RpcTest, SyncAndAsyncCallsBetweenEveryPair) {
  auto agents = startAgents(3, basicFunctions());
  for (int from = 0; from < 3; ++from) {
    RpcAgent& a = *agents[static_cast<size_t>(from)];
    for (int to = 0; to < 3; ++to) {
      const std::string peer = "w" + std::to_string(to);
      EXPECT_EQ(a.rpcSync(peer, "add", args(from, to * 10)).get<int>(), from + to * 10);
      EXPECT_EQ(a.rpcSync(peer, "concat", args("ab", peer)).get<std::string>(), "ab" + peer);
      EXPECT_TRUE(a.rpcSync(peer, "nothing").is_null());
      const Value who = a.rpcSync(peer, "whoami", args(1, "x"));
      EXPECT_EQ(who.at("caller"), "w" + std::to_string(from));
      EXPECT_EQ(who.at("rank"), from);
      EXPECT_EQ(who.at("fn"), "whoami");
      EXPECT_EQ(who.at("args"), args(1, "x"));
    }
  }
  // Many calls in flight at once from one caller to one callee.
  std::vector<Future> futures;
  for (int i = 0; i < 200; ++i) futures.push_back(agents[0]->rpcAsync("w1", "add", args(i, 1)));
  for (int i = 0; i < 200; ++i) EXPECT_EQ(futures[static_cast<size_t>(i)].waitAs<int>(), i + 1);
  EXPECT_DOUBLE_EQ(
      agents[2]->rpcSync("w0", "sum", args(std::vector<double>{1, 2.5, 3})).get<double>(), 6.5);
}

TEST(RpcTest, BinaryFloatsTravelExactly) {
  auto agents = startAgents(2, basicFunctions());
  std::vector<float> v(100000);
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.001f * static_cast<float>(i) - 3.0f;
  const std::vector<float> out = toFloats(agents[0]->rpcSync("w1", "scale", args(floats(v), 2.0f)));
  ASSERT_EQ(out.size(), v.size());
  for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(out[i], v[i] * 2.0f) << i;
}

TEST(RpcTest, CalleeExceptionComesBackWithItsMessageAndTheCallee) {
  auto agents = startAgents(2, basicFunctions());
  try {
    agents[0]->rpcSync("w1", "fail", args(99));
    FAIL() << "no error";
  } catch (const RemoteError& e) {
    EXPECT_EQ(e.callee(), "w1");
    EXPECT_EQ(e.function(), "fail");
    EXPECT_EQ(e.remoteType(), "loom::InvalidArgumentError");
    EXPECT_NE(e.remoteMessage().find("row 99 is out of range [0, 64)"), std::string::npos);
    const std::string what = e.what();
    EXPECT_NE(what.find("'fail' on worker 'w1' raised loom::InvalidArgumentError"),
              std::string::npos)
        << what;
  }
  // The same through a future, and the agent keeps working afterwards.
  Future f = agents[1]->rpcAsync("w0", "fail", args(7));
  EXPECT_NE(messageOf<RemoteError>([&] { f.wait(); }).find("row 7"), std::string::npos);
  EXPECT_TRUE(f.failed());
  EXPECT_EQ(agents[0]->rpcSync("w1", "add", args(2, 3)).get<int>(), 5);
}

TEST(RpcTest, UnknownNamesAndWrongArgumentsAreClearErrors) {
  auto agents = startAgents(2, basicFunctions());
  const std::string noFn = messageOf<RemoteError>([&] { agents[0]->rpcSync("w1", "ad", args(1)); });
  EXPECT_NE(noFn.find("no function 'ad' is registered on worker 'w1'"), std::string::npos) << noFn;
  EXPECT_NE(noFn.find("registered: add, concat"), std::string::npos) << noFn;
  const std::string noWorker =
      messageOf<InvalidArgumentError>([&] { agents[0]->rpcSync("w9", "add", args(1, 2)); });
  EXPECT_NE(noWorker.find("no worker named 'w9'; the workers are: w0, w1"), std::string::npos)
      << noWorker;
  const std::string arity =
      messageOf<RemoteError>([&] { agents[0]->rpcSync("w1", "add", args(1)); });
  EXPECT_NE(arity.find("takes 2 argument(s), got 1"), std::string::npos) << arity;
  const std::string type =
      messageOf<RemoteError>([&] { agents[0]->rpcSync("w1", "add", args("x", 1)); });
  EXPECT_NE(type.find("type_error"), std::string::npos) << type;
  EXPECT_THROW(agents[0]->rpcSync("w1", "add", Value(3)), InvalidArgumentError);
}

TEST(RpcTest, CallTimesOutNamingTheCallAndTheAgentKeepsWorking) {
  Gate gate;
  Registry f = basicFunctions();
  f.add("block", [&gate] { return gate.waitOpen(milliseconds(20000)); });
  auto agents = startAgents(2, f);
  const std::string message = messageOf<TimeoutError>(
      [&] { agents[0]->rpcSync("w1", "block", args(), milliseconds(300)); });
  EXPECT_NE(message.find("'block' to worker 'w1' (rank 1) timed out"), std::string::npos)
      << message;
  EXPECT_NE(message.find("timeout 300 ms"), std::string::npos) << message;
  // A future nobody waits on also completes when its deadline passes.
  Future unwaited = agents[0]->rpcAsync("w1", "block", args(), milliseconds(200));
  EXPECT_THROW(unwaited.wait(), TimeoutError);
  gate.open();
  EXPECT_EQ(agents[0]->rpcSync("w1", "add", args(1, 1)).get<int>(), 2);
  EXPECT_TRUE(agents[0]->rpcSync("w1", "block").get<bool>());
}

TEST(RpcTest, CalleeRunsRequestsConcurrently) {
  // "meet" returns only once 4 calls are inside it at the same time: it would time out if the
  // callee ran them one by one.
  std::mutex mu;
  std::condition_variable cv;
  int inside = 0;
  Registry f;
  f.add("meet", [&] {
    std::unique_lock<std::mutex> lock(mu);
    ++inside;
    cv.notify_all();
    return cv.wait_for(lock, milliseconds(10000), [&] { return inside >= 4; });
  });
  RpcOptions options;
  options.numThreads = 4;
  auto agents = startAgents(2, f, options);
  std::vector<Future> futures;
  for (int i = 0; i < 4; ++i) futures.push_back(agents[0]->rpcAsync("w1", "meet"));
  for (auto& fut : futures) EXPECT_TRUE(fut.waitAs<bool>());
}

TEST(RpcTest, RemoteValuesStayOnTheOwnerUntilFetched) {
  std::atomic<int> made{0};
  Registry f = basicFunctions();
  f.add("make_table", [&](int rows) {
    ++made;
    std::vector<int> t(static_cast<size_t>(rows));
    for (int i = 0; i < rows; ++i) t[static_cast<size_t>(i)] = i * i;
    return t;
  });
  auto agents = startAgents(3, f);
  RRef ref = agents[0]->remote("w2", "make_table", args(5));
  EXPECT_EQ(ref.owner(), "w2");
  EXPECT_EQ(ref.ownerRank(), 2);
  EXPECT_EQ(ref.toHereAs<std::vector<int>>(), (std::vector<int>{0, 1, 4, 9, 16}));
  RRef copy = ref;
  EXPECT_EQ(copy.toHereAs<std::vector<int>>(), (std::vector<int>{0, 1, 4, 9, 16}));
  EXPECT_TRUE(ref.created().wait().is_null());
  EXPECT_EQ(made.load(), 1) << "toHere must fetch the kept value, not run the function again";

  // An RRef on oneself, and two independent RRefs.
  RRef mine = agents[1]->remote("w1", "add", args(20, 22));
  RRef other = agents[1]->remote("w0", "add", args(1, 2));
  EXPECT_EQ(mine.toHereAs<int>(), 42);
  EXPECT_EQ(other.toHereAs<int>(), 3);
  EXPECT_NE(mine.id(), other.id());

  // Making the value raised: toHere and created() both say so.
  RRef bad = agents[0]->remote("w1", "fail", args(3));
  const std::string message = messageOf<RemoteError>([&] { bad.toHere(); });
  EXPECT_NE(message.find("row 3 is out of range"), std::string::npos) << message;
  EXPECT_THROW(bad.created().wait(), RemoteError);
}

TEST(RpcTest, OwnerDropsTheValueWhenTheLastRRefGoes) {
  auto agents = startAgents(2, basicFunctions());
  {
    RRef a = agents[0]->remote("w1", "add", args(1, 2));
    RRef b = agents[0]->remote("w1", "add", args(3, 4));
    EXPECT_EQ(a.toHereAs<int>(), 3);
    EXPECT_EQ(b.toHereAs<int>(), 7);
    EXPECT_EQ(agents[1]->ownedValues(), 2u);
    RRef copyOfA = a;
    a = RRef();
    b = RRef();
    // b's delete is one-way: wait (bounded) for the owner to see it; a is still referenced.
    const Deadline deadline(milliseconds(10000));
    while (agents[1]->ownedValues() != 1 && !deadline.expired()) {
      std::this_thread::sleep_for(milliseconds(1));
    }
    EXPECT_EQ(agents[1]->ownedValues(), 1u);
    EXPECT_EQ(copyOfA.toHereAs<int>(), 3);
  }
  const Deadline deadline(milliseconds(10000));
  while (agents[1]->ownedValues() != 0 && !deadline.expired()) {
    std::this_thread::sleep_for(milliseconds(1));
  }
  EXPECT_EQ(agents[1]->ownedValues(), 0u);
}

TEST(RpcTest, GracefulShutdownWaitsForOutstandingCalls) {
  Gate started, release;
  Registry f = basicFunctions();
  f.add("slow", [&] {
    started.open();
    return release.waitOpen(milliseconds(20000));
  });
  auto agents = startAgents(2, f);
  Future pending = agents[0]->rpcAsync("w1", "slow");
  ASSERT_TRUE(started.waitOpen(milliseconds(20000)));
  // w0's shutdown cannot finish before "slow" answers; w1 shuts down on its own thread.
  std::thread w1([&] { agents[1]->shutdown(); });
  std::thread w0([&] { agents[0]->shutdown(); });
  EXPECT_FALSE(pending.done());
  release.open();
  w0.join();
  w1.join();
  EXPECT_TRUE(pending.done());
  EXPECT_TRUE(pending.waitAs<bool>());
  const std::string after =
      messageOf<IoError>([&] { agents[0]->rpcSync("w1", "add", args(1, 2)); });
  EXPECT_NE(after.find("shut down"), std::string::npos) << after;
}

TEST(RpcTest, GracefulShutdownWaitIsBoundedWhenACallNeverAnswers) {
  // Shared with the handler: its thread may outlive the callee's shutdown.
  auto release = std::make_shared<Gate>();
  Registry f = basicFunctions();
  f.add("stuck", [release] { return release->waitOpen(milliseconds(20000)); });
  RpcOptions options;
  options.timeout = milliseconds(1000);
  auto agents = startAgents(2, f, options);
  Future pending = agents[0]->rpcAsync("w1", "stuck", args(), milliseconds(20000));
  // w0 waits its timeout for "stuck", then its timeout at the barrier, where w1 never comes
  // (w1 is busy, not shutting down): both bounds pass and the error says so.
  const std::string message = messageOf<TimeoutError>([&] { agents[0]->shutdown(); });
  EXPECT_NE(message.find("missing ranks: 1"), std::string::npos) << message;
  EXPECT_NE(message.find("(and 1 of its own call(s) were still pending)"), std::string::npos)
      << message;
  EXPECT_THROW(pending.wait(), IoError);
  release->open();
}

TEST(RpcTest, ShutdownBarrierNamesTheWorkersThatNeverCame) {
  RpcOptions options;
  options.timeout = milliseconds(500);
  auto agents = startAgents(3, basicFunctions(), options);
  const std::string message = messageOf<TimeoutError>([&] { agents[1]->shutdown(); });
  EXPECT_NE(message.find("shutdown of worker 'w1'"), std::string::npos) << message;
  EXPECT_NE(message.find("missing ranks: 0, 2"), std::string::npos) << message;
}

TEST(RpcTest, NonGracefulShutdownFailsPendingCalls) {
  Gate release;
  Registry f = basicFunctions();
  f.add("block", [&] { return release.waitOpen(milliseconds(20000)); });
  auto agents = startAgents(2, f);
  Future pending = agents[0]->rpcAsync("w1", "block");
  agents[0]->shutdown(false);
  const std::string message = messageOf<IoError>([&] { pending.wait(); });
  EXPECT_NE(message.find("'block' to worker 'w1'"), std::string::npos) << message;
  EXPECT_NE(message.find("shut down"), std::string::npos) << message;
  release.open();
}

TEST(RpcTest, MessagesOverTheLimitAreRefusedOnBothSides) {
  Registry f = basicFunctions();
  f.add("big", [](int n) { return floats(std::vector<float>(static_cast<size_t>(n), 1.0f)); });
  RpcOptions options;
  options.maxMessageBytes = 4096;
  auto agents = startAgents(2, f, options);
  const std::string sent = messageOf<InvalidArgumentError>(
      [&] { agents[0]->rpcSync("w1", "scale", args(floats(std::vector<float>(2000)), 1.0f)); });
  EXPECT_NE(sent.find("at most 4096 allowed"), std::string::npos) << sent;
  const std::string answered =
      messageOf<RemoteError>([&] { agents[0]->rpcSync("w1", "big", args(2000)); });
  EXPECT_NE(answered.find("the result of 'big' takes"), std::string::npos) << answered;
  EXPECT_EQ(toFloats(agents[0]->rpcSync("w1", "big", args(10))).size(), 10u);
}

TEST(RpcTest, GarbageOnTheServerPortClosesOnlyThatConnection) {
  auto agents = startAgents(2, basicFunctions());
  net::Socket s = net::connectTo("127.0.0.1", agents[1]->self().port, milliseconds(5000));
  const std::string junk(64, 'x');
  net::writeFull(s.fd(), junk.data(), junk.size(), Deadline(milliseconds(5000)), "w1");
  char byte = 0;
  const std::string closed = messageOf<IoError>(
      [&] { net::readFull(s.fd(), &byte, 1, Deadline(milliseconds(10000)), "w1"); });
  // Closed, or reset: the server drops it with the rest of the junk unread (it fails the
  // authentication handshake, rpc_auth_test).
  EXPECT_TRUE(closed.find("connection closed") != std::string::npos ||
              closed.find("reset by peer") != std::string::npos)
      << closed;
  EXPECT_EQ(agents[0]->rpcSync("w1", "add", args(4, 5)).get<int>(), 9);
}

TEST(RpcTest, BadConstructionIsRejected) {
  auto store = std::make_shared<HashStore>();
  Registry f;
  EXPECT_THROW(RpcAgent("", 0, 1, store, f), InvalidArgumentError);
  EXPECT_THROW(RpcAgent("a/b", 0, 1, store, f), InvalidArgumentError);
  EXPECT_THROW(RpcAgent("a", 1, 1, store, f), InvalidArgumentError);
  EXPECT_THROW(RpcAgent("a", 0, 1, nullptr, f), InvalidArgumentError);
  EXPECT_THROW(f.add("x", [] {}); f.add("x", [] {}), InvalidArgumentError);
  RpcOptions options;
  options.timeout = milliseconds(300);
  const std::string missing =
      messageOf<TimeoutError>([&] { RpcAgent("a", 0, 3, store, f, options); });
  EXPECT_NE(missing.find("missing ranks: 1, 2"), std::string::npos) << missing;
  // Two workers with one name.
  auto store2 = std::make_shared<HashStore>();
  std::thread other([&] {
    try {
      RpcAgent("same", 1, 2, store2, f, options);
    } catch (const std::exception&) {
    }
  });
  const std::string dup =
      messageOf<InvalidArgumentError>([&] { RpcAgent("same", 0, 2, store2, f, options); });
  other.join();
  EXPECT_NE(dup.find("worker name 'same' is used by ranks 0 and 1"), std::string::npos) << dup;
}

}  // namespace
}  // namespace loom::rpc
