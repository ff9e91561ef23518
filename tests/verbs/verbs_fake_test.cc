// The verbs transport end to end over the in-memory fake fabric (FakeOps), with thread
// ranks and a HashStore: queue-pair setup through the Store, tag matching, unexpected
// messages, fragmentation and credit flow control (tiny rings so that every large message
// cycles the credits many times), zero-copy sends from registered buffers, size mismatch,
// timeouts, abort propagation, a cut link, a peer that left, setup errors, the comm/
// collectives and a ProcessGroup over the verbs Context; plus the no-device errors of the
// real entry points. No RDMA device is involved anywhere in this file.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <thread>
#include <vector>

#include "comm_backend.h"
#include "loom/comm/collectives.h"
#include "loom/comm/context.h"
#include "loom/comm/transport.h"
#include "loom/comm/verbs.h"
#include "loom/common/error.h"
#include "loom/process_group/factory.h"
#include "loom/process_group/work.h"
#include "loom/store/hash_store.h"
#include "loom/testing/errors.h"
#include "loom/testing/ranks.h"
#include "signature.h"
#include "tag.h"
#include "verbs/fake_ops.h"
#include "verbs/ibv_ops.h"
#include "verbs/verbs_context.h"
#include "verbs/verbs_transport.h"

namespace loom::comm::verbs {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

struct FakeWorld {
  HashStore store;
  std::shared_ptr<FakeFabric> fabric = std::make_shared<FakeFabric>();
  VerbsConfig config = [] {
    VerbsConfig c;
    c.slots = 4;
    c.slotBytes = 256;  // 224 payload bytes per fragment
    return c;
  }();

  std::shared_ptr<Context> make(int rank, int size, milliseconds timeout = 10s) {
    ContextOptions o;
    o.timeout = timeout;
    return createContextWithOps(store, rank, size, o, std::make_unique<FakeOps>(fabric, rank),
                                config);
  }
};

std::vector<uint8_t> pattern(size_t n, int seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 31 + seed * 7 + (i >> 8));
  return v;
}

using loom::testing::messageOf;

TEST(VerbsFake, TaggedMessagesMatchByTagInAnyOrder) {
  FakeWorld w;
  loom::testing::runThreadRanks(2, [&](int rank) {
    auto ctx = w.make(rank, 2);
    Transport& t = ctx->transport();
    EXPECT_STREQ(t.name(), "verbs");
    const std::vector<size_t> sizes = {10, 1000, 0, 224, 225};
    if (rank == 0) {
      std::vector<std::vector<uint8_t>> bufs;
      std::vector<RequestPtr> reqs;
      for (size_t i = 0; i < sizes.size(); ++i) bufs.push_back(pattern(sizes[i], int(i)));
      for (size_t i = 0; i < sizes.size(); ++i) {
        reqs.push_back(t.isend(1, bufs[i].data(), sizes[i], 100 + i));
      }
      for (auto& r : reqs) ASSERT_TRUE(r->wait(Deadline(10s)));
    } else {
      std::vector<std::vector<uint8_t>> bufs(sizes.size());
      std::vector<RequestPtr> reqs(sizes.size());
      for (size_t k = sizes.size(); k-- > 0;) {  // reverse order
        bufs[k].assign(sizes[k], 0xee);
        reqs[k] = t.irecv(0, bufs[k].data(), sizes[k], 100 + k);
      }
      for (size_t k = 0; k < sizes.size(); ++k) {
        ASSERT_TRUE(reqs[k]->wait(Deadline(10s)));
        EXPECT_EQ(bufs[k], pattern(sizes[k], int(k))) << "message " << k;
      }
    }
  });
}

TEST(VerbsFake, LargeMessagesBothWaysCycleTheCredits) {
  FakeWorld w;
  const size_t n = 1 << 20;  // ~4700 fragments through a 4-slot ring
  loom::testing::runThreadRanks(2, [&](int rank) {
    auto ctx = w.make(rank, 2);
    Transport& t = ctx->transport();
    auto out = pattern(n, rank);
    std::vector<uint8_t> in(n);
    auto s = t.isend(1 - rank, out.data(), n, 7);
    auto r = t.irecv(1 - rank, in.data(), n, 7);
    ASSERT_TRUE(r->wait(Deadline(20s)));
    ASSERT_TRUE(s->wait(Deadline(20s)));
    EXPECT_EQ(in, pattern(n, 1 - rank));
    EXPECT_EQ(r->bytesOutstanding(), 0u);
  });
  // Data fragments plus credit returns (one per 2 slots freed) both ways, plus goodbyes.
  const uint64_t frags = fragmentCount(n, 256 - sizeof(SlotHeader));
  EXPECT_GE(w.fabric->writes(), 2 * (frags + frags / 2));
  EXPECT_LE(w.fabric->maxOutstandingRecvs(), 4u + VerbsTransport::kCtrlRecvs);
}

TEST(VerbsFake, UnexpectedMessageWaitsUntilReceived) {
  FakeWorld w;
  const size_t n = 100000;
  loom::testing::runThreadRanks(2, [&](int rank) {
    auto ctx = w.make(rank, 2);
    Transport& t = ctx->transport();
    if (rank == 0) {
      auto data = pattern(n, 3);
      // Completes with no receive posted: the receiver drains the ring into an unexpected
      // message and keeps returning credits.
      ASSERT_TRUE(
          t.isend(1, data.data(), n, makeTag(OpType::kAllreduce, 5, 2))->wait(Deadline(10s)));
      w.store.set("sent", toBytes("1"));
      w.store.wait({"received"}, 10s);
    } else {
      w.store.wait({"sent"}, 10s);
      EXPECT_THAT(t.describeUnexpected(0), HasSubstr("(100000 bytes)"));
      std::vector<uint8_t> in(n);
      ASSERT_TRUE(t.irecv(0, in.data(), n, makeTag(OpType::kAllreduce, 5, 2))->wait(Deadline(10s)));
      EXPECT_EQ(in, pattern(n, 3));
      EXPECT_EQ(t.describeUnexpected(0), "");
      w.store.set("received", toBytes("1"));
    }
  });
}

TEST(VerbsFake, RegisteredBuffersAreSentZeroCopy) {
  FakeWorld w;
  const size_t n = 10000;
  loom::testing::runThreadRanks(2, [&](int rank) {
    auto ctx = w.make(rank, 2);
    auto& t = dynamic_cast<VerbsTransport&>(ctx->transport());
    if (rank == 0) {
      auto data = pattern(n, 9);
      const RegisteredBuffer handle = t.registerBuffer(data.data(), n);
      EXPECT_EQ(handle.data, data.data());
      EXPECT_EQ(handle.bytes, n);
      EXPECT_NE(handle.rkey, 0u);  // what a peer would need to RDMA-write into it
      EXPECT_EQ(t.registeredRegions(), 1u);
      const uint64_t before = t.zeroCopySends();
      ASSERT_TRUE(t.isend(1, data.data() + 100, n - 100, 1)->wait(Deadline(10s)));
      EXPECT_EQ(t.zeroCopySends() - before, fragmentCount(n - 100, 256 - sizeof(SlotHeader)));
      t.unregisterBuffer(handle);
      EXPECT_EQ(t.registeredRegions(), 0u);
      // Unregistered: copied through the staging ring again.
      const uint64_t after = t.zeroCopySends();
      ASSERT_TRUE(t.isend(1, data.data(), n, 2)->wait(Deadline(10s)));
      EXPECT_EQ(t.zeroCopySends(), after);
    } else {
      std::vector<uint8_t> a(n - 100), b(n);
      ASSERT_TRUE(t.irecv(0, a.data(), n - 100, 1)->wait(Deadline(10s)));
      ASSERT_TRUE(t.irecv(0, b.data(), n, 2)->wait(Deadline(10s)));
      auto expect = pattern(n, 9);
      EXPECT_TRUE(std::equal(a.begin(), a.end(), expect.begin() + 100));
      EXPECT_EQ(b, expect);
    }
  });
}

TEST(VerbsFake, SizeMismatchFailsWithBothSizes) {
  FakeWorld w;
  loom::testing::runThreadRanks(2, [&](int rank) {
    auto ctx = w.make(rank, 2);
    Transport& t = ctx->transport();
    std::vector<uint8_t> buf(16);
    if (rank == 0) {
      t.isend(1, buf.data(), 8, 5)->wait(Deadline(10s));
      w.store.wait({"checked"}, 10s);
    } else {
      auto r = t.irecv(0, buf.data(), 16, 5);
      // The receive is the caller's mistake (transport.h); the transport fails as a whole.
      const std::string m = messageOf<InvalidArgumentError>([&] { r->wait(Deadline(10s)); });
      EXPECT_THAT(m, HasSubstr("rank 0 sent 8 bytes for "));
      EXPECT_THAT(m, HasSubstr(" but rank 1 receives 16 bytes"));
      EXPECT_TRUE(t.failed());
      EXPECT_THROW(t.irecv(0, buf.data(), 8, 6)->wait(Deadline(10s)), IoError);
      w.store.set("checked", toBytes("1"));
    }
  });
}

TEST(VerbsFake, WaitReturnsFalseAtTheDeadline) {
  FakeWorld w;
  loom::testing::runThreadRanks(2, [&](int rank) {
    auto ctx = w.make(rank, 2);
    if (rank == 1) {
      std::vector<uint8_t> buf(64);
      auto r = ctx->transport().irecv(0, buf.data(), 64, 1);
      EXPECT_FALSE(r->wait(Deadline(50ms)));
      EXPECT_FALSE(r->test());
      EXPECT_EQ(r->bytesOutstanding(), 64u);
      EXPECT_EQ(r->peer(), 0);
      EXPECT_FALSE(r->isSend());
      w.store.set("checked", toBytes("1"));
    } else {
      w.store.wait({"checked"}, 10s);
    }
  });
}

TEST(VerbsFake, AbortFailsLocalRequestsAndReachesThePeer) {
  FakeWorld w;
  loom::testing::runThreadRanks(2, [&](int rank) {
    auto ctx = w.make(rank, 2);
    Transport& t = ctx->transport();
    std::vector<uint8_t> buf(64);
    if (rank == 0) {
      w.store.wait({"posted"}, 10s);
      auto pending = t.irecv(1, buf.data(), 64, 9);
      ctx->abort("the user gave up");
      EXPECT_TRUE(t.failed());
      EXPECT_THAT(messageOf<IoError>([&] { pending->wait(Deadline(1s)); }),
                  HasSubstr("the user gave up"));
      EXPECT_THAT(messageOf<IoError>([&] { t.isend(1, buf.data(), 64, 1)->wait(Deadline(1s)); }),
                  HasSubstr("the user gave up"));
    } else {
      auto r = t.irecv(0, buf.data(), 64, 1);
      w.store.set("posted", toBytes("1"));
      // The abort carries its reason (the abort-text area after the ring).
      const std::string m = messageOf<IoError>([&] { r->wait(Deadline(10s)); });
      EXPECT_THAT(m, HasSubstr("rank 0 aborted: "));
      EXPECT_THAT(m, HasSubstr("the user gave up"));
    }
  });
}

TEST(VerbsFake, CutLinkFailsTheSenderNamingThePeer) {
  FakeWorld w;
  loom::testing::runThreadRanks(2, [&](int rank) {
    auto ctx = w.make(rank, 2);
    Transport& t = ctx->transport();
    w.store.add("up", 1);
    w.store.wait({"up"}, 10s);
    std::vector<uint8_t> buf(1000);
    if (rank == 0) {
      w.fabric->cutLink(0, 1);
      auto s = t.isend(1, buf.data(), 1000, 1);
      const std::string m = messageOf<IoError>([&] { s->wait(Deadline(10s)); });
      EXPECT_THAT(m, HasSubstr("RDMA write to rank 1"));
      EXPECT_THAT(m, HasSubstr("transport retry counter exceeded"));
      w.store.set("failed", toBytes("1"));
    } else {
      w.store.wait({"failed"}, 10s);
      auto r = t.irecv(0, buf.data(), 1000, 1);
      EXPECT_FALSE(r->wait(Deadline(50ms)));  // nothing gets through the cut link
      t.abort("test over");
    }
  });
}

TEST(VerbsFake, PeerThatLeftFailsReceivesFromIt) {
  FakeWorld w;
  loom::testing::runThreadRanks(2, [&](int rank) {
    auto ctx = w.make(rank, 2);
    if (rank == 0) {
      ctx.reset();  // goodbye
      w.store.set("gone", toBytes("1"));
    } else {
      w.store.wait({"gone"}, 10s);
      std::vector<uint8_t> buf(8);
      auto r = ctx->transport().irecv(0, buf.data(), 8, 4);
      EXPECT_THAT(messageOf<IoError>([&] { r->wait(Deadline(10s)); }),
                  HasSubstr("closed its connection"));
    }
  });
}

// Corrupts the header of the 3rd data fragment it posts (what a protocol bug or a stray
// write would look like to the receiver).
class CorruptingOps : public FakeOps {
 public:
  using FakeOps::FakeOps;
  void postWriteImm(int peer, uint64_t wrId, const std::vector<Sge>& sges, uint64_t raddr,
                    uint32_t rkey, uint32_t imm) override {
    if (immKind(imm) == ImmKind::kData && ++dataWrites_ == 3) {
      auto* h = static_cast<SlotHeader*>(const_cast<void*>(sges[0].addr));
      h->magic = 0x12345678;
    }
    FakeOps::postWriteImm(peer, wrId, sges, raddr, rkey, imm);
  }

 private:
  int dataWrites_ = 0;
};

TEST(VerbsFake, CorruptFragmentFailsTheReceiverNamingTheSender) {
  FakeWorld w;
  loom::testing::runThreadRanks(2, [&](int rank) {
    ContextOptions o;
    o.timeout = 10s;
    auto ctx = createContextWithOps(w.store, rank, 2, o,
                                    std::make_unique<CorruptingOps>(w.fabric, rank), w.config);
    Transport& t = ctx->transport();
    std::vector<uint8_t> buf(2000);
    if (rank == 0) {
      auto s = t.isend(1, buf.data(), buf.size(), 3);
      EXPECT_THAT(messageOf<IoError>([&] { s->wait(Deadline(10s)); }), HasSubstr("rank 1 aborted"));
    } else {
      auto r = t.irecv(0, buf.data(), buf.size(), 3);
      const std::string m = messageOf<IoError>([&] { r->wait(Deadline(10s)); });
      EXPECT_THAT(m, HasSubstr("corrupt fragment from rank 0"));
      EXPECT_THAT(m, HasSubstr("bad header (magic 0x12345678"));
    }
  });
}

TEST(VerbsFake, SetupTimeoutNamesTheMissingRanks) {
  FakeWorld w;
  loom::testing::runThreadRanks(2, [&](int rank) {
    EXPECT_THAT(messageOf<TimeoutError>([&] { w.make(rank, 3, 300ms); }),
                HasSubstr("ranks 2 never published their queue-pair info"));
  });
}

TEST(VerbsFake, RingShapeMustMatchOnEveryRank) {
  FakeWorld w;
  loom::testing::runThreadRanks(2, [&](int rank) {
    ContextOptions o;
    o.timeout = 10s;
    VerbsConfig c = w.config;
    if (rank == 1) c.slots = 8;
    EXPECT_THAT(messageOf<InvalidArgumentError>([&] {
                  createContextWithOps(w.store, rank, 2, o,
                                       std::make_unique<FakeOps>(w.fabric, rank), c);
                }),
                HasSubstr("LOOM_IB_SLOTS / LOOM_IB_SLOT_BYTES must be equal on every rank"));
  });
}

TEST(VerbsFake, CollectivesRunOverTheVerbsTransport) {
  for (int size : {2, 3, 4}) {
    FakeWorld w;
    w.config.slotBytes = 4096;
    loom::testing::runThreadRanks(size, [&](int rank) {
      auto ctx = w.make(rank, size);
      uint64_t seq = 0;
      for (size_t n : {size_t{1}, size_t{1000}, size_t{100000}}) {
        for (Algorithm algo : {Algorithm::kRing, Algorithm::kRecursiveDoubling}) {
          std::vector<float> in(n), out(n);
          for (size_t i = 0; i < n; ++i) in[i] = float(rank + 1) + float(i % 7);
          CollectiveOptions o{.timeout = 20s, .seq = ++seq, .algorithm = algo};
          allreduce(*ctx, in.data(), out.data(), n, DType::kFloat32, ReduceOp::kSum, o);
          const float ranksSum = float(size * (size + 1) / 2);
          for (size_t i = 0; i < n; ++i) {
            ASSERT_EQ(out[i], ranksSum + float(size) * float(i % 7))
                << "size " << size << " n " << n << " algo " << algorithmName(algo);
          }
        }
        std::vector<int32_t> b(n, rank == size - 1 ? 42 : 0);
        broadcast(*ctx, b.data(), n, DType::kInt32, size - 1, {.timeout = 20s, .seq = ++seq});
        for (int32_t v : b) ASSERT_EQ(v, 42);
        std::vector<int32_t> mine(n, rank), all(n * size);
        allgather(*ctx, mine.data(), all.data(), n, DType::kInt32, {.timeout = 20s, .seq = ++seq});
        for (int r = 0; r < size; ++r) ASSERT_EQ(all[r * n + n - 1], r);
      }
      barrier(*ctx, {.timeout = 20s, .seq = ++seq});
    });
  }
}

TEST(VerbsFake, ProcessGroupOverTheVerbsContext) {
  auto store = std::make_shared<HashStore>();
  auto fabric = std::make_shared<FakeFabric>();
  VerbsConfig config;
  config.slots = 8;
  config.slotBytes = 1024;
  loom::testing::runThreadRanks(2, [&](int rank) {
    ProcessGroupOptions o;
    o.timeout = 20s;
    auto pg = std::make_shared<ProcessGroupComm>(
        "verbs", store, rank, 2, o, [&](Store& s, int r, int n, const ContextOptions& co) {
          return createContextWithOps(s, r, n, co, std::make_unique<FakeOps>(fabric, r), config);
        });
    EXPECT_EQ(pg->backendName(), "verbs");
    std::vector<double> buf(5000, rank + 1.0);
    pg->allreduce(view(buf.data(), buf.size()))->wait();
    for (double v : buf) ASSERT_EQ(v, 3.0);
    std::vector<int64_t> p2p(300, rank == 0 ? 11 : 0);
    if (rank == 0) {
      pg->send(view(p2p.data(), p2p.size()), 1, 77)->wait();
    } else {
      pg->recv(view(p2p.data(), p2p.size()), 0, 77)->wait();
      for (int64_t v : p2p) ASSERT_EQ(v, 11);
    }
    pg->barrier()->wait();
  });
}

// Records the slot header of every data fragment it posts.
class HeaderSpyOps : public FakeOps {
 public:
  HeaderSpyOps(std::shared_ptr<FakeFabric> fabric, int rank, std::vector<SlotHeader>* headers)
      : FakeOps(std::move(fabric), rank), headers_(headers) {}
  void postWriteImm(int peer, uint64_t wrId, const std::vector<Sge>& sges, uint64_t raddr,
                    uint32_t rkey, uint32_t imm) override {
    if (immKind(imm) == ImmKind::kData) {
      SlotHeader h;
      std::memcpy(&h, sges[0].addr, sizeof(h));
      headers_->push_back(h);
    }
    FakeOps::postWriteImm(peer, wrId, sges, raddr, rkey, imm);
  }

 private:
  std::vector<SlotHeader>* headers_;  // written under the transport's mutex, read after join
};

// Every fragment of a message sent inside a collective carries the collective's signature (the
// receiver checks the first); a send outside any collective carries 0.
TEST(VerbsFake, EveryFragmentCarriesTheSignature) {
  FakeWorld w;
  std::vector<SlotHeader> headers;
  const Signature sig =
      packSignature(OpType::kAllreduce, DType::kFloat32, 250, true, ReduceOp::kMax, false, 0);
  loom::testing::runThreadRanks(2, [&](int rank) {
    ContextOptions o;
    o.timeout = 10s;
    auto ctx =
        createContextWithOps(w.store, rank, 2, o,
                             rank == 0 ? std::make_unique<HeaderSpyOps>(w.fabric, rank, &headers)
                                       : std::make_unique<FakeOps>(w.fabric, rank),
                             w.config);
    Transport& t = ctx->transport();
    std::vector<uint8_t> buf(1000);  // 5 fragments of at most 208 bytes
    SignatureScope scope(sig);
    if (rank == 0) {
      ASSERT_TRUE(t.isend(1, buf.data(), buf.size(), 3)->wait(Deadline(10s)));
      SignatureScope none(Signature{});
      ASSERT_TRUE(t.isend(1, buf.data(), 8, 4)->wait(Deadline(10s)));
    } else {
      ASSERT_TRUE(t.irecv(0, buf.data(), buf.size(), 3)->wait(Deadline(10s)));
      SignatureScope none(Signature{});
      ASSERT_TRUE(t.irecv(0, buf.data(), 8, 4)->wait(Deadline(10s)));
    }
  });
  const size_t frags = fragmentCount(1000, 256 - sizeof(SlotHeader));
  ASSERT_EQ(headers.size(), frags + 1);
  for (size_t i = 0; i < frags; ++i) {
    EXPECT_EQ(headers[i].tag, 3u);
    EXPECT_EQ(headers[i].signature, sig.word) << "fragment " << i;
    EXPECT_EQ(headers[i].signatureExtra, sig.extra) << "fragment " << i;
  }
  EXPECT_EQ(headers.back().tag, 4u);
  EXPECT_EQ(headers.back().signature, 0u);
}

// A message whose signature differs from the posted receive's fails the receiver at its first
// fragment (InvalidArgumentError, both signatures); the sender's transport fails through the
// abort, whose text carries the same two signatures.
TEST(VerbsFake, SignatureMismatchFailsBothSidesWithBothSignatures) {
  FakeWorld w;
  const Signature sum =
      packSignature(OpType::kAllreduce, DType::kInt32, 64, true, ReduceOp::kSum, false, 0);
  const Signature max =
      packSignature(OpType::kAllreduce, DType::kInt32, 64, true, ReduceOp::kMax, false, 0);
  loom::testing::runThreadRanks(2, [&](int rank) {
    auto ctx = w.make(rank, 2);
    Transport& t = ctx->transport();
    std::vector<int32_t> buf(64);
    if (rank == 0) {
      SignatureScope scope(sum);
      auto s = t.isend(1, buf.data(), 256, 5);
      // The send may complete (its fragment was posted) before rank 1 aborts.
      try {
        s->wait(Deadline(10s));
      } catch (const IoError&) {
      }
      const Deadline deadline(10s);
      while (!t.failed() && !deadline.expired()) std::this_thread::sleep_for(1ms);
      ASSERT_TRUE(t.failed()) << "rank 1's abort never arrived";
      const std::string m =
          messageOf<IoError>([&] { t.irecv(1, buf.data(), 4, 6)->wait(Deadline(1s)); });
      EXPECT_THAT(m, HasSubstr("rank 1 aborted: "));
      EXPECT_THAT(m, HasSubstr("allreduce(dtype=int32, count=64, op=sum)"));
      EXPECT_THAT(m, HasSubstr("allreduce(dtype=int32, count=64, op=max)"));
    } else {
      SignatureScope scope(max);
      auto r = t.irecv(0, buf.data(), 256, 5);
      const std::string m = messageOf<InvalidArgumentError>([&] { r->wait(Deadline(10s)); });
      EXPECT_THAT(m, HasSubstr("mismatched collective"));
      EXPECT_THAT(m, HasSubstr("rank 0 called allreduce(dtype=int32, count=64, op=sum)"));
      EXPECT_THAT(m, HasSubstr("rank 1 called allreduce(dtype=int32, count=64, op=max)"));
      EXPECT_TRUE(t.failed());
    }
  });
}

// The same collective with different arguments over the verbs Context (the comm/ algorithms
// open the signature scope): both ranks fail with both signatures, found in the first message,
// as over tcp and shm (tests/comm/transport_errors_test.cc).
TEST(VerbsFake, MismatchedCollectivesPrintBothSignaturesOnBothRanks) {
  struct Case {
    const char* name;
    std::function<void(Context&, int, std::vector<int32_t>&, const CollectiveOptions&)> run;
    std::vector<std::string> expected;
    bool bothFail = true;  // else rank 1's sends may complete before rank 0 fails
  };
  const std::vector<Case> cases = {
      {"reduce op",
       [](Context& ctx, int rank, std::vector<int32_t>& buf, const CollectiveOptions& o) {
         allreduce(ctx, buf.data(), buf.data(), buf.size(), DType::kInt32,
                   rank == 0 ? ReduceOp::kSum : ReduceOp::kMax, o);
       },
       {"allreduce(dtype=int32, count=1000, op=sum)",
        "allreduce(dtype=int32, count=1000, op=max)"}},
      {"dtype",
       [](Context& ctx, int rank, std::vector<int32_t>& buf, const CollectiveOptions& o) {
         allreduce(ctx, buf.data(), buf.data(), buf.size(),
                   rank == 0 ? DType::kInt32 : DType::kFloat32, ReduceOp::kSum, o);
       },
       {"allreduce(dtype=int32, count=1000, op=sum)",
        "allreduce(dtype=float, count=1000, op=sum)"}},
      {"collective",
       [](Context& ctx, int rank, std::vector<int32_t>& buf, const CollectiveOptions& o) {
         if (rank == 0) {
           allreduce(ctx, buf.data(), buf.data(), buf.size(), DType::kInt32, ReduceOp::kSum, o);
         } else {
           broadcast(ctx, buf.data(), buf.size(), DType::kInt32, 1, o);
         }
       },
       {"allreduce(dtype=int32, count=1000, op=sum)", "broadcast(dtype=int32, count=1000, root=1)"},
       false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    FakeWorld w;
    w.config.slotBytes = 4096;
    loom::testing::runThreadRanks(2, [&](int rank) {
      auto ctx = w.make(rank, 2, 20s);
      std::vector<int32_t> buf(1000, 1);
      const CollectiveOptions o{.timeout = 20s, .seq = 7};
      try {
        c.run(*ctx, rank, buf, o);
        if (rank == 0 || c.bothFail) ADD_FAILURE() << "rank " << rank << ": no error";
      } catch (const TimeoutError& e) {
        ADD_FAILURE() << "rank " << rank << ": the mismatch was not found: " << e.what();
      } catch (const Error& e) {
        for (const std::string& part : c.expected) EXPECT_THAT(e.what(), HasSubstr(part));
      }
    });
  }
}

TEST(VerbsNoDevice, EntryPointsSayNoDeviceWasFound) {
  if (!listDevices().empty()) GTEST_SKIP() << "an RDMA device is present";
  std::string why;
  EXPECT_FALSE(verbsAvailable(&why));
  EXPECT_EQ(why.substr(why.find("no RDMA")),
            "no RDMA device found (ibv_get_device_list returned 0 devices)");
  EXPECT_FALSE(isAvailable("verbs"));
  HashStore store;
  EXPECT_THAT(messageOf<NotAvailableError>([&] { createVerbsContext(store, 0, 1); }),
              HasSubstr("no RDMA device found (ibv_get_device_list returned 0 devices)"));
  auto shared = std::make_shared<HashStore>();
  EXPECT_THAT(messageOf<NotAvailableError>([&] { createProcessGroup("verbs", shared, 0, 1); }),
              HasSubstr("createProcessGroup(\"verbs\"): "));
  // A named device that does not exist, with no device at all: still "no device".
  ContextOptions named;
  named.verbs.device = "mlx5_9";
  EXPECT_THAT(messageOf<NotAvailableError>([&] { createVerbsContext(store, 0, 1, named); }),
              HasSubstr("no RDMA device found"));
  EXPECT_FALSE(verbsAvailable(&why, named.verbs));
  EXPECT_THAT(why, HasSubstr("no RDMA device found"));
  // A bad option is named, by both entry points.
  ContextOptions bad;
  bad.verbs.port = 0;
  EXPECT_THAT(messageOf<InvalidArgumentError>([&] { createVerbsContext(store, 0, 1, bad); }),
              HasSubstr("ContextOptions::verbs.port is 0"));
  EXPECT_FALSE(verbsAvailable(&why, bad.verbs));
  EXPECT_THAT(why, HasSubstr("verbs.port"));
}

}  // namespace
}  // namespace loom::comm::verbs
