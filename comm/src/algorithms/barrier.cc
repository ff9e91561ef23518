// Dissemination barrier: in round k = 0, 1, ... (distance 2^k < size) each rank sends an
// empty message to rank + 2^k and waits for one from rank - 2^k. After ceil(log2(size))
// rounds every rank has heard, directly or through others, from every rank.
#include <vector>

#include "algorithms/algorithms.h"

namespace loom::comm {

void barrierDissemination(Op& op) {
  const int size = op.size();
  const int rank = op.rank();
  uint32_t round = 0;
  for (int dist = 1; dist < size; dist <<= 1, ++round) {
    auto s = op.send((rank + dist) % size, nullptr, 0, round);
    auto r = op.recv((rank - dist + size) % size, nullptr, 0, round);
    op.wait(r);
    op.wait(s);
  }
}

// Every send first, so that the signature is on its way to every peer before this rank can
// fail on what it receives; then every receive.
void zeroCountExchange(Op& op) {
  const int size = op.size();
  const int rank = op.rank();
  std::vector<RequestPtr> requests;
  requests.reserve(2 * static_cast<size_t>(size - 1));
  for (int i = 1; i < size; ++i) requests.push_back(op.send((rank + i) % size, nullptr, 0, 0));
  for (int i = 1; i < size; ++i) {
    requests.push_back(op.recv((rank - i + size) % size, nullptr, 0, 0));
  }
  op.waitAll(requests);
}

}  // namespace loom::comm
