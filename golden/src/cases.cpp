// The case registry: the case files of fixtures/cases/ (docs/CASES.md), built into the library
// (golden/CMakeLists.txt) in a fixed order; the name is the filter key and the file name.
#include <stdexcept>
#include <utility>

#include "dsv32/golden/case_file.hpp"
#include "dsv32/golden/golden.hpp"

namespace dsv32::golden {

const std::vector<std::pair<const char*, const char*>>& registry_case_files();

const std::vector<CaseSpec>& registry() {
  static const std::vector<CaseSpec> cases = [] {
    std::vector<CaseSpec> r;
    for (const auto& [where, text] : registry_case_files())
      r.push_back(case_from_json(text, where));
    return r;
  }();
  return cases;
}

CaseSpec find_case(const std::string& name) {
  std::string known;
  for (const CaseSpec& c : registry()) {
    if (c.name == name) return c;
    known += (known.empty() ? "" : ", ") + c.name;
  }
  throw std::invalid_argument("unknown case '" + name + "' (known: " + known + ")");
}

}  // namespace dsv32::golden
