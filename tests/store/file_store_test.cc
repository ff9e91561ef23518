// FileStore specifics: crash-torn records, corrupt records, a full disk.
#include "loom/store/file_store.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

#include "loom/common/error.h"
#include "loom/testing/ranks.h"

namespace loom {
namespace {

off_t fileSize(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0);
  return st.st_size;
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
