// Coverage requirements on a run (`--require`, docs/COVERAGE.md): checked against what the run
// exercised, each one not met printed, all of them as JSON for the report.
#pragma once

#include <fmt/core.h>

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dsv32/oracle/coverage.hpp"

namespace dsv32::tools {

struct RequirementsChecked {
  std::string first_unmet;                           // why the first one is not met; "" if all are
  nlohmann::json results = nlohmann::json::array();  // {require, met, why} of each
};

/// `require` (each validated when the command line was read) against `coverage` and the counts
/// `more` a report adds to its metrics (`dsv32 gpu`'s steps_full, ...); prints
/// "  NOT MET --require WHY" for each one not met.
inline RequirementsChecked check_requirements(const std::vector<std::string>& require,
                                              const Coverage& coverage,
                                              const std::map<std::string, long>& more = {}) {
  std::vector<std::string> names;
  for (const auto& [name, n] : more) names.push_back(name);
  RequirementsChecked out;
  for (const std::string& text : require) {
    const std::string why = Requirement::parse(text, names).check(coverage, more);
    if (!why.empty()) fmt::print("  NOT MET --require {}\n", why);
    if (out.first_unmet.empty()) out.first_unmet = why;
    out.results.push_back({{"require", text}, {"met", why.empty()}, {"why", why}});
  }
  return out;
}

}  // namespace dsv32::tools
