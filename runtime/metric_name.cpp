#include "runtime/metric_name.hpp"

namespace troupe::runtime {

std::string peer_metric_name_why(std::string_view name) {
  if (name.empty() || name.size() > max_peer_metric_name)
    return "a name of " + std::to_string(name.size()) + " bytes (1 to " +
           std::to_string(max_peer_metric_name) + ")";
  for (size_t i = 0; i < name.size(); ++i) {
    const auto c = static_cast<unsigned char>(name[i]);
    const bool alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    if (!alnum && c != '_' && c != '.' && c != '-' && c != '/')
      return "byte " + std::to_string(i) + " of a name is " + std::to_string(c) +
             " (letters, digits and _ . - / only)";
  }
  return "";
}

} // namespace troupe::runtime
