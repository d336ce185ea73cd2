// A small deterministic mutation fuzzer for the file parsers: from a valid input it
// derives damaged ones — flipped bits, random and "interesting" bytes and integers (0, -1,
// 2^31, 2^63, ...), inserted, deleted, duplicated and swapped stretches, truncation — and, for
// JSON, structural damage (a value replaced by another type, a huge or negative number, a key
// dropped or renamed, arrays emptied or grown). Seeded, so a failing iteration is reproducible
// from its number alone: the fixture prints the seed, the iteration and where the input went.
#pragma once
#include <cstdint>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>

namespace megadlm::fuzz {

/// splitmix64: tiny, fast, good enough to pick mutations; one stream per (seed, iteration).
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t next() {
    uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  /// Uniform in [0, n) (n > 0).
  uint64_t below(uint64_t n) { return next() % n; }
  bool coin(int percent) { return below(100) < static_cast<uint64_t>(percent); }

 private:
  uint64_t s_;
};

/// Values that break size and offset arithmetic when they land in a header field.
inline const std::vector<uint64_t>& interesting_integers() {
  static const std::vector<uint64_t> v = {0,          1,          2,          7,          8,
                                          0x7F,       0x80,       0xFF,       0x7FFF,     0x8000,
                                          0xFFFF,     0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 0x100000000ull,
                                          0x7FFFFFFFFFFFFFFFull, 0x8000000000000000ull, ~0ull, ~0ull - 7};
  return v;
}

/// 1-4 byte-level mutations of `in`.
inline std::string mutate_bytes(const std::string& in, Rng& rng) {
  std::string s = in;
  const int rounds = 1 + static_cast<int>(rng.below(4));
  for (int r = 0; r < rounds; ++r) {
    const size_t n = s.size();
    const size_t at = n ? rng.below(n) : 0;
    switch (rng.below(10)) {
      case 0:  // flip a bit
        if (n) s[at] = static_cast<char>(s[at] ^ (1 << rng.below(8)));
        break;
      case 1:  // a random byte
        if (n) s[at] = static_cast<char>(rng.below(256));
        break;
      case 2: {  // an interesting little-endian integer of 1, 2, 4 or 8 bytes
        const uint64_t v = interesting_integers()[rng.below(interesting_integers().size())];
        const size_t width = size_t{1} << rng.below(4);
        for (size_t b = 0; b < width && at + b < n; ++b) s[at + b] = static_cast<char>(v >> (8 * b));
        break;
      }
      case 3: {  // insert random bytes
        std::string ins(1 + rng.below(16), '\0');
        for (char& c : ins) c = static_cast<char>(rng.below(256));
        s.insert(at, ins);
        break;
      }
      case 4:  // delete a stretch
        if (n) s.erase(at, 1 + rng.below(std::min<size_t>(64, n - at)));
        break;
      case 5:  // duplicate a stretch
        if (n) s.insert(at, s.substr(at, 1 + rng.below(std::min<size_t>(64, n - at))));
        break;
      case 6:  // truncate
        s.resize(n ? rng.below(n) : 0);
        break;
      case 7: {  // swap two stretches of equal length
        if (n < 4) break;
        const size_t len = 1 + rng.below(std::min<size_t>(16, n / 2));
        const size_t a = rng.below(n - len + 1), b = rng.below(n - len + 1);
        std::string x = s.substr(a, len), y = s.substr(b, len);
        s.replace(a, len, y);
        s.replace(b, len, x);
        break;
      }
      case 8: {  // a token that means something to a parser
        static const char* const kTokens[] = {"{", "}", "[", "]", ",", ":", "\"", "\\", "-1", "1e308",
                                              "null", "nan", "-0", "99999999999999999999", "\xff\xfe",
                                              "\n", "#", "@", "'", "\xc3", "\0"};
        const std::string t = kTokens[rng.below(sizeof(kTokens) / sizeof(kTokens[0]))];
        s.insert(at, t.empty() ? std::string(1, '\0') : t);
        break;
      }
      default:  // several bits in a row (a burst)
        for (size_t k = 0; k < 8 && at + k < n; ++k) s[at + k] = static_cast<char>(~s[at + k]);
        break;
    }
  }
  return s;
}

/// Replaces one random value somewhere in `j` (recursively) with a damaged one.
inline void mutate_json_node(nlohmann::json& j, Rng& rng, int depth = 0) {
  using nlohmann::json;
  const bool container = (j.is_object() || j.is_array()) && !j.empty();
  if (container && depth < 12 && rng.coin(80)) {
    auto it = j.begin();
    std::advance(it, static_cast<long>(rng.below(j.size())));
    if (j.is_object() && rng.coin(10)) {  // drop or rename a key
      const std::string key = it.key();
      json value = *it;
      j.erase(key);
      if (rng.coin(50)) j[key + "_"] = value;
      return;
    }
    mutate_json_node(*it, rng, depth + 1);
    return;
  }
  static const json kValues[] = {nullptr, true, -1, 0, 1, 2147483648.0, -9223372036854775807LL,
                                 1e308, -1e308, 0.5, "", "x", "F32", "../../etc/passwd",
                                 json::array(), json::object(), json::array({1, 2, 3}),
                                 json::array({json::array()}), 18446744073709551615ull};
  switch (rng.below(4)) {
    case 0:
      j = kValues[rng.below(sizeof(kValues) / sizeof(kValues[0]))];
      break;
    case 1:
      if (j.is_number_integer() || j.is_number_unsigned()) j = j.get<int64_t>() + (rng.coin(50) ? 1 : -1);
      else j = kValues[rng.below(sizeof(kValues) / sizeof(kValues[0]))];
      break;
    case 2:
      if (j.is_array()) {
        if (!j.empty() && rng.coin(50)) j.erase(j.begin() + static_cast<long>(rng.below(j.size())));
        else j.push_back(j.empty() ? json(0) : j.front());
      } else if (j.is_string()) {
        std::string s = j.get<std::string>();
        j = rng.coin(50) ? s + s : std::string(s.rbegin(), s.rend());
      } else {
        j = json::array({j});
      }
      break;
    default:
      if (j.is_number()) j = j.get<double>() * -1e6;
      else j = std::to_string(rng.below(1000));
      break;
  }
}

/// A damaged version of valid JSON text: structural (parsed, a node changed, re-dumped) or
/// byte-level, half each.
inline std::string mutate_json_text(const std::string& text, Rng& rng) {
  if (rng.coin(50)) {
    nlohmann::json j = nlohmann::json::parse(text);
    const int rounds = 1 + static_cast<int>(rng.below(3));
    for (int r = 0; r < rounds; ++r) mutate_json_node(j, rng);
    return j.dump();
  }
  return mutate_bytes(text, rng);
}

}  // namespace megadlm::fuzz
