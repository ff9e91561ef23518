// TcpRequest::wait: spin briefly on small messages, then let the waiting thread drive the
// sockets (TcpTransport::drive) until the request completes or the deadline passes.
#include <sched.h>

#include "tcp/peer.h"

namespace loom::comm::tcp {

thread_local bool tlsDriving = false;
thread_local const TcpRequest* tlsWaiting = nullptr;

bool TcpRequest::wait(const Deadline& deadline) {
  if (state_.load(std::memory_order_acquire) != kPending) return test();
  struct WaitScope {
    TcpTransport* t;
    ~WaitScope() { t->endWait(); }
  };
  transport_->beginWait(this);
  WaitScope scope{transport_};
  if (bytes_ <= kSpinBytes) {
    const auto spinEnd = Clock::now() + transport_->spinTime();
    do {
      transport_->pollPeer(peer_, send_);
      if (state_.load(std::memory_order_acquire) != kPending) break;
      sched_yield();
    } while (Clock::now() < spinEnd);
  }
  if (state_.load(std::memory_order_acquire) == kPending) {
    sleeping_.store(1);
    const bool done = transport_->drive(state_, deadline.end());
    if (!done) return false;
  }
  return test();
}

}  // namespace loom::comm::tcp
