// FileStore specifics: crash-torn records, corrupt records, a full disk, a lock holder that
// stopped.
#include "loom/store/file_store.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>

#include "loom/common/error.h"
#include "loom/testing/errors.h"
#include "loom/testing/ranks.h"

namespace loom {
namespace {

off_t fileSize(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0);
  return st.st_size;
}

// A process that holds the file's lock and does not let go (stopped, or its NFS host frozen)
// makes every operation a TimeoutError at the store's timeout that names the holder; it
// blocked in flock() without end.
TEST(FileStoreLog, AHolderThatKeepsTheLockIsATimeoutNamingIt) {
  testing::TempDir dir;
  const std::string path = dir.file("store");
  FileStoreOptions options;
  options.timeout = std::chrono::milliseconds(300);
  FileStore store(path, options);
  store.set("before", std::string_view("1"));
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t holder = ::fork();
  if (holder == 0) {
    const int fd = ::open(path.c_str(), O_RDWR);
    if (fd < 0 || ::flock(fd, LOCK_EX) != 0) ::_exit(1);
    if (::write(ready[1], "x", 1) != 1) ::_exit(1);
    ::sleep(60);  // the test kills it long before
    ::_exit(0);
  }
  char byte = 0;
  ASSERT_EQ(::read(ready[0], &byte, 1), 1);
  const std::string name = "pid " + std::to_string(holder) + " (WRITE)";
  const std::string set = testing::messageOf<TimeoutError>([&] { store.set("a", "1"); });
  EXPECT_NE(set.find("FileStore " + path + ": could not take its exclusive file lock"),
            std::string::npos)
      << set;
  EXPECT_NE(set.find(name), std::string::npos) << set;
  const std::string get = testing::messageOf<TimeoutError>([&] { store.get("before"); });
  EXPECT_NE(get.find("shared file lock"), std::string::npos) << get;
  EXPECT_NE(get.find(name), std::string::npos) << get;
  ::kill(holder, SIGKILL);
  int status = 0;
  ::waitpid(holder, &status, 0);
  ::close(ready[0]);
  ::close(ready[1]);
  // Once the holder is gone, nothing is lost and the store works on.
  store.set("a", std::string_view("2"));
  EXPECT_EQ(store.getString("a"), "2");
  EXPECT_EQ(store.getString("before"), "1");
}

TEST(FileStoreLog, TornTailIsIgnoredAndCutOffByTheNextWriter) {
  testing::TempDir dir;
  const std::string path = dir.file("store");
  {
    FileStore s(path);
    s.set("a", std::string_view("1"));
    s.set("b", std::string_view("2"));
  }
  const off_t good = fileSize(path);
  {
    // What a writer killed in the middle of a record leaves: a header and half a body.
    std::ofstream out(path, std::ios::binary | std::ios::app);
    const unsigned char torn[] = {'L', 'F', 'S', '1', 0, 0, 0, 40, 1, 2, 3, 4, 1, 0, 0};
    out.write(reinterpret_cast<const char*>(torn), sizeof(torn));
  }
  FileStore reader(path);
  EXPECT_EQ(reader.getString("a"), "1");
  EXPECT_EQ(reader.getString("b"), "2");
  EXPECT_EQ(reader.numKeys(), 2);
  ::testing::internal::CaptureStderr();
  reader.set("c", std::string_view("3"));
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("cutting off 15 byte(s)"), std::string::npos) << log;
  EXPECT_NE(log.find(path), std::string::npos) << log;
  FileStore again(path);
  EXPECT_EQ(again.getString("c"), "3");
  EXPECT_EQ(again.numKeys(), 3);
  EXPECT_GT(fileSize(path), good);
}

TEST(FileStoreLog, RecordWithABadChecksumIsNotBelieved) {
  testing::TempDir dir;
  const std::string path = dir.file("store");
  {
    FileStore s(path);
    s.set("kept", std::string_view("yes"));
    s.set("flipped", std::string_view("value"));
  }
  {
    // Flip the last byte of the last record's value.
    const int fd = ::open(path.c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    const off_t last = fileSize(path) - 1;
    char c = 0;
    ASSERT_EQ(::pread(fd, &c, 1, last), 1);
    c ^= 0x20;
    ASSERT_EQ(::pwrite(fd, &c, 1, last), 1);
    ::close(fd);
  }
  FileStore s(path);
  EXPECT_EQ(s.getString("kept"), "yes");
  EXPECT_FALSE(s.check({"flipped"}));
}

TEST(FileStoreLog, DeletesAreCountedAcrossReopens) {
  testing::TempDir dir;
  const std::string path = dir.file("store");
  {
    FileStore s(path);
    s.multiSet({"x", "y", "z"}, {toBytes("1"), toBytes("2"), toBytes("3")});
    EXPECT_TRUE(s.deleteKey("y"));
    s.add("x", 5);
  }
  FileStore s(path);
  EXPECT_EQ(s.numKeys(), 2);
  EXPECT_EQ(s.getString("x"), "6");
  EXPECT_FALSE(s.check({"y"}));
}

TEST(FileStoreLog, FullDiskIsAnIoErrorNamingTheFile) {
  const int probe = ::open("/dev/full", O_RDWR);
  if (probe < 0) GTEST_SKIP() << "/dev/full cannot be opened here";
  ::close(probe);
  FileStore s("/dev/full");
  try {
    s.set("k", std::string_view("v"));
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("/dev/full"), std::string::npos) << what;
    EXPECT_NE(what.find("No space left"), std::string::npos) << what;
  }
}

TEST(FileStoreLog, UnopenableFileNamesThePath) {
  try {
    FileStore s("/nonexistent-dir/store");
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent-dir/store"), std::string::npos);
  }
}

}  // namespace
}  // namespace loom
