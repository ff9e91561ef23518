#include "lr_schedule.h"

#include <sstream>
#include <vector>

#include "loom/common/error.h"

namespace loom::train {

std::unique_ptr<ag::optim::LRScheduler> makeScheduler(const std::string& spec,
                                                      ag::optim::Optimizer& optimizer) {
  if (spec == "none") return nullptr;
  std::vector<std::string> parts;
  std::stringstream in(spec);
  for (std::string item; std::getline(in, item, ':');) parts.push_back(item);
  auto number = [&](size_t i) {
    size_t used = 0;
    double v = 0;
    try {
      v = std::stod(parts[i], &used);
    } catch (const std::exception&) {
      used = 0;
    }
    LOOM_CHECK(used == parts[i].size() && used > 0, "--lr-schedule ", spec, ": '", parts[i],
               "' is not a number");
    return v;
  };
  if (!parts.empty() && parts[0] == "step" && parts.size() == 3) {
    const double size = number(1);
    LOOM_CHECK(size >= 1 && size == static_cast<int64_t>(size), "--lr-schedule ", spec,
               ": the step size must be an integer >= 1");
    return std::make_unique<ag::optim::StepLR>(optimizer, static_cast<int64_t>(size), number(2));
  }
  if (!parts.empty() && parts[0] == "cosine" && (parts.size() == 2 || parts.size() == 3)) {
    const double tMax = number(1);
    LOOM_CHECK(tMax >= 1 && tMax == static_cast<int64_t>(tMax), "--lr-schedule ", spec,
               ": TMAX must be an integer >= 1");
    return std::make_unique<ag::optim::CosineAnnealingLR>(optimizer, static_cast<int64_t>(tMax),
                                                          parts.size() == 3 ? number(2) : 0.0);
  }
  LOOM_THROW(InvalidArgumentError, "--lr-schedule: '", spec,
             "' is not one of none, step:SIZE:GAMMA, cosine:TMAX[:ETA_MIN]");
}

}  // namespace loom::train
