#include "loom/autograd/serialize.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "shape_bytes.h"

namespace loom::ag {

namespace {

static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes little-endian");

const char* safetensorsDType(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "F32";
    case DType::kFloat64:
      return "F64";
    case DType::kInt64:
      return "I64";
    case DType::kBFloat16:
      return "BF16";
    case DType::kFloat16:
      return "F16";
  }
  return "?";
}

std::string readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot open for reading: " + std::strerror(errno));
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw std::runtime_error(path + ": read failed");
  return data;
}

// Writes `tmp` and renames it over `path`; on any failure the temporary file is removed, so a
// failed save (a full disk, say) leaves nothing behind.
void writeFileAtomically(const std::string& path, const std::string& head, const NamedTensors& ts) {
  const std::string tmp = path + ".tmp";
  auto fail = [&](const std::string& what) {
    std::remove(tmp.c_str());
    throw std::runtime_error(what);
  };
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) fail(tmp + ": cannot open for writing: " + std::strerror(errno));
    out.write(head.data(), static_cast<std::streamsize>(head.size()));
    for (const auto& [name, t] : ts) {
      out.write(static_cast<const char*>(t.rawData()), static_cast<std::streamsize>(t.nbytes()));
    }
    out.flush();
    if (!out) fail(tmp + ": write failed: " + std::strerror(errno));
    out.close();
    if (!out) fail(tmp + ": close failed: " + std::strerror(errno));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    fail("rename " + tmp + " -> " + path + " failed: " + std::strerror(errno));
  }
}

}  // namespace

void saveSafetensors(const std::string& path, const NamedTensors& tensors,
                     const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (!t.defined()) throw std::invalid_argument("saveSafetensors: '" + name + "' is undefined");
    if (name == "__metadata__" || header.contains(name)) {
      throw std::invalid_argument("saveSafetensors: duplicate or reserved name '" + name + "'");
    }
    const uint64_t end = offset + t.nbytes();
    header[name] = {{"dtype", safetensorsDType(t.dtype())},
                    {"shape", t.shape()},
                    {"data_offsets", {offset, end}}};
    offset = end;
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string head(8, '\0');
  const uint64_t n = json.size();
  std::memcpy(head.data(), &n, 8);
  head += json;
  writeFileAtomically(path, head, tensors);
}

NamedTensors loadSafetensors(const std::string& path,
                             std::map<std::string, std::string>* metadata) {
  const std::string data = readFile(path);
  if (data.size() < 8) {
    throw std::runtime_error(path + ": not a safetensors file (" + std::to_string(data.size()) +
                             " bytes, the 8-byte header length is missing)");
  }
  uint64_t n = 0;
  std::memcpy(&n, data.data(), 8);
  if (n > data.size() - 8) {
    throw std::runtime_error(path + ": header length " + std::to_string(n) + " exceeds the file (" +
                             std::to_string(data.size()) + " bytes)");
  }
  nlohmann::json header;
  try {
    header =
        nlohmann::json::parse(data.begin() + 8, data.begin() + 8 + static_cast<std::ptrdiff_t>(n));
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(path + ": invalid safetensors header JSON: " + e.what());
  }
  if (!header.is_object())
    throw std::runtime_error(path + ": safetensors header is not a JSON object");
  const char* body = data.data() + 8 + n;
  const uint64_t bodySize = data.size() - 8 - n;
  std::vector<std::pair<uint64_t, std::pair<std::string, Tensor>>> found;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    if (name == "__metadata__") {
      if (metadata != nullptr && it->is_object()) {
        for (auto m = it->begin(); m != it->end(); ++m) {
          if (m->is_string()) (*metadata)[m.key()] = m->get<std::string>();
        }
      }
      continue;
    }
    auto bad = [&](const std::string& why) {
      return std::runtime_error(path + ": tensor '" + name + "': " + why);
    };
    const auto& e = *it;
    if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") ||
        !e.contains("data_offsets")) {
      throw bad("entry needs dtype, shape and data_offsets");
    }
    if (!e["dtype"].is_string()) throw bad("dtype is not a string");
    const std::string dt = e["dtype"].get<std::string>();
    DType dtype;
    if (dt == "F32") {
      dtype = DType::kFloat32;
    } else if (dt == "F64") {
      dtype = DType::kFloat64;
    } else if (dt == "I64") {
      dtype = DType::kInt64;
    } else if (dt == "BF16") {
      dtype = DType::kBFloat16;
    } else if (dt == "F16") {
      dtype = DType::kFloat16;
    } else {
      throw bad("unsupported dtype '" + dt + "' (supported: F32, F64, I64, BF16, F16)");
    }
    Shape shape;
    if (!e["shape"].is_array()) throw bad("shape is not an array");
    for (const auto& d : e["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) throw bad("shape has a bad dimension");
      shape.push_back(d.get<int64_t>());
    }
    const auto& off = e["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
        !off[1].is_number_unsigned()) {
      throw bad("data_offsets must be two non-negative integers");
    }
    const uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
    // Checked before anything is allocated: the shape's size must be what the offsets hold,
    // inside the file.
    uint64_t bytes = 0;
    if (!shapeBytes(shape, dtypeSize(dtype), bytes)) {
      throw bad(dt + " " + shapeToString(shape) + " has more bytes than 64 bits count");
    }
    if (end < begin || end - begin != bytes) {
      throw bad("data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) + "] hold " +
                std::to_string(end >= begin ? end - begin : 0) + " bytes, but " + dt + " " +
                shapeToString(shape) + " needs " + std::to_string(bytes));
    }
    if (end > bodySize) {
      throw bad("data ends at " + std::to_string(end) + ", past the file's " +
                std::to_string(bodySize) + " data bytes (truncated file?)");
    }
    Tensor t = empty(shape, dtype);
    if (t.nbytes() > 0) std::memcpy(t.rawData(), body + begin, t.nbytes());
    found.push_back({begin, {name, t}});
  }
  std::stable_sort(found.begin(), found.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  NamedTensors out;
  out.reserve(found.size());
  for (auto& [off, nt] : found) out.push_back(std::move(nt));
  return out;
}

void saveStateDict(const nn::Module& module, const std::string& path) {
  saveSafetensors(path, module.stateDict());
}

void loadStateDict(nn::Module& module, const std::string& path, bool strict) {
  const NamedTensors state = loadSafetensors(path);
  try {
    module.loadStateDict(state, strict);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(path + ": " + e.what());
  }
}

}  // namespace loom::ag
