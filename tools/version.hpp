// The generator string recorded in golden files: tool, version, git revision.
#pragma once

#include <string>

#ifndef DSV32_VERSION
#define DSV32_VERSION "0.0.0"
#endif
#ifndef DSV32_GIT_REVISION
#define DSV32_GIT_REVISION "unknown"
#endif

namespace dsv32::tools {

inline std::string generator_string(const std::string& command) {
  return "dsv32 " + command + " " DSV32_VERSION " (git " DSV32_GIT_REVISION ")";
}

}  // namespace dsv32::tools
