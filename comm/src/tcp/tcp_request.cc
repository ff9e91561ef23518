// TcpRequest::wait: spin briefly on small messages, then let the waiting thread drive the
// sockets (TcpTransport::drive) until the request completes or the deadline passes.
#include <sched.h>

#include "tcp/peer.h"

namespace loom::comm::tcp {

thread_local bool tlsDriving = false;
thread_local const TcpRequest* tlsWaiting = nullptr;

bool TcpRequest::wait(const Deadline& deadline) {
  if (finished()) return check();
  struct WaitScope {
    TcpTransport* t;
    ~WaitScope() { t->endWait(); }
  };
  transport_->beginWait(this);
  WaitScope scope{transport_};
  if (bytes() <= kSpinBytes) {
    const auto spinEnd = Clock::now() + transport_->spinTime();
    do {
      transport_->pollPeer(peer(), isSend());
      if (finished()) break;
      sched_yield();
    } while (Clock::now() < spinEnd);
  }
  if (!finished()) {
    sleeping_.store(1);
    const bool done = transport_->drive(*this, deadline.end());
    if (!done) return false;
  }
  return check();
}

}  // namespace loom::comm::tcp
