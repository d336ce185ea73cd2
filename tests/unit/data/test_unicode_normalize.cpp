// NFC (src/data/unicode_normalize.cpp) on hand-picked cases of UAX #15, and on test vectors that
// Python's unicodedata computed (tests/golden/nfc_conformance.py, command in its header).
#include <gtest/gtest.h>
#include <sstream>
#include <string>
#include <vector>
#include "data/unicode_normalize.h"

using megadlm::data::unicode::is_nfc_quick;
using megadlm::data::unicode::nfc;

namespace {

// UTF-8 of space-separated hex code points ("0065 0301").
std::string utf8(const std::string& hex) {
  std::string out;
  std::istringstream in(hex);
  for (std::string h; in >> h;) {
    megadlm::data::unicode::append_utf8(out, static_cast<uint32_t>(std::stoul(h, nullptr, 16)));
  }
  return out;
}

struct Case {
  const char* what;
  const char* source;  // hex code points
  const char* nfc;
};

const Case kCases[] = {
    {"e + acute composes", "0065 0301", "00E9"},
    {"A + ring above composes", "0041 030A", "00C5"},
    {"precomposed text stays", "0063 0061 0066 00E9", "0063 0061 0066 00E9"},
    {"singleton Angstrom sign", "212B", "00C5"},
    {"singleton Ohm sign", "2126", "03A9"},
    {"singleton CJK compatibility ideograph", "F900", "8C48"},
    {"composition exclusion stays decomposed", "0958", "0915 093C"},
    {"decomposed exclusion is not composed", "0915 093C", "0915 093C"},
    {"non-starter decomposition", "0344", "0308 0301"},
    {"Tibetan non-starter decomposition", "0F73", "0F71 0F72"},
    {"marks are reordered before composing", "0061 0302 0323", "1EAD"},
    {"marks in canonical order compose", "0061 0323 0302", "1EAD"},
    {"precomposed letter with a lower-class mark after it", "00E9 0323", "1EB9 0301"},
    {"e circumflex + dot below", "00EA 0323", "1EC7"},
    {"Devanagari nukta that composes", "0928 093C", "0929"},
    {"Devanagari nukta that does not compose", "091C 093C 094D", "091C 093C 094D"},
    {"composition chains", "0055 0308 0301", "01D7"},
    {"a mark of the same class blocks", "0061 0305 0301", "0061 0305 0301"},
    {"a mark of a lower class does not block", "0065 0316 0301", "00E9 0316"},
    {"equal classes keep their order", "0061 0301 0300", "00E1 0300"},
    {"a starter between blocks", "0065 0062 0301", "0065 0062 0301"},
    {"leading marks are only reordered", "0301 0323 0065", "0323 0301 0065"},
    {"Hangul L + V", "1100 1161", "AC00"},
    {"Hangul L + V + T", "1100 1161 11A8", "AC01"},
    {"Hangul LV + T", "AC00 11A8", "AC01"},
    {"Hangul LVT takes no second T", "AC01 11A8", "AC01 11A8"},
    {"Hangul T index 0 is no consonant", "1100 1161 11A7", "AC00 11A7"},
    {"Hangul mark between L and V blocks", "1100 0301 1161", "1100 0301 1161"},
    {"Hangul syllable stays", "D55C AE00", "D55C AE00"},
    {"Arabic marks reordered", "0628 0651 064E", "0628 064E 0651"},
    {"supplementary plane composition", "11099 110BA", "1109A"},
    {"empty", "", ""},
};

std::string hex(const std::string& s) {
  std::ostringstream o;
  for (unsigned char c : s) o << std::hex << static_cast<int>(c) << ' ';
  return o.str();
}

}  // namespace

TEST(UnicodeNormalize, HandPickedCases) {
  for (const Case& c : kCases) {
    const std::string got = nfc(utf8(c.source));
    EXPECT_EQ(got, utf8(c.nfc)) << c.what << ": got bytes " << hex(got);
    EXPECT_EQ(nfc(got), got) << c.what << ": NFC of NFC";
  }
}

TEST(UnicodeNormalize, QuickCheck) {
  EXPECT_TRUE(is_nfc_quick(""));
  EXPECT_TRUE(is_nfc_quick("plain ASCII text, long enough for the eight-byte steps"));
  EXPECT_TRUE(is_nfc_quick(utf8("0063 0061 0066 00E9 0020 65E5 672C D55C")));
  EXPECT_TRUE(is_nfc_quick(utf8("0628 064E 0651")));  // marks in canonical order, no composition
  EXPECT_FALSE(is_nfc_quick(utf8("0628 0651 064E")));
  EXPECT_FALSE(is_nfc_quick(utf8("0065 0301")));   // may compose: Maybe
  EXPECT_FALSE(is_nfc_quick(utf8("212B")));        // never in NFC: No
  EXPECT_FALSE(is_nfc_quick(utf8("1100 1161")));   // Hangul V: Maybe
  // A Maybe is settled when the starter before it has no decomposition.
  EXPECT_TRUE(is_nfc_quick(utf8("091C 093C")));    // no composite of ja + nukta
  EXPECT_FALSE(is_nfc_quick(utf8("0928 093C")));   // na + nukta is U+0929
  EXPECT_FALSE(is_nfc_quick(utf8("00EA 0323")));   // the circumflex inside U+00EA reorders
  EXPECT_TRUE(is_nfc_quick(utf8("AC00 1161")));    // a Hangul LV takes no V
  EXPECT_FALSE(is_nfc_quick(utf8("AC00 11A8")));   // but a T
}

TEST(UnicodeNormalize, InvalidUtf8PassesThroughAndBlocks) {
  // Stray and truncated bytes, an overlong form, an encoded surrogate: copied as they are, and
  // nothing composes across them.
  const std::vector<std::string> unchanged = {
      "\xFF", "e\xFF\xCC\x81", "\xCC", "e\xCC", "\x80\x80", "\xC1\x81", "\xED\xA0\x80\xCC\x81",
      "\xF4\x90\x80\x80", "ab\xE2\x82", "\xC3\xA9\xCC"};
  for (const std::string& s : unchanged) EXPECT_EQ(nfc(s), s) << hex(s);
  EXPECT_EQ(nfc("e\xCC\x81\xC3"), "\xC3\xA9\xC3");
  EXPECT_EQ(nfc("\xFF" "e\xCC\x81\xFF"), "\xFF\xC3\xA9\xFF");
  // Marks after a stray byte are still put in canonical order.
  EXPECT_EQ(nfc("\xFF\xCC\x81\xCC\xA3"), "\xFF\xCC\xA3\xCC\x81");
}

TEST(UnicodeNormalize, LongRunsOfMarks) {
  // A long run of marks (a "zalgo" text) is sorted, not compared pairwise.
  std::string source = "a", want = "a";
  for (int i = 0; i < 20000; ++i) source += utf8(i % 2 ? "0301" : "0316");
  want = utf8("00E1");
  for (int i = 0; i < 10000; ++i) want += utf8("0316");
  for (int i = 1; i < 10000; ++i) want += utf8("0301");
  EXPECT_EQ(nfc(source), want);
}

namespace {
struct Vector {
  const char* source;
  const char* nfc;
};
const Vector kConformance[] = {
#include "golden/nfc_conformance.inc"
};
}  // namespace

TEST(UnicodeNormalize, MatchesPythonUnicodedata) {
  size_t compared = 0;
  for (const Vector& v : kConformance) {
    const std::string source = utf8(v.source), want = utf8(v.nfc);
    EXPECT_EQ(nfc(source), want) << "NFC(" << v.source << ") should be " << v.nfc;
    EXPECT_EQ(nfc(want), want) << "NFC(" << v.nfc << ") should be itself";
    if (is_nfc_quick(source)) {
      EXPECT_EQ(source, want) << "the quick check said Yes for " << v.source;
    }
    ++compared;
  }
  EXPECT_GT(compared, 4000u);
}
