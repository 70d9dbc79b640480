// Verdict rows printed as a terminal table and written as JSON for CI.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace dsv32::tools {

/// A verdict row's outcome; only `fail` fails the table.
enum class Status { pass, fail, info, not_run };
/// As printed: "pass", "FAIL", "info", "not run".
std::string_view to_string(Status s);

/// One line of a verdict table.
struct Verdict {
  std::string check;  // what was checked
  Status status = Status::pass;
  std::string detail;                        // numbers behind the status
  std::map<std::string, long> metrics = {};  // counts the JSON carries (a coverage row's)
  std::string bisect = {};  // a failing row: the command that bisects it (bisect_command)
};

/// The command line that runs `dsv32 bisect` on registry case `case_name` under `plan` (with
/// `mutant` switched on where not empty), as this process's own binary: it runs as printed.
std::string bisect_command(const std::string& case_name, const std::string& plan,
                           const std::string& mutant);

/// Progress of a long job on stderr: on a terminal one line rewritten in place; piped (a log, CI)
/// a line each, since a `\r` there runs every update into one line. `done` ends it.
void progress(const std::string& text, bool done = false);

/// Prints the table, then for each failing row that has one the command that bisects it;
/// returns true when no row failed.
bool print_verdicts(const std::string& title, const std::vector<Verdict>& rows);
/// Writes {"title":..., "rows":[...], "pass": bool} to path (temporary name, then rename).
void write_verdicts_json(const std::string& path, const std::string& title,
                         const std::vector<Verdict>& rows);

}  // namespace dsv32::tools
