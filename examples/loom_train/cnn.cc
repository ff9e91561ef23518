// --model cnn: a small conv net on scikit-learn's 8x8 digits (1797 images, 10 classes).
//
// Data: --data-dir holds digits_{train,val}_x.npy (float32 [N, 64], pixels / 16, row-major
// 8x8) and digits_{train,val}_y.npy (int64 [N] in [0, 10)), written by
// examples/loom_train/data/make_digits.py. The model, as nn.Sequential in PyTorch:
//   0 Conv2d(1, 16, 3, padding 1), 1 ReLU, 2 MaxPool2d(2)    [N, 1, 8, 8] -> [N, 16, 4, 4]
//   3 Conv2d(16, 32, 3, padding 1), 4 ReLU, 5 MaxPool2d(2)   -> [N, 32, 2, 2]
//   6 Flatten, 7 Linear(128, 10)                             -> [N, 10]
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "loom/autograd/engine.h"
#include "loom/autograd/npy.h"
#include "loom/autograd/ops.h"
#include "loom/common/error.h"
#include "model_tasks.h"

namespace loom::train {
namespace {

namespace nn = ag::nn;
constexpr int64_t kSide = 8, kClasses = 10;

struct Split {
  ag::Tensor x, y;  // x: [N, 64] float32, y: [N] int64
};

Split loadSplit(const std::string& dir, const std::string& name) {
  Split s;
  const std::string xPath = dir + "/digits_" + name + "_x.npy";
  const std::string yPath = dir + "/digits_" + name + "_y.npy";
  for (const auto& p : {xPath, yPath}) {
    LOOM_CHECK(std::filesystem::exists(p), "--data-dir: ", p,
               " is missing (write the digits with /usr/bin/python3 "
               "examples/loom_train/data/make_digits.py ",
               dir, ")");
  }
  s.x = ag::loadNpy(xPath);
  s.y = ag::loadNpy(yPath);
  LOOM_CHECK(s.x.dtype() == ag::DType::kFloat32 && s.x.dim() == 2 && s.x.size(1) == kSide * kSide,
             xPath, ": expected float32 [N, 64], got ", ag::dtypeName(s.x.dtype()), " ",
             ag::shapeToString(s.x.shape()));
  LOOM_CHECK(s.y.dtype() == ag::DType::kInt64 && s.y.dim() == 1 && s.y.size(0) == s.x.size(0),
             yPath, ": expected int64 [", s.x.size(0), "], got ", ag::dtypeName(s.y.dtype()), " ",
             ag::shapeToString(s.y.shape()));
  LOOM_CHECK(s.x.size(0) >= 1, xPath, ": no rows");
  for (int64_t i = 0; i < s.y.numel(); ++i) {
    const int64_t label = s.y.data<int64_t>()[i];
    LOOM_CHECK(label >= 0 && label < kClasses, yPath, ": label ", label, " at row ", i,
               " is outside [0, 10)");
  }
  return s;
}

// Copies rows of src ([N, ...]) into dst ([rows.size(), ...]).
void gather(const ag::Tensor& src, const std::vector<int64_t>& rows, ag::Tensor& dst) {
  const size_t rowBytes = src.nbytes() / static_cast<size_t>(src.size(0));
  for (size_t i = 0; i < rows.size(); ++i) {
    std::memcpy(static_cast<char*>(dst.rawData()) + i * rowBytes,
                static_cast<const char*>(src.rawData()) + rows[i] * rowBytes, rowBytes);
  }
}

class CnnTask : public Task {
 public:
  CnnTask(const ModelArgs& a, uint64_t seed) : args_(a) {
    LOOM_CHECK(!a.dataDir.empty(),
               "--model cnn needs --data-dir DIR with the digits .npy files (write them with "
               "/usr/bin/python3 examples/loom_train/data/make_digits.py DIR)");
    train_ = loadSplit(a.dataDir, "train");
    val_ = loadSplit(a.dataDir, "val");
    nn::Conv2dOptions c1, c2;
    c1.padding = c2.padding = 1;
    c1.seed = seed * 1000;
    c2.seed = seed * 1000 + 1;
    nn::LinearOptions lo;
    lo.seed = seed * 1000 + 2;
    model_ = std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
        std::make_shared<nn::Conv2d>(1, 16, 3, c1), std::make_shared<nn::ReLU>(),
        std::make_shared<nn::MaxPool2d>(2), std::make_shared<nn::Conv2d>(16, 32, 3, c2),
        std::make_shared<nn::ReLU>(), std::make_shared<nn::MaxPool2d>(2),
        std::make_shared<nn::Flatten>(), std::make_shared<nn::Linear>(32 * 2 * 2, kClasses, lo)});
  }

  std::shared_ptr<nn::Module> model() const override { return model_; }
  int64_t trainRows() const override { return train_.x.size(0); }
  ag::Tensor makeInputs(int64_t batch) const override {
    return ag::empty({batch, 1, kSide, kSide});
  }
  ag::Tensor makeTargets(int64_t batch) const override {
    return ag::empty({batch}, ag::DType::kInt64);
  }
  void fillBatch(const std::vector<int64_t>& rows, ag::Tensor& x, ag::Tensor& y) const override {
    gather(train_.x, rows, x);
    gather(train_.y, rows, y);
  }
  ag::Tensor loss(const ag::Tensor& output, const ag::Tensor& y) const override {
    return ag::crossEntropy(output, y);
  }

  EvalResult evaluate(ProcessGroup& pg) override {
    ag::NoGradGuard noGrad;
    model_->eval();
    EvalResult result = evaluateSplit(pg, val_.x.size(0), args_.evalBatch,
                                      [&](const std::vector<int64_t>& rows, double* out) {
                                        const int64_t b = static_cast<int64_t>(rows.size());
                                        ag::Tensor x = makeInputs(b), y = makeTargets(b);
                                        gather(val_.x, rows, x);
                                        gather(val_.y, rows, y);
                                        const ag::Tensor logits = (*model_)(x);  // [b, 10]
                                        std::vector<double> loss(rows.size()), correct(rows.size());
                                        scoreRows(logits.data<float>(), y.data<int64_t>(), b,
                                                  kClasses, loss.data(), correct.data());
                                        for (int64_t i = 0; i < b; ++i) {
                                          out[2 * i] = loss[i];
                                          out[2 * i + 1] = correct[i];
                                        }
                                      });
    model_->train();
    return result;
  }

  std::string describe(const EvalResult& r) const override {
    char buf[128];
    std::snprintf(buf, sizeof buf, "validation loss %.4f, accuracy %.2f%% (%lld images)", r.loss,
                  100 * r.accuracy, static_cast<long long>(val_.x.size(0)));
    return buf;
  }

 private:
  ModelArgs args_;
  Split train_, val_;
  std::shared_ptr<nn::Sequential> model_;
};

}  // namespace

std::unique_ptr<Task> makeCnnTask(const ModelArgs& args, uint64_t seed) {
  return std::make_unique<CnnTask>(args, seed);
}

}  // namespace loom::train
