#include "algorithms/op.h"

#include "loom/common/error.h"

namespace loom::comm {

Op::Op(Context& ctx, OpType kind, const CollectiveOptions& opts, size_t chunkBytes)
    : ctx_(ctx),
      transport_(ctx.transport()),
      kind_(kind),
      seq_(opts.seq),
      rank_(ctx.rank()),
      size_(ctx.size()),
      timeout_(opts.timeout.count() > 0 ? opts.timeout : ctx.timeout()),
      deadline_(timeout_),
      chunkBytes_(chunkBytes) {
  LOOM_CHECK(opts.seq <= kMaxSeq, "sequence number ", opts.seq, " exceeds the maximum ", kMaxSeq);
}

std::string Op::name() const {
  return detail::str(opTypeName(kind_), "#", seq_);
}

RequestPtr Op::send(int peer, const void* data, size_t bytes, uint32_t step) {
  return transport_.isend(peer, data, bytes, makeTag(kind_, seq_, step));
}

RequestPtr Op::recv(int peer, void* data, size_t bytes, uint32_t step) {
  return transport_.irecv(peer, data, bytes, makeTag(kind_, seq_, step));
}

RequestPtr Op::sendTagged(int peer, const void* data, size_t bytes, uint64_t tag) {
  return transport_.isend(peer, data, bytes, tag);
}

RequestPtr Op::recvTagged(int peer, void* data, size_t bytes, uint64_t tag) {
  return transport_.irecv(peer, data, bytes, tag);
}

void Op::wait(const RequestPtr& request) {
  bool done = false;
  try {
    done = request->wait(deadline_);
  } catch (const std::exception& e) {
    failed(*request, e);
  }
  if (!done) timedOut(*request);
}

void Op::waitAll(std::vector<RequestPtr>& requests) {
  for (auto& r : requests) wait(r);
  requests.clear();
}

void Op::timedOut(const Request& request) {
  const int peer = request.peer();
  std::string message =
      detail::str("rank ", rank_, ": ", name(), " timed out after ", timeout_.count(),
                  " ms waiting to ", directionName(request), " rank ", peer, " (",
                  transport_.peerAddress(peer), "): ", request.bytesOutstanding(), " of ",
                  request.bytes(), " bytes outstanding (", describeTag(request.tag()), ")");
  const std::string stray = transport_.describeUnexpected(peer);
  if (!stray.empty()) {
    message += detail::str("; rank ", peer, " sent instead: ", stray,
                           " (did the ranks call different collectives?)");
  }
  transport_.abort(message);
  throw TimeoutError(message);
}

void Op::failed(const Request& request, const std::exception& e) {
  const std::string message =
      detail::str("rank ", rank_, ": ", name(), " failed while waiting to ", directionName(request),
                  " rank ", request.peer(), ": ", e.what());
  transport_.abort(message);
  // A peer whose message disagrees with this rank's (another count or dtype) is the callers'
  // mistake, not the wire's: the type says so; the transport is aborted either way.
  if (dynamic_cast<const InvalidArgumentError*>(&e) != nullptr) throw InvalidArgumentError(message);
  throw IoError(message);
}

}  // namespace loom::comm
