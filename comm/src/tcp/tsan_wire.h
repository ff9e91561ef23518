// ThreadSanitizer and the network: orders a receive after the sends it causally follows.
//
// The collectives reuse buffers by causality through the network. In the ring all-reduce in
// place, the all-gather data for a segment can only arrive after the peer received (so the
// kernel had copied) this rank's reduce-scatter bytes from that same segment; the heal mode's
// replay copy of a finished send is likewise older than any reply to it. TSan cannot see an
// ordering that goes through a socket, so with thread ranks (one process) or a transport's
// progress thread it reports the send's read (the sendmsg interceptor, or the replay copy) and
// the later receive into the same bytes as a race, sometimes with the earlier stack lost.
//
// In a TSan build the transport's sends record their read of the payload, release one
// process-wide sync object, and only then make the system call (not the intercepted libc call,
// which would record its read after the release, when the reply may already be arriving). Every
// write of received bytes into a receive's memory acquires the object first. So a receive is
// ordered after every send that entered the kernel before it, which includes every send it can
// depend on. Races on the transport's own state, and a user thread writing a buffer while it is
// being sent, are still reported. Elsewhere these are the plain calls.
//
// The heal mode copies a finished message into its replay ring after its last byte left, and a
// reply may overwrite those bytes before the copy reads them (seen under TSan in
// comm_sweep_large_tcp_heal_test). The ring then holds other bytes for that message, but never
// sends them again: a reply means the peer received the whole message, and a reconnect resends
// only what the peer had not received. So the copy's reads are not recorded
// (UnrecordedReplayCopy): TSan cannot know that the bytes it would flag are dead.
#pragma once

#if defined(__SANITIZE_THREAD__)
#define LOOM_TSAN_WIRE 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define LOOM_TSAN_WIRE 1
#endif
#endif

#include <sys/socket.h>
#include <sys/types.h>

#include <cstddef>

#ifdef LOOM_TSAN_WIRE
#include <sys/syscall.h>
#include <unistd.h>

extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
extern "C" void __tsan_read_range(void* addr, unsigned long size);
extern "C" void AnnotateIgnoreReadsBegin(const char* file, int line);
extern "C" void AnnotateIgnoreReadsEnd(const char* file, int line);
#endif

namespace loom::comm::tcp {

#ifdef LOOM_TSAN_WIRE
inline char tsanWireClock;  // only its address is used
inline void wireSent() {
  __tsan_release(&tsanWireClock);
}
inline void wireReceiving() {
  __tsan_acquire(&tsanWireClock);
}
// sendmsg(2): the payload's read recorded and released before the call.
inline ssize_t wireSendmsg(int fd, const msghdr* msg, int flags) {
  for (size_t i = 0; i < msg->msg_iovlen; ++i) {
    __tsan_read_range(msg->msg_iov[i].iov_base, msg->msg_iov[i].iov_len);
  }
  wireSent();
  return ::syscall(SYS_sendmsg, fd, msg, flags);
}
// The replay ring's copy of a finished send, unrecorded for as long as it lives.
struct UnrecordedReplayCopy {
  UnrecordedReplayCopy() { AnnotateIgnoreReadsBegin(__FILE__, __LINE__); }
  ~UnrecordedReplayCopy() { AnnotateIgnoreReadsEnd(__FILE__, __LINE__); }
  UnrecordedReplayCopy(const UnrecordedReplayCopy&) = delete;
  UnrecordedReplayCopy& operator=(const UnrecordedReplayCopy&) = delete;
};
#else
struct UnrecordedReplayCopy {};
inline void wireSent() {}
inline void wireReceiving() {}
inline ssize_t wireSendmsg(int fd, const msghdr* msg, int flags) {
  return ::sendmsg(fd, msg, flags);
}
#endif

}  // namespace loom::comm::tcp
