// How Loom parses the values of its environment variables (LOOM_*, RANK, ...), one way
// everywhere. The variables are declared and read by the settings registry (settings.h);
// docs/env.md lists them.
//
// Contract:
// - A variable that is unset or set to the empty string is "not set": the caller's fallback.
// - A value that is set must be valid as a whole: no leading or trailing blanks, no trailing
//   garbage, no silent clamping. Anything else is an InvalidArgumentError that names the
//   variable, quotes the value and says what is accepted:
//     LOOM_CHUNK_BYTES='4x' is not valid; expected a byte count in [4096, 1073741824] ...
// - Integers are base 10 with an optional '-'. Byte counts are non-negative integers with an
//   optional binary suffix K, M or G (case-insensitive), optionally followed by B or iB:
//   512K, 4M, 1GiB, 65536. Flags are 1/0, on/off, true/false, yes/no (case-insensitive).
//   Choices are matched case-insensitively and returned spelled as in `allowed`.
// - These functions take the value itself; they never read the environment. The settings
//   registry (settings.h), the one reader of the environment, parses with them.
// - Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <initializer_list>
#include <string>
#include <string_view>

namespace loom::env {

// ---- pure parsers: `value` is what the variable `name` holds (empty is an error) ----

// `note`, when given, is appended to the expected form: "(microseconds)", "(or 'auto')".
long long parseInteger(const char* name, std::string_view value, long long lo, long long hi,
                       std::string_view note = {});
size_t parseBytes(const char* name, std::string_view value, size_t lo, size_t hi,
                  std::string_view note = {});
bool parseFlag(const char* name, std::string_view value);
std::string parseChoice(const char* name, std::string_view value,
                        std::initializer_list<std::string_view> allowed);

}  // namespace loom::env
