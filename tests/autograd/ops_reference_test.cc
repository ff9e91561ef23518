// The new ops and modules against values PyTorch 1.13 computed (fixtures/ops_reference.json,
// made by fixtures/make_ops_references.py): outputs and the gradients of sum(out * w).
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "test_util.h"

namespace loom::ag {
namespace {

using nlohmann::json;

const json& reference() {
  static const json ref = test_util::loadJson("ops_reference.json");
  return ref;
}

Tensor fromJson(const json& j) {
  const Shape shape = j["shape"].get<Shape>();
  if (j["dtype"] == "int64") {
    return fromVector(j["data"].get<std::vector<int64_t>>(), shape.empty() ? Shape{} : shape)
        .reshape(shape);
  }
  return fromVector(j["data"].get<std::vector<float>>(), shape.empty() ? Shape{1} : shape)
      .reshape(shape);
}

// Max |a - b| / (1 + |b|) over elements: relative for large values, absolute near zero.
void expectClose(const Tensor& got, const json& want, const std::string& what, double tol = 2e-5) {
  ASSERT_TRUE(got.defined()) << what << ": undefined";
  ASSERT_EQ(got.shape(), want["shape"].get<Shape>()) << what;
  const auto w = want["data"].get<std::vector<double>>();
  const Tensor g = got.dtype() == DType::kFloat32 ? got : got.to(DType::kFloat32);
  const float* p = g.data<float>();
  double worst = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    worst = std::max(worst, std::abs(p[i] - w[i]) / (1.0 + std::abs(w[i])));
  }
  EXPECT_LE(worst, tol) << what << ": max relative difference " << worst;
}

// Runs one case: leaves from the fixture's inputs (float ones require grad), out = f(inputs),
// backward of sum(out * w), then output and every gradient compared.
void runCase(const std::string& name,
             const std::function<Tensor(std::map<std::string, Tensor>&)>& f, double tol = 2e-5) {
  SCOPED_TRACE(name);
  const json& c = reference().at(name);
  std::map<std::string, Tensor> in;
  for (const auto& [n, t] : c["inputs"].items()) {
    in[n] = fromJson(t);
    if (in[n].dtype() == DType::kFloat32) in[n].setRequiresGrad(true);
  }
  Tensor out = f(in);
  expectClose(out, c["output"], name + " output", tol);
  sum(mul(out, fromJson(c["w"]))).backward();
  for (const auto& [n, g] : c["grads"].items())
    expectClose(in[n].grad(), g, name + " grad " + n, tol);
}

TEST(OpsReference, Matmul) {
  for (const char* n : {"matmul_batched", "matmul_shared_rhs", "matmul_shared_lhs"}) {
    runCase(n, [](auto& in) { return matmul(in["a"], in["b"]); });
  }
  runCase("linear_3d", [](auto& in) { return linear(in["x"], in["w"], in["b"]); });
}

TEST(OpsReference, ShapeOps) {
  runCase("permute", [](auto& in) { return permute(in["x"], {1, 2, 0}); });
  runCase("transpose", [](auto& in) { return transpose(in["x"], 0, 2); });
  runCase("slice", [](auto& in) { return slice(slice(in["x"], 1, 1, 3), 2, 0, 4, 2); });
  runCase("cat", [](auto& in) { return cat({in["a"], in["b"], in["c"]}, 1); });
  runCase("split", [](auto& in) {
    std::vector<Tensor> pieces = split(in["x"], 2, 0);
    for (size_t i = 0; i < pieces.size(); ++i) pieces[i] = pieces[i] * static_cast<double>(i + 1);
    return cat(pieces, 0);
  });
}

TEST(OpsReference, SoftmaxLayerNorm) {
  runCase("softmax", [](auto& in) { return softmax(in["x"], 1); });
  runCase("log_softmax", [](auto& in) { return logSoftmax(in["x"], -1); });
  runCase("layer_norm", [](auto& in) { return layerNorm(in["x"], {8}, in["w"], in["b"]); });
  runCase("layer_norm_2d_no_affine", [](auto& in) {
    return layerNorm(in["x"], {3, 4}, Tensor(), Tensor());
  });
}

TEST(OpsReference, CausalSelfAttentionModule) {
  // The module with the fixture's weights loaded by name.
  runCase("attention", [](auto& in) {
    nn::CausalSelfAttention att(8, 2);
    att.loadStateDict({{"qkv.weight", in["qkv_w"]},
                       {"qkv.bias", in["qkv_b"]},
                       {"proj.weight", in["proj_w"]},
                       {"proj.bias", in["proj_b"]}});
    // Gradients land on the module's parameters; hand them to the fixture's names.
    Tensor out = att(in["x"]);
    for (auto& [n, p] : att.namedParameters()) {
      const std::string key = n == "qkv.weight"    ? "qkv_w"
                              : n == "qkv.bias"    ? "qkv_b"
                              : n == "proj.weight" ? "proj_w"
                                                   : "proj_b";
      in[key] = p;
    }
    return out;
  });
}

TEST(OpsReference, ConvAndPooling) {
  for (const char* name : {"conv2d", "conv2d_plain"}) {
    const json& c = reference().at(name);
    const Conv2dParams p{.strideH = c["stride"][0],
                         .strideW = c["stride"][1],
                         .padH = c["padding"][0],
                         .padW = c["padding"][1]};
    runCase(name, [p](auto& in) {
      return conv2d(in["x"], in["w"], in.count("b") ? in["b"] : Tensor(), p);
    });
  }
  const Pool2dParams pool{
      .kernelH = 3, .kernelW = 3, .strideH = 2, .strideW = 2, .padH = 1, .padW = 1};
  runCase("max_pool2d", [pool](auto& in) { return maxPool2d(in["x"], pool); });
  runCase("avg_pool2d", [pool](auto& in) { return avgPool2d(in["x"], pool); });
}

TEST(OpsReference, CrossEntropyAndEmbedding) {
  for (const char* name : {"cross_entropy_ignore_smooth", "cross_entropy_ignore_2"}) {
    const json& c = reference().at(name);
    const CrossEntropyOptions o{.ignoreIndex = c["ignore_index"],
                                .labelSmoothing = c["label_smoothing"]};
    runCase(name, [o](auto& in) { return crossEntropy(in["x"], in["y"], o); });
  }
  runCase("embedding_padding", [](auto& in) { return embedding(in["w"], in["idx"], 2); });
}

TEST(OpsReference, SmallCnn) {
  runCase("cnn", [](auto& in) {
    Tensor h = relu(conv2d(in["x"], in["cw"], in["cb"], {.padH = 1, .padW = 1}));
    h = avgPool2d(maxPool2d(h, {}), {});
    return crossEntropy(linear(flatten(h, 1), in["lw"], in["lb"]), in["y"]);
  });
}

TEST(OpsReference, ClipGradNorm) {
  const json& ref = reference().at("clip_grad_norm");
  for (const auto& [name, c] : ref["cases"].items()) {
    SCOPED_TRACE(name);
    std::vector<Tensor> params;
    for (const auto& g : ref["grads"]) {
      Tensor gt = fromJson(g);
      Tensor p = zerosLike(gt).setRequiresGrad(true);
      p.setGrad(gt);
      params.push_back(p);
    }
    const double normType = c["norm_type"].is_string() ? INFINITY : c["norm_type"].get<double>();
    const double total = clipGradNorm(params, c["max_norm"], normType);
    EXPECT_NEAR(total, c["total_norm"].get<double>(), 1e-5 * (1 + total));
    for (size_t i = 0; i < params.size(); ++i) {
      expectClose(params[i].grad(), c["clipped"][i], name + " param " + std::to_string(i));
    }
  }
}

}  // namespace
}  // namespace loom::ag
