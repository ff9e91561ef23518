// libFuzzer target: the tcp transport's frame headers and the collective signature they carry
// (comm/src/tcp/peer.h: Header; comm/src/tag_matcher.cc, signature.cc, tag.cc), read as the
// transport's reader reads a peer's stream (tcp_transport.cc: progressRecvLocked,
// onHeaderLocked): each header is copied from the stream into a Header (so a change of the
// header's layout changes nothing here), checked for the magic and the kind, and a data message
// goes to the connection's TagMatcher (arrive, then its payload, buffered when no receive waits,
// left on the wire -- "held" -- when large and nothing waits), interleaved with receives posted
// with their own tag, size and signature.
//
// Input (FuzzedDataProvider): a sequence of steps; a step reads the next header (often with the
// magic and the data kind forced, and a tag, size and signature from small sets so that messages
// and receives meet), or the next piece of the payload being read, or posts a receive.
//
// Properties:
// - the reader never writes past a receive's or an unexpected buffer's end (ASan), whatever the
//   header says;
// - a mismatch (size, signature, another collective at the same sequence number) is reported as
//   an error text that fails the transport, and the receive it concerns fails with
//   InvalidArgumentError; nothing else is thrown;
// - every receive that completes holds exactly the payload of the message it matched: per tag,
//   the i-th receive posted gets the i-th message that arrived (transport.h's matching rule),
//   whether it was posted before the message, while it arrived, or after;
// - describing tags, signatures and what is unexpected never throws.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "fuzz_support.h"
#include "loom/common/error.h"
#include "signature.h"
#include "tag.h"
#include "tag_matcher.h"
#include "tcp/peer.h"

namespace {

using namespace loom::comm;
using loom::DType;
using loom::OpType;
using loom::ReduceOp;

// The transport holds an unexpected message larger than kEagerBytes (64 KiB) on the wire; the
// inputs are smaller, so the harness holds from this size to reach that path.
constexpr size_t kHoldBytes = 256;

class FuzzReceive final : public RequestCore {
 public:
  FuzzReceive(void* data, size_t bytes, uint64_t tag) : RequestCore(1, false, data, bytes, tag) {}
  bool wait(const loom::Deadline&) override { return check(); }
};

struct Receive {
  std::vector<uint8_t> buffer;
  std::shared_ptr<FuzzReceive> request;
};

struct Message {
  std::vector<uint8_t> payload;  // as read so far
  size_t bytes = 0;
};

class Reader {
 public:
  explicit Reader(FuzzedDataProvider& in) : in_(in) {}

  void run() {
    while (in_.remaining_bytes() > 0 && !failed_) {
      switch (in_.ConsumeIntegralInRange<int>(0, 3)) {
        case 0:
        case 1:
          if (held_) break;  // nothing is read until a receive for the held message is posted
          if (remaining_ > 0) {
            readPayload();
          } else {
            readHeader();
          }
          break;
        case 2:
          postReceive();
          break;
        case 3:
          describe();
          break;
      }
    }
    checkReceived();
  }

 private:
  uint64_t pickTag() {
    if (in_.ConsumeBool()) return in_.ConsumeIntegral<uint64_t>();
    const int kind = in_.ConsumeIntegralInRange<int>(0, 3);
    const uint64_t seq = in_.ConsumeIntegralInRange<uint64_t>(0, 3);
    const uint32_t step = in_.ConsumeIntegralInRange<uint32_t>(0, 2);
    if (kind == 3) return makeP2PTag(seq);
    const OpType ops[] = {OpType::kAllreduce, OpType::kBroadcast, OpType::kAllgather};
    return makeTag(ops[kind], seq, step);
  }

  Signature pickSignature() {
    if (in_.ConsumeBool()) return {};
    if (in_.ConsumeBool()) {
      const uint64_t word = in_.ConsumeIntegral<uint64_t>();
      return {word, in_.ConsumeIntegral<uint64_t>()};
    }
    const auto type = static_cast<OpType>(in_.ConsumeIntegralInRange<int>(1, 17));
    const auto dtype = static_cast<DType>(in_.ConsumeIntegralInRange<int>(0, 8));
    const auto op = static_cast<ReduceOp>(in_.ConsumeIntegralInRange<int>(0, 7));
    // Counts near 2^32 too: they differ from small ones only in the second word.
    const uint64_t count = in_.ConsumeBool()
                               ? in_.ConsumeIntegralInRange<uint64_t>(0, 3)
                               : (uint64_t{1} << 32) + in_.ConsumeIntegralInRange<uint64_t>(0, 3);
    const bool reduces = in_.ConsumeBool();
    const bool rooted = in_.ConsumeBool();
    const int root = in_.ConsumeIntegralInRange<int>(-1, 70000);
    if (isUneven(type)) {
      const size_t counts[] = {in_.ConsumeIntegralInRange<size_t>(0, 3),
                               in_.ConsumeIntegralInRange<size_t>(0, 3)};
      return withBlock(
          packUnevenSignature(type, dtype, reduces, op, rooted, root, countsDigest(counts)),
          in_.ConsumeIntegralInRange<uint64_t>(0, 3));
    }
    return packSignature(type, dtype, count, reduces, op, rooted, root);
  }

  size_t pickBytes() {
    return in_.ConsumeBool() ? in_.ConsumeIntegralInRange<size_t>(0, 300)
                             : in_.ConsumeIntegralInRange<size_t>(0, 8);
  }

  void fail(const std::string& error) {
    LOOM_FUZZ_CHECK(!error.empty(), "a failure without a reason");
    failed_ = true;
  }

  void readHeader() {
    const uint8_t shape = in_.ConsumeIntegral<uint8_t>();
    tcp::Header h{};
    const std::vector<uint8_t> raw = in_.ConsumeBytes<uint8_t>(sizeof(h));
    if (!raw.empty()) std::memcpy(&h, raw.data(), raw.size());
    if (shape & 1) h.magic = tcp::kMagic;
    if (shape & 2) h.kind = tcp::kData;
    if (shape & 4) {
      h.tag = pickTag();
      h.bytes = pickBytes();
      const Signature signature = pickSignature();
      h.signature = signature.word;
      h.signatureExtra = signature.extra;
    }
    // onHeaderLocked's checks.
    if (h.magic != tcp::kMagic) return fail("bad magic");
    switch (h.kind) {
      case tcp::kGoodbye:
        goodbye_ = true;
        return;
      case tcp::kAbort:
        if (h.bytes == 0 || h.bytes > tcp::kMaxAbortText) return fail("corrupt abort");
        (void)in_.ConsumeBytesAsString(h.bytes);
        return fail("aborted");
      case tcp::kData:
        break;
      default:
        return fail("unknown kind");
    }
    // A payload the input cannot hold ends the stream here (the transport would wait for it).
    if (h.bytes > in_.remaining_bytes()) {
      failed_ = true;
      return;
    }
    std::string error;
    const bool landed =
        matcher_.arrive(h.tag, h.bytes, Signature{h.signature, h.signatureExtra}, error);
    if (!error.empty()) return fail(error);
    messages_[h.tag].push_back(Message{{}, h.bytes});
    current_ = &messages_[h.tag].back();
    remaining_ = h.bytes;
    if (!landed) {
      if (h.bytes > kHoldBytes && !matcher_.waiting()) {
        held_ = true;  // left on the wire until a receive for it is posted
        return;
      }
      if (!matcher_.bufferIncoming(error)) return fail(error);
    }
    if (remaining_ == 0) finishMessage();
  }

  void readPayload() {
    const size_t n = in_.ConsumeIntegralInRange<size_t>(1, remaining_);
    const std::vector<uint8_t> piece = in_.ConsumeBytes<uint8_t>(n);
    if (piece.empty()) {
      failed_ = true;
      return;
    }
    TagMatcher::Incoming& inc = matcher_.incoming();
    LOOM_FUZZ_CHECK(inc.target != nullptr && inc.got + piece.size() <= inc.bytes,
                    "payload with nowhere to go");
    std::memcpy(inc.target + inc.got, piece.data(), piece.size());
    matcher_.arrived(piece.size());
    current_->payload.insert(current_->payload.end(), piece.begin(), piece.end());
    remaining_ -= piece.size();
    if (remaining_ == 0) finishMessage();
  }

  void finishMessage() {
    matcher_.finishIncoming();
    current_ = nullptr;
  }

  void postReceive() {
    const uint64_t tag = pickTag();
    const size_t bytes = pickBytes();
    const Signature signature = pickSignature();
    Receive r;
    r.buffer.assign(bytes, 0xcd);
    {
      SignatureScope scope(signature);
      r.request = std::make_shared<FuzzReceive>(r.buffer.data(), bytes, tag);
    }
    std::string error;
    TagMatcher::Match m = TagMatcher::Match::kNone;
    try {
      m = matcher_.receive(r.request, error);
    } catch (const std::exception& e) {
      LOOM_FUZZ_CHECK(false, "receive() threw: %s", e.what());
    }
    receives_[tag].push_back(std::move(r));
    const auto& request = receives_[tag].back().request;
    switch (m) {
      case TagMatcher::Match::kNone:
        matcher_.post(request);
        break;
      case TagMatcher::Match::kDone:
        LOOM_FUZZ_CHECK(request->finished(), "kDone but not done");
        break;
      case TagMatcher::Match::kArriving:
        held_ = false;  // a held message now lands in this receive: the reader resumes
        if (remaining_ == 0) finishMessage();
        break;
      case TagMatcher::Match::kError:
        LOOM_FUZZ_CHECK(failedWithInvalidArgument(*request), "a mismatch failed otherwise");
        fail(error);
        break;
    }
  }

  static bool failedWithInvalidArgument(const FuzzReceive& r) {
    try {
      r.check();
    } catch (const loom::InvalidArgumentError&) {
      return true;
    } catch (...) {
    }
    return false;
  }

  void describe() {
    const uint64_t v = in_.ConsumeIntegral<uint64_t>();
    const Signature s{v, in_.ConsumeIntegral<uint64_t>()};
    LOOM_FUZZ_CHECK(!describeSignature(s).empty() && !describeTag(v).empty(), "empty text");
    (void)matcher_.describeUnexpected();
    (void)matcher_.hasUnexpected(pickTag());
  }

  // Per tag, the i-th receive gets the i-th message.
  void checkReceived() {
    for (auto& [tag, list] : receives_) {
      auto it = messages_.find(tag);
      size_t i = 0;
      for (Receive& r : list) {
        bool done = false;
        try {
          done = r.request->check();
        } catch (const loom::Error&) {
          continue;  // failed: a mismatch, reported above
        }
        if (!done) continue;
        LOOM_FUZZ_CHECK(it != messages_.end() && i < it->second.size(),
                        "a receive completed with no message for it");
        const Message& m = it->second[i];
        LOOM_FUZZ_CHECK(m.payload.size() == m.bytes && r.buffer == m.payload,
                        "receive %zu of tag %s holds other bytes than its message", i,
                        describeTag(tag).c_str());
        ++i;
      }
    }
  }

  FuzzedDataProvider& in_;
  TagMatcher matcher_{0, 1};
  std::map<uint64_t, std::vector<Receive>> receives_;  // posted, in order, per tag
  std::map<uint64_t, std::vector<Message>> messages_;  // arrived, in order, per tag
  Message* current_ = nullptr;                         // the message being read
  size_t remaining_ = 0;
  bool held_ = false;
  bool goodbye_ = false;
  bool failed_ = false;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  Reader(in).run();
  return 0;
}
