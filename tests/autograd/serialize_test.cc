// safetensors and .npy: round trips, files made by Python, errors for bad files, and a failed
// save that leaves no temporary file.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "loom/testing/ranks.h"
#include "test_util.h"

namespace loom::ag {
namespace {

void writeBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}

template <class E>
void expectError(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    FAIL() << "expected an error containing '" << needle << "'";
  } catch (const E& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Safetensors, RoundTripAllDTypes) {
  loom::testing::TempDir dir;
  Generator gen(3);
  nn::NamedTensors in = {{"a", randn({3, 5}, gen)},
                         {"b.c", randn({7}, gen, DType::kFloat64)},
                         {"n", fromVector(std::vector<int64_t>{-5, 1LL << 40})},
                         {"scalar", scalarTensor(2.5)},
                         {"empty", zeros({0, 4})}};
  const std::string path = dir.path() + "/t.safetensors";
  saveSafetensors(path, in, {{"note", "hi"}});
  std::map<std::string, std::string> meta;
  nn::NamedTensors out = loadSafetensors(path, &meta);
  ASSERT_EQ(out.size(), in.size());
  EXPECT_EQ(meta["note"], "hi");
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ(out[i].first, in[i].first);
    EXPECT_EQ(out[i].second.shape(), in[i].second.shape());
    EXPECT_EQ(out[i].second.dtype(), in[i].second.dtype());
    EXPECT_EQ(0,
              std::memcmp(out[i].second.rawData(), in[i].second.rawData(), in[i].second.nbytes()));
  }
  // The header length is a multiple of 8 and the data follows it.
  std::ifstream f(path, std::ios::binary);
  uint64_t n = 0;
  f.read(reinterpret_cast<char*>(&n), 8);
  EXPECT_EQ(n % 8, 0u);
}

TEST(Safetensors, ModuleRoundTrip) {
  loom::testing::TempDir dir;
  auto make = [](uint64_t seed) {
    return std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
        std::make_shared<nn::Linear>(3, 4, nn::LinearOptions{.seed = seed}),
        std::make_shared<nn::BatchNorm1d>(4)});
  };
  auto a = make(1), b = make(2);
  Generator gen(1);
  (*a)(randn({5, 3}, gen));  // moves the running statistics
  const std::string path = dir.path() + "/m.safetensors";
  saveStateDict(*a, path);
  loadStateDict(*b, path);
  auto sa = a->stateDict(), sb = b->stateDict();
  for (size_t i = 0; i < sa.size(); ++i) {
    EXPECT_EQ(0, std::memcmp(sa[i].second.rawData(), sb[i].second.rawData(), sa[i].second.nbytes()))
        << sa[i].first;
  }
  EXPECT_EQ(b->stateDict()[6].second.item(), 1.0);  // num_batches_tracked
  auto other = std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(3, 5), std::make_shared<nn::BatchNorm1d>(5)});
  expectError<std::invalid_argument>([&] { loadStateDict(*other, path); },
                                     "'0.weight' has shape [4, 3], expected [5, 3]");
}

TEST(Safetensors, BadFiles) {
  loom::testing::TempDir dir;
  const std::string p = dir.path() + "/bad.safetensors";
  expectError<std::runtime_error>([&] { loadSafetensors(dir.path() + "/none"); }, "cannot open");
  writeBytes(p, "abc");
  expectError<std::runtime_error>([&] { loadSafetensors(p); }, "8-byte header length");
  auto withHeader = [&](const std::string& json, const std::string& body) {
    std::string bytes(8, '\0');
    const uint64_t n = json.size();
    std::memcpy(bytes.data(), &n, 8);
    writeBytes(p, bytes + json + body);
  };
  withHeader("{not json", "");
  expectError<std::runtime_error>([&] { loadSafetensors(p); }, "invalid safetensors header JSON");
  withHeader(R"({"w":{"dtype":"I8","shape":[2],"data_offsets":[0,4]}})", "1234");
  expectError<std::runtime_error>([&] { loadSafetensors(p); },
                                  "tensor 'w': unsupported dtype 'I8'");
  withHeader(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", "1234");
  expectError<std::runtime_error>([&] { loadSafetensors(p); }, "needs 8");
  withHeader(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", "1234");
  expectError<std::runtime_error>([&] { loadSafetensors(p); }, "truncated");
  std::string big(8, '\0');
  const uint64_t huge = 1000;
  std::memcpy(big.data(), &huge, 8);
  writeBytes(p, big + "{}");
  expectError<std::runtime_error>([&] { loadSafetensors(p); }, "exceeds the file");
}

// A save that fails (here the rename: the name is taken by a non-empty directory) throws naming
// the cause and leaves no path.tmp behind (a job failing to save on a full disk piled them up).
TEST(Safetensors, AFailedSaveRemovesItsTemporaryFile) {
  loom::testing::TempDir dir;
  const std::string p = dir.path() + "/w.safetensors";
  std::filesystem::create_directories(p + "/occupied");
  const NamedTensors tensors{{"w", zeros({4, 4})}};
  expectError<std::runtime_error>([&] { saveSafetensors(p, tensors); }, "rename " + p + ".tmp");
  EXPECT_FALSE(std::filesystem::exists(p + ".tmp"));
}

TEST(Npy, FilesWrittenByNumpy) {
  Tensor a = loadNpy(test_util::fixturePath("npy/f32_2x3.npy"));
  EXPECT_EQ(a.shape(), (Shape{2, 3}));
  EXPECT_EQ(a.toVector<float>(), (std::vector<float>{-1, -0.5, 0, 0.5, 1, 1.5}));
  Tensor b = loadNpy(test_util::fixturePath("npy/i64_4.npy"));
  EXPECT_EQ(b.toVector<int64_t>(), (std::vector<int64_t>{3, -1, 7, 0}));
  Tensor c = loadNpy(test_util::fixturePath("npy/f32_scalar.npy"));
  EXPECT_EQ(c.dim(), 0);
  EXPECT_EQ(c.item(), 2.5);
  expectError<std::runtime_error>([] { loadNpy(test_util::fixturePath("npy/i32_3.npy")); },
                                  "unsupported .npy dtype '<i4'");
  expectError<std::runtime_error>([] { loadNpy(test_util::fixturePath("npy/f32_be.npy")); },
                                  "unsupported .npy dtype '>f4'");
  expectError<std::runtime_error>([] { loadNpy(test_util::fixturePath("npy/f32_fortran.npy")); },
                                  "Fortran-order");
}

TEST(Npy, RoundTripAndTruncation) {
  loom::testing::TempDir dir;
  Generator gen(2);
  for (const Tensor& t : {randn({4, 5}, gen), randn({3}, gen, DType::kFloat64),
                          fromVector(std::vector<int64_t>{1, 2, 3}, {3, 1})}) {
    const std::string p = dir.path() + "/x.npy";
    saveNpy(p, t);
    Tensor back = loadNpy(p);
    EXPECT_EQ(back.shape(), t.shape());
    EXPECT_EQ(back.dtype(), t.dtype());
    EXPECT_EQ(0, std::memcmp(back.rawData(), t.rawData(), t.nbytes()));
  }
  const std::string p = dir.path() + "/t.npy";
  saveNpy(p, zeros({10}));
  std::string bytes;
  {
    std::ifstream in(p, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  writeBytes(p, bytes.substr(0, bytes.size() - 4));
  expectError<std::runtime_error>([&] { loadNpy(p); }, "truncated .npy data");
  writeBytes(p, "hello world");
  expectError<std::runtime_error>([&] { loadNpy(p); }, "not a .npy file");
}

}  // namespace
}  // namespace loom::ag
