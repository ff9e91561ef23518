// What the libFuzzer targets share (docs/fuzz.md): a property check that stops the run with a
// message (libFuzzer then saves the input as crash-*), the rule that a parser's errors are of its
// documented type and nothing else, and files in a private temporary directory for parsers that
// read a path.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <string>
#include <system_error>
#include <typeinfo>

namespace loom::fuzz {

// Fails the run when `cond` is false: the property the target asserts does not hold.
#define LOOM_FUZZ_CHECK(cond, ...)                                                     \
  do {                                                                                 \
    if (!(cond)) {                                                                     \
      std::fprintf(stderr, "%s:%d: property failed: %s\n", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, "  " __VA_ARGS__);                                          \
      std::fprintf(stderr, "\n");                                                      \
      std::abort();                                                                    \
    }                                                                                  \
  } while (0)

// Runs `parse`; an exception of type `Allowed` (the parser's documented error) is a rejection
// and returns false, anything else thrown fails the run naming its type and message.
template <class Allowed, class F>
bool rejectsOnlyWith(F&& parse) {
  try {
    parse();
    return true;
  } catch (const Allowed& e) {
    LOOM_FUZZ_CHECK(e.what() != nullptr && *e.what() != '\0', "an error without a message");
    return false;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "undocumented exception %s: %s\n", typeid(e).name(), e.what());
    std::abort();
  } catch (...) {
    std::fprintf(stderr, "undocumented exception that is not a std::exception\n");
    std::abort();
  }
}

// A directory of this process's own (under /dev/shm when it exists: no disk writes), removed
// at exit. Files in it are rewritten for every input.
inline const std::string& scratchDir() {
  static const std::string dir = [] {
    std::string base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    std::string templ = base + "/loom-fuzz-XXXXXX";
    if (mkdtemp(templ.data()) == nullptr) {
      std::perror("mkdtemp");
      std::abort();
    }
    static std::string removeAtExit = templ;
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(removeAtExit, ec);
    });
    return templ;
  }();
  return dir;
}

// Writes `data` to `name` in scratchDir() and returns the path.
inline std::string writeScratch(const std::string& name, const uint8_t* data, size_t size) {
  const std::string path = scratchDir() + "/" + name;
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    std::perror(path.c_str());
    std::abort();
  }
  size_t done = 0;
  while (done < size) {
    const ssize_t w = ::write(fd, data + done, size - done);
    if (w <= 0) {
      std::perror("write");
      std::abort();
    }
    done += static_cast<size_t>(w);
  }
  ::close(fd);
  return path;
}

}  // namespace loom::fuzz
