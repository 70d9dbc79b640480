// What a command writes must not collide (docs/BAD_INPUT.md, "Writes"): no two outputs on one
// path, and no output over an input. Checked before any work, by every command; free of CLI11 so
// that it is tested on its own (tests/golden/test_writes.cpp).
#pragma once

#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

namespace dsv32::tools {

/// A file a command reads or writes, and what names it in messages ("--json", "case a's golden").
struct NamedPath {
  std::string what, path;
};

/// `path` made absolute and normal, with the links of the part that exists resolved: two
/// spellings of one file (`F`, `./F`, `d/../F`, a link to a directory on the way) compare equal
/// even before the file exists.
inline std::filesystem::path normal_path(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path p = fs::absolute(path, ec).lexically_normal();
  if (fs::path real = fs::weakly_canonical(p, ec); !ec) p = real;
  return p;
}

/// Why `outputs` cannot be written as given, or "": two outputs that name one file (compared as
/// normal_path, so also when neither exists yet), or an output that is one of `inputs` (by
/// normal_path, or the same file by device and inode: a hard link to it included). Writing it
/// would lose one output or destroy what is read. Empty paths (options not given) are skipped.
inline std::string output_clash(const std::vector<NamedPath>& outputs,
                                const std::vector<NamedPath>& inputs) {
  namespace fs = std::filesystem;
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const NamedPath& out = outputs[i];
    if (out.path.empty()) continue;
    const fs::path p = normal_path(out.path);
    for (std::size_t k = 0; k < i; ++k)
      if (!outputs[k].path.empty() && normal_path(outputs[k].path) == p)
        return out.what + " " + out.path + " and " + outputs[k].what + " " + outputs[k].path +
               " name one file: give each output a path of its own";
    for (const NamedPath& in : inputs) {
      if (in.path.empty()) continue;
      std::error_code ec;
      if (normal_path(in.path) == p || (fs::equivalent(out.path, in.path, ec) && !ec))
        return out.what + " " + out.path + " is also an input (" + in.what + " " + in.path +
               "): writing it would overwrite what is read";
    }
  }
  return "";
}

}  // namespace dsv32::tools
