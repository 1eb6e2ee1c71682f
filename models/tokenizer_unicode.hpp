#pragma once
// The Unicode a tokenizer needs, without ICU: UTF-8 decoding, letter / number
// / white-space classification (regex \p{L}, \p{N}, \s) and NFC normalisation.
// Tables are generated (tokenizer_unicode_tables.cpp).

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

/// Appends the UTF-8 encoding of `cp` (must be a scalar value).
void append_utf8(std::string& out, char32_t cp);

/// `text` with every maximal ill-formed subsequence replaced by U+FFFD (the
/// substitution that Rust's String::from_utf8_lossy and Python use).
std::string to_valid_utf8(std::string_view text);

/// Whether `cp` has general category L* (regex \p{L}).
bool is_letter(char32_t cp);

/// Whether `cp` has general category N* (regex \p{N}).
bool is_number(char32_t cp);

/// Whether `cp` has the White_Space property (regex \s).
bool is_whitespace(char32_t cp);

/// Canonical combining class of `cp`.
uint8_t combining_class(char32_t cp);

/// Unicode Normalization Form C of `text`; invalid bytes pass through.
std::string nfc(std::string_view text);

namespace detail {

struct code_range {
  char32_t first;
  char32_t last;
};
struct class_range {
  char32_t first;
  char32_t last;
  uint8_t ccc;
};
struct decomposition {
  char32_t cp;
  char32_t first;
  char32_t second; // 0 for a singleton mapping
  bool composes;   // a primary composite: NFC recomposes first + second into cp
};

extern const code_range letter_ranges[];
extern const size_t letter_range_count;
extern const code_range number_ranges[];
extern const size_t number_range_count;
extern const class_range ccc_ranges[];
extern const size_t ccc_range_count;
extern const decomposition decompositions[];
extern const size_t decomposition_count;

} // namespace detail

} // namespace troupe::models::unicode
