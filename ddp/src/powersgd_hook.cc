#include "loom/ddp/powersgd_hook.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "loom/autograd/tensor.h"
#include "loom/common/error.h"

namespace loom::ddp {

namespace {

// One gradient of the bucket viewed as a matrix (rows x cols, row-major at data + offset).
struct Matrix {
  size_t offset = 0;
  int64_t rows = 0, cols = 0, rank = 0;
  size_t pOffset = 0, qOffset = 0;  // where its factors start in the P and Q buffers
};

// Gram-Schmidt on the columns of a (rows x cols) row-major matrix, in place: each column is
// normalized (divided by its norm, plus epsilon when epsilon > 0), then removed from the
// columns after it. A zero column (with epsilon 0) stays zero: dividing it made NaN, which a
// zero gradient (a dead layer, an unused parameter's zeros) then carried into every later
// step through the warm start and the error feedback.
void orthogonalize(float* a, int64_t rows, int64_t cols, double epsilon) {
  for (int64_t i = 0; i < cols; ++i) {
    double norm = 0;
    for (int64_t r = 0; r < rows; ++r)
      norm += static_cast<double>(a[r * cols + i]) * a[r * cols + i];
    const float divisor = static_cast<float>(std::sqrt(norm) + epsilon);
    if (divisor == 0) continue;  // all zeros: nothing to normalize or to remove
    for (int64_t r = 0; r < rows; ++r) a[r * cols + i] /= divisor;
    for (int64_t j = i + 1; j < cols; ++j) {
      double dot = 0;
      for (int64_t r = 0; r < rows; ++r)
        dot += static_cast<double>(a[r * cols + i]) * a[r * cols + j];
      const float d = static_cast<float>(dot);
      for (int64_t r = 0; r < rows; ++r) a[r * cols + j] -= d * a[r * cols + i];
    }
  }
}

// out (n x r) = m (n x k) * q (k x r); all row-major. Walks m once, in order; sums in double.
void matmul(const float* m, const float* q, float* out, int64_t n, int64_t k, int64_t r) {
  std::vector<double> acc(static_cast<size_t>(r));
  for (int64_t i = 0; i < n; ++i) {
    std::fill(acc.begin(), acc.end(), 0.0);
    const float* row = m + i * k;
    for (int64_t j = 0; j < k; ++j) {
      const double v = row[j];
      const float* qj = q + j * r;
      for (int64_t c = 0; c < r; ++c) acc[c] += v * qj[c];
    }
    for (int64_t c = 0; c < r; ++c) out[i * r + c] = static_cast<float>(acc[c]);
  }
}

// out (k x r) = m^T (k x n) * p (n x r), m being (n x k). Walks m once, in order.
void matmulTransposed(const float* m, const float* p, float* out, int64_t n, int64_t k, int64_t r) {
  std::vector<double> acc(static_cast<size_t>(k * r), 0.0);
  for (int64_t i = 0; i < n; ++i) {
    const float* row = m + i * k;
    const float* pi = p + i * r;
    for (int64_t j = 0; j < k; ++j) {
      const double v = row[j];
      double* aj = acc.data() + j * r;
      for (int64_t c = 0; c < r; ++c) aj[c] += v * pi[c];
    }
  }
  for (int64_t j = 0; j < k * r; ++j) out[j] = static_cast<float>(acc[j]);
}

struct Job {
  ProcessGroup* pg = nullptr;
  float* data = nullptr;
  size_t count = 0;
  std::vector<Matrix> compressed;
  std::vector<std::pair<size_t, size_t>> uncompressedRanges;  // (offset, count) in data
  std::vector<float> uncompressed;
  std::vector<float> inputCopy;
  PowerSgdHook::BucketState* state = nullptr;
  std::shared_ptr<Work> uncompressedWork, pWork;
};

class PowerSgdFuture : public HookFuture {
 public:
  PowerSgdFuture(std::unique_ptr<Job> job, PowerSgdHook& hook)
      : job_(std::move(job)), hook_(hook) {}

  void wait() override {
    if (done_) return;
    done_ = true;
    Job& j = *job_;
    const float world = static_cast<float>(j.pg->size());
    if (j.uncompressedWork) {
      j.uncompressedWork->wait();
      size_t at = 0;
      for (const auto& [offset, count] : j.uncompressedRanges) {
        for (size_t i = 0; i < count; ++i) j.data[offset + i] = j.uncompressed[at + i] / world;
        at += count;
      }
    }
    if (!j.compressed.empty()) {
      std::vector<float>& p = j.state->p;
      std::vector<float>& q = j.state->q;
      if (j.pWork) j.pWork->wait();
      const double eps = hook_.options().orthogonalizationEpsilon;
      for (const Matrix& m : j.compressed) {
        orthogonalize(p.data() + m.pOffset, m.rows, m.rank, eps);
        matmulTransposed(j.data + m.offset, p.data() + m.pOffset, q.data() + m.qOffset, m.rows,
                         m.cols, m.rank);
      }
      if (j.pg->size() > 1) j.pg->allreduce(view(q.data(), q.size()))->wait();
      for (float& v : q) v /= world;
      for (const Matrix& m : j.compressed) {
        // M = P Q^T: (rows x rank) times (rank x cols).
        const float* pm = p.data() + m.pOffset;
        const float* qm = q.data() + m.qOffset;
        float* out = j.data + m.offset;
        for (int64_t r = 0; r < m.rows; ++r) {
          for (int64_t c = 0; c < m.cols; ++c) {
            double sum = 0;
            for (int64_t k = 0; k < m.rank; ++k) {
              sum += static_cast<double>(pm[r * m.rank + k]) * qm[c * m.rank + k];
            }
            out[r * m.cols + c] = static_cast<float>(sum);
          }
        }
      }
      if (!hook_.options().warmStart) {
        p.clear();
        q.clear();
      }
    }
    if (hook_.options().useErrorFeedback) {
      std::vector<float>& error = j.state->error;
      for (size_t i = 0; i < j.count; ++i) error[i] = j.inputCopy[i] - j.data[i];
    }
  }

 private:
  std::unique_ptr<Job> job_;
  PowerSgdHook& hook_;
  bool done_ = false;
};

}  // namespace

PowerSgdHook::PowerSgdHook(const PowerSgdOptions& options)
    : options_(options), seeds_(static_cast<uint32_t>(options.randomSeed)) {
  LOOM_CHECK(options_.matrixApproximationRank >= 1,
             "PowerSgdHook: matrixApproximationRank must be >= 1, got ",
             options_.matrixApproximationRank);
  LOOM_CHECK(options_.startPowerSgdIter >= 0, "PowerSgdHook: startPowerSgdIter must be >= 0, got ",
             options_.startPowerSgdIter);
  LOOM_CHECK(!(options_.useErrorFeedback || options_.warmStart) || options_.startPowerSgdIter > 1,
             "PowerSgdHook: startPowerSgdIter must be > 1 when useErrorFeedback or warmStart is "
             "on (DDP rebuilds its buckets after the first iteration), got ",
             options_.startPowerSgdIter);
  LOOM_CHECK(options_.minCompressionRate > 0, "PowerSgdHook: minCompressionRate must be > 0, got ",
             options_.minCompressionRate);
  LOOM_CHECK(options_.orthogonalizationEpsilon >= 0,
             "PowerSgdHook: orthogonalizationEpsilon must be >= 0, got ",
             options_.orthogonalizationEpsilon);
}

void PowerSgdHook::maybeIncreaseIteration(const GradBucket& bucket) {
  if (bucket.isLast) ++iteration_;
}

std::unique_ptr<HookFuture> PowerSgdHook::start(ProcessGroup& pg, GradBucket& bucket) {
  if (iteration_ < options_.startPowerSgdIter) {
    maybeIncreaseIteration(bucket);
    AllreduceOptions opts;
    opts.reduceOp = ReduceOp::kAvg;
    return std::make_unique<WorkFuture>(pg.allreduce(view(bucket.data, bucket.count), opts));
  }
  LOOM_CHECK_EQ(bucket.shapes.size(), bucket.offsets.size(), "PowerSgdHook: bucket ", bucket.index,
                " needs one shape per parameter");
  auto job = std::make_unique<Job>();
  job->pg = &pg;
  job->data = bucket.data;
  job->count = bucket.count;
  BucketState& st = state_[bucket.index];
  job->state = &st;
  if (options_.useErrorFeedback) {
    if (st.error.size() == bucket.count) {
      for (size_t i = 0; i < bucket.count; ++i) bucket.data[i] += st.error[i];
    } else {
      st.error.assign(bucket.count, 0.0f);
    }
    job->inputCopy.assign(bucket.data, bucket.data + bucket.count);
  }

  // Which gradients to compress; factors laid out by shape groups, first-seen shape first.
  std::vector<std::vector<int64_t>> groupShapes;
  std::vector<std::vector<size_t>> groups;
  size_t pTotal = 0, qTotal = 0;
  for (size_t i = 0; i < bucket.shapes.size(); ++i) {
    const auto& shape = bucket.shapes[i];
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    const int64_t rows = shape.empty() ? 1 : shape[0];
    const int64_t cols = rows == 0 ? 0 : numel / rows;
    const int64_t rank =
        std::min<int64_t>({rows, cols, static_cast<int64_t>(options_.matrixApproximationRank)});
    const bool compress = static_cast<double>((rows + cols) * rank) * options_.minCompressionRate <
                          static_cast<double>(rows * cols);
    floatsUncompressed_ += numel;
    if (!compress) {
      job->uncompressedRanges.emplace_back(bucket.offsets[i], static_cast<size_t>(numel));
      floatsSent_ += numel;
      continue;
    }
    floatsSent_ += (rows + cols) * rank;
    Matrix m;
    m.offset = bucket.offsets[i];
    m.rows = rows;
    m.cols = cols;
    m.rank = rank;
    job->compressed.push_back(m);
    pTotal += static_cast<size_t>(rows * rank);
    qTotal += static_cast<size_t>(cols * rank);
    const std::vector<int64_t> matrixShape{rows, cols};
    auto it = std::find(groupShapes.begin(), groupShapes.end(), matrixShape);
    if (it == groupShapes.end()) {
      groupShapes.push_back(matrixShape);
      groups.emplace_back();
      it = groupShapes.end() - 1;
    }
    groups[it - groupShapes.begin()].push_back(job->compressed.size() - 1);
  }
  {
    std::vector<Matrix> ordered;
    size_t pAt = 0, qAt = 0;
    for (const auto& group : groups) {
      for (size_t k : group) {
        Matrix m = job->compressed[k];
        m.pOffset = pAt;
        m.qOffset = qAt;
        pAt += static_cast<size_t>(m.rows * m.rank);
        qAt += static_cast<size_t>(m.cols * m.rank);
        ordered.push_back(m);
      }
    }
    job->compressed = std::move(ordered);
  }

  for (const auto& [offset, count] : job->uncompressedRanges) {
    job->uncompressed.insert(job->uncompressed.end(), bucket.data + offset,
                             bucket.data + offset + count);
  }
  if (!job->uncompressed.empty()) {
    job->uncompressedWork = pg.allreduce(view(job->uncompressed.data(), job->uncompressed.size()));
  }

  if (!job->compressed.empty()) {
    st.p.resize(pTotal);
    // A warm-start Q with a zero column (the step before compressed a gradient that was zero on
    // every rank, so Q = M^T P came out zero there) would keep P = M Q zero in that column for
    // good, whatever the gradients: it is drawn afresh like a first Q. Q is equal on every rank
    // (all-reduced), so every rank decides alike and draws the same numbers.
    const auto zeroColumn = [&] {
      for (const Matrix& m : job->compressed) {
        const float* q = st.q.data() + m.qOffset;
        for (int64_t k = 0; k < m.rank; ++k) {
          bool zero = true;
          for (int64_t c = 0; c < m.cols && zero; ++c) zero = q[c * m.rank + k] == 0.0f;
          if (zero) return true;
        }
      }
      return false;
    };
    if (!options_.warmStart || st.q.size() != qTotal || zeroColumn()) {
      ag::Generator gen(seeds_() % 1000000000u);
      ag::Tensor draw = ag::randn({static_cast<int64_t>(qTotal)}, gen);
      st.q.assign(draw.data<float>(), draw.data<float>() + qTotal);
    }
    for (const Matrix& m : job->compressed) {
      orthogonalize(st.q.data() + m.qOffset, m.cols, m.rank, options_.orthogonalizationEpsilon);
      matmul(bucket.data + m.offset, st.q.data() + m.qOffset, st.p.data() + m.pOffset, m.rows,
             m.cols, m.rank);
    }
    if (pg.size() > 1) job->pWork = pg.allreduce(view(st.p.data(), st.p.size()));
  }
  maybeIncreaseIteration(bucket);
  return std::make_unique<PowerSgdFuture>(std::move(job), *this);
}

}  // namespace loom::ddp
