// TagMatcher and RequestCore on their own, without a wire: the matching rule of transport.h
// (oldest posted receive with the tag; a receive takes the oldest unexpected message with its
// tag), size and collective mismatches, a receive taking over a message still arriving, held
// messages, failAll, describeUnexpected, and RequestCore's first-wins state machine.
#include "tag_matcher.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "loom/common/deadline.h"
#include "loom/common/error.h"
#include "loom/testing/ranks.h"
#include "signature.h"
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
  if (!m.arrive(tag, payload.size(), Signature{}, error)) {
    ASSERT_EQ(error, "");
    ASSERT_TRUE(m.bufferIncoming(error)) << error;
  }
  std::memcpy(m.incoming().target, payload.data(), payload.size());
  m.arrived(payload.size());
  m.finishIncoming();
}

const uint64_t kTagA = makeTag(OpType::kAllreduce, 7, 1);
const uint64_t kTagB = makeTag(OpType::kAllreduce, 7, 2);

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitizerReservesAddressSpace = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kSanitizerReservesAddressSpace = true;
#else
constexpr bool kSanitizerReservesAddressSpace = false;
#endif
#else
constexpr bool kSanitizerReservesAddressSpace = false;
#endif

// This process's virtual size (/proc/self/statm, first field, in pages).
size_t addressSpaceInUse() {
  std::ifstream statm("/proc/self/statm");
  size_t pages = 0;
  statm >> pages;
  LOOM_CHECK(pages > 0, "cannot read /proc/self/statm");
  return pages * static_cast<size_t>(::sysconf(_SC_PAGESIZE));
}

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
  EXPECT_FALSE(m.arrive(makeTag(OpType::kBroadcast, 9, 0), 4, Signature{}, error));
  EXPECT_THAT(error, HasSubstr("broadcast#9"));
  EXPECT_THAT(error, HasSubstr("allreduce#9"));
}

// A peer's messages reach the matcher in the order it sent them and a rank runs one collective
// at a time, so a message of another sequence number while a receive of this collective has
// not been answered means the peer left or skipped it: a mismatch at once, both ways (the
// message after the posted receive; the message queued before the receive is posted), naming
// both collectives and both signatures. A peer that is merely ahead (its message of the next
// collective arrives after everything this rank waits for from it) is no mismatch, nor is a
// point-to-point message or a collective without a sequence number.
TEST(TagMatcher, AnotherSequenceNumberWhileAReceiveWaitsIsASkippedCollective) {
  const Signature gather =
      packSignature(OpType::kAllgather, DType::kFloat32, 64, false, ReduceOp::kSum, false, 0);
  const Signature scatter =
      packSignature(OpType::kReduceScatter, DType::kFloat32, 64, true, ReduceOp::kSum, false, 0);
  std::vector<uint8_t> buf(4);
  {
    SCOPED_TRACE("the message after the posted receive");
    TagMatcher m(0, 2);
    std::shared_ptr<TestRequest> r;
    {
      SignatureScope scope(gather);  // the request takes its creating thread's signature
      r = std::make_shared<TestRequest>(2, false, buf.data(), buf.size(),
                                        makeTag(OpType::kAllgather, 2, 0));
    }
    std::string error;
    ASSERT_EQ(m.receive(r, error), TagMatcher::Match::kNone);
    m.post(r);
    EXPECT_FALSE(m.arrive(makeTag(OpType::kReduceScatter, 3, 0), 4, scatter, error));
    EXPECT_THAT(error, HasSubstr("rank 2 sent reduce_scatter#3 step 0 (reduce_scatter(dtype="
                                 "float, count=64, op=sum)) while rank 0 waits for its message "
                                 "of allgather#2 (allgather(dtype=float, count=64))"));
    EXPECT_THAT(error, HasSubstr("skipped a collective"));
    EXPECT_THROW(r->test(), InvalidArgumentError);
    EXPECT_FALSE(m.waiting());
  }
  {
    SCOPED_TRACE("the message queued before the receive is posted");
    TagMatcher m(2, 0);
    deliver(m, makeTag(OpType::kAllgather, 2, 0), {1, 2, 3, 4});
    auto r = receive(buf, makeTag(OpType::kReduceScatter, 3, 0));
    std::string error;
    EXPECT_EQ(m.receive(r, error), TagMatcher::Match::kError);
    EXPECT_THAT(error, HasSubstr("rank 0 sent allgather#2 step 0 while rank 2 waits for its "
                                 "message of reduce_scatter#3"));
    EXPECT_THROW(r->test(), InvalidArgumentError);
  }
  {
    SCOPED_TRACE("a peer ahead");
    TagMatcher m(0, 1);
    auto r = receive(buf, makeTag(OpType::kAllreduce, 4, 1));
    std::string error;
    ASSERT_EQ(m.receive(r, error), TagMatcher::Match::kNone);
    m.post(r);
    deliver(m, makeTag(OpType::kAllreduce, 4, 1), {1, 1, 1, 1});
    EXPECT_TRUE(r->test());
    // Its next collectives' messages wait for their receives.
    deliver(m, makeTag(OpType::kBroadcast, 5, 0), {5, 5, 5, 5});
    deliver(m, makeTag(OpType::kAllreduce, 6, 0), {6, 6, 6, 6});
    auto r5 = receive(buf, makeTag(OpType::kBroadcast, 5, 0));
    EXPECT_EQ(m.receive(r5, error), TagMatcher::Match::kDone) << error;
    EXPECT_EQ(buf, (std::vector<uint8_t>{5, 5, 5, 5}));
  }
  {
    SCOPED_TRACE("point-to-point and sequence 0");
    TagMatcher m(0, 1);
    deliver(m, makeP2PTag(3), {0, 0, 0, 0});
    deliver(m, makeTag(OpType::kAllreduce, 0, 0), {0, 0, 0, 0});
    auto r = receive(buf, makeTag(OpType::kAllreduce, 8, 0));
    std::string error;
    ASSERT_EQ(m.receive(r, error), TagMatcher::Match::kNone) << error;
    m.post(r);
    auto u = receive(buf, makeTag(OpType::kBroadcast, 0, 0));
    ASSERT_EQ(m.receive(u, error), TagMatcher::Match::kNone) << error;
    EXPECT_FALSE(m.arrive(makeP2PTag(9), 4, Signature{}, error));
    EXPECT_EQ(error, "");
  }
}

// The exact flag (the reproducible mode's n-ary shared-memory reductions) is its own bit: the
// same call with and without it differs, keeps its op, and says so in the text; every op of
// ReduceOp fits beside it.
TEST(Signature, ExactReductionIsAnotherSignature) {
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kBxor}) {
    const Signature plain = packSignature(OpType::kReduce, DType::kFloat32, 9, true, op, true, 2);
    const Signature exact =
        packSignature(OpType::kReduce, DType::kFloat32, 9, true, op, true, 2, true);
    EXPECT_NE(plain, exact);
    const std::string name = reduceOpName(op);
    EXPECT_EQ(describeSignature(plain), "reduce(dtype=float, count=9, op=" + name + ", root=2)");
    EXPECT_EQ(describeSignature(exact),
              "reduce(dtype=float, count=9, op=" + name + ", exact, root=2)");
  }
}

// Issue 38: counts compare in 64 bits. Two counts with the same low 32 bits (5 and 2^32 + 5)
// are another signature, and the error prints both counts whole.
TEST(TagMatcher, CountsThatDifferAbove32BitsAreAMismatch) {
  const uint64_t big = (uint64_t{1} << 32) + 5;
  const Signature five =
      packSignature(OpType::kAllreduce, DType::kUInt8, 5, true, ReduceOp::kSum, false, 0);
  const Signature large =
      packSignature(OpType::kAllreduce, DType::kUInt8, big, true, ReduceOp::kSum, false, 0);
  EXPECT_NE(five, large);
  EXPECT_EQ(five.word, large.word);  // what a 32-bit count field compared
  EXPECT_EQ(describeSignature(large), "allreduce(dtype=uint8, count=4294967301, op=sum)");
  TagMatcher m(0, 1);
  std::vector<uint8_t> buf(4);
  std::shared_ptr<TestRequest> r;
  {
    const SignatureScope scope(five);
    r = receive(buf, kTagA);
  }
  std::string error;
  ASSERT_EQ(m.receive(r, error), TagMatcher::Match::kNone);
  m.post(r);
  EXPECT_FALSE(m.arrive(kTagA, 4, large, error));
  EXPECT_THAT(error, HasSubstr("rank 1 called allreduce(dtype=uint8, count=4294967301, op=sum)"));
  EXPECT_THAT(error, HasSubstr("rank 0 called allreduce(dtype=uint8, count=5, op=sum)"));
  EXPECT_THROW(r->test(), InvalidArgumentError);
}

// Issue 38: a rank that passed count 0 exchanges one empty message per peer at step 0 while
// the other runs its algorithm's steps: two messages of one collective (same sequence number)
// with other steps and other signatures are a mismatch too, found by whichever side sees the
// other's first, as a message arriving for a posted receive or a receive finding the message.
TEST(TagMatcher, AnotherSignatureAtAnotherStepOfTheSameCollectiveIsAMismatch) {
  const Signature zero =
      packSignature(OpType::kAllreduce, DType::kFloat32, 0, true, ReduceOp::kSum, false, 0);
  const Signature n =
      packSignature(OpType::kAllreduce, DType::kFloat32, 1000, true, ReduceOp::kSum, false, 0);
  std::vector<uint8_t> buf(4);
  std::string error;
  {
    TagMatcher m(0, 1);
    std::shared_ptr<TestRequest> r;
    {
      const SignatureScope scope(zero);
      r = receive(buf, makeTag(OpType::kAllreduce, 7, 0));
    }
    ASSERT_EQ(m.receive(r, error), TagMatcher::Match::kNone);
    m.post(r);
    EXPECT_FALSE(m.arrive(makeTag(OpType::kAllreduce, 7, 3), 4, n, error));
    EXPECT_THAT(error, HasSubstr("count=1000"));
    EXPECT_THAT(error, HasSubstr("count=0"));
    EXPECT_THROW(r->test(), InvalidArgumentError);
  }
  {
    TagMatcher m(0, 1);
    error.clear();
    ASSERT_FALSE(m.arrive(makeTag(OpType::kAllreduce, 7, 0), 0, zero, error));
    ASSERT_EQ(error, "");
    ASSERT_TRUE(m.bufferIncoming(error)) << error;
    m.finishIncoming();
    std::shared_ptr<TestRequest> r;
    {
      const SignatureScope scope(n);
      r = receive(buf, makeTag(OpType::kAllreduce, 7, 3));
    }
    EXPECT_EQ(m.receive(r, error), TagMatcher::Match::kError);
    EXPECT_THAT(error, HasSubstr("rank 1 called allreduce(dtype=float, count=0, op=sum)"));
    EXPECT_THAT(error, HasSubstr("rank 0 called allreduce(dtype=float, count=1000, op=sum)"));
  }
  {
    // The same signature at another step is the next message of an agreeing collective.
    TagMatcher m(0, 1);
    error.clear();
    std::shared_ptr<TestRequest> r;
    {
      const SignatureScope scope(n);
      r = receive(buf, makeTag(OpType::kAllreduce, 7, 0));
    }
    ASSERT_EQ(m.receive(r, error), TagMatcher::Match::kNone);
    m.post(r);
    EXPECT_FALSE(m.arrive(makeTag(OpType::kAllreduce, 7, 3), 4, n, error));
    EXPECT_EQ(error, "");
  }
}

// Issue 38: the uneven collectives' signature names the message's block and the digest of the
// counts; the digest tells count vectors apart (order included).
TEST(TagMatcher, UnevenSignaturesCarryTheBlockAndTheCountsDigest) {
  const std::vector<size_t> a{3, 0, 2}, b{3, 2, 0}, c{3, 0, 2, 0};
  EXPECT_NE(countsDigest(a), countsDigest(b));
  EXPECT_NE(countsDigest(a), countsDigest(c));
  EXPECT_EQ(countsDigest(a), countsDigest(std::vector<size_t>{3, 0, 2}));
  const Signature s = withBlock(packUnevenSignature(OpType::kAllgatherv, DType::kFloat32, false,
                                                    ReduceOp::kSum, false, 0, countsDigest(a)),
                                2);
  const std::string text = describeSignature(s);
  EXPECT_THAT(text, HasSubstr("allgatherv(dtype=float, block of 2 elements, counts digest 0x"));
  EXPECT_NE(s, withBlock(s, 3));
}

TEST(TagMatcher, PointToPointTagsAreNeverACollectiveMismatch) {
  TagMatcher m(0, 1);
  std::vector<uint8_t> buf(4);
  auto r = receive(buf, makeTag(OpType::kAllreduce, 5, 0));
  std::string error;
  ASSERT_EQ(m.receive(r, error), TagMatcher::Match::kNone);
  m.post(r);
  // A send/recv whose user tag happens to look like seq 5.
  EXPECT_FALSE(m.arrive(makeP2PTag(uint64_t{5} << 16), 4, Signature{}, error));
  EXPECT_EQ(error, "");
}

TEST(TagMatcher, AReceivePostedWhileItsMessageArrivesTakesItOver) {
  TagMatcher m(0, 1);
  std::string error;
  ASSERT_FALSE(m.arrive(kTagA, 6, Signature{}, error));
  ASSERT_TRUE(m.bufferIncoming(error)) << error;
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
  auto ra = receive(a, kTagA), rc = receive(c, makeTag(OpType::kAllreduce, 7, 3));
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
    EXPECT_THAT(e.what(), HasSubstr("allreduce#7 step 3"));
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

// The size to buffer is the sender's word. One larger than this machine's memory (a corrupt
// header, or a message nobody can hold) is refused with the peer, the message and both sizes,
// and nothing is allocated or counted; the transport then fails with that text.
TEST(TagMatcher, AMessageLargerThanMemoryIsRefusedNotAllocated) {
  TagMatcher m(0, 3);
  std::string error;
  const size_t huge = std::numeric_limits<size_t>::max() / 2;
  ASSERT_GT(huge, TagMatcher::maxBufferBytes());
  ASSERT_FALSE(m.arrive(kTagA, huge, Signature{}, error));
  ASSERT_EQ(error, "");
  EXPECT_FALSE(m.bufferIncoming(error));
  EXPECT_THAT(error, HasSubstr("rank 3 sent allreduce#7 step 1"));
  EXPECT_THAT(error, HasSubstr(std::to_string(huge) + " bytes"));
  EXPECT_THAT(error, HasSubstr("larger than this machine's memory"));
  EXPECT_THAT(error, HasSubstr(std::to_string(TagMatcher::maxBufferBytes())));
  EXPECT_EQ(m.bufferedBytes(), 0u);
  EXPECT_EQ(m.incoming().target, nullptr);
  EXPECT_FALSE(m.hasUnexpected(kTagA + 1));
  // The transport fails every waiter and forgets the message; the matcher stays usable for
  // describeUnexpected().
  m.failAll(error);
  EXPECT_EQ(m.describeUnexpected(), "");
  // A size the machine can hold is buffered.
  error.clear();
  ASSERT_FALSE(m.arrive(kTagB, 16, Signature{}, error));
  EXPECT_TRUE(m.bufferIncoming(error)) << error;
  EXPECT_EQ(m.bufferedBytes(), 16u);
}

// The other refusal: a size under the machine's memory that the allocator cannot give (the
// process's address space is limited here, in a child). bufferIncoming() returns false with the
// peer, the message, its size and "out of memory" instead of throwing std::bad_alloc on the
// progress thread; nothing is counted, and a message that fits is buffered after it. Not under
// AddressSanitizer or ThreadSanitizer, which reserve more address space than any limit allows.
TEST(TagMatcher, AMessageTheAllocatorCannotGiveIsRefusedAsOutOfMemory) {
  if (kSanitizerReservesAddressSpace) GTEST_SKIP() << "an address-space limit breaks the sanitizer";
  loom::testing::ChildProcesses child;
  child.spawn([] {
    const size_t size = size_t{1} << 30;  // 1 GiB: under physical memory, over the limit below
    LOOM_CHECK(size < TagMatcher::maxBufferBytes(), "this machine has under 1 GiB of memory");
    rlimit limit{};
    LOOM_CHECK(::getrlimit(RLIMIT_AS, &limit) == 0, "getrlimit");
    limit.rlim_cur = addressSpaceInUse() + (size_t{256} << 20);
    LOOM_CHECK(::setrlimit(RLIMIT_AS, &limit) == 0, "setrlimit: ", std::strerror(errno));
    TagMatcher m(1, 2);
    std::string error;
    LOOM_CHECK(!m.arrive(kTagA, size, Signature{}, error) && error.empty(), error);
    LOOM_CHECK(!m.bufferIncoming(error), "a 1 GiB buffer was allocated under the limit");
    for (const std::string& part :
         {std::string("rank 2 sent allreduce#7 step 1"), std::to_string(size) + " bytes",
          std::string("out of memory")}) {
      LOOM_CHECK(error.find(part) != std::string::npos, "no '", part, "' in: ", error);
    }
    LOOM_CHECK(m.bufferedBytes() == 0, "counted ", m.bufferedBytes(), " bytes");
    m.failAll(error);
    error.clear();
    LOOM_CHECK(!m.arrive(kTagB, 16, Signature{}, error), error);
    LOOM_CHECK(m.bufferIncoming(error), error);
  });
  EXPECT_EQ(child.waitAllOk(std::chrono::seconds(60)), "");
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
