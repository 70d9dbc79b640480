#include "report.hpp"

#include "dsv32/golden/files.hpp"

#include <fmt/core.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <system_error>

namespace dsv32::tools {

void progress(const std::string& text, bool done) {
  static const bool tty = ::isatty(STDERR_FILENO) == 1;
  static std::size_t shown = 0;  // the width of the line on screen, to blank its tail
  if (!tty) {
    if (!text.empty()) fmt::print(stderr, "{}\n", text);
    return;
  }
  fmt::print(stderr, "\r{:<{}}{}", text, shown, done ? "\n" : "");
  shown = done ? 0 : std::max(shown, text.size());
}

std::string_view to_string(Status s) {
  switch (s) {
    case Status::pass:
      return "pass";
    case Status::fail:
      return "FAIL";
    case Status::info:
      return "info";
    case Status::not_run:
      return "not run";
  }
  return "?";
}

std::string bisect_command(const std::string& case_name, const std::string& plan,
                           const std::string& mutant) {
  std::error_code ec;
  std::string self = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  if (ec || self.empty()) self = "dsv32";
  // Registry case names, plan and mutant names are words without spaces or quotes; the binary's
  // path is quoted where it holds anything a shell would split.
  if (self.find_first_of(" \t'\"$`\\") != std::string::npos) self = "'" + self + "'";
  return self + " bisect --case " + case_name + " --plan " + plan +
         (mutant.empty() ? "" : " --mutant " + mutant);
}

bool print_verdicts(const std::string& title, const std::vector<Verdict>& rows) {
  std::size_t w0 = 5, w1 = 6;
  for (const Verdict& v : rows)
    w0 = std::max(w0, v.check.size()), w1 = std::max(w1, to_string(v.status).size());
  fmt::print("\n{}\n", title);
  fmt::print("{:<{}}  {:<{}}  {}\n", "check", w0, "status", w1, "detail");
  fmt::print("{:-<{}}  {:-<{}}  {:-<6}\n", "", w0, "", w1, "");
  bool ok = true;
  for (const Verdict& v : rows) {
    fmt::print("{:<{}}  {:<{}}  {}\n", v.check, w0, to_string(v.status), w1, v.detail);
    ok = ok && v.status != Status::fail;
  }
  for (const Verdict& v : rows)
    if (v.status == Status::fail && !v.bisect.empty())
      fmt::print("to bisect \"{}\": {}\n", v.check, v.bisect);
  return ok;
}

void write_verdicts_json(const std::string& path, const std::string& title,
                         const std::vector<Verdict>& rows) {
  nlohmann::json j;
  j["title"] = title;
  bool ok = true;
  for (const Verdict& v : rows) {
    nlohmann::json row{
        {"check", v.check}, {"status", std::string(to_string(v.status))}, {"detail", v.detail}};
    if (!v.metrics.empty()) row["metrics"] = v.metrics;
    if (v.status == Status::fail && !v.bisect.empty()) row["bisect"] = v.bisect;
    j["rows"].push_back(row);
    ok = ok && v.status != Status::fail;
  }
  j["pass"] = ok;
  files::write_atomically(path, j.dump(2) + "\n");
}

}  // namespace dsv32::tools
