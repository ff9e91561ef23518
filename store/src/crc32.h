// CRC-32 (IEEE 802.3, the zlib polynomial) for the stores' on-disk records (FileStore's file,
// the TCPStore server's log and snapshots). Not a cryptographic check: it finds torn and
// corrupted records.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace loom::store_detail {

inline uint32_t crc32(const uint8_t* data, size_t n) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) c = table[(c ^ data[i]) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

}  // namespace loom::store_detail
