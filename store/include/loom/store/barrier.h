// Store-based barrier that names the ranks that never arrived.
//
// storeBarrier(store, name, rank, worldSize, timeout): every rank of the group calls it with
// the same name; it returns once all worldSize ranks have arrived, or throws TimeoutError
//   "barrier 'init' #1 timed out after 5000 ms: 2/4 ranks arrived; missing ranks: 1, 3"
// It is reusable: each rank counts its own calls under "<name>/calls/<rank>" (add), so call n
// on every rank meets call n on the others without any shared counter; arrival is a per-rank
// key "<name>/<n>/<rank>", which is how the missing ranks are known. Keys are left behind
// (two per rank per call), which is what rendezvous stores expect.
#pragma once

#include <string>

#include "loom/store/store.h"

namespace loom {

void storeBarrier(Store& store, const std::string& name, int rank, int worldSize,
                  milliseconds timeout);
inline void storeBarrier(Store& store, const std::string& name, int rank, int worldSize) {
  storeBarrier(store, name, rank, worldSize, store.timeout());
}

}  // namespace loom
