#include "models/regex.hpp"

#include "models/tokenizer_unicode.hpp"

#include <oniguruma.h>

#include <mutex>
#include <optional>

namespace troupe::models {

namespace {

// Backtracking steps one search may take (over all its start positions) before
// it gives up as "no match": far above what a sane pattern needs on a
// response, far below a hang.
constexpr unsigned long search_retry_limit = 20'000'000;

void initialise_oniguruma() {
  static std::once_flag once;
  std::call_once(once, [] {
    OnigEncoding encodings[] = {ONIG_ENCODING_UTF8};
    onig_initialize(encodings, 1);
  });
}

std::string onig_message(int code, OnigErrorInfo* info) {
  OnigUChar message[ONIG_MAX_ERROR_MESSAGE_LEN];
  onig_error_code_to_str(message, code, info);
  return reinterpret_cast<const char*>(message);
}

} // namespace

struct regex::compiled {
  regex_t* re = nullptr;
  ~compiled() {
    if (re != nullptr)
      onig_free(re);
  }
};

expected<regex> regex::compile(const std::string& pattern, options opts) {
  initialise_oniguruma();
  auto* syntax = opts.syntax == dialect::python ? ONIG_SYNTAX_PYTHON : ONIG_SYNTAX_DEFAULT;
  OnigOptionType flags = opts.dot_all ? ONIG_OPTION_MULTILINE : ONIG_OPTION_NONE;
  auto build = [&](const std::string& source, regex_t** re) -> expected<void> {
    OnigErrorInfo info{};
    auto* b = reinterpret_cast<const OnigUChar*>(source.data());
    int r = onig_new(re, b, b + source.size(), flags, ONIG_ENCODING_UTF8, syntax, &info);
    if (r != ONIG_NORMAL)
      return make_error(errc::parse_error,
                        "invalid regex '" + pattern + "': " + onig_message(r, &info));
    return {};
  };
  auto c = std::make_shared<compiled>();
  if (auto ok = build(pattern, &c->re); !ok)
    return ok.error();
  if (opts.full) {
    // Compiled alone first, so an unbalanced pattern cannot escape the group.
    c = std::make_shared<compiled>();
    auto anchored = "\\A(?:" + pattern + ")" + (opts.syntax == dialect::python ? "\\Z" : "\\z");
    if (auto ok = build(anchored, &c->re); !ok)
      return ok.error();
  }
  regex out;
  out.pattern_ = pattern;
  out.re_ = std::move(c);
  return out;
}

namespace {

// One search from byte `from`: the match's range, or nothing.
std::optional<std::pair<size_t, size_t>> search_from(regex_t* re, std::string_view text,
                                                     size_t from, OnigRegion* region) {
  auto* begin = reinterpret_cast<const OnigUChar*>(text.data());
  auto* end = begin + text.size();
  OnigMatchParam* mp = onig_new_match_param();
  onig_initialize_match_param(mp);
  onig_set_retry_limit_in_search_of_match_param(mp, search_retry_limit);
  onig_region_clear(region);
  auto r = onig_search_with_param(re, begin, end, begin + from, end, region, ONIG_OPTION_NONE, mp);
  onig_free_match_param(mp);
  if (r < 0)
    return std::nullopt; // ONIG_MISMATCH, the retry limit, or an engine error
  return std::pair{static_cast<size_t>(region->beg[0]), static_cast<size_t>(region->end[0])};
}

} // namespace

bool regex::matches(std::string_view text) const {
  OnigRegion* region = onig_region_new();
  auto m = search_from(re_->re, text, 0, region);
  onig_region_free(region, 1);
  return m.has_value();
}

std::vector<std::pair<size_t, size_t>> regex::find_all(std::string_view text) const {
  std::vector<std::pair<size_t, size_t>> out;
  OnigRegion* region = onig_region_new();
  size_t from = 0;
  std::optional<size_t> last_match_end;
  while (from <= text.size()) {
    auto m = search_from(re_->re, text, from, region);
    if (!m)
      break;
    auto [s, e] = *m;
    if (s == e && last_match_end && *last_match_end == e) {
      from += from < text.size() ? unicode::decode_one(text, from).length : 1;
      continue;
    }
    from = e;
    last_match_end = e;
    out.emplace_back(s, e);
  }
  onig_region_free(region, 1);
  return out;
}

} // namespace troupe::models
