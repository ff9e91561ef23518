// Google Benchmark: TCPStore set/get/add latency and throughput with 1 and 16 clients.
//
// One TCPStoreServer runs in this process on 127.0.0.1; each benchmark thread is one client
// with its own TCPStore (its own connection), created outside the timed loop. Time per
// iteration is the round-trip latency seen by one client; items_per_second is the aggregate
// request rate of all clients (real time, so 16 threads report the server's throughput).
// HashStore rows give the in-process floor for comparison.
#include <benchmark/benchmark.h>

#include <memory>
#include <string>

#include "loom/store/hash_store.h"
#include "loom/store/tcp_store.h"
#include "loom/store/tcp_store_server.h"

namespace {

using loom::Bytes;

loom::TCPStoreServer& server() {
  static loom::TCPStoreServer instance(loom::TCPStoreServerOptions{"127.0.0.1", 0, "", -1});
  return instance;
}

std::unique_ptr<loom::TCPStore> client() {
  loom::TCPStoreOptions options;
  options.timeout = std::chrono::milliseconds(30000);
  return std::make_unique<loom::TCPStore>("127.0.0.1", server().port(), options);
}

std::string threadKey(const benchmark::State& state) {
  return "key/" + std::to_string(state.thread_index());
}

void BM_TCPStoreSet(benchmark::State& state) {
  auto store = client();
  const Bytes value(static_cast<size_t>(state.range(0)), 0xAB);
  const std::string key = threadKey(state);
  for (auto _ : state) store->set(key, value);
  state.SetItemsProcessed(state.iterations());
  state.SetBytesProcessed(state.iterations() * state.range(0));
}

void BM_TCPStoreGet(benchmark::State& state) {
  auto store = client();
  const std::string key = threadKey(state);
  store->set(key, Bytes(static_cast<size_t>(state.range(0)), 0xCD));
  for (auto _ : state) benchmark::DoNotOptimize(store->get(key));
  state.SetItemsProcessed(state.iterations());
  state.SetBytesProcessed(state.iterations() * state.range(0));
}

void BM_TCPStoreAdd(benchmark::State& state) {
  auto store = client();
  for (auto _ : state) benchmark::DoNotOptimize(store->add("counter", 1));
  state.SetItemsProcessed(state.iterations());
}

void BM_HashStoreAdd(benchmark::State& state) {
  static loom::HashStore store;
  for (auto _ : state) benchmark::DoNotOptimize(store.add("counter", 1));
  state.SetItemsProcessed(state.iterations());
}

BENCHMARK(BM_TCPStoreSet)->Arg(16)->Arg(65536)->Threads(1)->Threads(16)->UseRealTime();
BENCHMARK(BM_TCPStoreGet)->Arg(16)->Arg(65536)->Threads(1)->Threads(16)->UseRealTime();
BENCHMARK(BM_TCPStoreAdd)->Threads(1)->Threads(16)->UseRealTime();
BENCHMARK(BM_HashStoreAdd)->Threads(1)->Threads(16)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
