#include "shm/routing_transport.h"

namespace loom::comm::shm {

RoutingTransport::RoutingTransport(std::unique_ptr<Transport> tcp,
                                   std::unique_ptr<ShmTransport> shm)
    : tcp_(std::move(tcp)), shm_(std::move(shm)) {
  shm_->setSibling(tcp_.get());
}

RoutingTransport::~RoutingTransport() {
  shm_.reset();
}

Transport& RoutingTransport::route(int peer) const {
  // Once tcp failed (a shm failure aborts tcp too), every request goes to tcp and fails at
  // once with its first reason, also those for same-host peers (the shm transport may not
  // have noticed yet); unless the shm transport failed itself: then its requests fail with its
  // reason and its kind (InvalidArgumentError after a mismatch, which tcp's abort lost).
  if (shm_->reaches(peer) && (!tcp_->failed() || shm_->failed())) return *shm_;
  return *tcp_;
}

RequestPtr RoutingTransport::isend(int peer, const void* data, size_t bytes, uint64_t tag) {
  return route(peer).isend(peer, data, bytes, tag);
}

RequestPtr RoutingTransport::irecv(int peer, void* data, size_t bytes, uint64_t tag) {
  return route(peer).irecv(peer, data, bytes, tag);
}

// Shared memory needs no registration (the rings are the shared memory); tcp decides for the
// other peers.
RegisteredBuffer RoutingTransport::registerBuffer(const void* data, size_t bytes) {
  return tcp_->registerBuffer(data, bytes);
}

void RoutingTransport::unregisterBuffer(const RegisteredBuffer& buffer) {
  tcp_->unregisterBuffer(buffer);
}

void RoutingTransport::abort(const std::string& reason) {
  shm_->abort(reason);  // aborts tcp too (its sibling)
  tcp_->abort(reason);
}

bool RoutingTransport::failed() const {
  return shm_->failed() || tcp_->failed();
}

std::string RoutingTransport::peerAddress(int peer) const {
  return route(peer).peerAddress(peer);
}

std::string RoutingTransport::describeUnexpected(int peer) const {
  return route(peer).describeUnexpected(peer);
}

bool RoutingTransport::probe(int peer, uint64_t tag) const {
  return route(peer).probe(peer, tag);
}

}  // namespace loom::comm::shm
