#include "amp.h"

#include <stdexcept>

namespace loom::train {

std::optional<ag::DType> ampDType(const std::string& amp) {
  if (amp == "bf16") return ag::DType::kBFloat16;
  if (amp == "fp16") return ag::DType::kFloat16;
  if (amp == "none") return std::nullopt;
  throw std::invalid_argument("--amp: expected none, bf16 or fp16, got '" + amp + "'");
}

ScaledOptimizerState::ScaledOptimizerState(ag::optim::Optimizer& optimizer,
                                           ag::optim::GradScaler& scaler)
    : Optimizer(optimizer.params(), optimizer.lr()), optimizer_(optimizer), scaler_(scaler) {}

void ScaledOptimizerState::step() {
  throw std::logic_error("ScaledOptimizerState::step: step through GradScaler::step");
}

ag::nn::NamedTensors ScaledOptimizerState::stateDict() const {
  ag::nn::NamedTensors state = optimizer_.stateDict();
  for (auto& [name, t] : scaler_.stateDict()) state.emplace_back(kPrefix + name, t);
  return state;
}

void ScaledOptimizerState::loadStateDict(const ag::nn::NamedTensors& state) {
  ag::nn::NamedTensors optimizerPart, scalerPart;
  const std::string prefix = kPrefix;
  for (const auto& [name, t] : state) {
    if (name.compare(0, prefix.size(), prefix) == 0) {
      scalerPart.emplace_back(name.substr(prefix.size()), t);
    } else {
      optimizerPart.emplace_back(name, t);
    }
  }
  if (scalerPart.empty()) {
    throw std::invalid_argument(
        "no GradScaler state (" + prefix +
        "scale, ...) among the optimizer entries: not the state of a --amp fp16 run");
  }
  // Check the scaler's part on a copy first, so that a bad one leaves the optimizer as it was.
  ag::optim::GradScaler check(scaler_.options());
  check.loadStateDict(scalerPart);
  optimizer_.loadStateDict(optimizerPart);
  scaler_.loadStateDict(scalerPart);
}

}  // namespace loom::train
