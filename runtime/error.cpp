#include "runtime/error.hpp"

#include <caf/atom.hpp>
#include <caf/message.hpp>

namespace troupe {

std::string_view to_string(errc x) noexcept {
  switch (x) {
    case errc::none: return "none";
    case errc::invalid_argument: return "invalid_argument";
    case errc::invalid_config: return "invalid_config";
    case errc::parse_error: return "parse_error";
    case errc::io_error: return "io_error";
    case errc::not_found: return "not_found";
    case errc::out_of_range: return "out_of_range";
    case errc::unsupported: return "unsupported";
    case errc::shape_mismatch: return "shape_mismatch";
    case errc::timeout: return "timeout";
    case errc::unavailable: return "unavailable";
    case errc::cancelled: return "cancelled";
    case errc::version_mismatch: return "version_mismatch";
    case errc::corrupted: return "corrupted";
    case errc::process_failed: return "process_failed";
    case errc::lost:
      return "lost";
    case errc::internal: return "internal";
    case errc::illegal_state: return "illegal_state";
  }
  return "unknown";
}

caf::atom_value error_category() noexcept {
  return caf::atom("troupe");
}

caf::error make_error(errc code, std::string context) {
  return caf::error{static_cast<uint8_t>(code), error_category(),
                    caf::make_message(std::move(context))};
}

caf::error make_error(errc code) {
  return caf::error{static_cast<uint8_t>(code), error_category()};
}

errc code_of(const caf::error& err) noexcept {
  if (!err)
    return errc::none;
  if (err.category() != error_category() || err.code() >= errc_count)
    return errc::internal;
  return static_cast<errc>(err.code());
}

std::string context_of(const caf::error& err) {
  if (!err || err.category() != error_category())
    return {};
  const auto& ctx = err.context();
  if (!ctx.empty() && ctx.match_element<std::string>(0))
    return ctx.get_as<std::string>(0);
  return {};
}

std::vector<std::string> violations_of(const caf::error& err) {
  if (!err || err.category() != error_category())
    return {};
  const auto& ctx = err.context();
  if (ctx.size() == 2 && ctx.match_element<std::vector<std::string>>(1))
    return ctx.get_as<std::vector<std::string>>(1);
  auto single = context_of(err);
  if (single.empty())
    return {};
  return {single};
}

std::string describe(const caf::error& err) {
  if (!err)
    return "none";
  if (err.category() != error_category())
    return caf::to_string(err);
  auto ctx = context_of(err);
  std::string out{to_string(code_of(err))};
  if (!ctx.empty()) {
    out += ": ";
    out += ctx;
  }
  return out;
}

caf::error make_error_list(errc code, const std::vector<std::string>& violations) {
  if (violations.empty())
    return {};
  std::string msg;
  for (const auto& v : violations)
    msg += (msg.empty() ? "" : "; ") + v;
  return caf::error{static_cast<uint8_t>(code), error_category(),
                    caf::make_message(std::move(msg), violations)};
}

caf::error with_prefix(const caf::error& err, std::string_view prefix) {
  if (!err || err.category() != error_category())
    return err;
  auto ctx = context_of(err);
  std::string out{prefix};
  if (!ctx.empty()) {
    out += ": ";
    out += ctx;
  }
  const auto& c = err.context();
  if (c.size() == 2 && c.match_element<std::vector<std::string>>(1))
    return caf::error{err.code(), error_category(),
                      caf::make_message(std::move(out), c.get_as<std::vector<std::string>>(1))};
  return make_error(code_of(err), std::move(out));
}

} // namespace troupe
