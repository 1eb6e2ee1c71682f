#pragma once
// The dashboard's files (web/src and the charting library from
// web/node_modules), built into troupe by cmake/embed_assets.cmake: the
// controller serves them with no file on disk and no network.

#include <string_view>

namespace troupe::cluster {

struct web_asset {
  std::string_view name;
  std::string_view bytes;
  std::string_view content_type;
};

/// The asset called `name` ("app.js", "index.html"), or null.
const web_asset* find_web_asset(std::string_view name) noexcept;

} // namespace troupe::cluster
