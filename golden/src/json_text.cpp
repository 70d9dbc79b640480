#include "dsv32/golden/json_text.hpp"

#include <set>
#include <vector>

namespace dsv32::golden {

nlohmann::json parse_json_strict(const std::string& text, const std::string& where) {
  using json = nlohmann::json;
  // One frame per open object or array: the keys seen so far and the name it is reached by.
  struct Frame {
    std::set<std::string> keys;
    std::string name;
  };
  std::vector<Frame> open;
  std::string next_name;  // the key just read: the name of the value that follows
  const auto path = [&] {
    std::string p;
    for (const Frame& f : open) p += f.name.empty() ? "" : (p.empty() ? "" : ".") + f.name;
    return p.empty() ? std::string("the top level") : p;
  };
  const json::parser_callback_t check = [&](int depth, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        if (depth >= kMaxJsonDepth)
          throw JsonError(where + ": nested deeper than " + std::to_string(kMaxJsonDepth) +
                          " levels at " + path());
        open.push_back({{}, next_name});
        next_name.clear();
        break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        if (!open.empty()) open.pop_back();
        break;
      case json::parse_event_t::key: {
        const std::string key = parsed.get<std::string>();
        if (!open.empty() && !open.back().keys.insert(key).second)
          throw JsonError(where + ": key '" + key + "' given twice in one object at " + path());
        next_name = key;
        break;
      }
      case json::parse_event_t::value:
        next_name.clear();
        break;
    }
    return true;
  };
  try {
    return json::parse(text, check);
  } catch (const json::exception& e) {
    throw JsonError(where + ": not JSON: " + e.what());
  }
}

std::string quote_json(const nlohmann::json& v, std::size_t limit) {
  // Arrays and objects are quoted by their first elements only: dumping a large one whole
  // would cost its size for a message that shows 40 characters.
  std::string s;
  if (v.is_array() || v.is_object()) {
    s = v.is_array() ? "[" : "{";
    for (auto it = v.begin(); it != v.end() && s.size() <= limit; ++it) {
      if (s.size() > 1) s += ",";
      if (v.is_object()) s += nlohmann::json(it.key()).dump() + ":";
      s += quote_json(*it, limit);
    }
    s += v.is_array() ? "]" : "}";
  } else {
    s = v.dump();
  }
  return s.size() > limit ? s.substr(0, limit) + "..." : s;
}

}  // namespace dsv32::golden
