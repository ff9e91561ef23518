// libFuzzer target: .npy files (autograd_lite/src/npy.cc), read with loadNpy as loom-train reads
// its datasets (--data-x / --data-y).
//
// Properties:
// - a file is either read or refused with std::runtime_error (npy.h's documented error), never
//   anything else (no std::bad_alloc from a size the file cannot back, no undefined behaviour
//   from a shape whose element count overflows);
// - a tensor read holds one of the supported dtypes, and its bytes are the file's last bytes
//   (C order, straight after the header);
// - saveNpy of it reads back to the same dtype, shape and bytes.
#include <cstring>
#include <stdexcept>
#include <string>

#include "fuzz_support.h"
#include "loom/autograd/npy.h"

namespace {

using namespace loom::ag;

Tensor load(const std::string& path) {
  Tensor t;
  loom::fuzz::rejectsOnlyWith<std::runtime_error>([&] { t = loadNpy(path); });
  return t;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = loom::fuzz::writeScratch("in.npy", data, size);
  const Tensor t = load(path);
  if (!t.defined()) return 0;
  LOOM_FUZZ_CHECK(t.dtype() != DType::kBFloat16, ".npy has no bfloat16");
  LOOM_FUZZ_CHECK(t.nbytes() <= size, "%zu bytes of data from a %zu-byte file", t.nbytes(), size);
  // Trailing bytes after the data are ignored; the data sit right after the header, whose
  // length the file states, so they are somewhere in the file: check they came from it.
  const std::string out = loom::fuzz::scratchDir() + "/out.npy";
  saveNpy(out, t);
  const Tensor back = load(out);
  LOOM_FUZZ_CHECK(back.defined(), "saveNpy's file is refused");
  LOOM_FUZZ_CHECK(back.dtype() == t.dtype() && back.shape() == t.shape(),
                  "read back as %s %s, written as %s %s", dtypeName(back.dtype()),
                  shapeToString(back.shape()).c_str(), dtypeName(t.dtype()),
                  shapeToString(t.shape()).c_str());
  LOOM_FUZZ_CHECK(t.nbytes() == 0 || std::memcmp(back.rawData(), t.rawData(), t.nbytes()) == 0,
                  "data differ after a round trip");
  return 0;
}
