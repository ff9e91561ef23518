#include "loom/autograd/npy.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string>

#include "shape_bytes.h"

namespace loom::ag {

namespace {

static_assert(std::endian::native == std::endian::little, ".npy I/O assumes little-endian");

constexpr char kMagic[] = "\x93NUMPY";

// The value text after 'key': in the header dict, up to the next top-level ',' or '}'.
std::string headerField(const std::string& header, const std::string& key,
                        const std::string& path) {
  const std::string quoted[] = {"'" + key + "'", "\"" + key + "\""};
  size_t pos = std::string::npos;
  for (const auto& q : quoted) {
    pos = header.find(q);
    if (pos != std::string::npos) {
      pos += q.size();
      break;
    }
  }
  if (pos == std::string::npos) {
    throw std::runtime_error(path + ": .npy header has no '" + key + "' field: " + header);
  }
  pos = header.find(':', pos);
  if (pos == std::string::npos)
    throw std::runtime_error(path + ": malformed .npy header: " + header);
  ++pos;
  while (pos < header.size() && header[pos] == ' ') ++pos;
  int depth = 0;
  size_t end = pos;
  for (; end < header.size(); ++end) {
    const char c = header[end];
    if (c == '(' || c == '[') ++depth;
    if (c == ')' || c == ']') --depth;
    if (depth == 0 && (c == ',' || c == '}')) break;
  }
  std::string v = header.substr(pos, end - pos);
  while (!v.empty() && v.back() == ' ') v.pop_back();
  return v;
}

}  // namespace

Tensor loadNpy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot open for reading: " + std::strerror(errno));
  // Lengths are checked against what the file holds before anything is allocated for them.
  in.seekg(0, std::ios::end);
  const auto fileBytes = static_cast<uint64_t>(std::max<std::streamoff>(in.tellg(), 0));
  in.seekg(0);
  const auto left = [&] {
    return fileBytes - std::min<uint64_t>(fileBytes, static_cast<uint64_t>(in.tellg()));
  };
  char magic[8];
  if (!in.read(magic, 8) || std::memcmp(magic, kMagic, 6) != 0) {
    throw std::runtime_error(path + ": not a .npy file (missing the \\x93NUMPY magic)");
  }
  const int major = static_cast<unsigned char>(magic[6]);
  uint32_t headerLen = 0;
  if (major == 1) {
    unsigned char b[2];
    if (!in.read(reinterpret_cast<char*>(b), 2))
      throw std::runtime_error(path + ": truncated .npy header");
    headerLen = b[0] | (b[1] << 8);
  } else if (major == 2 || major == 3) {
    unsigned char b[4];
    if (!in.read(reinterpret_cast<char*>(b), 4))
      throw std::runtime_error(path + ": truncated .npy header");
    headerLen = b[0] | (b[1] << 8) | (b[2] << 16) | (static_cast<uint32_t>(b[3]) << 24);
  } else {
    throw std::runtime_error(path + ": unsupported .npy format version " + std::to_string(major) +
                             "." + std::to_string(static_cast<unsigned char>(magic[7])) +
                             " (supported: 1.0, 2.0, 3.0)");
  }
  if (headerLen > left()) {
    throw std::runtime_error(path + ": truncated .npy header (" + std::to_string(headerLen) +
                             " bytes declared, " + std::to_string(left()) + " in the file)");
  }
  std::string header(headerLen, '\0');
  if (!in.read(header.data(), headerLen))
    throw std::runtime_error(path + ": truncated .npy header");

  std::string descr = headerField(header, "descr", path);
  if (descr.size() >= 2 && (descr.front() == '\'' || descr.front() == '"')) {
    descr = descr.substr(1, descr.size() - 2);
  }
  DType dtype;
  if (descr == "<f4") {
    dtype = DType::kFloat32;
  } else if (descr == "<i8") {
    dtype = DType::kInt64;
  } else if (descr == "<f8") {
    dtype = DType::kFloat64;
  } else if (descr == "<f2") {
    dtype = DType::kFloat16;
  } else {
    throw std::runtime_error(
        path + ": unsupported .npy dtype '" + descr +
        "' (supported: '<f4' float32, '<f8' float64, '<i8' int64, '<f2' float16; "
        "convert with arr.astype(...))");
  }
  const std::string fortran = headerField(header, "fortran_order", path);
  if (fortran != "False") {
    throw std::runtime_error(path +
                             ": Fortran-order .npy arrays are not supported "
                             "(save with np.ascontiguousarray)");
  }
  const std::string shapeText = headerField(header, "shape", path);
  if (shapeText.size() < 2 || shapeText.front() != '(' || shapeText.back() != ')') {
    throw std::runtime_error(path + ": malformed .npy shape '" + shapeText + "'");
  }
  Shape shape;
  std::string inner = shapeText.substr(1, shapeText.size() - 2);
  size_t pos = 0;
  while (pos < inner.size()) {
    while (pos < inner.size() && (inner[pos] == ' ' || inner[pos] == ',')) ++pos;
    if (pos >= inner.size()) break;
    size_t used = 0;
    long long d = 0;
    try {
      d = std::stoll(inner.substr(pos), &used);
    } catch (const std::exception&) {
      throw std::runtime_error(path + ": malformed .npy shape '" + shapeText + "'");
    }
    if (d < 0) throw std::runtime_error(path + ": negative dimension in .npy shape " + shapeText);
    shape.push_back(d);
    pos += used;
  }
  uint64_t bytes = 0;
  if (!shapeBytes(shape, dtypeSize(dtype), bytes) || bytes > left()) {
    throw std::runtime_error(path + ": truncated .npy data: " + shapeToString(shape) + " " +
                             dtypeName(dtype) + " needs more than the file's " +
                             std::to_string(left()) + " bytes after the header");
  }
  Tensor t = empty(shape, dtype);
  if (t.nbytes() > 0 &&
      !in.read(static_cast<char*>(t.rawData()), static_cast<std::streamsize>(t.nbytes()))) {
    throw std::runtime_error(path + ": truncated .npy data: " + shapeToString(shape) + " " +
                             dtypeName(dtype) + " needs " + std::to_string(t.nbytes()) + " bytes");
  }
  return t;
}

void saveNpy(const std::string& path, const Tensor& tensor) {
  if (!tensor.defined()) throw std::invalid_argument("saveNpy: tensor is undefined");
  const char* descr = "";
  switch (tensor.dtype()) {
    case DType::kFloat32:
      descr = "<f4";
      break;
    case DType::kFloat64:
      descr = "<f8";
      break;
    case DType::kInt64:
      descr = "<i8";
      break;
    case DType::kFloat16:
      descr = "<f2";
      break;
    case DType::kBFloat16:
      throw std::invalid_argument(
          "saveNpy: .npy has no bfloat16 dtype; save t.to(DType::kFloat32) (" + path + ")");
  }
  std::string shape = "(";
  for (int64_t d : tensor.shape()) shape += std::to_string(d) + ", ";
  if (tensor.dim() > 1) shape.resize(shape.size() - 2);
  if (tensor.dim() == 1) shape.resize(shape.size() - 1);
  shape += ")";
  std::string header =
      std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw std::runtime_error(path + ": cannot open for writing: " + std::strerror(errno));
  out.write(kMagic, 6);
  const char version[2] = {1, 0};
  out.write(version, 2);
  const uint16_t len = static_cast<uint16_t>(header.size());
  const char lenBytes[2] = {static_cast<char>(len & 0xff), static_cast<char>(len >> 8)};
  out.write(lenBytes, 2);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(static_cast<const char*>(tensor.rawData()),
            static_cast<std::streamsize>(tensor.nbytes()));
  if (!out) throw std::runtime_error(path + ": write failed");
}

}  // namespace loom::ag
