// A persisting TCPStore server (dataDir): keys survive a restart, a torn last record is
// dropped and named, compaction keeps every key, a directory serves one server, a full disk
// refuses the change with an IoError (and nothing of it survives), a log whose failed record
// cannot be cut back refuses every later change, and clients with a reconnect timeout carry on
// across a server restart.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <string>
#include <thread>
#include <unordered_map>

#include "loom/common/error.h"
#include "loom/common/socket.h"
#include "loom/store/store_protocol.h"
#include "loom/store/tcp_store.h"
#include "loom/store/tcp_store_server.h"
#include "store_log.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "loom_store_persist_XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TCPStoreServerOptions persisting(const std::string& dir, int port = 0) {
  TCPStoreServerOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  o.token = "";
  o.dataDir = dir;
  return o;
}

TCPStoreOptions client(milliseconds reconnect = milliseconds(0)) {
  TCPStoreOptions o;
  o.timeout = milliseconds(30000);
  o.token = "";
  o.reconnectTimeout = reconnect;
  return o;
}

TEST(StorePersistenceTest, KeysSurviveAServerRestart) {
  TempDir dir;
  {
    TCPStoreServer server(persisting(dir.path() + "/data"));
    EXPECT_EQ(server.numKeysLoaded(), 0);
    TCPStore store("127.0.0.1", server.port(), client());
    store.set("a", "1");
    EXPECT_EQ(store.add("counter", 5), 5);
    EXPECT_EQ(store.add("counter", 5), 10);
    store.multiSet({"b", "c"}, {toBytes("bee"), toBytes("sea")});
    EXPECT_EQ(toString(store.compareSet("a", toBytes("1"), toBytes("2"))), "2");
    EXPECT_TRUE(store.deleteKey("c"));
    store.set("empty", Bytes{});
  }
  TCPStoreServer server(persisting(dir.path() + "/data"));
  EXPECT_EQ(server.numKeysLoaded(), 4);
  EXPECT_EQ(server.bytesDropped(), 0);
  TCPStore store("127.0.0.1", server.port(), client());
  EXPECT_EQ(store.getString("a"), "2");
  EXPECT_EQ(store.add("counter", 0), 10);
  EXPECT_EQ(store.getString("b"), "bee");
  EXPECT_FALSE(store.check({"c"}));
  EXPECT_TRUE(store.get("empty").empty());
  EXPECT_EQ(store.numKeys(), 4);
}

TEST(StorePersistenceTest, ATornLastRecordIsDroppedAndNamed) {
  TempDir dir;
  const std::string data = dir.path() + "/data";
  {
    TCPStoreServer server(persisting(data));
    TCPStore store("127.0.0.1", server.port(), client());
    for (int i = 0; i < 3; ++i) store.set("k" + std::to_string(i), "v" + std::to_string(i));
  }
  const std::string log = data + "/log.0";
  const auto goodSize = fs::file_size(log);
  {
    // What a server killed in the middle of a write leaves: a header promising 100 bytes and
    // only 10 of them.
    std::ofstream out(log, std::ios::binary | std::ios::app);
    const char torn[] = {'L', 'S', 'L', '1', 0, 0, 0, 100, 1, 2, 3,
                         4,   0,   0,   0,   1, 1, 0, 0,   0, 9, 'x'};
    out.write(torn, sizeof(torn));
  }
  testing::internal::CaptureStderr();
  std::unique_ptr<TCPStoreServer> server;
  try {
    server = std::make_unique<TCPStoreServer>(persisting(data));
  } catch (...) {
    testing::internal::GetCapturedStderr();
    throw;
  }
  const std::string warning = testing::internal::GetCapturedStderr();
  EXPECT_NE(warning.find(log), std::string::npos) << warning;
  EXPECT_NE(warning.find("offset " + std::to_string(goodSize)), std::string::npos) << warning;
  EXPECT_EQ(server->bytesDropped(), 22);
  EXPECT_EQ(server->numKeysLoaded(), 3);
  EXPECT_EQ(fs::file_size(log), goodSize);
  {
    TCPStore store("127.0.0.1", server->port(), client());
    EXPECT_EQ(store.getString("k2"), "v2");
    store.set("k3", "v3");
  }
  server.reset();
  TCPStoreServer again(persisting(data));
  EXPECT_EQ(again.bytesDropped(), 0);
  EXPECT_EQ(again.numKeysLoaded(), 4);
}

TEST(StorePersistenceTest, CompactionKeepsEveryKey) {
  TempDir dir;
  const std::string data = dir.path() + "/data";
  std::map<std::string, std::string> expected;
  {
    auto options = persisting(data);
    options.compactBytes = 4096;
    TCPStoreServer server(options);
    TCPStore store("127.0.0.1", server.port(), client());
    for (int round = 0; round < 5; ++round) {
      for (int i = 0; i < 60; ++i) {
        const std::string key = "key/" + std::to_string(i);
        const std::string value = std::string(40, static_cast<char>('a' + round)) + key;
        if ((i + round) % 7 == 0) {
          store.deleteKey(key);
          expected.erase(key);
        } else {
          store.set(key, value);
          expected[key] = value;
        }
      }
    }
    EXPECT_EQ(store.add("n", 3), 3);
    expected["n"] = "3";
  }
  // Compacted at least once: a snapshot of a later generation, and no generation-0 log left.
  bool snapshot = false;
  for (const auto& entry : fs::directory_iterator(data)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("snapshot.", 0) == 0) snapshot = true;
    EXPECT_NE(name, "log.0");
    EXPECT_EQ(name.find(".tmp"), std::string::npos) << name;
  }
  EXPECT_TRUE(snapshot);
  TCPStoreServer server(persisting(data));
  EXPECT_EQ(server.numKeysLoaded(), static_cast<int64_t>(expected.size()));
  TCPStore store("127.0.0.1", server.port(), client());
  EXPECT_EQ(store.numKeys(), static_cast<int64_t>(expected.size()));
  for (const auto& [key, value] : expected) EXPECT_EQ(store.getString(key), value) << key;
}

TEST(StorePersistenceTest, ADirectoryServesOneServer) {
  TempDir dir;
  TCPStoreServer first(persisting(dir.path()));
  try {
    TCPStoreServer second(persisting(dir.path()));
    FAIL() << "a second server on the same directory started";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("in use by another store server"), std::string::npos)
        << e.what();
  }
}

// A full disk: the change is refused with an IoError naming the file, the client's store stays
// usable, and a restart has every key but the refused one. Needs a small tmpfs, mounted in a
// private mount namespace of a child process (root only).
TEST(StorePersistenceTest, AFullDiskRefusesTheChangeAndLosesNothing) {
  TempDir dir;
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int code = 0;
    try {
      if (::unshare(CLONE_NEWNS) != 0) _exit(77);
      if (::mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) _exit(77);
      if (::mount("tmpfs", dir.path().c_str(), "tmpfs", 0, "size=256k") != 0) _exit(77);
      const std::string data = dir.path() + "/data";
      {
        TCPStoreServer server(persisting(data));
        TCPStore store("127.0.0.1", server.port(), client());
        store.set("before", "1");
        try {
          store.set("big", Bytes(400 * 1024, 7));
          code = 10;  // the store claimed to keep what the disk cannot hold
        } catch (const IoError& e) {
          const std::string what = e.what();
          if (what.find("No space left") == std::string::npos ||
              what.find(data + "/log.0") == std::string::npos) {
            fprintf(stderr, "unexpected error: %s\n", what.c_str());
            code = 11;
          }
        }
        if (code == 0 && store.check({"big"})) code = 12;
        if (code == 0) store.set("after", "2");
      }
      if (code == 0) {
        TCPStoreServer server(persisting(data));
        TCPStore store("127.0.0.1", server.port(), client());
        if (server.numKeysLoaded() != 2 || store.getString("after") != "2" || store.check({"big"}))
          code = 13;
      }
    } catch (const std::exception& e) {
      fprintf(stderr, "child: %s\n", e.what());
      code = 20;
    }
    ::umount(dir.path().c_str());
    _exit(code);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 77) GTEST_SKIP() << "cannot mount a tmpfs (needs root)";
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

// A failed append whose cut back fails too (injected through StoreLogOptions::faultForTest: the
// write leaves a partial record and fails with ENOSPC, the cut back fails with EIO): the log is
// broken, and every later change is refused with an IoError naming both failures instead of
// being acknowledged and then dropped by the next replay, which stops at the partial record.
// A restart cuts the torn record and has every change that was acknowledged.
TEST(StorePersistenceTest, ALogThatCannotBeCutBackRefusesEveryLaterChange) {
  TempDir dir;
  const std::string data = dir.path() + "/data";
  const std::string log = data + "/log.0";
  {
    std::unordered_map<std::string, Bytes> keys;
    bool fail = false;
    StoreLogOptions options;
    options.dir = data;
    options.faultForTest = [&](const char* step, int fd) -> int {
      if (!fail) return 0;
      if (std::strcmp(step, "write") == 0) {
        const ssize_t n = ::write(fd, "LSL1", 4);  // the start of a record, then the disk is full
        return n == 4 ? ENOSPC : EIO;
      }
      return std::strcmp(step, "cut") == 0 ? EIO : 0;
    };
    StoreLog storeLog(options, keys);
    storeLog.append({{"before", Bytes{'1'}}});
    fail = true;
    try {
      storeLog.append({{"refused", Bytes{'2'}}});
      ADD_FAILURE() << "an append whose write failed succeeded";
    } catch (const IoError& e) {
      EXPECT_NE(std::string(e.what()).find("No space left"), std::string::npos) << e.what();
    }
    fail = false;
    for (const char* key : {"after", "later"}) {
      try {
        storeLog.append({{key, Bytes{'3'}}});
        ADD_FAILURE() << "'" << key << "' was stored after a partial record that was not cut back";
      } catch (const IoError& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find(log), std::string::npos) << what;
        EXPECT_NE(what.find("No space left"), std::string::npos) << what;
        EXPECT_NE(what.find("cutting it back"), std::string::npos) << what;
        EXPECT_NE(what.find("Input/output error"), std::string::npos) << what;
      }
    }
    EXPECT_NE(storeLog.broken(), "");
  }
  std::unordered_map<std::string, Bytes> keys;
  testing::internal::CaptureStderr();  // the warning about the torn record
  StoreLogOptions options;
  options.dir = data;
  StoreLog again(options, keys);
  testing::internal::GetCapturedStderr();
  EXPECT_EQ(again.loaded().droppedBytes, 4u);
  EXPECT_EQ(keys.size(), 1u);
  EXPECT_EQ(keys.count("before"), 1u);
  EXPECT_EQ(again.broken(), "");
  again.append({{"after", Bytes{'3'}}});
}

TEST(StorePersistenceTest, ClientsCarryOnAcrossAServerRestart) {
  TempDir dir;
  auto server = std::make_unique<TCPStoreServer>(persisting(dir.path()));
  const int port = server->port();
  TCPStore store("127.0.0.1", port, client(milliseconds(60000)));
  store.set("k", "v");
  EXPECT_EQ(store.add("n", 1), 1);
  // A get parked on the old server goes on waiting on the new one.
  auto parked = std::async(std::launch::async, [&] { return store.getString("later"); });
  Deadline parkedDeadline(milliseconds(30000));
  while (server->numWaiting() == 0 && !parkedDeadline.expired()) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  ASSERT_EQ(server->numWaiting(), 1);
  server.reset();
  server = std::make_unique<TCPStoreServer>(persisting(dir.path(), port));
  EXPECT_EQ(store.getString("k"), "v");
  EXPECT_EQ(store.add("n", 1), 2);
  TCPStore other("127.0.0.1", port, client());
  other.set("later", "here");
  EXPECT_EQ(parked.get(), "here");
}

// A server that dies after reading an add but before answering it: the add may or may not
// have been applied, so the client does not send it again. It says so with an IoError, and the
// store stays usable: the next call reaches the restarted server.
TEST(StorePersistenceTest, AnAddInFlightWhenTheServerDiesIsNotRepeated) {
  net::Socket listener = net::listenOn("127.0.0.1", 0);
  const int port = net::localPort(listener.fd());
  std::thread fake([&] {
    // Speaks just enough of the protocol: answers the hello, reads one request, hangs up.
    net::Socket conn = net::acceptWithDeadline(listener.fd(), Deadline(milliseconds(30000)));
    if (!conn.valid()) return;
    std::vector<uint8_t> in;
    int answered = 0;
    while (answered < 2) {
      uint8_t buf[4096];
      const ssize_t r = ::recv(conn.fd(), buf, sizeof(buf), 0);
      if (r <= 0) return;
      in.insert(in.end(), buf, buf + r);
      store_protocol::Message m;
      const auto result = store_protocol::decode(in.data(), in.size(), m);
      if (result.status != store_protocol::DecodeStatus::kOk) continue;
      in.erase(in.begin(), in.begin() + static_cast<std::ptrdiff_t>(result.consumed));
      if (++answered == 1) {
        const auto ok = store_protocol::encode(
            store_protocol::Message{store_protocol::Op::kOk, m.id, 0, {}, {}});
        net::writeFull(conn.fd(), ok.data(), ok.size(), Deadline(milliseconds(30000)), "client");
      }
    }
    listener = net::Socket();  // the "server" is gone: connection and listener closed
  });
  TCPStore store("127.0.0.1", port, client(milliseconds(60000)));
  try {
    store.add("n", 1);
    FAIL() << "an add whose answer never came succeeded";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("not sent again"), std::string::npos) << e.what();
  }
  fake.join();
  TempDir dir;
  TCPStoreServer server(persisting(dir.path(), port));
  store.set("k", "v");  // the store is still usable, on the new server
  EXPECT_EQ(store.add("n", 1), 1);
}

TEST(StorePersistenceTest, WithoutReconnectALostServerMakesTheStoreUnusable) {
  TempDir dir;
  auto server = std::make_unique<TCPStoreServer>(persisting(dir.path()));
  const int port = server->port();
  TCPStore store("127.0.0.1", port, client(milliseconds(0)));
  store.set("k", "v");
  server.reset();
  server = std::make_unique<TCPStoreServer>(persisting(dir.path(), port));
  EXPECT_THROW(store.get("k"), IoError);
  EXPECT_THROW(store.get("k"), IoError);  // and stays so
}

}  // namespace
}  // namespace loom
