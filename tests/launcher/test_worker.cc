// launcher_test_worker: the PROGRAM that launcher_test runs under loom-run.
//
//   env                      print "RANK=.. WORLD_SIZE=.. ..." on one line
//   sleep DIR                write DIR/pid.<rank> (and DIR/child.<rank> for a grandchild that
//                            sleeps too), record a received SIGTERM/SIGINT in DIR/sig.<rank>,
//                            then wait up to 60 s
//   fail RANK CODE           that rank exits CODE at once; the others wait up to 60 s
//   selfkill RANK            that rank SIGKILLs itself; the others wait up to 60 s
//   stubborn RANK CODE       every rank ignores SIGTERM; RANK exits CODE, the others wait
//   flaky RANK CODE TIMES    RANK exits CODE while LOOM_RESTART_COUNT < TIMES, else all exit 0
//   chatter                  two lines on stdout, one on stderr, then a last partial line
//   flood DIR RANK CODE      RANK exits CODE after 1 s; the others record a received SIGTERM in
//                            DIR/sig.<rank> and write "flood <rank> <i>" lines, i = 0, 1, ..., to
//                            stdout for up to 60 s
//   elastic DIR TAG [fail]   append "tag=TAG round=R rank=K world=W node=N nnodes=M" to
//                            DIR/rounds, then exit 3 with `fail`, else wait until DIR/finish
//                            exists (at most 120 s) and exit 0
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>

#include "loom/common/settings.h"

namespace {

int envInt(const char* name) {
  return static_cast<int>(loom::settings::integer(name).value_or(-1));
}

// The value as printf("%s") showed a missing one before.
std::string envText(const char* name) {
  return loom::settings::value(name).value_or("(null)");
}

std::string g_sigFile;

void onSignal(int sig) {
  if (!g_sigFile.empty()) {
    const int fd = open(g_sigFile.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0) {
      char buf[16];
      const int n = std::snprintf(buf, sizeof(buf), "%d\n", sig);
      if (write(fd, buf, static_cast<size_t>(n)) < 0) {
      }
      close(fd);
    }
  }
  _exit(128 + sig);
}

void writeFile(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (!f) std::exit(90);
  std::fputs(text.c_str(), f);
  std::fclose(f);
  std::rename(tmp.c_str(), path.c_str());  // readers never see a half-written file
}

// Waits for a signal, at most 60 s (a bound, so a broken launcher can't leave us forever).
void waitLong() {
  for (int i = 0; i < 600; ++i) usleep(100 * 1000);  // the worker must live until killed
  std::exit(91);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return 99;
  const std::string mode = argv[1];
  const int rank = envInt("RANK");
  if (mode == "env") {
    std::printf(
        "RANK=%s WORLD_SIZE=%s LOCAL_RANK=%s LOCAL_WORLD_SIZE=%s NODE_RANK=%s "
        "MASTER_ADDR=%s MASTER_PORT=%s LOOM_RESTART_COUNT=%s\n",
        envText("RANK").c_str(), envText("WORLD_SIZE").c_str(), envText("LOCAL_RANK").c_str(),
        envText("LOCAL_WORLD_SIZE").c_str(), envText("NODE_RANK").c_str(),
        envText("MASTER_ADDR").c_str(), envText("MASTER_PORT").c_str(),
        envText("LOOM_RESTART_COUNT").c_str());
    return 0;
  }
  if (mode == "sleep" && argc == 3) {
    const std::string dir = argv[2];
    const std::string r = std::to_string(rank);
    const pid_t child = fork();
    if (child == 0) {
      // A grandchild of loom-run that knows nothing about it.
      writeFile(dir + "/child." + r, std::to_string(getpid()));
      waitLong();
    }
    g_sigFile = dir + "/sig." + r;
    signal(SIGTERM, onSignal);
    signal(SIGINT, onSignal);
    writeFile(dir + "/pid." + r, std::to_string(getpid()));
    waitLong();
  }
  if ((mode == "fail" || mode == "stubborn") && argc == 4) {
    if (mode == "stubborn") signal(SIGTERM, SIG_IGN);
    if (rank == std::atoi(argv[2])) return std::atoi(argv[3]);
    waitLong();
  }
  if (mode == "selfkill" && argc == 3) {
    if (rank == std::atoi(argv[2])) kill(getpid(), SIGKILL);
    waitLong();
  }
  if (mode == "flaky" && argc == 5) {
    if (rank == std::atoi(argv[2]) && envInt("LOOM_RESTART_COUNT") < std::atoi(argv[4])) {
      return std::atoi(argv[3]);
    }
    if (rank != std::atoi(argv[2]) && envInt("LOOM_RESTART_COUNT") < std::atoi(argv[4])) {
      waitLong();
    }
    return 0;
  }
  if (mode == "elastic" && (argc == 4 || argc == 5)) {
    const std::string dir = argv[2];
    const std::string line =
        "tag=" + std::string(argv[3]) + " round=" + std::to_string(envInt("LOOM_RESTART_COUNT")) +
        " rank=" + std::to_string(rank) + " world=" + std::to_string(envInt("WORLD_SIZE")) +
        " node=" + std::to_string(envInt("NODE_RANK")) +
        " nnodes=" + std::to_string(envInt("GROUP_WORLD_SIZE")) + "\n";
    const int fd = open((dir + "/rounds").c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0 || write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
      return 92;
    }
    close(fd);
    if (argc == 5) return 3;
    for (int i = 0; i < 6000; ++i) {
      if (access((dir + "/finish").c_str(), F_OK) == 0) return 0;
      usleep(20 * 1000);
    }
    return 93;
  }
  if (mode == "flood" && argc == 5) {
    if (rank == std::atoi(argv[3])) {
      sleep(1);
      return std::atoi(argv[4]);
    }
    g_sigFile = std::string(argv[2]) + "/sig." + std::to_string(rank);
    signal(SIGTERM, onSignal);
    const time_t end = time(nullptr) + 60;
    for (long i = 0; time(nullptr) < end; ++i) std::printf("flood %d %ld\n", rank, i);
    return 94;
  }
  if (mode == "chatter") {
    std::printf("out one %d\nout two %d\n", rank, rank);
    std::fflush(stdout);
    std::fprintf(stderr, "err one %d\n", rank);
    std::printf("partial %d", rank);
    return 0;
  }
  std::fprintf(stderr, "launcher_test_worker: bad arguments\n");
  return 99;
}
