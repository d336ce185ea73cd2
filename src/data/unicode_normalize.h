// Unicode Normalization Form C (UAX #15) of UTF-8 text, for the NFC normalizer of Hugging Face
// tokenizer.json files (internal to the data module). The data: src/data/unicode_tables.h.
// Bytes that are not well-formed UTF-8 pass through unchanged and nothing composes across them:
// the byte-level tokenizer encodes any bytes as they are (Hugging Face only ever sees valid text).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace megadlm::data::unicode {

/// Appends the UTF-8 encoding (1 to 4 bytes) of code point `cp` (at most U+10FFFF).
void append_utf8(std::string& out, uint32_t cp);

/// `bytes` as well-formed UTF-8: every maximal ill-formed subpart (a byte that starts no
/// character, or the start of one cut short) becomes U+FFFD, as The Unicode Standard recommends
/// (section 3.9) and Rust's String::from_utf8_lossy (Hugging Face's byte-level decoder) and
/// Python's errors="replace" do. Well-formed text is returned unchanged.
std::string to_valid_utf8(std::string_view bytes);

/// True when `utf8` is certainly in NFC, so that nfc() would return it unchanged: the UAX #15
/// quick check, with its Maybe answers settled where that is cheap. Text below U+0300 costs a
/// byte scan.
bool is_nfc_quick(std::string_view utf8);

/// The NFC form of `utf8`: full canonical decomposition, canonical ordering of combining marks,
/// canonical composition.
std::string nfc(std::string_view utf8);

}  // namespace megadlm::data::unicode
