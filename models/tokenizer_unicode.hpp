#pragma once
// The Unicode a tokenizer needs, without ICU: UTF-8 decoding, general
// categories (regex \p{L}, \p{N}, \p{P}, \p{S}, \p{M}, \s, \w), the four
// normalization forms and lowercasing. Tables are generated from the Unicode
// 14.0 database (scripts/gen_unicode_tables.py → tokenizer_unicode_tables.cpp),
// the version of the regex engine's tables.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::models::unicode {

/// One decoded unit of a UTF-8 string: a code point, or one invalid byte.
struct utf8_unit {
  char32_t cp = 0;     // the code point; the byte value when !valid
  uint32_t offset = 0; // byte offset in the input
  uint32_t length = 0; // bytes in the input (1 for an invalid byte)
  bool valid = true;
};

/// Decodes `text`; each byte of an ill-formed sequence becomes its own
/// invalid unit, so the units always cover the input exactly.
std::vector<utf8_unit> decode_utf8(std::string_view text);

/// The unit at byte `pos` of `text` (pos < text.size()).
utf8_unit decode_one(std::string_view text, size_t pos);

/// Appends the UTF-8 encoding of `cp` (must be a scalar value).
void append_utf8(std::string& out, char32_t cp);

/// `text` with every maximal ill-formed subsequence replaced by U+FFFD (the
/// substitution that Rust's String::from_utf8_lossy, Python and the WHATWG
/// decoder use).
std::string to_valid_utf8(std::string_view text);

/// Whether `text` is well-formed UTF-8.
bool is_valid_utf8(std::string_view text);

/// General categories; Cn (unassigned) is 0.
enum class category : uint8_t {
  Cn,
  Lu,
  Ll,
  Lt,
  Lm,
  Lo,
  Mn,
  Mc,
  Me,
  Nd,
  Nl,
  No,
  Pc,
  Pd,
  Ps,
  Pe,
  Pi,
  Pf,
  Po,
  Sm,
  Sc,
  Sk,
  So,
  Zs,
  Zl,
  Zp,
  Cc,
  Cf,
  Cs,
  Co,
};

/// The general category of `cp`.
category general_category(char32_t cp);

/// Whether `cp` has general category L* (regex \p{L}).
bool is_letter(char32_t cp);
/// Whether `cp` has general category N* (regex \p{N}).
bool is_number(char32_t cp);
/// Whether `cp` has general category M* (regex \p{M}).
bool is_mark(char32_t cp);
/// Whether `cp` has general category P* (regex \p{P}).
bool is_punctuation(char32_t cp);
/// Whether `cp` has general category S* (regex \p{S}).
bool is_symbol(char32_t cp);
/// Whether `cp` has the White_Space property (regex \s).
bool is_whitespace(char32_t cp);
/// Whether `cp` is a word character (regex \w: L, M, Nd, Pc).
bool is_word_char(char32_t cp);

/// Canonical combining class of `cp`.
uint8_t combining_class(char32_t cp);

/// The Unicode normalization forms.
enum class normal_form { nfc, nfd, nfkc, nfkd };

/// `text` in normalization form `form`; invalid bytes pass through.
std::string normalize(std::string_view text, normal_form form);

/// Unicode Normalization Form C of `text`; invalid bytes pass through.
inline std::string nfc(std::string_view text) {
  return normalize(text, normal_form::nfc);
}

/// Appends the full lowercase mapping of `cp` (one or two code points;
/// U+0130 → "i̇"), without context rules (Σ → σ always).
void append_lowercase(std::string& out, char32_t cp);

/// `text` lowercased code point by code point; invalid bytes pass through.
std::string lowercase(std::string_view text);

namespace detail {

struct category_range {
  char32_t first;
  char32_t last;
  uint8_t cat;
};
struct class_range {
  char32_t first;
  char32_t last;
  uint8_t ccc;
};
struct decomposition {
  char32_t cp;
  uint32_t offset; // into decomposition_pool
  uint8_t length;
  bool compat;   // a compatibility (tagged) mapping
  bool composes; // a primary composite: NFC recomposes the two into cp
};
struct case_mapping {
  char32_t cp;
  char32_t first;
  char32_t second; // 0 for a one-code-point mapping
};

extern const category_range category_ranges[];
extern const size_t category_range_count;
extern const class_range ccc_ranges[];
extern const size_t ccc_range_count;
extern const char32_t decomposition_pool[];
extern const decomposition decompositions[];
extern const size_t decomposition_count;
extern const case_mapping lowercase_mappings[];
extern const size_t lowercase_mapping_count;

} // namespace detail

} // namespace troupe::models::unicode
