// Copies that go around the cache (non-temporal stores) for collective outputs too large to
// stay in it: they save the read-for-ownership of every output line (on the Intel Xeon VM,
// one thread: 11.7 GB/s memcpy against 14.0 streamed at 16 MiB, 8.3-10.7 against 13.4-14.4 at
// 64 MiB; in cache, at 1 MiB, memcpy is faster: 23 against 17).
#pragma once

#include <cstddef>
#include <cstring>

namespace loom::comm::shm {

// Outputs at least this large (a collective's whole output on this rank) are streamed.
inline constexpr size_t kStreamOutputBytes = 8 << 20;

// memcpy with non-temporal stores (SSE2, part of x86-64; plain memcpy elsewhere). Call
// fenceStreams() after the last one, before anything that tells another thread or process
// the data is there.
void streamCopy(void* dst, const void* src, size_t bytes);
void fenceStreams();

// A piece of a collective's output: streamed when the whole output is large.
inline void copyOut(void* dst, const void* src, size_t bytes, bool stream) {
  if (stream) {
    streamCopy(dst, src, bytes);
  } else if (bytes != 0) {
    std::memcpy(dst, src, bytes);
  }
}

}  // namespace loom::comm::shm
