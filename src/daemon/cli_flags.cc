#include "daemon/cli_flags.h"

#include <algorithm>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace fluxon {

std::vector<char*> NormalizeFlagNames(int argc, char** argv, std::vector<std::string>* storage) {
  storage->clear();
  storage->reserve(argc);
  std::vector<char*> out;
  for (int i = 0; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("--", 0) == 0) {
      const size_t end = std::min(arg.find('='), arg.size());
      std::replace(arg.begin() + 2, arg.begin() + end, '-', '_');
    }
    storage->push_back(std::move(arg));
  }
  for (std::string& s : *storage) out.push_back(s.data());
  return out;
}

absl::StatusOr<std::vector<std::string>> ParseFlagsOrUsageError(int argc, char** argv) {
  std::vector<std::string> storage;
  NormalizeFlagNames(argc, argv, &storage);
  std::vector<std::string> positional;
  for (size_t i = 1; i < storage.size(); ++i) {
    const std::string& arg = storage[i];
    const std::string typed = argv[i];  // as the user wrote it, for messages
    if (arg == "--") {
      for (size_t j = i + 1; j < storage.size(); ++j) positional.emplace_back(argv[j]);
      break;
    }
    if (arg.size() < 2 || arg[0] != '-' || arg == "-") {
      positional.push_back(arg);
      continue;
    }
    // "-x" and "--x" are both flags, as in absl.
    const std::string body = arg.substr(arg[1] == '-' ? 2 : 1);
    const size_t eq = body.find('=');
    std::string name = body.substr(0, eq);
    const bool has_value = eq != std::string::npos;
    std::string value = has_value ? body.substr(eq + 1) : "";
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr && !has_value && absl::StartsWith(name, "no")) {
      absl::CommandLineFlag* negated = absl::FindCommandLineFlag(name.substr(2));
      if (negated != nullptr && negated->IsOfType<bool>()) {
        flag = negated;
        value = "false";
      }
    }
    if (flag == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag ", typed));
    }
    if (value.empty() && !has_value) {
      if (flag->IsOfType<bool>()) {
        value = "true";
      } else if (i + 1 < storage.size()) {
        value = std::string(argv[++i]);  // the value as typed, not name-normalized
      } else {
        return absl::InvalidArgumentError(absl::StrCat("flag ", typed, " needs a value"));
      }
    }
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad value '", value, "' for ", typed, ": ", error));
    }
  }
  return positional;
}

}  // namespace fluxon
