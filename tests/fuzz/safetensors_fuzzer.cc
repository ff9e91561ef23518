// libFuzzer target: safetensors files (autograd_lite/src/serialize.cc), read with
// loadSafetensors as loom-train reads initial weights and loadStateDict reads checkpoints.
//
// Properties:
// - a file is either read or refused with std::runtime_error (serialize.h's documented error for
//   malformed files), never anything else (no std::bad_alloc or nlohmann exception escaping, no
//   allocation the file cannot back, no undefined behaviour from an overflowing shape);
// - every tensor read has its declared bytes, taken from inside the file;
// - saveSafetensors of what was read (tensors in file order, and the metadata) reads back to the
//   same names, dtypes, shapes, bytes and metadata.
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>

#include "fuzz_support.h"
#include "loom/autograd/serialize.h"

namespace {

using namespace loom::ag;

bool load(const std::string& path, NamedTensors& out, std::map<std::string, std::string>& meta) {
  return loom::fuzz::rejectsOnlyWith<std::runtime_error>(
      [&] { out = loadSafetensors(path, &meta); });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = loom::fuzz::writeScratch("in.safetensors", data, size);
  NamedTensors tensors;
  std::map<std::string, std::string> meta;
  if (!load(path, tensors, meta)) return 0;
  size_t total = 0;
  for (const auto& [name, t] : tensors) {
    LOOM_FUZZ_CHECK(t.defined() && name != "__metadata__", "bad entry '%s'", name.c_str());
    LOOM_FUZZ_CHECK(t.nbytes() <= size, "tensor '%s' of %zu bytes from a %zu-byte file",
                    name.c_str(), t.nbytes(), size);
    total += t.nbytes();
  }
  (void)total;  // tensors may share bytes: no bound on the sum
  const std::string out = loom::fuzz::scratchDir() + "/out.safetensors";
  saveSafetensors(out, tensors, meta);
  NamedTensors back;
  std::map<std::string, std::string> metaBack;
  LOOM_FUZZ_CHECK(load(out, back, metaBack), "saveSafetensors' file is refused");
  LOOM_FUZZ_CHECK(back.size() == tensors.size(), "%zu tensors read back, %zu written", back.size(),
                  tensors.size());
  LOOM_FUZZ_CHECK(metaBack == meta, "metadata differ after a round trip");
  for (size_t i = 0; i < back.size(); ++i) {
    const auto& [name, t] = tensors[i];
    const auto& [nameBack, b] = back[i];
    LOOM_FUZZ_CHECK(nameBack == name && b.dtype() == t.dtype() && b.shape() == t.shape(),
                    "'%s' %s %s read back as '%s' %s %s", name.c_str(), dtypeName(t.dtype()),
                    shapeToString(t.shape()).c_str(), nameBack.c_str(), dtypeName(b.dtype()),
                    shapeToString(b.shape()).c_str());
    LOOM_FUZZ_CHECK(t.nbytes() == 0 || std::memcmp(b.rawData(), t.rawData(), t.nbytes()) == 0,
                    "'%s': data differ after a round trip", name.c_str());
  }
  return 0;
}
