// Byte-level BPE (GPT-2's scheme, used by GPT-2, GPT-NeoX, Llama-3 and Qwen2 tokenizers), read
// from a Hugging Face tokenizer.json or from GPT-2's vocab.json + merges.txt. Written from the
// published algorithm; no regex engine: the pre-tokenization patterns these tokenizers use are
// recognised by their text and run as hand-written scanners over Unicode classes
// (src/data/unicode_tables.h), with the semantics of the regex alternation (first alternative
// that matches, greedy, with the backtracking of `\s+(?!\S)` and `\s*[\r\n]+` worked out below).
#include <algorithm>
#include <array>
#include <climits>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <queue>
#include <sstream>
#include <unordered_map>
#include <nlohmann/json.hpp>
#include "data/unicode_normalize.h"
#include "data/unicode_tables.h"
#include "megadlm/core/error.h"
#include "megadlm/data/tokenizer.h"

namespace megadlm::data {

namespace {

using nlohmann::json;

// ------------------------------------------------------------------------------ Unicode bits

template <size_t N>
bool in_ranges(const unicode::CodeRange (&r)[N], uint32_t cp) {
  size_t lo = 0, hi = N;
  while (lo < hi) {
    const size_t mid = (lo + hi) / 2;
    if (cp < r[mid].first) hi = mid;
    else if (cp > r[mid].last) lo = mid + 1;
    else return true;
  }
  return false;
}

bool is_letter(uint32_t c) {
  if (c < 128) return (c | 32) - 'a' < 26;
  return in_ranges(unicode::kLetters, c);
}
bool is_number(uint32_t c) {
  if (c < 128) return c - '0' < 10;
  return in_ranges(unicode::kNumbers, c);
}
bool is_space(uint32_t c) {
  if (c < 128) return c == ' ' || (c >= 9 && c <= 13);
  return in_ranges(unicode::kSpaces, c);
}
bool is_other(uint32_t c) { return !is_space(c) && !is_letter(c) && !is_number(c); }
bool is_newline(uint32_t c) { return c == '\r' || c == '\n'; }

// Code points of a UTF-8 string with the byte offset of each (plus one past the end). Invalid
// bytes become U+FFFD-like "other" code points of one byte (byte-level BPE encodes any bytes).
void decode_utf8(std::string_view s, std::vector<uint32_t>& cps, std::vector<size_t>& at) {
  cps.clear();
  at.clear();
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    uint32_t cp = 0xFFFD;
    size_t len = 1;
    if (c < 0x80) {
      cp = c;
    } else if ((c >> 5) == 6 && i + 1 < s.size()) {
      cp = ((c & 0x1Fu) << 6) | (static_cast<unsigned char>(s[i + 1]) & 0x3Fu);
      len = 2;
    } else if ((c >> 4) == 14 && i + 2 < s.size()) {
      cp = ((c & 0x0Fu) << 12) | ((static_cast<unsigned char>(s[i + 1]) & 0x3Fu) << 6) |
           (static_cast<unsigned char>(s[i + 2]) & 0x3Fu);
      len = 3;
    } else if ((c >> 3) == 30 && i + 3 < s.size()) {
      cp = ((c & 0x07u) << 18) | ((static_cast<unsigned char>(s[i + 1]) & 0x3Fu) << 12) |
           ((static_cast<unsigned char>(s[i + 2]) & 0x3Fu) << 6) | (static_cast<unsigned char>(s[i + 3]) & 0x3Fu);
      len = 4;
    }
    cps.push_back(cp);
    at.push_back(i);
    i += len;
  }
  at.push_back(s.size());
}

// --------------------------------------------------------------------------- pre-tokenizers

enum class Pattern {
  Gpt2,    // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  Llama3,  // (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
  Qwen2,   // the same with \p{N} (one digit per piece)
};

const char* kGpt2Regex = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const char* kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Length of a contraction ('s 't 're 've 'm 'll 'd) at i, or 0. Case-insensitive for the
// (?i:...) patterns, where Unicode case folding also lets U+017F (long s) match s.
size_t contraction(const std::vector<uint32_t>& c, size_t i, bool fold) {
  const size_t n = c.size();
  if (c[i] != '\'' || i + 1 >= n) return 0;
  auto is = [&](size_t k, char ch) {
    if (k >= n) return false;
    uint32_t x = c[k];
    if (fold) {
      if (x == 0x17F) x = 's';
      if (x < 128) x = static_cast<uint32_t>(std::tolower(static_cast<int>(x)));
    }
    return x == static_cast<uint32_t>(ch);
  };
  if (is(i + 1, 's') || is(i + 1, 't') || is(i + 1, 'm') || is(i + 1, 'd')) return 2;
  if ((is(i + 1, 'r') && is(i + 2, 'e')) || (is(i + 1, 'v') && is(i + 2, 'e')) ||
      (is(i + 1, 'l') && is(i + 2, 'l')))
    return 3;
  return 0;
}

template <typename Pred>
size_t run(const std::vector<uint32_t>& c, size_t i, Pred p) {
  while (i < c.size() && p(c[i])) ++i;
  return i;
}

// End (exclusive) of the whitespace alternatives `\s+(?!\S)|\s+` at a space i: the run up to the
// next non-space j; when a non-space follows, the first alternative backtracks one code point
// (so the space before a word stays with the word) unless that would leave nothing.
size_t whitespace_piece(const std::vector<uint32_t>& c, size_t i) {
  const size_t j = run(c, i, is_space);
  if (j == c.size()) return j;
  return j - 1 > i ? j - 1 : j;
}

size_t next_piece(const std::vector<uint32_t>& c, size_t i, Pattern p) {
  const size_t n = c.size();
  const uint32_t x = c[i];
  if (p == Pattern::Gpt2) {
    if (size_t k = contraction(c, i, false)) return i + k;
    const bool sp = x == ' ' && i + 1 < n;
    if (is_letter(x) || (sp && is_letter(c[i + 1]))) return run(c, is_letter(x) ? i : i + 1, is_letter);
    if (is_number(x) || (sp && is_number(c[i + 1]))) return run(c, is_number(x) ? i : i + 1, is_number);
    if (is_other(x) || (sp && is_other(c[i + 1]))) return run(c, is_other(x) ? i : i + 1, is_other);
    return whitespace_piece(c, i);
  }
  if (size_t k = contraction(c, i, true)) return i + k;
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (is_letter(x)) return run(c, i, is_letter);
  if (!is_newline(x) && !is_number(x) && i + 1 < n && is_letter(c[i + 1])) return run(c, i + 1, is_letter);
  // \p{N}{1,3} or \p{N}
  if (is_number(x)) return std::min(run(c, i, is_number), i + (p == Pattern::Llama3 ? 3 : 1));
  // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
  if (is_other(x) || (x == ' ' && i + 1 < n && is_other(c[i + 1]))) {
    const size_t j = run(c, is_other(x) ? i : i + 1, is_other);
    return run(c, j, is_newline);
  }
  // \s*[\r\n]+ : the whitespace run up to its last newline, if it has one.
  const size_t j = run(c, i, is_space);
  for (size_t k = j; k-- > i;)
    if (is_newline(c[k])) return k + 1;
  return whitespace_piece(c, i);
}

// ----------------------------------------------------------------------- the byte-level map

// GPT-2's bytes_to_unicode: printable bytes keep their code point, the others map to 256 + k.
struct ByteMap {
  std::array<std::string, 256> to_char;
  std::unordered_map<uint32_t, uint8_t> to_byte;
  ByteMap() {
    uint32_t extra = 0;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      const uint32_t cp = printable ? b : 256 + extra++;
      unicode::append_utf8(to_char[b], cp);
      to_byte[cp] = static_cast<uint8_t>(b);
    }
  }
};

const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool lstrip = false, rstrip = false;
};

// ------------------------------------------------------------------------------ the tokenizer

class ByteLevelBpe final : public Tokenizer {
 public:
  Pattern pattern = Pattern::Gpt2;
  bool add_prefix_space = false;
  bool ignore_merges = false;
  bool nfc = false;  // normalizer NFC: see encode_segment()
  std::unordered_map<std::string, int32_t> vocab;
  std::vector<std::string> id_to_token;
  std::unordered_map<std::string, int32_t> merge_rank;  // "left right" -> rank
  std::vector<AddedToken> added;
  std::array<std::vector<size_t>, 256> added_by_byte;  // candidates by first byte, longest first
  std::vector<int32_t> prefix_ids, suffix_ids;           // post-processor template
  int32_t eod_id = -1;
  std::string source;
  std::string type_name;

  void index_added() {
    for (size_t k = 0; k < added.size(); ++k) {
      if (added[k].content.empty()) continue;
      added_by_byte[static_cast<unsigned char>(added[k].content[0])].push_back(k);
      if (added[k].id >= static_cast<int32_t>(id_to_token.size())) id_to_token.resize(static_cast<size_t>(added[k].id) + 1);
      id_to_token[static_cast<size_t>(added[k].id)] = added[k].content;
    }
    for (auto& v : added_by_byte)
      std::stable_sort(v.begin(), v.end(), [&](size_t a, size_t b) { return added[a].content.size() > added[b].content.size(); });
    is_added.assign(id_to_token.size(), 0);
    for (const auto& a : added) is_added[static_cast<size_t>(a.id)] = 1;
  }

  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> out(prefix_ids);
    size_t seg = 0, p = 0;
    while (p < text.size()) {
      const auto& cands = added_by_byte[static_cast<unsigned char>(text[p])];
      const AddedToken* hit = nullptr;
      for (size_t k : cands) {
        const std::string& t = added[k].content;
        if (text.compare(p, t.size(), t) == 0) {
          hit = &added[k];
          break;
        }
      }
      if (hit == nullptr) {
        ++p;
        continue;
      }
      size_t seg_end = p;
      if (hit->lstrip)
        while (seg_end > seg && std::isspace(static_cast<unsigned char>(text[seg_end - 1]))) --seg_end;
      encode_segment(text.substr(seg, seg_end - seg), out);
      out.push_back(hit->id);
      p += hit->content.size();
      if (hit->rstrip)
        while (p < text.size() && std::isspace(static_cast<unsigned char>(text[p]))) ++p;
      seg = p;
    }
    encode_segment(text.substr(seg), out);
    out.insert(out.end(), suffix_ids.begin(), suffix_ids.end());
    return out;
  }

  std::string decode(std::span<const int32_t> ids) const override {
    std::string out;
    const ByteMap& bm = byte_map();
    std::vector<uint32_t> cps;
    std::vector<size_t> at;
    for (int32_t id : ids) {
      if (id < 0 || static_cast<size_t>(id) >= id_to_token.size())
        MDLM_FAIL(source, ": cannot decode token id ", id, " (vocabulary of ", id_to_token.size(), ")");
      const std::string& tok = id_to_token[static_cast<size_t>(id)];
      if (is_added[static_cast<size_t>(id)]) {
        out += tok;
        continue;
      }
      decode_utf8(tok, cps, at);
      for (uint32_t cp : cps) {
        auto it = bm.to_byte.find(cp);
        if (it != bm.to_byte.end()) out.push_back(static_cast<char>(it->second));
        else unicode::append_utf8(out, cp);
      }
    }
    // Ids may end inside a character (or hold bytes that make none): text, as Hugging Face's
    // ByteLevel decoder gives it, has U+FFFD there.
    return unicode::to_valid_utf8(out);
  }

  int64_t vocab_size() const override { return static_cast<int64_t>(id_to_token.size()); }
  int32_t eod() const override { return eod_id; }
  std::string describe() const override {
    return type_name + " (" + source + ", " + std::to_string(vocab_size()) + " ids, EOD " +
           std::to_string(eod_id) + ")";
  }

 private:
  std::vector<uint8_t> is_added;
  static constexpr size_t kShards = 64;
  mutable std::array<std::mutex, kShards> cache_mu_;
  mutable std::array<std::unordered_map<std::string, std::vector<int32_t>>, kShards> cache_;

  // One stretch of text between added tokens: normalized on its own (as Hugging Face does, the
  // added tokens are split off first), then pre-tokenized and BPE-encoded piece by piece.
  void encode_segment(std::string_view text, std::vector<int32_t>& out) const {
    if (text.empty()) return;
    std::string normalized;
    if (nfc && !unicode::is_nfc_quick(text)) {  // the quick check keeps NFC text uncopied
      normalized = unicode::nfc(text);
      text = normalized;
    }
    std::string buf;
    if (add_prefix_space && text[0] != ' ') {
      buf = " ";
      buf += text;
      text = buf;
    }
    thread_local std::vector<uint32_t> cps;
    thread_local std::vector<size_t> at;
    decode_utf8(text, cps, at);
    size_t i = 0;
    while (i < cps.size()) {
      size_t j = next_piece(cps, i, pattern);
      if (j <= i) j = i + 1;
      encode_piece(text.substr(at[i], at[j] - at[i]), out);
      i = j;
    }
  }

  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
    const size_t shard = std::hash<std::string_view>{}(piece) % kShards;
    {
      std::lock_guard<std::mutex> lock(cache_mu_[shard]);
      auto it = cache_[shard].find(std::string(piece));
      if (it != cache_[shard].end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        return;
      }
    }
    std::vector<int32_t> ids = bpe(piece);
    out.insert(out.end(), ids.begin(), ids.end());
    std::lock_guard<std::mutex> lock(cache_mu_[shard]);
    if (cache_[shard].size() > 20000) cache_[shard].clear();  // bounded memory
    cache_[shard].emplace(std::string(piece), std::move(ids));
  }

  std::vector<int32_t> bpe(std::string_view piece) const {
    const ByteMap& bm = byte_map();
    std::string mapped;
    std::vector<size_t> bounds;  // symbol boundaries in `mapped`
    for (unsigned char b : piece) {
      bounds.push_back(mapped.size());
      mapped += bm.to_char[b];
    }
    bounds.push_back(mapped.size());
    if (ignore_merges) {
      auto it = vocab.find(mapped);
      if (it != vocab.end()) return {it->second};
    }
    // Symbols as a linked list; a heap of candidate merges ordered by (rank, position), each
    // checked against the list when popped (stale entries are skipped).
    const size_t n = bounds.size() - 1;
    std::vector<size_t> start(n), end(n);
    std::vector<long> prev(n), next(n);
    for (size_t k = 0; k < n; ++k) {
      start[k] = bounds[k];
      end[k] = bounds[k + 1];
      prev[k] = static_cast<long>(k) - 1;
      next[k] = k + 1 < n ? static_cast<long>(k + 1) : -1;
    }
    struct Cand {
      int rank;
      size_t left;
      size_t left_end, right_end;  // the symbols' extents when queued
      bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
    };
    std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
    std::string key;
    auto consider = [&](long l) {
      if (l < 0 || next[static_cast<size_t>(l)] < 0) return;
      const size_t a = static_cast<size_t>(l), b = static_cast<size_t>(next[a]);
      key.assign(mapped, start[a], end[a] - start[a]);
      key.push_back(' ');
      key.append(mapped, start[b], end[b] - start[b]);
      auto it = merge_rank.find(key);
      if (it != merge_rank.end()) heap.push({it->second, a, end[a], end[b]});
    };
    for (size_t k = 0; k + 1 < n; ++k) consider(static_cast<long>(k));
    std::vector<uint8_t> dead(n, 0);
    while (!heap.empty()) {
      const Cand c = heap.top();
      heap.pop();
      const size_t a = c.left;
      if (dead[a] || next[a] < 0 || end[a] != c.left_end) continue;
      const size_t b = static_cast<size_t>(next[a]);
      if (end[b] != c.right_end) continue;
      end[a] = end[b];  // merge b into a
      dead[b] = 1;
      next[a] = next[b];
      if (next[b] >= 0) prev[static_cast<size_t>(next[b])] = static_cast<long>(a);
      consider(prev[a]);
      consider(static_cast<long>(a));
    }
    std::vector<int32_t> ids;
    for (long k = 0; k >= 0; k = next[static_cast<size_t>(k)]) {
      const std::string sym = mapped.substr(start[static_cast<size_t>(k)], end[static_cast<size_t>(k)] - start[static_cast<size_t>(k)]);
      auto it = vocab.find(sym);
      if (it == vocab.end())
        MDLM_FAIL(source, ": the BPE symbol \"", sym, "\" is not in the vocabulary (the merges and "
                  "the vocabulary do not belong together)");
      ids.push_back(it->second);
    }
    return ids;
  }
};

json read_json(const std::string& path, const char* what) {
  std::ifstream f(path, std::ios::binary);
  if (!f) MDLM_FAIL("cannot open ", what, " ", path);
  try {
    return json::parse(f);
  } catch (const std::exception& e) {
    MDLM_FAIL(path, ": not valid JSON (", e.what(), ")");
  }
}

// Token ids index tables: a damaged file must not make us allocate for id 2^31 or write at -1.
constexpr int32_t kMaxTokenId = 1 << 24;  // no published tokenizer comes near 16.7M ids

int32_t checked_id(const json& v, const std::string& path, const std::string& what) {
  const int64_t id = v.get<int64_t>();
  if (id < 0 || id >= kMaxTokenId)
    MDLM_FAIL(path, ": ", what, " has id ", id, "; token ids lie in [0, ", kMaxTokenId, ")");
  return static_cast<int32_t>(id);
}

void set_vocab(ByteLevelBpe& t, const json& vocab, const std::string& path) {
  if (!vocab.is_object()) MDLM_FAIL(path, ": the vocabulary is not a JSON object of token -> id");
  t.vocab.reserve(vocab.size());
  int32_t max_id = -1;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    const int32_t id = checked_id(it.value(), path, "token \"" + it.key() + "\"");
    t.vocab.emplace(it.key(), id);
    max_id = std::max(max_id, id);
  }
  t.id_to_token.assign(static_cast<size_t>(max_id) + 1, std::string());
  for (const auto& [tok, id] : t.vocab) t.id_to_token[static_cast<size_t>(id)] = tok;
}

// Merge number `n` (from 1, in the file's order) of `source`: both parts and their
// concatenation must be tokens of the vocabulary, as Hugging Face's BPE builder requires
// (MergeTokenOutOfVocabulary); otherwise the file is refused here rather than on the first
// text that needs the merge.
void add_merge(ByteLevelBpe& t, std::string left, const std::string& right, size_t n, const std::string& source) {
  const std::string merge = left + " " + right;
  const char* const why = ", which is not in the vocabulary (every merge joins two tokens of the "
                          "vocabulary into a third; Hugging Face's tokenizers refuses this file too)";
  for (const std::string* part : std::initializer_list<const std::string*>{&left, &right})
    if (t.vocab.count(*part) == 0) MDLM_FAIL(source, ": merge ", n, " \"", merge, "\" uses \"", *part, "\"", why);
  if (t.vocab.count(left + right) == 0)
    MDLM_FAIL(source, ": merge ", n, " \"", merge, "\" makes \"", left + right, "\"", why);
  left.push_back(' ');
  left += right;
  t.merge_rank.emplace(std::move(left), static_cast<int>(t.merge_rank.size()));
}

Pattern pattern_of_split(const std::string& regex, const std::string& path) {
  if (regex == kGpt2Regex) return Pattern::Gpt2;
  if (regex == kLlama3Regex) return Pattern::Llama3;
  if (regex == kQwen2Regex) return Pattern::Qwen2;
  MDLM_FAIL(path, ": pre-tokenizer Split pattern ", regex, " is not supported; supported: the "
            "GPT-2 (ByteLevel use_regex), Llama-3 and Qwen2 patterns");
}

// Reads the pre_tokenizer: ByteLevel(use_regex) alone, or Sequence[Split(pattern), ByteLevel].
void read_pre_tokenizer(ByteLevelBpe& t, const json& pre, const std::string& path) {
  if (pre.is_null()) MDLM_FAIL(path, ": no pre_tokenizer; a byte-level BPE tokenizer.json needs one");
  const std::string type = pre.value("type", "");
  if (type == "ByteLevel") {
    t.add_prefix_space = pre.value("add_prefix_space", false);
    if (!pre.value("use_regex", true))
      MDLM_FAIL(path, ": ByteLevel pre-tokenizer without use_regex and without a Split is not supported");
    t.pattern = Pattern::Gpt2;
    return;
  }
  if (type == "Sequence") {
    bool have_split = false, have_byte_level = false;
    for (const json& p : pre.at("pretokenizers")) {
      const std::string pt = p.value("type", "");
      if (pt == "Split") {
        const json& pat = p.at("pattern");
        if (!pat.contains("Regex")) MDLM_FAIL(path, ": Split pre-tokenizer with a String pattern is not supported");
        if (p.value("behavior", "Isolated") != "Isolated" || p.value("invert", false))
          MDLM_FAIL(path, ": Split pre-tokenizer behaviour other than Isolated is not supported");
        t.pattern = pattern_of_split(pat.at("Regex").get<std::string>(), path);
        have_split = true;
      } else if (pt == "ByteLevel") {
        t.add_prefix_space = p.value("add_prefix_space", false);
        if (p.value("use_regex", true)) {
          if (have_split) MDLM_FAIL(path, ": a Split followed by a ByteLevel with use_regex is not supported");
          t.pattern = Pattern::Gpt2;
          have_split = true;
        }
        have_byte_level = true;
      } else {
        MDLM_FAIL(path, ": pre-tokenizer ", pt, " is not supported (byte-level BPE: Split + ByteLevel)");
      }
    }
    if (!have_split || !have_byte_level)
      MDLM_FAIL(path, ": the pre-tokenizer sequence is not byte-level BPE (Split + ByteLevel)");
    return;
  }
  MDLM_FAIL(path, ": pre-tokenizer ", type, " is not supported (supported: ByteLevel, Sequence of "
            "Split and ByteLevel); SentencePiece models use --tokenizer-type SentencePieceTokenizer");
}

void read_normalizer(ByteLevelBpe& t, const json& n, const std::string& path) {
  if (n.is_null()) return;
  const std::string type = n.value("type", "");
  if (type == "NFC") {
    t.nfc = true;
  } else if (type == "Sequence") {
    for (const json& x : n.at("normalizers")) read_normalizer(t, x, path);
  } else {
    MDLM_FAIL(path, ": normalizer ", type, " is not supported (supported: none, NFC, a Sequence of "
              "NFC)");
  }
}

void read_post_processor(ByteLevelBpe& t, const json& p, const std::string& path) {
  if (p.is_null()) return;
  const std::string type = p.value("type", "");
  if (type == "ByteLevel") return;  // offsets only
  if (type == "Sequence") {
    for (const json& x : p.at("processors")) read_post_processor(t, x, path);
    return;
  }
  if (type == "TemplateProcessing") {
    const json& specials = p.at("special_tokens");
    bool seen_sequence = false;
    for (const json& item : p.at("single")) {
      if (item.contains("Sequence")) {
        seen_sequence = true;
      } else if (item.contains("SpecialToken")) {
        const std::string id = item.at("SpecialToken").at("id").get<std::string>();
        for (const json& v : specials.at(id).at("ids"))
          (seen_sequence ? t.suffix_ids : t.prefix_ids).push_back(checked_id(v, path, "special token " + id));
      }
    }
    return;
  }
  MDLM_FAIL(path, ": post-processor ", type, " is not supported (supported: ByteLevel, "
            "TemplateProcessing)");
}

std::string token_text(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content")) return v.at("content").get<std::string>();
  return {};
}

}  // namespace

namespace {
std::unique_ptr<Tokenizer> huggingface_tokenizer_from_json(const json& j, const std::string& path,
                                                           const std::filesystem::path& dir);
}  // namespace

std::unique_ptr<Tokenizer> load_huggingface_tokenizer(const std::string& given) {
  namespace fs = std::filesystem;
  std::string path = given;
  fs::path dir;
  if (fs::is_directory(given)) {
    dir = given;
    path = (dir / "tokenizer.json").string();
    if (!fs::exists(path))
      MDLM_FAIL("--tokenizer-model ", given, ": the directory has no tokenizer.json (HuggingFaceTokenizer "
                "reads the fast-tokenizer file; SentencePiece .model files use SentencePieceTokenizer)");
  } else {
    dir = fs::path(given).parent_path();
  }
  const json j = read_json(path, "--tokenizer-model");
  // A field of the wrong JSON type anywhere below is the file's fault: say which file.
  try {
    return huggingface_tokenizer_from_json(j, path, dir);
  } catch (const json::exception& e) {
    MDLM_FAIL(path, ": not a tokenizer.json megadlm can read: a field is missing or has the wrong "
              "type (", e.what(), ")");
  }
}

namespace {

std::unique_ptr<Tokenizer> huggingface_tokenizer_from_json(const json& j, const std::string& path,
                                                           const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  auto t = std::make_unique<ByteLevelBpe>();
  t->source = path;
  t->type_name = "HuggingFaceTokenizer";
  const json& model = j.at("model");
  if (model.value("type", "BPE") != "BPE")
    MDLM_FAIL(path, ": model type ", model.value("type", ""), " is not supported (byte-level BPE only)");
  const json dec = j.contains("decoder") ? j.at("decoder") : json();
  if (!dec.is_null() && dec.value("type", "") != "ByteLevel")
    MDLM_FAIL(path, ": decoder ", dec.value("type", ""), " is not byte-level; this tokenizer.json is "
              "not a byte-level BPE (SentencePiece-style tokenizers need the .model file and "
              "--tokenizer-type SentencePieceTokenizer)");
  set_vocab(*t, model.at("vocab"), path);
  size_t n = 0;
  for (const json& m : model.at("merges")) {
    ++n;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos) MDLM_FAIL(path, ": merge \"", s, "\" is not `left right`");
      add_merge(*t, s.substr(0, sp), s.substr(sp + 1), n, path);
    } else {
      add_merge(*t, m.at(0).get<std::string>(), m.at(1).get<std::string>(), n, path);
    }
  }
  t->ignore_merges = model.value("ignore_merges", false);
  read_normalizer(*t, j.value("normalizer", json()), path);
  read_pre_tokenizer(*t, j.value("pre_tokenizer", json()), path);
  read_post_processor(*t, j.value("post_processor", json()), path);
  for (const json& a : j.value("added_tokens", json::array())) {
    AddedToken at;
    at.content = a.at("content").get<std::string>();
    at.id = checked_id(a.at("id"), path, "added token \"" + at.content + "\"");
    at.lstrip = a.value("lstrip", false);
    at.rstrip = a.value("rstrip", false);
    t->added.push_back(at);
  }
  t->index_added();
  for (const std::vector<int32_t>* ids : {&t->prefix_ids, &t->suffix_ids})
    for (int32_t id : *ids)
      if (static_cast<size_t>(id) >= t->id_to_token.size())
        MDLM_FAIL(path, ": the post-processor adds token id ", id, ", which is not in the vocabulary (",
                  t->id_to_token.size(), " ids)");
  // EOS from the tokenizer's config files, else the usual names among the added tokens.
  std::string eos;
  for (const char* cfg : {"tokenizer_config.json", "special_tokens_map.json"}) {
    const fs::path p = dir / cfg;
    if (eos.empty() && fs::exists(p)) {
      const json c = read_json(p.string(), "tokenizer config");
      if (c.contains("eos_token")) eos = token_text(c.at("eos_token"));
    }
  }
  auto id_of = [&](const std::string& s) -> int32_t {
    for (const auto& a : t->added)
      if (a.content == s) return a.id;
    auto it = t->vocab.find(s);
    return it == t->vocab.end() ? -1 : it->second;
  };
  if (!eos.empty()) t->eod_id = id_of(eos);
  for (const char* guess : {"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|im_end|>"})
    if (t->eod_id < 0) t->eod_id = id_of(guess);
  return t;
}

}  // namespace

std::unique_ptr<Tokenizer> load_gpt2_bpe_tokenizer(const std::string& vocab_file,
                                                   const std::string& merge_file) {
  auto t = std::make_unique<ByteLevelBpe>();
  t->source = vocab_file + " + " + merge_file;
  t->type_name = "GPT2BPETokenizer";
  set_vocab(*t, read_json(vocab_file, "--vocab-file"), vocab_file);
  std::ifstream f(merge_file);
  if (!f) MDLM_FAIL("cannot open --merge-file ", merge_file);
  std::string line;
  size_t n = 0;
  while (std::getline(f, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line.rfind("#version", 0) == 0) continue;
    const size_t sp = line.find(' ');
    if (sp == std::string::npos) MDLM_FAIL(merge_file, ": merge line \"", line, "\" is not `left right`");
    add_merge(*t, line.substr(0, sp), line.substr(sp + 1), ++n, merge_file);
  }
  if (t->merge_rank.empty()) MDLM_FAIL(merge_file, ": no merges found");
  t->pattern = Pattern::Gpt2;
  t->index_added();
  auto it = t->vocab.find("<|endoftext|>");
  t->eod_id = it == t->vocab.end() ? -1 : it->second;
  return t;
}

}  // namespace megadlm::data
