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
// One gap is left: the heal mode copies a finished message into its replay ring after its last
// byte left, and a reply can overwrite those bytes first. That copy is never replayed for the
// overwritten bytes (the peer had them), but TSan may report the pair; wireSent() after the copy
// narrows the window.
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
#else
inline void wireSent() {}
inline void wireReceiving() {}
inline ssize_t wireSendmsg(int fd, const msghdr* msg, int flags) {
  return ::sendmsg(fd, msg, flags);
}
#endif

}  // namespace loom::comm::tcp
