// Settings: every environment variable Loom reads, declared once (in the spirit of NCCL's
// NCCL_PARAM), and the only code that reads the process environment.
//
// Contract
// - The table (common/src/settings_table.cc) declares each variable: its name, its kind and
//   accepted values, its default, one line on what it does, the Options field it fills and
//   when it is read. docs/env.md is generated from it (`loom-settings --markdown`); a test
//   fails when the two differ, and another fails when any file but this registry calls getenv.
// - Entry points read the variables they own into Options structs: Context::create
//   (comm::ContextOptions), createProcessGroup and initProcessGroup (ProcessGroupOptions),
//   TCPStore and its server (the token), the logger (LOOM_LOG_LEVEL) and the programs. Code
//   below an entry point reads Options only.
// - Precedence, everywhere: a field the caller left at its default takes the variable's value
//   when the variable is set; a field the caller changed keeps the caller's value (so
//   `options.sharedMemory = false` beats LOOM_SHM=1, and LOOM_SHM=0 turns off a default).
// - A variable that is unset or set to the empty string is "not set": the readers return
//   nullopt. A value that is set must be valid as a whole for the declared kind and range;
//   anything else is an InvalidArgumentError that names the variable, quotes the value and says
//   what is accepted (loom/common/env.h holds the parsers):
//     LOOM_CHUNK_BYTES='4x' is not valid; expected a byte count in [4096, 1073741824] ...
// - Reading an undeclared variable is a LogicError: declare it in the table first.
// - Thread-safety: the readers call getenv, which must not race with setenv/unsetenv (a POSIX
//   rule); entry points read once at setup, never on a hot path.
#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace loom::settings {

enum class Kind : uint8_t {
  kInteger,  // base 10, in [min, max]
  kBytes,    // a byte count with an optional K/M/G suffix, in [min, max]
  kFlag,     // 1/0, on/off, true/false, yes/no
  kChoice,   // one of `choices` ('|'-separated), any case
  kText,     // any non-empty string
};

enum class Section : uint8_t {
  kRuntime,  // the libraries' knobs (LOOM_*)
  kLaunch,   // how a process learns its place in the job (RANK, MASTER_ADDR, srun, mpirun)
  kOther,    // read but not Loom's (PATH) or test-only
};

struct Setting {
  const char* name;          // "LOOM_CHUNK_BYTES"
  Kind kind;                 //
  Section section;           //
  const char* defaultValue;  // as a user would write it ("512K"); "" when there is none
  long long min = 0;         // kInteger / kBytes
  long long max = 0;         //
  const char* choices = "";  // kChoice: "auto|generic"; kBytes / kInteger: extra words ("auto")
  const char* unit = "";     // "µs", for messages and docs
  const char* meaning = "";  // one line: what it does
  const char* field = "";    // the Options field it fills ("comm::ContextOptions::chunkBytes")
  const char* readAt = "";   // when it is read ("Context setup")
};

// Every declared setting, in table order.
std::span<const Setting> all();
// The declaration of `name`; nullptr when undeclared.
const Setting* find(std::string_view name);

// ---- readers: nullopt when unset or empty; InvalidArgumentError when set but not valid ----

std::optional<long long> integer(std::string_view name);
std::optional<size_t> bytes(std::string_view name);
std::optional<bool> flag(std::string_view name);
// The matched choice, spelled as declared.
std::optional<std::string> choice(std::string_view name);
std::optional<std::string> text(std::string_view name);
// For kInteger / kBytes with extra words: the word when the value is one of them (any case),
// else nullopt (the value is then read with integer() / bytes()).
std::optional<std::string> word(std::string_view name);

// The raw value of a declared variable of any kind, unchecked (loom-settings shows it; tests'
// ScopedEnv saves it); nullopt when unset or empty.
std::optional<std::string> value(std::string_view name);

// Fills `field` from the variable when the caller left the field at `defaultValue` (see the
// precedence rule above). `value` is what a reader returned.
template <class T, class U>
void fillDefault(T& field, const T& defaultValue, const std::optional<U>& value) {
  if (value && field == defaultValue) field = static_cast<T>(*value);
}

// The declared variables of `section` that are set, name -> value (launch parsing takes this).
std::map<std::string, std::string> snapshot(Section section);
// Every NAME=VALUE of this process's environment, declared or not: what a launcher (loom-run,
// spawn) passes on to the processes it starts.
std::vector<std::string> inherited();
// "LOOM_SHM=0 LOOM_ALGO=ring": every declared runtime variable that is set, for logs.
std::string describeSet();

// A LOOM_* variable of this environment that no Loom library reads, and the declared name it
// most likely meant: one within two edits ("LOOM_TCP_SOCKET" -> "LOOM_TCP_SOCKETS"), else "".
// The scripts' own variables (LOOM_BUILD_DIR, LOOM_NPROC, ...) are unknown here too.
struct UnknownVariable {
  std::string name;
  std::string value;
  std::string didYouMean;
};
std::vector<UnknownVariable> unknownLoomVariables();

// docs/env.md, generated from the table.
std::string markdown();

}  // namespace loom::settings
