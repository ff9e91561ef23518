#include "loom/ddp/distributed_data_parallel.h"

#include <cstdint>
#include <sstream>
#include <vector>

#include "loom/autograd/engine.h"
#include "loom/common/error.h"
#include "loom/ddp/tensor_view.h"

namespace loom::ddp {

namespace {

// One entry per parameter and buffer: "param 0.weight [10, 4] float32".
std::vector<std::string> describeState(const ag::nn::Module& module) {
  std::vector<std::string> entries;
  for (const auto& [name, t] : module.namedParameters()) {
    entries.push_back("parameter " + name + " " + ag::shapeToString(t.shape()) + " " +
                      ag::dtypeName(t.dtype()));
  }
  for (const auto& [name, t] : module.namedBuffers()) {
    entries.push_back("buffer " + name + " " + ag::shapeToString(t.shape()) + " " +
                      ag::dtypeName(t.dtype()));
  }
  return entries;
}

std::string join(const std::vector<std::string>& entries) {
  std::string out;
  for (const auto& e : entries) out += e + "\n";
  return out;
}

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

}  // namespace

void broadcastTensors(ProcessGroup& pg, ag::nn::NamedTensors& tensors, int root) {
  if (pg.size() == 1) return;
  std::vector<std::shared_ptr<Work>> works;
  for (auto& [name, t] : tensors) {
    if (t.numel() == 0) continue;
    BroadcastOptions opts;
    opts.root = root;
    works.push_back(pg.broadcast(bufferView(t), opts));
  }
  for (auto& w : works) w->wait();
}

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<ag::nn::Module> module,
                                                 std::shared_ptr<ProcessGroup> pg,
                                                 const DdpOptions& options)
    : module_(std::move(module)), pg_(std::move(pg)), options_(options) {
  activeRanks_ = pg_ ? pg_->size() : 0;
  LOOM_CHECK(module_ != nullptr, "DistributedDataParallel needs a module");
  LOOM_CHECK(pg_ != nullptr, "DistributedDataParallel needs a process group");
  registerModule("module", module_);
  checkSameParametersEverywhere();
  broadcastState(false);
  ReducerOptions ro;
  ro.bucketCapMb = options_.bucketCapMb;
  ro.firstBucketCapMb = options_.firstBucketCapMb;
  ro.findUnusedParameters = options_.findUnusedParameters;
  ro.staticGraph = options_.staticGraph;
  ro.gradientAsBucketView = options_.gradientAsBucketView;
  ro.windowBuckets = options_.windowBuckets;
  ro.commHook = options_.commHook;
  Reducer::NamedParameters params;
  for (auto& [name, t] : module_->namedParameters()) {
    if (t.requiresGrad()) params.emplace_back(name, t);
  }
  reducer_ = std::make_unique<Reducer>(std::move(params), pg_, ro);
}

DistributedDataParallel::~DistributedDataParallel() = default;

std::string DistributedDataParallel::describe() const {
  return "DistributedDataParallel(" + module_->describe() + ")";
}

// Every rank sends its description (lengths first, then the bytes padded to the longest);
// each compares every rank's list with rank 0's, so all ranks raise the same error.
void DistributedDataParallel::checkSameParametersEverywhere() {
  const int size = pg_->size();
  if (size == 1) return;
  const std::string mine = join(describeState(*module_));
  std::vector<int64_t> lengths(size);
  int64_t myLength = static_cast<int64_t>(mine.size());
  pg_->allgather(view(&myLength, 1), view(lengths.data(), lengths.size()))->wait();
  int64_t longest = 1;
  for (int64_t l : lengths) longest = std::max(longest, l);
  std::vector<uint8_t> padded(longest, 0), all(longest * size, 0);
  std::copy(mine.begin(), mine.end(), padded.begin());
  pg_->allgather(view(padded.data(), padded.size()), view(all.data(), all.size()))->wait();
  auto text = [&](int r) {
    return std::string(reinterpret_cast<const char*>(all.data()) + r * longest, lengths[r]);
  };
  const std::vector<std::string> reference = split(text(0));
  for (int r = 1; r < size; ++r) {
    const std::vector<std::string> other = split(text(r));
    for (size_t i = 0; i < std::max(reference.size(), other.size()); ++i) {
      const std::string a = i < reference.size() ? reference[i] : "(nothing)";
      const std::string b = i < other.size() ? other[i] : "(nothing)";
      if (a != b) {
        LOOM_THROW(InvalidArgumentError, pg_->who(),
                   ": DistributedDataParallel needs the same model on every rank, but entry ", i,
                   " is '", b, "' on rank ", r, " and '", a, "' on rank 0 (rank 0 has ",
                   reference.size(), " parameters and buffers, rank ", r, " has ", other.size(),
                   ")");
      }
    }
  }
}

void DistributedDataParallel::broadcastState(bool buffersOnly, int root) {
  ag::nn::NamedTensors tensors;
  if (!buffersOnly) tensors = module_->namedParameters();
  for (auto& b : module_->namedBuffers()) tensors.push_back(b);
  broadcastTensors(*pg_, tensors, root);
}

void DistributedDataParallel::joinBegin(const JoinOptions& options) {
  LOOM_CHECK(!joining_, pg_->who(), ": DDP is already in a Join");
  LOOM_CHECK(!reducer_->expectingBackward(), pg_->who(),
             ": Join must begin between iterations, not after a forward whose backward is pending");
  joining_ = true;
  joinOptions_ = options;
  lastAuthoritative_ = -1;
  activeRanks_ = pg_->size();
}

std::vector<int32_t> DistributedDataParallel::joinAgree(int32_t mine) {
  std::vector<int32_t> flags(pg_->size(), 0);
  flags[pg_->rank()] = mine;
  if (pg_->size() > 1) pg_->allreduce(view(flags.data(), flags.size()))->wait();
  int active = 0, synced = 0;
  for (int r = 0; r < pg_->size(); ++r) {
    if (flags[r] > 0) ++active, lastAuthoritative_ = r;
    if (flags[r] == 2) ++synced;
  }
  if (synced > 0 && synced != active) {
    LOOM_THROW(InvalidArgumentError, pg_->who(), ": Join: ", active - synced, " of ", active,
               " ranks with data ran this iteration under noSync() and ", synced,
               " did not; every rank with data must make the same noSync choice");
  }
  if (active > 0) activeRanks_ = active;
  return flags;
}

void DistributedDataParallel::joinShadowUntilAllJoined() {
  LOOM_CHECK(joining_, pg_->who(), ": joinShadowUntilAllJoined outside a Join");
  for (;;) {
    const std::vector<int32_t> flags = joinAgree(0);
    bool anyActive = false, anySynced = false;
    for (int32_t f : flags) anyActive |= f > 0, anySynced |= f == 2;
    if (!anyActive) break;
    // Mirror what the ranks with data do in this iteration's forward and backward.
    if (options_.broadcastBuffers && pg_->size() > 1) broadcastState(true, lastAuthoritative_);
    if (anySynced) reducer_->shadowBackward();
  }
  // Ranks out of data skipped optimizer steps: take the model of a rank that ran to the end.
  if (lastAuthoritative_ >= 0 && pg_->size() > 1) broadcastState(false, lastAuthoritative_);
}

ag::Tensor DistributedDataParallel::forward(const ag::Tensor& input) {
  const bool training = isTraining();
  const bool synced = training && sync_ && ag::gradEnabled();
  int bufferRoot = 0;
  if (training && joining_) {
    joinAgree(synced ? 2 : 1);
    bufferRoot = lastAuthoritative_;
    reducer_->setGradientScale(joinOptions_.divideByInitialWorldSize
                                   ? 1.0f
                                   : static_cast<float>(pg_->size()) / activeRanks_);
  } else {
    reducer_->setGradientScale(1.0f);
  }
  if (training && options_.broadcastBuffers && pg_->size() > 1) broadcastState(true, bufferRoot);
  ag::Tensor out = module_->forward(input);
  if (synced) reducer_->prepareForBackward({out});
  return out;
}

}  // namespace loom::ddp
