// store_demo: N processes rendezvous through a TCPStore, as the ranks of a job do.
//
//   store_demo [--nproc N] [--timeout-ms T]
//
// The parent forks N ranks. Rank 0 hosts the server inside its own process (isServer, port 0
// so that any free port works) and hands the port to the others through a pipe, standing in
// for MASTER_PORT. Every rank identifies itself to the server, publishes a line about itself
// under "rank/<r>", counts itself in with add(), and waits at a store barrier; rank 0 then
// prints what everyone published. Exit status is non-zero when any rank fails or the demo
// runs past its deadline.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "loom/cli/checks.h"
#include "loom/common/deadline.h"
#include "loom/common/socket.h"
#include "loom/store/barrier.h"
#include "loom/store/tcp_store.h"

namespace {

using std::chrono::milliseconds;

void runRank(int rank, int nproc, int portReadFd, int portWriteFd, milliseconds timeout) {
  const loom::Deadline start(milliseconds(0));
  loom::TCPStoreOptions options;
  options.rank = rank;
  options.timeout = timeout;
  int port = 0;
  std::unique_ptr<loom::TCPStore> store;
  if (rank == 0) {
    options.isServer = true;
    options.numWorkers = nproc;
    options.waitForWorkers = false;  // the others need the port first
    store = std::make_unique<loom::TCPStore>("127.0.0.1", 0, options);
    port = store->port();
    for (int r = 1; r < nproc; ++r) {
      if (::write(portWriteFd, &port, sizeof(port)) != sizeof(port))
        throw std::runtime_error("pipe");
    }
    store->server()->waitForWorkers(nproc, timeout);
  } else {
    if (::read(portReadFd, &port, sizeof(port)) != sizeof(port)) {
      throw std::runtime_error("rank 0 never sent the store port");
    }
    store = std::make_unique<loom::TCPStore>("127.0.0.1", port, options);
  }
  const std::string line = "pid " + std::to_string(::getpid()) + " on " + loom::net::hostname() +
                           ", connected after " + std::to_string(start.elapsed().count()) + " ms";
  store->set("rank/" + std::to_string(rank), line);
  store->add("ranks_up", 1);
  loom::storeBarrier(*store, "published", rank, nproc);
  if (rank == 0) {
    std::vector<std::string> keys;
    for (int r = 0; r < nproc; ++r) keys.push_back("rank/" + std::to_string(r));
    const auto lines = store->multiGet(keys);
    std::cout << "store_demo: " << nproc << " processes rendezvoused through TCPStore "
              << store->address() << " (server inside rank 0)\n";
    for (int r = 0; r < nproc; ++r) {
      std::cout << "  rank " << r << ": " << loom::toString(lines[r]) << "\n";
    }
    std::cout << "  ranks_up counter: " << store->getString("ranks_up") << ", store holds "
              << store->numKeys() << " keys, barrier passed after " << start.elapsed().count()
              << " ms" << std::endl;
  }
  // Rank 0 owns the server: it leaves last, once every rank has said it is done with it.
  store->set("bye/" + std::to_string(rank), std::string_view("1"));
  if (rank == 0) {
    std::vector<std::string> byes;
    for (int r = 0; r < nproc; ++r) byes.push_back("bye/" + std::to_string(r));
    store->wait(byes);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"store_demo: processes rendezvous through a TCPStore"};
  int nproc = 4;
  int timeoutMs = 4000;
  app.add_option("--nproc", nproc, "number of processes")->check(loom::cli::wholeIn(1, 64));
  app.add_option("--timeout-ms", timeoutMs, "deadline for the whole demo")
      ->check(loom::cli::wholeAtLeast(1));
  CLI11_PARSE(app, argc, argv);

  int fds[2];
  if (::pipe(fds) != 0) {
    std::perror("pipe");
    return 1;
  }
  std::fflush(stdout);
  std::vector<pid_t> pids;
  for (int rank = 0; rank < nproc; ++rank) {
    const pid_t pid = ::fork();
    if (pid < 0) {
      std::perror("fork");
      return 1;
    }
    if (pid == 0) {
      // Only rank 0 writes the port; closing the other ends means the readers see EOF at
      // once if rank 0 dies before sending it.
      ::close(rank == 0 ? fds[0] : fds[1]);
      int code = 0;
      try {
        runRank(rank, nproc, fds[0], fds[1], milliseconds(timeoutMs));
      } catch (const std::exception& e) {
        std::cerr << "store_demo rank " << rank << ": " << e.what() << std::endl;
        code = 1;
      }
      std::cout.flush();
      _exit(code);
    }
    pids.push_back(pid);
  }
  ::close(fds[0]);
  ::close(fds[1]);

  // Wait for every rank, but never past the deadline (plus a grace second).
  const loom::Deadline deadline(milliseconds(timeoutMs + 1000));
  int failures = 0;
  size_t left = pids.size();
  while (left > 0) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      --left;
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failures;
      continue;
    }
    if (deadline.expired()) {
      std::cerr << "store_demo: " << left
                << " rank(s) still running at the deadline; killing them\n";
      for (pid_t p : pids) ::kill(p, SIGKILL);
      while (::waitpid(-1, &status, 0) > 0) {
      }
      return 1;
    }
    ::usleep(2000);
  }
  if (failures > 0) {
    std::cerr << "store_demo: " << failures << " rank(s) failed\n";
    return 1;
  }
  return 0;
}
