// The pure parts of the verbs transport, no device needed: the queue-pair info exchanged
// through the Store, the immediate encoding, fragmentation and credit arithmetic, the
// VerbsOptions checks, device / port / gid-index selection errors, the INIT -> RTR -> RTS
// attributes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <map>
#include <string>

#include "loom/comm/verbs.h"
#include "loom/common/error.h"
#include "loom/store/hash_store.h"
#include "loom/testing/errors.h"
#include "verbs/verbs_ops.h"
#include "verbs/verbs_qp.h"

namespace loom::comm::verbs {
namespace {

using ::testing::HasSubstr;

using loom::testing::messageOf;

QpInfo sampleInfo() {
  QpInfo info;
  info.lid = 0x1234;
  for (int i = 0; i < 16; ++i) info.gid[i] = static_cast<uint8_t>(0xf0 + i);
  info.qpn = 0xabcdef;
  info.psn = 0x123456;
  info.mtu = 5;
  info.rkey = 0xdeadbeef;
  info.addr = 0x7fff12345678ull;
  info.slots = 16;
  info.slotBytes = 65536;
  return info;
}

TEST(QpInfoText, RoundTrips) {
  const QpInfo info = sampleInfo();
  const std::string text = serializeQpInfo(info);
  EXPECT_EQ(parseQpInfo(text, "k"), info);
  QpInfo zero;
  zero.mtu = 1;
  zero.slots = 1;
  zero.slotBytes = 64;
  EXPECT_EQ(parseQpInfo(serializeQpInfo(zero), "k"), zero);
  EXPECT_TRUE(gidIsZero(zero.gid));
  EXPECT_FALSE(gidIsZero(info.gid));
}

TEST(QpInfoText, MalformedInputNamesKeyAndField) {
  std::string text = serializeQpInfo(sampleInfo());
  // v1 is the format before slot headers carried signatures: a rank of that build is refused.
  EXPECT_THAT(messageOf<InvalidArgumentError>([&] { parseQpInfo("v1 1 2", "comm/verbs/qp/1/0"); }),
              HasSubstr("queue-pair info comm/verbs/qp/1/0 has version \"v1\", expected \"v2\""));
  EXPECT_THAT(messageOf<InvalidArgumentError>([&] { parseQpInfo("v2 5", "key"); }),
              HasSubstr("field 'gid'"));
  EXPECT_THAT(
      messageOf<InvalidArgumentError>([&] { parseQpInfo(text.substr(0, text.rfind(' ')), "key"); }),
      HasSubstr("truncated: field 'slotBytes' missing"));
  EXPECT_THAT(messageOf<InvalidArgumentError>([&] { parseQpInfo(text + " 7", "key"); }),
              HasSubstr("trailing text \"7\""));
  QpInfo bad = sampleInfo();
  bad.qpn = 0x1000000;  // > 24 bits
  EXPECT_THAT(messageOf<InvalidArgumentError>([&] { parseQpInfo(serializeQpInfo(bad), "key"); }),
              HasSubstr("field 'qpn' is \"16777216\", expected an integer in [0, 16777215]"));
  bad = sampleInfo();
  bad.mtu = 0;
  EXPECT_THAT(messageOf<InvalidArgumentError>([&] { parseQpInfo(serializeQpInfo(bad), "key"); }),
              HasSubstr("field 'mtu' is 0"));
  bad = sampleInfo();
  bad.slotBytes = 16;
  EXPECT_THAT(messageOf<InvalidArgumentError>([&] { parseQpInfo(serializeQpInfo(bad), "key"); }),
              HasSubstr("ring of 16 slots of 16 bytes"));
}

TEST(Immediate, EncodesKindAndArgument) {
  for (ImmKind k : {ImmKind::kData, ImmKind::kCredit, ImmKind::kGoodbye, ImmKind::kAbort}) {
    for (uint32_t arg : {0u, 1u, 4095u, kImmArgMask}) {
      const uint32_t imm = encodeImm(k, arg);
      EXPECT_EQ(immKind(imm), k);
      EXPECT_EQ(immArg(imm), arg);
    }
  }
  EXPECT_EQ(immArg(encodeImm(ImmKind::kData, kImmArgMask + 5)), 4u);  // masked
}

// The slot header's wire layout (v3): the signature's two words sit between the offset and the
// fragment size, and a header written then read back keeps every field, the signature included.
TEST(SlotHeaderLayout, CarriesTheSignature) {
  EXPECT_EQ(sizeof(SlotHeader), 48u);
  EXPECT_EQ(offsetof(SlotHeader, tag), 0u);
  EXPECT_EQ(offsetof(SlotHeader, totalBytes), 8u);
  EXPECT_EQ(offsetof(SlotHeader, offset), 16u);
  EXPECT_EQ(offsetof(SlotHeader, signature), 24u);
  EXPECT_EQ(offsetof(SlotHeader, signatureExtra), 32u);
  EXPECT_EQ(offsetof(SlotHeader, fragBytes), 40u);
  EXPECT_EQ(offsetof(SlotHeader, magic), 44u);
  const SlotHeader h{7, 1000, 216, 0x8123456789abcdefull, 0x1234, 216, kSlotMagic};
  uint8_t wire[sizeof(SlotHeader)];
  std::memcpy(wire, &h, sizeof(h));
  SlotHeader back;
  std::memcpy(&back, wire, sizeof(back));
  EXPECT_EQ(back.tag, 7u);
  EXPECT_EQ(back.totalBytes, 1000u);
  EXPECT_EQ(back.offset, 216u);
  EXPECT_EQ(back.signature, 0x8123456789abcdefull);
  EXPECT_EQ(back.signatureExtra, 0x1234u);
  EXPECT_EQ(back.fragBytes, 216u);
  EXPECT_EQ(back.magic, kSlotMagic);
  // The abort's immediate carries the length of its text.
  EXPECT_LE(kAbortTextBytes, kImmArgMask);
}

TEST(Fragments, CountAndCreditThreshold) {
  EXPECT_EQ(fragmentCount(0, 100), 1u);
  EXPECT_EQ(fragmentCount(1, 100), 1u);
  EXPECT_EQ(fragmentCount(100, 100), 1u);
  EXPECT_EQ(fragmentCount(101, 100), 2u);
  EXPECT_EQ(fragmentCount(1000, 100), 10u);
  EXPECT_EQ(creditThreshold(16), 8u);
  EXPECT_EQ(creditThreshold(2), 1u);
  EXPECT_EQ(creditThreshold(1), 1u);
}

// The transport's config is ContextOptions::verbs as given (the LOOM_IB_* variables behind it
// are checked in tests/comm/settings_test.cc); out-of-range options fail Context setup naming
// the field.
TEST(Config, DefaultsAndOptions) {
  VerbsConfig c = verbsConfigFrom({});
  EXPECT_EQ(c.device, "");
  EXPECT_EQ(c.port, 1);
  EXPECT_EQ(c.gidIndex, 0);
  EXPECT_EQ(c.slots, 16u);
  EXPECT_EQ(c.slotBytes, 65536u);
  VerbsOptions o;
  o.device = "mlx5_1";
  o.port = 2;
  o.gidIndex = 3;
  o.slots = 32;
  o.slotBytes = 4096;
  c = verbsConfigFrom(o);
  EXPECT_EQ(c.device, "mlx5_1");
  EXPECT_EQ(c.port, 2);
  EXPECT_EQ(c.gidIndex, 3);
  EXPECT_EQ(c.slots, 32u);
  EXPECT_EQ(c.slotBytes, 4096u);
  HashStore store;
  ContextOptions bad;
  bad.verbs.port = 0;
  EXPECT_THAT(messageOf<InvalidArgumentError>([&] { createVerbsContext(store, 0, 1, bad); }),
              HasSubstr("ContextOptions::verbs.port is 0; expected a port in [1, 255]"));
  bad = {};
  bad.verbs.slots = 1;
  EXPECT_THAT(messageOf<InvalidArgumentError>([&] { createVerbsContext(store, 0, 1, bad); }),
              HasSubstr("ContextOptions::verbs.slots is 1"));
}

TEST(Device, SelectionErrors) {
  EXPECT_THAT(messageOf<NotAvailableError>([] { selectDevice({}, ""); }),
              HasSubstr("no RDMA device found (ibv_get_device_list returned 0 devices)"));
  EXPECT_THAT(messageOf<NotAvailableError>([] { selectDevice({}, "mlx5_0"); }),
              HasSubstr("no RDMA device found"));
  EXPECT_EQ(selectDevice({"mlx5_0", "mlx5_1"}, ""), 0u);
  EXPECT_EQ(selectDevice({"mlx5_0", "mlx5_1"}, "mlx5_1"), 1u);
  EXPECT_THAT(
      messageOf<InvalidArgumentError>([] {
        selectDevice({"mlx5_0", "rxe0"}, "mlx9");
      }),
      HasSubstr("LOOM_IB_DEVICE=\"mlx9\" names no RDMA device; devices found: mlx5_0, rxe0"));
}

TEST(Device, PortAndGidIndexChecks) {
  EXPECT_NO_THROW(checkPortAndGid("mlx5_0", 1, 1, 0, 16));
  EXPECT_THAT(messageOf<InvalidArgumentError>([] { checkPortAndGid("mlx5_0", 2, 1, 0, 16); }),
              HasSubstr("LOOM_IB_PORT=2 is not a port of mlx5_0: expected 1..1"));
  EXPECT_THAT(
      messageOf<InvalidArgumentError>([] { checkPortAndGid("mlx5_0", 1, 1, 16, 16); }),
      HasSubstr("LOOM_IB_GID_INDEX=16 is out of range for mlx5_0 port 1: its GID table has 16 "
                "entries (expected 0..15)"));
}

TEST(QpStateMachine, InitAttributes) {
  LocalPort port;
  port.port = 2;
  const QpTransition t = qpToInit(port);
  EXPECT_EQ(t.attr.qp_state, IBV_QPS_INIT);
  EXPECT_EQ(t.attr.port_num, 2);
  EXPECT_EQ(t.attr.qp_access_flags,
            static_cast<unsigned>(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE));
  EXPECT_EQ(t.mask, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

TEST(QpStateMachine, RtrOnInfinibandWithoutGid) {
  LocalPort port;
  port.activeMtu = IBV_MTU_4096;
  QpInfo remote = sampleInfo();
  std::fill(std::begin(remote.gid), std::end(remote.gid), 0);
  remote.mtu = IBV_MTU_2048;
  const QpTransition t = qpToRtr(port, remote);
  EXPECT_EQ(t.attr.qp_state, IBV_QPS_RTR);
  EXPECT_EQ(t.attr.path_mtu, IBV_MTU_2048);  // min of both sides
  EXPECT_EQ(t.attr.dest_qp_num, remote.qpn);
  EXPECT_EQ(t.attr.rq_psn, remote.psn);
  EXPECT_EQ(t.attr.ah_attr.dlid, remote.lid);
  EXPECT_EQ(t.attr.ah_attr.is_global, 0);
  EXPECT_EQ(t.mask, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                        IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
}

TEST(QpStateMachine, RtrOnRoceUsesTheGid) {
  LocalPort port;
  port.ethernet = true;
  port.gidIndex = 3;
  port.activeMtu = IBV_MTU_1024;
  QpInfo remote = sampleInfo();
  const QpTransition t = qpToRtr(port, remote);
  EXPECT_EQ(t.attr.path_mtu, IBV_MTU_1024);
  EXPECT_EQ(t.attr.ah_attr.is_global, 1);
  EXPECT_EQ(t.attr.ah_attr.grh.sgid_index, 3);
  EXPECT_EQ(std::memcmp(t.attr.ah_attr.grh.dgid.raw, remote.gid, 16), 0);
  std::fill(std::begin(remote.gid), std::end(remote.gid), 0);
  EXPECT_THAT(messageOf<InvalidArgumentError>([&] { qpToRtr(port, remote); }),
              HasSubstr("peer published a zero GID"));
  remote = sampleInfo();
  remote.mtu = 9;
  EXPECT_THAT(messageOf<InvalidArgumentError>([&] { qpToRtr(port, remote); }),
              HasSubstr("peer's path MTU enum 9"));
}

TEST(QpStateMachine, RtsAttributes) {
  QpInfo local = sampleInfo();
  const QpTransition t = qpToRts(local);
  EXPECT_EQ(t.attr.qp_state, IBV_QPS_RTS);
  EXPECT_EQ(t.attr.sq_psn, local.psn);
  EXPECT_EQ(t.attr.retry_cnt, 7);
  EXPECT_EQ(t.attr.rnr_retry, 7);
  EXPECT_GT(t.attr.timeout, 0);
  EXPECT_EQ(t.mask, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                        IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC);
}

}  // namespace
}  // namespace loom::comm::verbs
