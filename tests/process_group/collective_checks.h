// Runs every collective of a ProcessGroup once with known values and checks the closed form.
// Throws std::runtime_error naming the first wrong result, so that it works both in thread
// ranks (runThreadRanks rethrows) and in forked ranks (the child exits non-zero).
#pragma once

#include <cstdint>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "loom/process_group/process_group.h"

namespace loom::testing {

inline void expectEq(long long got, long long want, const std::string& what) {
  if (got != want) {
    throw std::runtime_error(what + ": got " + std::to_string(got) + ", expected " +
                             std::to_string(want));
  }
}

inline void checkEveryCollective(ProcessGroup& pg, size_t n = 5) {
  const int r = pg.rank();
  const int p = pg.size();
  const std::string who = "rank " + std::to_string(r) + ": ";

  std::vector<int32_t> a(n);
  for (size_t i = 0; i < n; ++i) a[i] = r * 100 + static_cast<int32_t>(i);
  pg.allreduce(view(a.data(), n))->wait();
  for (size_t i = 0; i < n; ++i) {
    expectEq(a[i], 100LL * p * (p - 1) / 2 + static_cast<long long>(p * i), who + "allreduce");
  }

  const int bRoot = 1 % p;
  std::vector<double> b(n, r == bRoot ? 7.5 : 0.0);
  BroadcastOptions bopts;
  bopts.root = bRoot;
  pg.broadcast(view(b.data(), n), bopts)->wait();
  for (double v : b) expectEq(static_cast<long long>(v * 2), 15, who + "broadcast");

  const int rRoot = 2 % p;
  std::vector<int64_t> red(n, r + 1);
  ReduceOptions ropts;
  ropts.root = rRoot;
  ropts.reduceOp = ReduceOp::kMax;
  pg.reduce(view(red.data(), n), ropts)->wait();
  for (int64_t v : red) expectEq(v, r == rRoot ? p : r + 1, who + "reduce(max)");

  std::vector<float> in(n, static_cast<float>(r));
  std::vector<float> all(n * p, -1.0f);
  pg.allgather(view(in.data(), n), view(all.data(), n * p))->wait();
  for (int k = 0; k < p; ++k) {
    for (size_t i = 0; i < n; ++i)
      expectEq(static_cast<long long>(all[k * n + i]), k, who + "allgather");
  }

  std::vector<int32_t> rsIn(n * p);
  std::iota(rsIn.begin(), rsIn.end(), 0);
  std::vector<int32_t> rsOut(n, -1);
  pg.reduceScatter(view(rsIn.data(), n * p), view(rsOut.data(), n))->wait();
  for (size_t i = 0; i < n; ++i) {
    expectEq(rsOut[i], static_cast<long long>(p) * (r * n + i), who + "reduce_scatter");
  }

  const int gRoot = 3 % p;
  std::vector<int32_t> gIn(n, r);
  std::vector<int32_t> gOut(r == gRoot ? n * p : 0, -1);
  GatherOptions gopts;
  gopts.root = gRoot;
  pg.gather(view(gIn.data(), n), view(gOut.data(), gOut.size()), gopts)->wait();
  if (r == gRoot) {
    for (int k = 0; k < p; ++k) expectEq(gOut[k * n + n - 1], k, who + "gather");
  }

  const int sRoot = 1 % p;
  std::vector<int32_t> sIn(r == sRoot ? n * p : 0);
  std::iota(sIn.begin(), sIn.end(), 0);
  std::vector<int32_t> sOut(n, -1);
  ScatterOptions sopts;
  sopts.root = sRoot;
  pg.scatter(view(sIn.data(), sIn.size()), view(sOut.data(), n), sopts)->wait();
  for (size_t i = 0; i < n; ++i)
    expectEq(sOut[i], static_cast<long long>(r * n + i), who + "scatter");

  std::vector<int32_t> aIn(n * p);
  for (int k = 0; k < p; ++k) {
    for (size_t i = 0; i < n; ++i) aIn[k * n + i] = r * 10 + k;
  }
  std::vector<int32_t> aOut(n * p, -1);
  pg.alltoall(view(aIn.data(), n * p), view(aOut.data(), n * p))->wait();
  for (int k = 0; k < p; ++k) expectEq(aOut[k * n], k * 10 + r, who + "alltoall");

  auto barrier = pg.barrier();
  barrier->wait();
  expectEq(static_cast<long long>(barrier->seq()), 9, who + "barrier sequence number");

  if (p > 1) {
    std::vector<int32_t> msg(n, r);
    std::vector<int32_t> got(n, -1);
    auto sent = pg.send(view(msg.data(), n), (r + 1) % p, /*tag=*/7);
    auto recvd = pg.recv(view(got.data(), n), (r + p - 1) % p, /*tag=*/7);
    sent->wait();
    recvd->wait();
    for (int32_t v : got) expectEq(v, (r + p - 1) % p, who + "send/recv");
    expectEq(static_cast<long long>(sent->seq()), 1, who + "send sequence number (per peer)");
  }
  expectEq(static_cast<long long>(pg.lastSeq()), 9, who + "collective sequence number");
}

}  // namespace loom::testing
