// loom-store: a standalone TCPStore server.
//
//   loom-store --host H --port P [--token T | LOOM_STORE_TOKEN] [--workers N --timeout S]
//              [--data-dir DIR | LOOM_STORE_DIR] [--fsync always|never | LOOM_STORE_FSYNC]
//
// With --data-dir the keys persist in DIR (docs/store.md): a restarted loom-store starts with
// every key it had answered for, and clients with LOOM_STORE_RECONNECT_MS reconnect to it.
// Prints "loom-store listening on H:P" once it accepts connections (port 0 picks one and the
// line says which). With --workers N it then reports when N clients have joined, or exits 1
// after --timeout seconds saying how many joined and which ranks are missing. SIGINT and
// SIGTERM stop it cleanly (exit 0). A bad flag exits 2.
#include <signal.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <thread>

#include "loom/cli/checks.h"
#include "loom/common/error.h"
#include "loom/common/logging.h"
#include "loom/common/settings.h"
#include "loom/store/tcp_store_server.h"

namespace {

int run(const loom::TCPStoreServerOptions& options, int workers, double timeoutSeconds) {
  // Block the stop signals before the server thread exists so that only sigtimedwait below
  // receives them.
  sigset_t stopSignals;
  sigemptyset(&stopSignals);
  sigaddset(&stopSignals, SIGINT);
  sigaddset(&stopSignals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stopSignals, nullptr);

  loom::TCPStoreServer server(options);
  if (!options.dataDir.empty()) {
    std::cout << "loom-store: " << server.numKeysLoaded() << " key(s) loaded from "
              << options.dataDir << " (fsync "
              << (options.fsync == loom::StoreFsync::kAlways ? "always" : "never") << ")"
              << std::endl;
  }
  std::cout << "loom-store listening on " << server.address() << std::endl;

  // The wait for workers runs on its own thread so that a signal can still stop everything.
  std::atomic<int> joinState{workers > 0 ? 0 : 1};  // 0 waiting, 1 done, 2 failed
  std::string joinError;
  std::thread joiner;
  if (workers > 0) {
    joiner = std::thread([&] {
      const loom::Deadline deadline(std::chrono::milliseconds(0));
      try {
        server.waitForWorkers(
            workers, std::chrono::milliseconds(static_cast<int64_t>(timeoutSeconds * 1000)));
        std::cout << "loom-store: " << workers << "/" << workers << " workers joined in "
                  << deadline.elapsed().count() << " ms" << std::endl;
        joinState = 1;
      } catch (const std::exception& e) {
        joinError = e.what();
        joinState = 2;
      }
    });
  }
  int code = 0;
  for (;;) {
    // Wake every 100 ms only to see whether the join failed; requests never wait on this loop.
    timespec tick{0, 100 * 1000 * 1000};
    const int sig = sigtimedwait(&stopSignals, nullptr, &tick);
    if (sig == SIGINT || sig == SIGTERM) {
      std::cout << "loom-store: stopping on " << (sig == SIGINT ? "SIGINT" : "SIGTERM")
                << std::endl;
      break;
    }
    if (joinState.load() == 2) {
      std::cerr << "loom-store: " << joinError << std::endl;
      code = 1;
      break;
    }
  }
  server.stop();
  if (joiner.joinable()) joiner.join();
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"loom-store: standalone TCPStore server"};
  std::string host;
  int port = 29500;
  std::string token = loom::defaultStoreToken();
  int workers = 0;
  double timeoutSeconds = 300;
  app.add_option("--host", host, "address to listen on (default: all interfaces)");
  app.add_option("--port", port, "port to listen on; 0 picks a free one")
      ->check(loom::cli::wholeIn(0, 65535))
      ->capture_default_str();
  app.add_option("--token", token,
                 "shared secret clients must present (default: LOOM_STORE_TOKEN)");
  app.add_option("--workers", workers, "wait for this many clients to join (0: don't wait)")
      ->check(loom::cli::wholeAtLeast(0));
  // At most a year: a larger value overflowed the milliseconds it becomes (1e300 gave 0 ms).
  app.add_option("--timeout", timeoutSeconds, "seconds to wait for --workers (at most a year)")
      ->check(loom::cli::numberIn(0.001, 365.0 * 24 * 3600))
      ->capture_default_str();
  std::string dataDir;
  std::string fsync;
  app.add_option("--data-dir", dataDir,
                 "persist the keys in this directory (append-only log + snapshots; default: "
                 "LOOM_STORE_DIR, or memory only)");
  app.add_option("--fsync", fsync,
                 "with --data-dir: 'always' fdatasyncs every change before answering (survives "
                 "a machine crash), 'never' only writes it (survives loom-store being killed); "
                 "default: LOOM_STORE_FSYNC, or always")
      ->check(CLI::IsMember({"always", "never"}));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return loom::cli::exitFor(app, e, "loom-store");
  }
  if (!fsync.empty() && dataDir.empty() && !loom::settings::text("LOOM_STORE_DIR")) {
    std::cerr << "loom-store: --fsync applies to a store that persists its keys; give --data-dir "
                 "(or LOOM_STORE_DIR) with it"
              << std::endl;
    return 2;
  }
  try {
    loom::TCPStoreServerOptions options;
    options.host = host;
    options.port = port;
    options.token = token;
    options.numWorkers = workers;
    options.dataDir =
        app.count("--data-dir") ? dataDir : loom::settings::text("LOOM_STORE_DIR").value_or("");
    if (!fsync.empty()) {
      options.fsync = fsync == "never" ? loom::StoreFsync::kNever : loom::StoreFsync::kAlways;
    }
    return run(options, workers, timeoutSeconds);
  } catch (const std::exception& e) {
    std::cerr << "loom-store: " << e.what() << std::endl;
    return 1;
  }
}
