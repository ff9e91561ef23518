// Checks of numeric command-line flags, shared by every Loom program (CLI11 validators).
//
// CLI11's own (CLI::Range, CLI::PositiveNumber) name a value that is not a number as out of
// range ("Value x not in range 1 to 4096"), and an integer flag without a check says only
// "Could not convert: --iters = x". These say what was given and what is expected, the same way
// in every program:
//   --iters: 'x' is not a whole number; expected at least 1
//   --port: '70000' is out of range; expected 0 to 65535
//   --lr: 'abc' is not a number; expected more than 0
// A validator runs on the text before CLI11 converts it, so a bad value never reaches the
// conversion's message.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace loom::cli {

// An integer in [lo, hi].
CLI::Validator wholeIn(long long lo, long long hi);
// An integer >= lo that fits in an int (the flags it checks are ints).
CLI::Validator wholeAtLeast(long long lo);
// A finite number in [lo, hi].
CLI::Validator numberIn(double lo, double hi);
// A finite number >= lo.
CLI::Validator numberAtLeast(double lo);
// A finite number > lo (numberAbove(0): positive).
CLI::Validator numberAbove(double lo);

// What a program does with CLI11's ParseError: --help prints the help on stdout and gives 0; a
// usage error prints "<program>: <what>" and where the flags are explained on stderr and gives
// 2, the usage-error status of every Loom program.
int exitFor(const CLI::App& app, const CLI::ParseError& e, const std::string& program);

}  // namespace loom::cli
