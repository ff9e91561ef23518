// RoutingTransport: the Context's transport when some peers share this rank's host and shared
// memory is on: requests to those peers go through the shared-memory transport
// (shm_transport.h), all others through tcp. Both fail together: aborting this aborts both,
// a failure of either fails the other (they poll each other), and failed() is true once
// either failed.
//
// Thread-safety: as its two transports (any thread).
#pragma once

#include <memory>
#include <string>

#include "loom/comm/transport.h"
#include "shm/shm_transport.h"

namespace loom::comm::shm {

class RoutingTransport final : public Transport {
 public:
  RoutingTransport(std::unique_ptr<Transport> tcp, std::unique_ptr<ShmTransport> shm);
  // The shared-memory transport goes first (its progress thread stops; peers see a goodbye).
  ~RoutingTransport() override;

  ShmTransport& sharedMemory() { return *shm_; }

  const char* name() const override { return "shm+tcp"; }
  int rank() const override { return tcp_->rank(); }
  int size() const override { return tcp_->size(); }
  RequestPtr isend(int peer, const void* data, size_t bytes, uint64_t tag) override;
  RequestPtr irecv(int peer, void* data, size_t bytes, uint64_t tag) override;
  RegisteredBuffer registerBuffer(const void* data, size_t bytes) override;
  void unregisterBuffer(const RegisteredBuffer& buffer) override;
  void abort(const std::string& reason) override;
  bool failed() const override;
  std::string peerAddress(int peer) const override;
  std::string describeUnexpected(int peer) const override;
  bool probe(int peer, uint64_t tag) const override;

 private:
  Transport& route(int peer) const;

  std::unique_ptr<Transport> tcp_;
  std::unique_ptr<ShmTransport> shm_;
};

}  // namespace loom::comm::shm
