// Message sizes as loom-bench and nccl-tests take them: "8", "64K", "16M", "1G" (powers of
// 1024, upper or lower case, optional trailing B), and the geometric sweep between two sizes.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace loom::bench {

// Throws InvalidArgumentError naming the text and the accepted forms.
size_t parseSize(std::string_view text);

// min, min*factor, min*factor^2, ... up to and including max. Throws InvalidArgumentError when
// min is 0, min > max or factor < 2.
std::vector<size_t> sweepSizes(size_t minBytes, size_t maxBytes, size_t factor);

// Short human form for labels: "8 B", "1 KiB", "64 MiB", "1 GiB", "1536 B".
std::string formatSize(size_t bytes);

}  // namespace loom::bench
