// Command-line helpers shared by fluxond and fluxonctl, on top of absl flags.
//
// Invariants:
// - Flag names are spelled with '-' on our command lines (--check-config) and defined with '_'
//   (ABSL_FLAG(..., check_config, ...)); NormalizeFlagNames rewrites only the name part of a
//   "--name[=value]" argument, never a value or a positional argument.
// - ParseFlagsOrUsageError never exits the process (absl::ParseCommandLine exits with status 1
//   on a bad flag); it returns InvalidArgument naming the offending argument, so a tool can
//   report a usage error with its own exit status. Arguments after "--" are positional.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace fluxon {

// argv with every "--flag-name" rewritten to "--flag_name"; `storage` owns the strings.
std::vector<char*> NormalizeFlagNames(int argc, char** argv, std::vector<std::string>* storage);

// Parses the absl flags among argv[1..] ("--name=value", "--name value", "--bool", "--nobool";
// '-' in names accepted) and returns the positional arguments in order.
absl::StatusOr<std::vector<std::string>> ParseFlagsOrUsageError(int argc, char** argv);

}  // namespace fluxon
