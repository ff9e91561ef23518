#include "float_memory.h"

#include <algorithm>
#include <mutex>

#include "loom/comm/window.h"
#include "loom/common/error.h"
#include "loom/common/logging.h"

namespace loom::ddp {

std::shared_ptr<float> allocateFloats(size_t count, bool window, const char* what) {
  if (window && count > 0) {
    try {
      std::shared_ptr<comm::Window> w = comm::Window::allocate(count * sizeof(float));
      auto* data = static_cast<float*>(w->data());
      return std::shared_ptr<float>(std::move(w), data);
    } catch (const IoError& e) {
      // Once per process: a machine that cannot make one window cannot make the next.
      static std::once_flag warned;
      std::call_once(warned,
                     [&] { LOOM_LOG_WARNING(what, " in ordinary memory (", e.what(), ")"); });
    }
  }
  return std::shared_ptr<float>(new float[std::max<size_t>(count, 1)](),
                                std::default_delete<float[]>());
}

}  // namespace loom::ddp
