// JSON text read the way bad input demands (docs/BAD_INPUT.md): nesting bounded (walking or
// quoting a value recurses, and a value nested tens of thousands deep overflowed the stack), and
// a key given twice in one object refused rather than resolved last-wins.
#pragma once

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

namespace dsv32::golden {

/// Text that is not JSON, or JSON this project refuses: the message names the file and why.
struct JsonError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

/// Deepest nesting of arrays and objects accepted (a case file needs 4).
inline constexpr int kMaxJsonDepth = 64;

/// `text` parsed as JSON; JsonError "WHERE: ..." when it is not JSON, nests deeper than
/// kMaxJsonDepth, or gives a key twice in one object (the message names the key's path).
nlohmann::json parse_json_strict(const std::string& text, const std::string& where);

/// A value quoted for a message: its JSON text, cut at `limit` characters.
std::string quote_json(const nlohmann::json& v, std::size_t limit = 40);

}  // namespace dsv32::golden
