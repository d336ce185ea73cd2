// NFC as UAX #15 defines it: full canonical decomposition, canonical ordering of combining marks
// (stable, by combining class), then canonical composition of unblocked pairs. Most text never
// gets there: a scan in the manner of the quick check finds it in NFC and it is returned as it is.
// Otherwise only the stretches where the scan stops, from the boundary before to the boundary
// after, are normalized; the rest is copied.
#include "data/unicode_normalize.h"
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>
#include "data/unicode_tables.h"

namespace megadlm::data::unicode {

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string to_valid_utf8(std::string_view bytes) {
  const auto* s = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size();
  std::string out;
  size_t i = 0;
  while (i < n) {
    const unsigned char c = s[i];
    size_t len = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // the range of the second byte (table 3-7)
    if (c < 0x80) len = 1;
    else if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c == 0xE0) len = 3, lo = 0xA0;
    else if (c == 0xED) len = 3, hi = 0x9F;
    else if (c >= 0xE1 && c <= 0xEF) len = 3;
    else if (c == 0xF0) len = 4, lo = 0x90;
    else if (c == 0xF4) len = 4, hi = 0x8F;
    else if (c >= 0xF1 && c <= 0xF3) len = 4;
    size_t ok = len == 0 ? 0 : 1;  // bytes of a well-formed prefix
    while (ok > 0 && ok < len && i + ok < n) {
      const unsigned char b = s[i + ok];
      if (ok == 1 ? (b < lo || b > hi) : (b & 0xC0) != 0x80) break;
      ++ok;
    }
    if (len > 0 && ok == len) {
      out.append(bytes.substr(i, len));
      i += len;
    } else {
      out.append("\xEF\xBF\xBD");  // U+FFFD for the maximal subpart (at least the byte at i)
      i += std::max<size_t>(ok, 1);
    }
  }
  return out;
}

namespace {

// Hangul syllables decompose and compose by arithmetic (The Unicode Standard, section 3.12).
constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28;
constexpr uint32_t kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

// A byte that does not belong to well-formed UTF-8 travels as this flag plus the byte: outside
// every table, it has class 0 and composes with nothing, so it stays in place and blocks
// composition across it.
constexpr uint32_t kRawByte = 0x80000000u;

struct NfcProperties {
  uint8_t combining_class = 0;
  NfcQuickCheck quick_check = kYes;
};

// Whether some code point of the 128-code-point block is listed in kNfcRanges.
constexpr bool block_listed(uint32_t block) {
  for (const NfcRange& r : kNfcRanges)
    if (r.first >> 7 <= block && block <= r.last >> 7) return true;
  return false;
}

constexpr size_t count_listed_bmp_blocks() {
  size_t n = 0;
  for (uint32_t block = 0; block < 512; ++block) n += block_listed(block);
  return n;
}

constexpr size_t kListedBmpBlocks = count_listed_bmp_blocks();
static_assert(kListedBmpBlocks < 255);

// kNfcRanges over the BMP as a two-stage table, so that the scan of non-Latin text looks up each
// code point in two loads: the block of 128 code points, then the code point in it. The blocks
// without a listed code point (CJK, Hangul syllables, most letters) share block 0: class 0,
// quick check Yes.
struct BmpProperties {
  uint8_t block[512] = {};
  NfcProperties in_block[kListedBmpBlocks + 1][128] = {};
};

constexpr BmpProperties make_bmp_properties() {
  BmpProperties t;
  uint8_t next = 1;
  for (const NfcRange& r : kNfcRanges) {
    for (uint32_t cp = r.first; cp <= r.last && cp <= 0xFFFF; ++cp) {
      uint8_t& b = t.block[cp >> 7];
      if (b == 0) b = next++;
      t.in_block[b][cp & 127] = {r.combining_class, r.quick_check};
    }
  }
  return t;
}

constexpr BmpProperties kBmpProperties = make_bmp_properties();

NfcProperties properties(uint32_t cp) {
  if (cp < 0x10000) return kBmpProperties.in_block[kBmpProperties.block[cp >> 7]][cp & 127];
  const NfcRange* r = std::upper_bound(std::begin(kNfcRanges), std::end(kNfcRanges), cp,
                                       [](uint32_t c, const NfcRange& x) { return c < x.first; });
  if (r == std::begin(kNfcRanges) || cp > (r - 1)->last) return {};
  return {(r - 1)->combining_class, (r - 1)->quick_check};
}

// Length of the well-formed UTF-8 sequence at s[i] (The Unicode Standard, table 3-7), with its
// code point in `cp`; 0 when the byte at i does not start one.
size_t decode_one(const unsigned char* s, size_t n, size_t i, uint32_t& cp) {
  const unsigned char c = s[i];
  auto continuation = [&](size_t k) { return i + k < n && (s[i + k] & 0xC0) == 0x80; };
  if (c < 0x80) {
    cp = c;
    return 1;
  }
  if (c >= 0xC2 && c <= 0xDF) {
    if (!continuation(1)) return 0;
    cp = (c & 0x1Fu) << 6 | (s[i + 1] & 0x3Fu);
    return 2;
  }
  if (c >= 0xE0 && c <= 0xEF) {
    if (!continuation(1) || !continuation(2)) return 0;
    cp = (c & 0x0Fu) << 12 | (s[i + 1] & 0x3Fu) << 6 | (s[i + 2] & 0x3Fu);
    return cp >= 0x800 && (cp < 0xD800 || cp > 0xDFFF) ? 3 : 0;  // no overlong forms, no surrogates
  }
  if (c >= 0xF0 && c <= 0xF4) {
    if (!continuation(1) || !continuation(2) || !continuation(3)) return 0;
    cp = (c & 0x07u) << 18 | (s[i + 1] & 0x3Fu) << 12 | (s[i + 2] & 0x3Fu) << 6 | (s[i + 3] & 0x3Fu);
    return cp >= 0x10000 && cp <= 0x10FFFF ? 4 : 0;
  }
  return 0;
}

// A decoded element back to bytes: a raw (ill-formed) byte as itself, a code point as UTF-8.
void append_element(std::string& out, uint32_t cp) {
  if (cp & kRawByte) out.push_back(static_cast<char>(cp & 0xFF));
  else append_utf8(out, cp);
}

struct CodePoint {
  uint32_t cp;
  uint8_t combining_class;
};

// The canonical decomposition mapping of cp, or null (also for Hangul syllables).
const CanonicalDecomposition* decomposition(uint32_t cp) {
  if (cp < kCanonicalDecompositions[0].code_point) return nullptr;
  const CanonicalDecomposition* d =
      std::lower_bound(std::begin(kCanonicalDecompositions), std::end(kCanonicalDecompositions), cp,
                       [](const CanonicalDecomposition& x, uint32_t c) { return x.code_point < c; });
  return d != std::end(kCanonicalDecompositions) && d->code_point == cp ? d : nullptr;
}

// Appends the full canonical decomposition of cp (its mappings applied recursively).
void decompose(uint32_t cp, std::vector<CodePoint>& out) {
  if (cp - kSBase < kSCount) {
    const uint32_t s = cp - kSBase;
    out.push_back({kLBase + s / kNCount, 0});
    out.push_back({kVBase + (s % kNCount) / kTCount, 0});
    if (s % kTCount != 0) out.push_back({kTBase + s % kTCount, 0});
    return;
  }
  if (const CanonicalDecomposition* d = decomposition(cp)) {
    decompose(d->first, out);
    if (d->second != 0) decompose(d->second, out);
    return;
  }
  out.push_back({cp, properties(cp).combining_class});
}

// The primary composite of the pair (a, b), or 0 when they do not compose.
uint32_t compose(uint32_t a, uint32_t b) {
  if (a - kLBase < kLCount && b - kVBase < kVCount)
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  if (a - kSBase < kSCount && (a - kSBase) % kTCount == 0 && b - kTBase - 1 < kTCount - 1)
    return a + (b - kTBase);
  const CanonicalComposition* c = std::lower_bound(
      std::begin(kCanonicalCompositions), std::end(kCanonicalCompositions), std::make_pair(a, b),
      [](const CanonicalComposition& x, const std::pair<uint32_t, uint32_t>& k) {
        return x.first != k.first ? x.first < k.first : x.second < k.second;
      });
  if (c != std::end(kCanonicalCompositions) && c->first == a && c->second == b) return c->composite;
  return 0;
}

// Whether the code point at s[i] is a boundary: a starter with quick check Yes (or a stray byte),
// which nothing before it combines with or reorders around, so the text on either side normalizes
// on its own (scripts/gen_unicode_tables.py checks the decompositions this relies on). `len` is
// its length in bytes.
bool boundary_at(const unsigned char* s, size_t n, size_t i, size_t& len) {
  len = 1;
  if (s[i] < 0xCC) return true;  // below U+0300, or a stray byte
  uint32_t cp;
  len = decode_one(s, n, i, cp);
  if (len == 0) {
    len = 1;
    return true;
  }
  const NfcProperties p = properties(cp);
  return p.combining_class == 0 && p.quick_check == kYes;
}

// Appends the NFC of `text` to `out`. `cps` is scratch space.
void normalize_stretch(std::string_view text, std::vector<CodePoint>& cps, std::string& out) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  cps.clear();
  for (size_t i = 0; i < n;) {
    uint32_t cp;
    const size_t len = decode_one(s, n, i, cp);
    if (len == 0) {
      cps.push_back({kRawByte | s[i], 0});
      ++i;
      continue;
    }
    decompose(cp, cps);
    i += len;
  }

  // Canonical ordering: each run of non-starters sorted by class, stably.
  for (size_t i = 0; i < cps.size();) {
    if (cps[i].combining_class == 0) {
      ++i;
      continue;
    }
    size_t j = i + 1;
    while (j < cps.size() && cps[j].combining_class != 0) ++j;
    if (j - i > 1)
      std::stable_sort(cps.begin() + i, cps.begin() + j, [](const CodePoint& a, const CodePoint& b) {
        return a.combining_class < b.combining_class;
      });
    i = j;
  }

  // Canonical composition, in place: each code point is tried against the last starter, unless a
  // code point between them blocks it (class 0, or a class not below its own). Ordered marks
  // leave the last one kept as the highest class between them.
  constexpr size_t kNone = static_cast<size_t>(-1);
  size_t starter = kNone, kept = 0;
  for (size_t i = 0; i < cps.size(); ++i) {
    const CodePoint c = cps[i];
    if (starter != kNone &&
        (kept == starter + 1 || cps[kept - 1].combining_class < c.combining_class)) {
      if (const uint32_t composite = compose(cps[starter].cp, c.cp)) {
        cps[starter].cp = composite;
        continue;
      }
    }
    if (c.combining_class == 0) starter = kept;
    cps[kept++] = c;
  }
  for (size_t i = 0; i < kept; ++i) append_element(out, cps[i].cp);
}

// Scans s from byte i, a boundary, while the text is certainly in NFC: the UAX #15 quick check,
// except that a Maybe (a code point that may compose with the starter before it) passes when it
// does not compose with that starter and the starter has no decomposition (which could hide marks
// that reorder around it), as for a nukta after most Devanagari consonants. Returns where it
// stops (n at the end), with `boundary` at the start of the last boundary before that.
size_t scan_nfc(const unsigned char* s, size_t n, size_t i, size_t& boundary) {
  constexpr uint32_t kUnknown = 0xFFFFFFFFu;  // a starter the scan did not decode
  uint32_t starter = kRawByte;                // none yet: composes with nothing
  uint8_t last_class = 0;
  while (i < n) {
    // Every code point below U+0300 (lead bytes below 0xCC) has class 0 and quick check Yes, and
    // a stray byte acts as one: no decoding; runs of ASCII go eight bytes at a time.
    if (s[i] < 0xCC) {
      if (s[i] < 0x80) {
        starter = s[i];
        boundary = i;
      } else if (s[i] >= 0xC0) {  // U+0080-U+02FF (maybe with a decomposition), or a stray byte
        starter = kUnknown;
        boundary = i;
      }  // else a continuation byte, inside such a code point or stray: no boundary, to be safe
      last_class = 0;
      ++i;
      uint64_t word;
      const size_t from = i;
      while (i + 8 <= n && (std::memcpy(&word, s + i, 8), (word & 0x8080808080808080ull) == 0))
        i += 8;
      if (i > from) {
        starter = s[i - 1];
        boundary = i - 1;
      }
      continue;
    }
    uint32_t cp;
    const size_t len = decode_one(s, n, i, cp);
    if (len == 0) {
      starter = kRawByte;
      boundary = i;
      last_class = 0;
      ++i;
      continue;
    }
    const NfcProperties p = properties(cp);
    if (p.quick_check == kNo) return i;
    if (p.combining_class != 0 && last_class > p.combining_class) return i;
    if (p.quick_check == kMaybe &&
        (starter == kUnknown || decomposition(starter) != nullptr || compose(starter, cp) != 0))
      return i;
    if (p.combining_class == 0) {
      starter = cp;
      if (p.quick_check == kYes) boundary = i;
    }
    last_class = p.combining_class;
    i += len;
  }
  return n;
}

}  // namespace

bool is_nfc_quick(std::string_view utf8) {
  size_t boundary = 0;
  return scan_nfc(reinterpret_cast<const unsigned char*>(utf8.data()), utf8.size(), 0, boundary) ==
         utf8.size();
}

std::string nfc(std::string_view utf8) {
  const auto* s = reinterpret_cast<const unsigned char*>(utf8.data());
  const size_t n = utf8.size();
  std::string out;
  std::vector<CodePoint> scratch;
  size_t copied = 0;  // utf8[0, copied) is in `out`
  for (size_t i = 0;;) {
    size_t boundary = i;
    i = scan_nfc(s, n, i, boundary);
    if (i == n) break;
    // Normalize from the boundary before the code point the scan stopped at (itself never a
    // boundary) to the next boundary; copy what comes before.
    size_t end = i, step;
    boundary_at(s, n, end, step);
    for (end += step; end < n && !boundary_at(s, n, end, step); end += step) {
    }
    if (out.empty()) out.reserve(n + n / 8);
    out.append(utf8.substr(copied, boundary - copied));
    normalize_stretch(utf8.substr(boundary, end - boundary), scratch, out);
    copied = i = end;
  }
  if (copied == 0) return std::string(utf8);
  out.append(utf8.substr(copied));
  return out;
}

}  // namespace megadlm::data::unicode
