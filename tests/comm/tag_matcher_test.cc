// TagMatcher and RequestCore on their own, without a wire: the matching rule of transport.h
// (oldest posted receive with the tag; a receive takes the oldest unexpected message with its
// tag), size and collective mismatches, a receive taking over a message still arriving, held
// messages, failAll, describeUnexpected, and RequestCore's first-wins state machine.
#include "tag_matcher.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "loom/common/deadline.h"
#include "loom/common/error.h"
#include "tag.h"

namespace loom::comm {
namespace {

using ::testing::HasSubstr;

// A receive as a transport would make one; waiting is not under test here.
class TestRequest final : public RequestCore {
 public:
  using RequestCore::RequestCore;
  bool wait(const Deadline& /*deadline*/) override { return test(); }
};

std::shared_ptr<TestRequest> receive(std::vector<uint8_t>& buf, uint64_t tag) {
  return std::make_shared<TestRequest>(/*peer=*/1, /*send=*/false, buf.data(), buf.size(), tag);
}

// Delivers a whole message from the wire: header, payload into the target (buffering it when
// no receive is posted), end.
void deliver(TagMatcher& m, uint64_t tag, const std::vector<uint8_t>& payload) {
  std::string error;
  if (!m.arrive(tag, payload.size(), 0, error)) {
    ASSERT_EQ(error, "");
    m.bufferIncoming();
  }
  std::memcpy(m.incoming().target, payload.data(), payload.size());
  m.arrived(payload.size());
  m.finishIncoming();
}

const uint64_t kTagA = makeTag(OpType::kAllreduce, 7, 1);
const uint64_t kTagB = makeTag(OpType::kAllreduce, 7, 2);

TEST(TagMatcher, AMessageLandsInTheOldestPostedReceiveWithItsTag) {
  TagMatcher m(/*rank=*/0, /*peer=*/1);
  std::vector<uint8_t> b1(4), a1(4), a2(4);
  auto rb = receive(b1, kTagB), ra1 = receive(a1, kTagA), ra2 = receive(a2, kTagA);
  std::string error;
  for (const auto& r : {rb, ra1, ra2}) {
    ASSERT_EQ(m.receive(r, error), TagMatcher::Match::kNone);
    m.post(r);
  }
  deliver(m, kTagA, {1, 2, 3, 4});
  EXPECT_TRUE(ra1->test());
  EXPECT_FALSE(ra2->test());
  EXPECT_FALSE(rb->test());
  EXPECT_EQ(a1, (std::vector<uint8_t>{1, 2, 3, 4}));
  deliver(m, kTagA, {5, 6, 7, 8});
  EXPECT_TRUE(ra2->test());
  EXPECT_EQ(a2, (std::vector<uint8_t>{5, 6, 7, 8}));
  EXPECT_TRUE(m.waiting());
  EXPECT_EQ(m.waitingTag(), kTagB);
}

TEST(TagMatcher, AReceiveTakesTheOldestUnexpectedMessageWithItsTag) {
  TagMatcher m(0, 1);
  deliver(m, kTagA, {1, 1});
  deliver(m, kTagB, {2, 2});
  deliver(m, kTagA, {3, 3});
  EXPECT_THAT(m.describeUnexpected(), HasSubstr("allreduce#7 step 1 (2 bytes)"));
  std::vector<uint8_t> x(2), y(2), z(2);
  std::string error;
  EXPECT_EQ(m.receive(receive(x, kTagA), error), TagMatcher::Match::kDone);
  EXPECT_EQ(m.receive(receive(y, kTagA), error), TagMatcher::Match::kDone);
  EXPECT_EQ(m.receive(receive(z, kTagB), error), TagMatcher::Match::kDone);
  EXPECT_EQ(x, (std::vector<uint8_t>{1, 1}));
  EXPECT_EQ(y, (std::vector<uint8_t>{3, 3}));
  EXPECT_EQ(z, (std::vector<uint8_t>{2, 2}));
  EXPECT_EQ(m.describeUnexpected(), "");
}

TEST(TagMatcher, SizeMismatchFailsTheReceiveAsTheCallersMistake) {
  TagMatcher m(0, 1);
  deliver(m, kTagA, {1, 2, 3});
  std::vector<uint8_t> buf(4);
  auto r = receive(buf, kTagA);
  std::string error;
  EXPECT_EQ(m.receive(r, error), TagMatcher::Match::kError);
  EXPECT_THAT(error, HasSubstr("3 bytes"));
  EXPECT_THAT(error, HasSubstr("4 bytes"));
  r->fail(error, RequestCore::Failure::kInvalidArgument);
  EXPECT_THROW(r->test(), InvalidArgumentError);
}

TEST(TagMatcher, SameSequenceAnotherCollectiveIsAMismatchNamingBoth) {
  TagMatcher m(0, 1);
  std::vector<uint8_t> buf(4);
  auto r = receive(buf, makeTag(OpType::kAllreduce, 9, 0));
  std::string error;
  ASSERT_EQ(m.receive(r, error), TagMatcher::Match::kNone);
  m.post(r);
  EXPECT_FALSE(m.arrive(makeTag(OpType::kBroadcast, 9, 0), 4, 0, error));
  EXPECT_THAT(error, HasSubstr("broadcast#9"));
  EXPECT_THAT(error, HasSubstr("allreduce#9"));
}

TEST(TagMatcher, PointToPointTagsAreNeverACollectiveMismatch) {
  TagMatcher m(0, 1);
  std::vector<uint8_t> buf(4);
  auto r = receive(buf, makeTag(OpType::kAllreduce, 5, 0));
  std::string error;
  ASSERT_EQ(m.receive(r, error), TagMatcher::Match::kNone);
  m.post(r);
  // A send/recv whose user tag happens to look like seq 5.
  EXPECT_FALSE(m.arrive(makeP2PTag(uint64_t{5} << 16), 4, 0, error));
  EXPECT_EQ(error, "");
}

TEST(TagMatcher, AReceivePostedWhileItsMessageArrivesTakesItOver) {
  TagMatcher m(0, 1);
  std::string error;
  ASSERT_FALSE(m.arrive(kTagA, 6, 0, error));
  m.bufferIncoming();
  std::memcpy(m.incoming().target, "abc", 3);
  m.arrived(3);
  std::vector<uint8_t> buf(6);
  auto r = receive(buf, kTagA);
  ASSERT_EQ(m.receive(r, error), TagMatcher::Match::kArriving);
  EXPECT_EQ(r->bytesOutstanding(), 3u);
  // The rest lands in the receive's buffer directly.
  std::memcpy(m.incoming().target + m.incoming().got, "def", 3);
  m.arrived(3);
  EXPECT_TRUE(m.finishIncoming());
  EXPECT_TRUE(r->test());
  EXPECT_EQ(std::string(buf.begin(), buf.end()), "abcdef");
}

TEST(TagMatcher, FailAllFailsEveryWaitingReceiveAndKeepsCompleteUnexpectedMessages) {
  TagMatcher m(0, 1);
  deliver(m, kTagB, {9});
  std::vector<uint8_t> a(4), c(4);
  auto ra = receive(a, kTagA), rc = receive(c, makeTag(OpType::kBarrier, 8, 0));
  std::string error;
  for (const auto& r : {ra, rc}) {
    ASSERT_EQ(m.receive(r, error), TagMatcher::Match::kNone);
    m.post(r);
  }
  m.failAll("rank 1 closed its connection", /*nameTag=*/true);
  EXPECT_THROW(ra->test(), IoError);
  try {
    rc->test();
    FAIL() << "no error";
  } catch (const IoError& e) {
    EXPECT_THAT(e.what(), HasSubstr("rank 1 closed its connection"));
    EXPECT_THAT(e.what(), HasSubstr("barrier#8"));
  }
  EXPECT_FALSE(m.waiting());
  EXPECT_THAT(m.describeUnexpected(), HasSubstr("allreduce#7 step 2 (1 bytes)"));
}

TEST(TagMatcher, DescribeUnexpectedShowsTheOldestFewThenEllipsis) {
  TagMatcher m(0, 1);
  for (uint32_t step = 0; step < TagMatcher::kShown + 2; ++step) {
    deliver(m, makeTag(OpType::kAllgather, 3, step), {0});
  }
  const std::string d = m.describeUnexpected();
  EXPECT_THAT(d, HasSubstr("allgather#3 step 0"));
  EXPECT_THAT(d, ::testing::Not(HasSubstr("step 5")));
  EXPECT_THAT(d, HasSubstr("..."));
}

TEST(RequestCore, TheFirstCompletionOrFailureWinsAndLaterOnesAreIgnored) {
  std::vector<uint8_t> buf(8);
  auto done = receive(buf, kTagA);
  EXPECT_FALSE(done->test());
  EXPECT_EQ(done->bytesOutstanding(), 8u);
  EXPECT_TRUE(done->complete());
  EXPECT_FALSE(done->fail("too late"));
  EXPECT_TRUE(done->test());
  EXPECT_EQ(done->bytesOutstanding(), 0u);

  auto failed = receive(buf, kTagA);
  EXPECT_TRUE(failed->fail("peer died"));
  EXPECT_FALSE(failed->complete());
  EXPECT_FALSE(failed->fail("another reason"));
  try {
    failed->test();
    FAIL() << "no error";
  } catch (const IoError& e) {
    EXPECT_THAT(e.what(), HasSubstr("peer died"));
  }
}

}  // namespace
}  // namespace loom::comm
