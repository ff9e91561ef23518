// The settings registry: the one reader of the process environment (settings.h), and the
// generator of docs/env.md.
#include "loom/common/settings.h"

#include <algorithm>
#include <cstdlib>
#include <initializer_list>
#include <sstream>
#include <string_view>
#include <vector>

#include "loom/common/env.h"
#include "loom/common/error.h"
#include "settings_table.h"

extern char** environ;

namespace loom::settings {

namespace {

// The declaration of `name`, of any kind; an Error when it is undeclared.
const Setting& declared(std::string_view name) {
  const Setting* s = find(name);
  if (s == nullptr) {
    LOOM_THROW(Error, "environment variable ", name,
               " is not declared in the settings registry (common/src/settings_table.cc)");
  }
  return *s;
}

// The declaration of `name`, which must be of one of `kinds`.
const Setting& declared(std::string_view name, std::initializer_list<Kind> kinds) {
  const Setting& s = declared(name);
  for (Kind k : kinds) {
    if (s.kind == k) return s;
  }
  LOOM_THROW(Error, "environment variable ", name, " is declared as another kind than read");
}

std::optional<std::string> raw(std::string_view name) {
  const std::string key(name);
  const char* v = std::getenv(key.c_str());
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

// The '|'-separated words of `list`.
std::vector<std::string_view> words(std::string_view list) {
  std::vector<std::string_view> out;
  while (!list.empty()) {
    const size_t bar = list.find('|');
    out.push_back(list.substr(0, bar));
    if (bar == std::string_view::npos) break;
    list.remove_prefix(bar + 1);
  }
  return out;
}

bool sameIgnoringCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    const auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? char(c - 'A' + 'a') : c; };
    if (lower(a[i]) != lower(b[i])) return false;
  }
  return true;
}

std::string unitNote(const Setting& s) {
  return *s.unit != '\0' ? std::string(s.unit) : std::string();
}

// "or 'auto'" when the setting takes extra words next to numbers.
std::string wordsNote(const Setting& s) {
  std::string note;
  for (std::string_view w : words(s.choices))
    note += detail::str(note.empty() ? "or '" : ", '", w, "'");
  return note;
}

std::string joinNotes(const std::string& a, const std::string& b) {
  if (a.empty()) return b;
  if (b.empty()) return a;
  return a + "; " + b;
}

std::optional<std::string> matchedWord(const Setting& s, const std::string& value) {
  for (std::string_view w : words(s.choices)) {
    if (sameIgnoringCase(value, w)) return std::string(w);
  }
  return std::nullopt;
}

}  // namespace

std::span<const Setting> all() {
  return table();
}

const Setting* find(std::string_view name) {
  for (const Setting& s : table()) {
    if (name == s.name) return &s;
  }
  return nullptr;
}

std::optional<long long> integer(std::string_view name) {
  const Setting& s = declared(name, {Kind::kInteger});
  const std::optional<std::string> v = raw(name);
  if (!v || matchedWord(s, *v)) return std::nullopt;
  return env::parseInteger(s.name, *v, s.min, s.max, joinNotes(unitNote(s), wordsNote(s)));
}

std::optional<size_t> bytes(std::string_view name) {
  const Setting& s = declared(name, {Kind::kBytes});
  const std::optional<std::string> v = raw(name);
  if (!v || matchedWord(s, *v)) return std::nullopt;
  return env::parseBytes(s.name, *v, static_cast<size_t>(s.min), static_cast<size_t>(s.max),
                         wordsNote(s));
}

std::optional<bool> flag(std::string_view name) {
  const Setting& s = declared(name, {Kind::kFlag});
  const std::optional<std::string> v = raw(name);
  if (!v) return std::nullopt;
  return env::parseFlag(s.name, *v);
}

std::optional<std::string> choice(std::string_view name) {
  const Setting& s = declared(name, {Kind::kChoice});
  const std::optional<std::string> v = raw(name);
  if (!v) return std::nullopt;
  if (std::optional<std::string> w = matchedWord(s, *v)) return w;
  std::string list;
  for (std::string_view w : words(s.choices)) list += detail::str(list.empty() ? "" : ", ", w);
  LOOM_THROW(InvalidArgumentError, s.name, "='", *v, "' is not valid; expected one of: ", list,
             " (any case)");
}

std::optional<std::string> text(std::string_view name) {
  (void)declared(name, {Kind::kText});
  return raw(name);
}

std::optional<std::string> word(std::string_view name) {
  const Setting& s = declared(name, {Kind::kInteger, Kind::kBytes});
  const std::optional<std::string> v = raw(name);
  return v ? matchedWord(s, *v) : std::nullopt;
}

std::optional<std::string> value(std::string_view name) {
  (void)declared(name);
  return raw(name);
}

std::map<std::string, std::string> snapshot(Section section) {
  std::map<std::string, std::string> out;
  for (const Setting& s : table()) {
    if (s.section != section) continue;
    if (std::optional<std::string> v = raw(s.name)) out.emplace(s.name, std::move(*v));
  }
  return out;
}

std::vector<std::string> inherited() {
  std::vector<std::string> out;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) out.emplace_back(*e);
  return out;
}

namespace {

// Levenshtein distance of a and b, capped: anything above `cap` is cap + 1.
size_t editDistance(std::string_view a, std::string_view b, size_t cap) {
  if ((a.size() > b.size() ? a.size() - b.size() : b.size() - a.size()) > cap) return cap + 1;
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return std::min(row[b.size()], cap + 1);
}

}  // namespace

std::vector<UnknownVariable> unknownLoomVariables() {
  std::vector<UnknownVariable> out;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string_view entry(*e);
    const std::string_view name = entry.substr(0, entry.find('='));
    if (name.substr(0, 5) != "LOOM_" || find(name) != nullptr) continue;
    const std::string_view value = name.size() < entry.size() ? entry.substr(name.size() + 1) : "";
    UnknownVariable unknown{std::string(name), std::string(value), ""};
    size_t best = 3;
    for (const Setting& s : table()) {
      const size_t d = editDistance(name, s.name, 2);
      if (d < best) {
        best = d;
        unknown.didYouMean = s.name;
      }
    }
    out.push_back(std::move(unknown));
  }
  return out;
}

std::string describeSet() {
  std::string out;
  for (const Setting& s : table()) {
    if (s.section != Section::kRuntime) continue;
    if (std::optional<std::string> v = raw(s.name)) {
      if (std::string_view(s.name) == "LOOM_STORE_TOKEN") v = "(set)";  // never log a secret
      out += detail::str(out.empty() ? "" : " ", s.name, "=", *v);
    }
  }
  return out;
}

namespace {

std::string accepts(const Setting& s) {
  const std::string unit = *s.unit != '\0' ? detail::str(" (", s.unit, ")") : std::string();
  std::string extra;
  for (std::string_view w : words(s.choices)) extra += detail::str(", or `", w, "`");
  switch (s.kind) {
    case Kind::kInteger:
      return detail::str("integer in [", s.min, ", ", s.max, "]", unit, extra);
    case Kind::kBytes:
      return detail::str("bytes in [", s.min, ", ", s.max, "]", extra);
    case Kind::kFlag:
      return "flag";
    case Kind::kChoice: {
      std::string list;
      for (std::string_view w : words(s.choices))
        list += detail::str(list.empty() ? "" : ", ", "`", w, "`");
      return "one of " + list;
    }
    case Kind::kText:
      return "text";
  }
  return "";
}

void writeTable(std::ostringstream& out, Section section) {
  out << "| Variable | Accepts | Default | What it does | Fills | Read |\n";
  out << "|---|---|---|---|---|---|\n";
  for (const Setting& s : all()) {
    if (s.section != section) continue;
    const std::string dflt = *s.defaultValue != '\0' ? detail::str("`", s.defaultValue, "`") : "";
    const std::string field = *s.field != '\0' ? detail::str("`", s.field, "`") : "";
    out << "| `" << s.name << "` | " << accepts(s) << " | " << dflt << " | " << s.meaning << " | "
        << field << " | " << s.readAt << " |\n";
  }
}

}  // namespace

std::string markdown() {
  std::ostringstream out;
  out << R"(# Environment variables

<!-- Generated from common/src/settings_table.cc by `build/bin/loom-settings --markdown`;
     settings_test fails when this file and the table differ. Edit the table, not this file. -->

Every variable Loom reads, declared once in the settings registry
(`common/include/loom/common/settings.h`). `build/bin/loom-settings` prints what the current
environment sets and checks every value.

- **Unset or empty** means the default.
- **Who reads them**: entry points only — `Context::create`, `createProcessGroup`,
  `initProcessGroup`, TCPStore and its server, the logger and the programs. Each reads its
  variables once into its Options struct (the *Fills* column); the code below reads Options.
- **Precedence**: a field the caller left at its default takes the variable's value; a field
  the caller set keeps it. So `LOOM_SHM=0` turns shared memory off for a group created with
  default options, and `options.sharedMemory = false` wins over `LOOM_SHM=1`.
- **A bad value is an error at setup**: the object it configures refuses to be created with an
  `InvalidArgumentError` that names the variable, quotes the value and says what is accepted,
  e.g. `LOOM_CHUNK_BYTES='4x' is not valid; expected a byte count in [4096, 1073741824]:
  digits with an optional K, M or G suffix (binary; 512K, 4M, 1GiB)`. Nothing is silently
  clamped. The one exception is `LOOM_LOG_LEVEL`, which must never stop logging: a bad value
  logs one warning and means `warning`.
- **Forms**: *integer*: base 10, the whole string. *bytes*: an integer with an optional binary
  suffix `K`, `M` or `G` (any case, optionally followed by `B` or `iB`): `65536`, `512K`,
  `4M`, `1GiB`. *flag*: `1`/`0`, `on`/`off`, `true`/`false`, `yes`/`no`, any case. *one of*:
  the listed words, any case.
- A process group logs, at creation, the variables that are set and the options that differ
  from their defaults (one line, level info; `LOOM_DEBUG=INFO` or `LOOM_LOG_LEVEL=info`).

## The runtime

)";
  writeTable(out, Section::kRuntime);
  out << R"(
## Launch

`initProcessGroup` takes its place in the job from torchrun's variables, then srun's, then
mpirun's. `loom-run` sets `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `NODE_RANK`,
`GROUP_RANK`, `GROUP_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`, `LOOM_RUN_ID`,
`LOOM_RESTART_COUNT`, `LOOM_MAX_RESTARTS` and, on multi-node jobs where it is not set already,
`LOOM_HOST` ([launcher.md](launcher.md)).

)";
  writeTable(out, Section::kLaunch);
  out << R"(
## Read, but not Loom's; test-only

)";
  writeTable(out, Section::kOther);
  out << R"(
Scripts (not read by the libraries): `scripts/build.sh` reads `LOOM_BUILD_DIR` (default
`build`), `LOOM_BUILD_TYPE` (default `RelWithDebInfo`) and `LOOM_BUILD_TARGETS` (default: all);
`scripts/test.sh` reads `LOOM_BUILD_DIR`, `LOOM_CTEST_ARGS`, `LOOM_CTEST_JOBS` (tests at once,
default: the CPU count), `LOOM_TORCH2_VERSION` (default 2.15.0), `LOOM_TORCH_MORE_VERSIONS`
(default 2.11.0; space-separated, empty: none), `LOOM_SKIP_TORCH2=1` and
`LOOM_SKIP_FUZZ=1`; `tests/fuzz/run.sh` reads `LOOM_FUZZ_BUILD_DIR` (default `build-fuzz`) and
`LOOM_FUZZ_STEP` (`build`, `run`, unset: both); `scripts/setup_torch.sh` reads `LOOM_PY_ENVS` (default ~/.cache/loom/py), and
`scripts/torch_matrix.sh` `LOOM_MATRIX_DIR` (default `build-torch-matrix`);
`scripts/run.sh` reads `LOOM_NPROC` (ranks, default 2).
)";
  return out.str();
}

}  // namespace loom::settings
