// loom-settings: shows which of Loom's environment variables this environment sets, checks
// each value the way the libraries will, and prints the generated reference.
//
//   loom-settings              every runtime and launch variable that is set: its value, and OK
//                              or the error the libraries will raise
//   loom-settings --all        every declared variable, set or not, with its default
//   loom-settings --markdown   docs/env.md, generated from the registry
//
// LOOM_* variables no library reads are listed too; one within two edits of a declared name
// (LOOM_TCP_SOCKET for LOOM_TCP_SOCKETS) is an error, since the setting it meant is not in force.
//
// Exit status: 0 when every set value is valid, 1 when one is not (or a name is a likely typo),
// 2 on a usage error.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <string>

#include "loom/cli/checks.h"
#include "loom/common/error.h"
#include "loom/common/settings.h"

namespace {

namespace st = loom::settings;

// Reads `s` with its kind's reader: "" when it is valid or unset, else the error.
std::string check(const st::Setting& s) {
  try {
    switch (s.kind) {
      case st::Kind::kInteger:
        (void)st::integer(s.name);
        break;
      case st::Kind::kBytes:
        (void)st::bytes(s.name);
        break;
      case st::Kind::kFlag:
        (void)st::flag(s.name);
        break;
      case st::Kind::kChoice:
        (void)st::choice(s.name);
        break;
      case st::Kind::kText:
        break;
    }
  } catch (const loom::Error& e) {
    return e.what();
  }
  return "";
}

std::string valueOf(const st::Setting& s) {
  return st::value(s.name).value_or("");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"loom-settings: Loom's environment variables, as this environment sets them"};
  bool markdown = false;
  bool all = false;
  app.add_flag("--markdown", markdown, "print docs/env.md, generated from the registry");
  app.add_flag("--all", all, "list every declared variable, set or not");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return loom::cli::exitFor(app, e, "loom-settings");
  }
  if (markdown) {
    std::cout << st::markdown();
    return 0;
  }
  int bad = 0;
  for (const st::Setting& s : st::all()) {
    const std::string value = valueOf(s);
    if (!all && (value.empty() || s.section == st::Section::kOther)) continue;
    const std::string error = check(s);
    if (!error.empty()) ++bad;
    if (value.empty()) {
      std::printf("%-28s (unset; default %s)\n", s.name,
                  *s.defaultValue != '\0' ? s.defaultValue : "none");
    } else if (std::string(s.name) == "LOOM_STORE_TOKEN") {
      std::printf("%-28s (set)  OK\n", s.name);
    } else {
      std::printf("%-28s %s  %s\n", s.name, value.c_str(), error.empty() ? "OK" : error.c_str());
    }
  }
  // LOOM_* names no library reads: a likely typo (within two edits of a declared name) counts
  // as an error, since the setting it meant is silently not in force.
  for (const st::UnknownVariable& u : st::unknownLoomVariables()) {
    if (u.didYouMean.empty()) {
      std::printf("%-28s %s  not a Loom library setting (a script's, or unknown)\n", u.name.c_str(),
                  u.value.c_str());
    } else {
      ++bad;
      std::printf("%-28s %s  not a Loom setting: did you mean %s?\n", u.name.c_str(),
                  u.value.c_str(), u.didYouMean.c_str());
    }
  }
  return bad == 0 ? 0 : 1;
}
