// The verbs transport's view of the hardware: a tiny "verbs ops" interface (register memory,
// create and connect one RC queue pair per peer, post RDMA writes with immediate and
// zero-length receives, poll the completion queue), the queue-pair info exchanged through the
// Store, the immediate-data encoding and the header at the start of every receive slot.
//
// Two implementations: IbvOps (ibv_ops.cc, libibverbs) and FakeOps (fake_ops.h, an in-memory
// fabric between threads of one process, for tests on machines without an RDMA device).
// Everything above this interface (flow control, fragmentation, tag matching, failure) is the
// same code for both.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "loom/comm/context.h"

namespace loom::comm::verbs {

// What a rank publishes for one peer (key "<prefix>/verbs/qp/<from>/<to>"): how to reach its
// queue pair, and where that peer may write (this rank's receive ring for it).
struct QpInfo {
  uint16_t lid = 0;        // port LID (InfiniBand); 0 on RoCE
  uint8_t gid[16] = {};    // GID at the chosen index (RoCE, or IB across subnets); zero = none
  uint32_t qpn = 0;        // queue pair number (24 bits)
  uint32_t psn = 0;        // initial packet sequence number (24 bits)
  uint32_t mtu = 0;        // ibv_mtu enum value of the active port MTU (1..5)
  uint32_t rkey = 0;       // remote key of the receive ring
  uint64_t addr = 0;       // address of the receive ring
  uint32_t slots = 0;      // slots in the ring
  uint32_t slotBytes = 0;  // bytes per slot (header included)
  bool operator==(const QpInfo&) const = default;
};

// Fixed-size text form: "v2 lid gid(32 hex) qpn psn mtu rkey addr slots slotBytes" (v2: the
// slot header carries the collective's signature, and the ring ends in an abort-text area).
std::string serializeQpInfo(const QpInfo& info);
// Throws InvalidArgumentError naming `what` (the store key) and the malformed field.
QpInfo parseQpInfo(const std::string& text, const std::string& what);
bool gidIsZero(const uint8_t (&gid)[16]);

// Immediate data: kind in the top 4 bits, an argument in the low 28 bits.
enum class ImmKind : uint32_t { kData = 1, kCredit = 2, kGoodbye = 3, kAbort = 4 };
constexpr uint32_t kImmArgMask = (1u << 28) - 1;
inline uint32_t encodeImm(ImmKind kind, uint32_t arg) {
  return (static_cast<uint32_t>(kind) << 28) | (arg & kImmArgMask);
}
inline ImmKind immKind(uint32_t imm) {
  return static_cast<ImmKind>(imm >> 28);
}
inline uint32_t immArg(uint32_t imm) {
  return imm & kImmArgMask;
}

// At the start of each slot: the fragment's message. Every fragment carries the message's
// collective signature (comm/src/signature.h; 0 for point-to-point): the receiver compares the
// first fragment's with its posted receive's (TagMatcher::arrive), as tcp and shm do with
// theirs, so that ranks that called the same collective with different arguments fail at the
// first message, both signatures in the error.
struct SlotHeader {
  uint64_t tag;
  uint64_t totalBytes;      // of the whole message
  uint64_t offset;          // of this fragment in the message
  uint64_t signature;       // the collective's (signature.h) word; 0: none
  uint64_t signatureExtra;  // its second word
  uint32_t fragBytes;       // payload bytes after the header
  uint32_t magic;
};
static_assert(sizeof(SlotHeader) == 48);
constexpr uint32_t kSlotMagic = 0x4c4d5633;  // "LMV3": the signature's two words

// After the `slots` slots of a receive ring: where a peer that aborts writes why (at most
// kAbortTextBytes of text; the abort's immediate carries the length), so that the receiver's
// error says what the aborting rank saw (a mismatched signature, a timeout) and not only that
// it aborted. Written at most once: nothing is sent after an abort.
constexpr uint32_t kAbortTextBytes = 4096;

// How a message of `bytes` is cut into fragments of at most `payloadPerSlot` bytes (a
// zero-byte message is one empty fragment).
inline size_t fragmentCount(size_t bytes, size_t payloadPerSlot) {
  return bytes == 0 ? 1 : (bytes + payloadPerSlot - 1) / payloadPerSlot;
}

// Credit return: the receiver returns freed slots once `threshold` accumulated. Any threshold
// in [1, slots] is deadlock-free: a sender without credits has `slots` slots outstanding,
// and the receiver frees every slot that arrived.
inline uint32_t creditThreshold(uint32_t slots) {
  return slots >= 2 ? slots / 2 : 1;
}

struct MemoryRegion {
  void* addr = nullptr;
  size_t bytes = 0;
  uint32_t lkey = 0;
  uint32_t rkey = 0;
  void* handle = nullptr;  // ibv_mr* (or the fake's record)
};

struct Sge {
  const void* addr;
  size_t bytes;
  uint32_t lkey;
};

struct Completion {
  enum Op { kSend, kRecv } op = kSend;
  int peer = -1;
  uint64_t wrId = 0;
  uint32_t imm = 0;  // kRecv
  bool ok = true;
  std::string error;  // when !ok: the status ("transport retry counter exceeded", ...)
};

class VerbsOps {
 public:
  virtual ~VerbsOps() = default;
  virtual std::string describe() const = 0;  // "mlx5_0 port 1" / "fake"

  virtual MemoryRegion regMr(void* addr, size_t bytes) = 0;
  virtual void deregMr(const MemoryRegion& mr) = 0;

  // Creates the RC queue pair to `peer` (sized for `sendDepth` / `recvDepth` work requests)
  // and returns its addressing part of QpInfo (lid, gid, qpn, psn, mtu).
  virtual QpInfo createQp(int peer, int sendDepth, int recvDepth) = 0;
  // INIT -> RTR -> RTS against the peer's published info.
  virtual void connectQp(int peer, const QpInfo& local, const QpInfo& remote) = 0;

  // A zero-length receive (consumed by one incoming write with immediate).
  virtual void postRecv(int peer, uint64_t wrId) = 0;
  // RDMA write of the gathered `sges` to remote [raddr, raddr + sum) with immediate `imm`;
  // signaled. sges may be empty (a zero-length write carrying only the immediate).
  virtual void postWriteImm(int peer, uint64_t wrId, const std::vector<Sge>& sges, uint64_t raddr,
                            uint32_t rkey, uint32_t imm) = 0;
  // Non-blocking; returns up to `max` completions.
  virtual int pollCq(Completion* out, int max) = 0;
  // Blocks until a completion may be ready, wake() was called, or `timeout` passed.
  virtual void waitCq(std::chrono::milliseconds timeout) = 0;
  virtual void wake() = 0;
};

// The transport's settings, from ContextOptions::verbs (validated at Context setup).
struct VerbsConfig {
  std::string device;  // empty = first device
  int port = 1;
  int gidIndex = 0;
  uint32_t slots = 16;
  uint32_t slotBytes = 64 * 1024;
};
VerbsConfig verbsConfigFrom(const VerbsOptions& options);

// Picks the device named `requested` (empty: the first). Throws NotAvailableError when the
// list is empty, InvalidArgumentError listing the devices found when `requested` is absent.
size_t selectDevice(const std::vector<std::string>& names, const std::string& requested);
// Port number in [1, numPorts] and gid index in [0, gidTableLen); InvalidArgumentError
// otherwise, naming the device and the valid range.
void checkPortAndGid(const std::string& device, int port, int numPorts, int gidIndex,
                     int gidTableLen);

}  // namespace loom::comm::verbs
