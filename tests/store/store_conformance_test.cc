// One suite over every Store type, in the spirit of PyTorch's test_store.py: the same calls
// must mean the same thing whether the store is a map, a file or a server.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "loom/common/error.h"
#include "store_kinds.h"

namespace loom::testing {
namespace {

using std::chrono::milliseconds;

template <typename Kind>
class StoreConformance : public ::testing::Test {
 protected:
  Kind kind;
};

struct KindNames {
  template <typename T>
  static std::string GetName(int) {
    return T::kName;
  }
};

using Kinds = ::testing::Types<HashStoreKind, FileStoreKind, TCPStoreKind, PrefixStoreKind>;
TYPED_TEST_SUITE(StoreConformance, Kinds, KindNames);

Bytes binary() {
  Bytes b;
  for (int i = 0; i < 256; ++i) b.push_back(static_cast<uint8_t>(i));
  b.push_back(0);
  return b;
}

TYPED_TEST(StoreConformance, SetThenGetFromAnotherClient) {
  auto a = this->kind.open();
  auto b = this->kind.open();
  a->set("key0", toBytes("value0"));
  a->set("empty", Bytes{});
  a->set("binary", binary());
  EXPECT_EQ(b->getString("key0"), "value0");
  EXPECT_TRUE(b->get("empty").empty());
  EXPECT_EQ(b->get("binary"), binary());
  b->set("key0", std::string_view("overwritten"));
  EXPECT_EQ(a->getString("key0"), "overwritten");
}

TYPED_TEST(StoreConformance, AddCountsFromZeroAndReturnsTheNewValue) {
  auto a = this->kind.open();
  auto b = this->kind.open();
  EXPECT_EQ(a->add("counter", 3), 3);
  EXPECT_EQ(b->add("counter", -5), -2);
  EXPECT_EQ(a->add("counter", 0), -2);
  EXPECT_EQ(b->getString("counter"), "-2");
  a->set("text", std::string_view("not a number"));
  EXPECT_THROW(a->add("text", 1), InvalidArgumentError);
  // The store is still usable after a refused add.
  EXPECT_EQ(a->add("counter", 2), 0);
}

TYPED_TEST(StoreConformance, CompareSetFollowsTorchSemantics) {
  auto s = this->kind.open();
  // Missing key, non-empty expected: returns expected, stores nothing.
  EXPECT_EQ(toString(s->compareSet("cas", toBytes("old"), toBytes("new"))), "old");
  EXPECT_FALSE(s->check({"cas"}));
  // Missing key, empty expected: creates it.
  EXPECT_EQ(toString(s->compareSet("cas", {}, toBytes("first"))), "first");
  EXPECT_EQ(s->getString("cas"), "first");
  // Mismatch: returns the current value, changes nothing.
  EXPECT_EQ(toString(s->compareSet("cas", toBytes("wrong"), toBytes("second"))), "first");
  EXPECT_EQ(s->getString("cas"), "first");
  // Match: swaps.
  EXPECT_EQ(toString(s->compareSet("cas", toBytes("first"), toBytes("second"))), "second");
  EXPECT_EQ(s->getString("cas"), "second");
}

TYPED_TEST(StoreConformance, DeleteCheckAndNumKeys) {
  auto s = this->kind.open();
  const int64_t before = s->numKeys();
  s->set("d1", std::string_view("1"));
  s->set("d2", std::string_view("2"));
  s->add("d3", 1);
  EXPECT_EQ(s->numKeys(), before + 3);
  EXPECT_TRUE(s->check({"d1", "d2", "d3"}));
  EXPECT_FALSE(s->check({"d1", "nope"}));
  EXPECT_TRUE(s->deleteKey("d2"));
  EXPECT_FALSE(s->deleteKey("d2"));
  EXPECT_FALSE(s->check({"d2"}));
  EXPECT_EQ(s->numKeys(), before + 2);
  s->set("d2", std::string_view("again"));
  EXPECT_EQ(s->numKeys(), before + 3);
  EXPECT_EQ(s->getString("d2"), "again");
}

TYPED_TEST(StoreConformance, MultiSetAndMultiGet) {
  auto s = this->kind.open();
  s->multiSet({"m1", "m2", "m3"}, {toBytes("a"), Bytes{}, binary()});
  auto values = this->kind.open()->multiGet({"m3", "m1", "m2"});
  ASSERT_EQ(values.size(), 3u);
  EXPECT_EQ(values[0], binary());
  EXPECT_EQ(toString(values[1]), "a");
  EXPECT_TRUE(values[2].empty());
  EXPECT_THROW(s->multiSet({"x"}, {}), InvalidArgumentError);
}

TYPED_TEST(StoreConformance, EmptyKeyIsRefused) {
  auto s = this->kind.open();
  EXPECT_THROW(s->set("", toBytes("v")), InvalidArgumentError);
  EXPECT_THROW(s->add("", 1), InvalidArgumentError);
  s->set("fine", std::string_view("still works"));
  EXPECT_EQ(s->getString("fine"), "still works");
}

TYPED_TEST(StoreConformance, GetTimesOutWithinBoundThenStoreStillWorks) {
  auto s = this->kind.open();
  s->setTimeout(milliseconds(200));
  Deadline d(milliseconds(0));
  try {
    s->get("never-set");
    FAIL() << "expected TimeoutError";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("never-set"), std::string::npos) << e.what();
  }
  EXPECT_GE(d.elapsed().count(), 200);
  EXPECT_LT(d.elapsed().count(), 3000);
  s->set("after-timeout", std::string_view("ok"));
  EXPECT_EQ(s->getString("after-timeout"), "ok");
  // A late set of the key that was waited for must not confuse the next call.
  s->set("never-set", std::string_view("late"));
  EXPECT_EQ(s->getString("never-set"), "late");
  EXPECT_EQ(s->add("after-timeout-counter", 7), 7);
}

TYPED_TEST(StoreConformance, WaitTimesOutNamingTheMissingKeys) {
  auto s = this->kind.open();
  s->set("present", std::string_view("1"));
  Deadline d(milliseconds(0));
  try {
    s->wait({"present", "absent"}, milliseconds(150));
    FAIL() << "expected TimeoutError";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("absent"), std::string::npos) << e.what();
  }
  EXPECT_GE(d.elapsed().count(), 150);
  EXPECT_LT(d.elapsed().count(), 3000);
  EXPECT_TRUE(s->check({"present"}));
}

TYPED_TEST(StoreConformance, WaitReturnsWhenAnotherClientSets) {
  auto waiter = this->kind.open();
  auto setter = this->kind.open();
  std::thread t([&] {
    setter->set("late1", std::string_view("x"));
    setter->add("late2", 1);
  });
  waiter->wait({"late1", "late2"}, milliseconds(10000));
  t.join();
  EXPECT_EQ(waiter->getString("late2"), "1");
}

TYPED_TEST(StoreConformance, ManyThreadsWaitOnDifferentKeys) {
  auto s = this->kind.open();
  constexpr int kThreads = 8;
  std::vector<std::string> got(kThreads);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] { got[i] = s->getString("wake" + std::to_string(i)); });
  }
  auto setter = this->kind.open();
  for (int i = kThreads - 1; i >= 0; --i)
    setter->set("wake" + std::to_string(i), "v" + std::to_string(i));
  for (auto& t : threads) t.join();
  for (int i = 0; i < kThreads; ++i) EXPECT_EQ(got[i], "v" + std::to_string(i));
}

TYPED_TEST(StoreConformance, BlockingGetDoesNotHoldUpOtherThreads) {
  auto s = this->kind.open();
  std::thread blocked([&] { EXPECT_EQ(s->getString("released"), "go"); });
  // While one thread waits in get, the same store object serves others.
  for (int i = 0; i < 20; ++i) s->add("busy", 1);
  s->set("released", std::string_view("go"));
  blocked.join();
  EXPECT_EQ(s->getString("busy"), "20");
}

TYPED_TEST(StoreConformance, SixteenThreadsTimesThousandAddsGiveTheExactTotal) {
  constexpr int kThreads = 16;
  constexpr int kAdds = 1000;
  auto shared = this->kind.open();
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      // Half the threads share one client object, half have their own.
      auto own = i % 2 == 0 ? shared : this->kind.open();
      for (int n = 0; n < kAdds; ++n) own->add("total", 1);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(shared->getString("total"), std::to_string(kThreads * kAdds));
}

}  // namespace
}  // namespace loom::testing
