// File parsers survive garbage: a Megatron .idx, the dataset index cache of --data-cache-path
// (document, sample, shuffle and blend indices), a safetensors header, a checkpoint
// index (metadata.json, with its run configuration), a Hugging Face tokenizer.json and a flag
// file are each fed kFuzzIterations inputs derived from a valid one by mutator.h (fixed
// seed). Every input must either parse (and then be usable: every sequence, tensor or token read
// back) or be refused with a megadlm::Error that says what is wrong and, for data files, names
// the file. Anything else — another exception type escaping, a crash, an out-of-bounds read under
// the sanitizers (-DMEGADLM_SANITIZE=ON) — fails, printing the seed and iteration; the input is
// kept in /tmp/megadlm_fuzz_failure_<target>.
#include <gtest/gtest.h>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <typeinfo>
#include "mutator.h"
#include "megadlm/core/error.h"
#include "megadlm/core/logging.h"
#include "megadlm/data/gpt_dataset.h"
#include "megadlm/data/indexed_dataset.h"
#include "megadlm/data/tokenizer.h"
#include "megadlm/training/arguments/arguments.h"
#include "megadlm/training/checkpoint/config_json.h"
#include "megadlm/training/checkpoint/format.h"
#include "megadlm/training/checkpoint/safetensors.h"
#include "support/scratch.h"

using namespace megadlm;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

constexpr uint64_t kSeed = 0x6d65676164;  // fixed: CI runs the same inputs every time
constexpr int kFuzzIterations = 3000;

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

void spit(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

struct Outcome {
  int accepted = 0, refused = 0;
};

// Runs `attempt(i, rng)` for every iteration: it returns normally (the input parsed and was
// used) or throws megadlm::Error, whose message must contain `must_name` (when not empty). The
// input of a failing iteration is at `input_path` (the attempt writes it there).
template <typename Attempt>
Outcome run_fuzzer(const std::string& target, const std::string& input_path, const std::string& must_name,
             Attempt&& attempt, int iterations = kFuzzIterations) {
  Outcome o;
  for (int i = 0; i < iterations; ++i) {
    fuzz::Rng rng(kSeed ^ (static_cast<uint64_t>(i) * 0x100000001B3ull));
    const auto keep = [&](const std::string& why) {
      const std::string kept = "/tmp/megadlm_fuzz_failure_" + target;
      std::error_code ec;
      fs::copy_file(input_path, kept, fs::copy_options::overwrite_existing, ec);
      ADD_FAILURE() << target << ": seed " << kSeed << " iteration " << i << ": " << why
                    << " (input kept in " << kept << ")";
    };
    try {
      attempt(i, rng);
      ++o.accepted;
    } catch (const Error& e) {
      ++o.refused;
      const std::string what = e.what();
      if (what.size() < 10) keep("an Error without a useful message: \"" + what + "\"");
      else if (!must_name.empty() && what.find(must_name) == std::string::npos)
        keep("the error does not name " + must_name + ": " + what);
    } catch (const std::exception& e) {
      keep(std::string("a ") + typeid(e).name() + " escaped instead of megadlm::Error: " + e.what());
    }
    if (::testing::Test::HasFailure()) break;  // one reproducer is enough
  }
  return o;
}

}  // namespace

TEST(FuzzParsers, IndexedDatasetIdx) {
  test::TempDir dir("fuzz_idx_");
  const std::string seed_prefix = dir / "seed", prefix = dir / "case";
  {
    data::IndexedDatasetWriter w(seed_prefix, data::IndexDType::UInt16);
    for (int d = 0; d < 6; ++d) {
      std::vector<int32_t> t(static_cast<size_t>(3 + d));
      for (size_t k = 0; k < t.size(); ++k) t[k] = static_cast<int32_t>(7 * d + k);
      w.add_sequence(t);
      if (d % 2 == 1) w.end_document();
    }
    w.finalize();
  }
  const std::string idx = slurp(seed_prefix + ".idx"), bin = slurp(seed_prefix + ".bin");
  const Outcome o = run_fuzzer("idx", prefix + ".idx", "case.", [&](int, fuzz::Rng& rng) {
    spit(prefix + ".idx", fuzz::mutate_bytes(idx, rng));
    // Now and then the .bin is damaged too (its size is what the index is checked against).
    spit(prefix + ".bin", rng.coin(20) ? fuzz::mutate_bytes(bin, rng) : bin);
    data::IndexedDataset ds(prefix);
    for (int64_t s = 0; s < ds.num_sequences(); ++s) (void)ds.sequence(s);
    for (int64_t d = 0; d <= ds.num_documents(); ++d) (void)ds.document_index(d);
    ds.check_token_ids(64);
  });
  EXPECT_GT(o.refused, kFuzzIterations / 2);  // most damage must be noticed
  RecordProperty("accepted", o.accepted);
}

// The .npy index files a --data-cache-path run reads back (one value out of
// range crashed the run). A damaged file is either noticed (the indices are rebuilt: the
// samples are the undamaged ones) or still a valid index (then every sample is still whole);
// nothing crashes and nothing reads outside the data.
TEST(FuzzParsers, DatasetIndexCache) {
  test::TempDir dir("fuzz_cache_");
  const std::string a = dir / "a", b = dir / "b";
  for (const std::string& prefix : {a, b}) {
    data::IndexedDatasetWriter w(prefix, data::IndexDType::Int32);
    for (int d = 0; d < 12; ++d) {
      std::vector<int32_t> t(static_cast<size_t>(1 + (d * 5) % 9));
      for (size_t k = 0; k < t.size(); ++k) t[k] = static_cast<int32_t>(100 * d + k);
      w.add_document(t);
    }
    w.finalize();
  }
  data::GptDatasetOptions o;
  o.seq_length = 4;
  o.cache_dir = dir / "cache";
  data::DataSources src;
  src.blend = data::parse_blend({"0.4", a, "0.6", b}, "--data-path");
  src.split = "100,0,0";
  const std::array<std::optional<int64_t>, 3> want_samples = {40, std::nullopt, std::nullopt};
  const auto reference = data::build_gpt_datasets(src, want_samples, o).train();
  std::vector<std::vector<int32_t>> want;
  for (int64_t i = 0; i < reference->num_samples(); ++i) want.push_back(reference->sample(i));
  std::vector<std::pair<std::string, std::string>> files;  // path, bytes
  for (const auto& f : fs::directory_iterator(o.cache_dir))
    if (f.path().extension() == ".npy") files.emplace_back(f.path().string(), slurp(f.path().string()));
  ASSERT_EQ(files.size(), 3u * 2 + 2);  // document, sample, shuffle index of a and b; the blend's two
  const logging::Options quiet_before = logging::options();
  logging::Options quiet = quiet_before;
  quiet.level = logging::Level::Error;  // one warning per damaged file otherwise
  logging::configure(quiet);
  const std::string input = dir / "case.npy";
  int undamaged = 0;
  size_t last = 0;  // the file damaged last time (a rebuild rewrites it, an accepted one stays)
  // Each input builds two datasets and a blend and reads every sample (files written, renamed):
  // fewer iterations than the parsers of one file get.
  constexpr int kIterations = kFuzzIterations / 5;
  const Outcome out = run_fuzzer("index_cache", input, "", [&](int, fuzz::Rng& rng) {
    spit(files[last].first, files[last].second);
    last = rng.below(files.size());
    const auto& [path, bytes] = files[last];
    const std::string damaged = rng.coin(50) ? fuzz::mutate_bytes(bytes, rng) : [&] {
      // Same size, one element's bytes replaced: the file is read, its values checked.
      std::string s = bytes;
      const size_t at = 128 + rng.below(s.size() - 128);
      const uint64_t v = fuzz::interesting_integers()[rng.below(fuzz::interesting_integers().size())];
      for (size_t k = 0; k < 8 && at + k < s.size(); ++k) s[at + k] = static_cast<char>(v >> (8 * k));
      return s;
    }();
    spit(input, damaged);
    spit(path, damaged);
    const auto got = data::build_gpt_datasets(src, want_samples, o).train();
    if (got->num_samples() != static_cast<int64_t>(want.size()))
      throw std::runtime_error("the blend has " + std::to_string(got->num_samples()) + " samples, not " +
                               std::to_string(want.size()));
    bool same = true;
    for (int64_t i = 0; i < got->num_samples(); ++i) {
      const std::vector<int32_t> s = got->sample(i);
      if (s.size() != 5) throw std::runtime_error("sample " + std::to_string(i) + " has " + std::to_string(s.size()) + " tokens");
      same = same && s == want[static_cast<size_t>(i)];
    }
    undamaged += same;
  }, kIterations);
  logging::configure(quiet_before);
  EXPECT_EQ(out.refused, 0);  // a cache is rebuilt, never a reason to stop
  // Most damage is noticed and rebuilt; what is left is a valid index of other samples.
  EXPECT_GT(undamaged, kIterations * 3 / 4);
  RecordProperty("undamaged", undamaged);
}

TEST(FuzzParsers, SafetensorsHeader) {
  test::TempDir dir("fuzz_st_");
  const std::string seed = dir / "seed.safetensors", path = dir / "case.safetensors";
  const std::vector<float> a = {1, 2, 3, 4, 5, 6};
  const std::vector<int32_t> b = {7, 8, 9};
  const std::vector<uint16_t> c = {1, 2, 3, 4};
  checkpoint::write_safetensors(seed, {{"a", DType::F32, {2, 3}, a.data()},
                                       {"b", DType::I32, {3}, b.data()},
                                       {"model/c#1", DType::BF16, {2, 2}, c.data()}},
                                {{"format", "megadlm-checkpoint"}});
  const std::string file = slurp(seed);
  uint64_t header_len = 0;
  for (int k = 0; k < 8; ++k) header_len |= uint64_t{static_cast<uint8_t>(file[k])} << (8 * k);
  const std::string header = file.substr(8, header_len), data = file.substr(8 + header_len);
  const Outcome o = run_fuzzer("safetensors", path, path, [&](int, fuzz::Rng& rng) {
    std::string bytes;
    if (rng.coin(35)) {
      bytes = fuzz::mutate_bytes(file, rng);
    } else {
      // Structural damage to the header, with a consistent length field most of the time.
      json h = json::parse(header);
      const int rounds = 1 + static_cast<int>(rng.below(3));
      for (int r = 0; r < rounds; ++r) fuzz::mutate_json_node(h, rng);
      std::string text = h.dump();
      uint64_t len = text.size();
      if (rng.coin(15)) len = fuzz::interesting_integers()[rng.below(fuzz::interesting_integers().size())];
      bytes.resize(8);
      for (int k = 0; k < 8; ++k) bytes[static_cast<size_t>(k)] = static_cast<char>(len >> (8 * k));
      bytes += text + data;
    }
    spit(path, bytes);
    checkpoint::SafetensorsFile f(path);
    for (const auto& [key, e] : f.entries()) {
      std::vector<char> buf(e.end - e.begin);
      if (e.numel() > 0 && e.end > e.begin) f.read_elements(key, 0, e.numel(), buf.data());
    }
  });
  EXPECT_GT(o.refused, kFuzzIterations / 2);
}

TEST(FuzzParsers, CheckpointIndexAndRunConfig) {
  test::TempDir dir("fuzz_index_");
  const std::string path = dir / "metadata.json";
  checkpoint::CheckpointIndex idx;
  idx.state.iteration = 6;
  idx.state.consumed_samples = 48;
  idx.state.optimizer_steps = 6;
  idx.state.has_optimizer = true;
  idx.state.rng_seed = 1234;
  RunConfig rc;
  rc.model.num_layers = 2;
  rc.model.hidden_size = 64;
  rc.model.num_attention_heads = 4;
  rc.model.vocab_size = rc.model.padded_vocab_size = 128;
  idx.state.run_config_json = checkpoint::run_config_to_json(rc);
  idx.state.model_args = {"--num-layers", "2", "--hidden-size", "64"};
  idx.files["model_rank00000.safetensors"] = {1024, std::string(64, 'a')};
  idx.files["model_rank00001.safetensors"] = {1024, std::string(64, 'b')};
  checkpoint::TensorInfo& t = idx.tensors["model/embedding.word_embeddings.weight"];
  t.shape = {128, 64};
  t.pieces.push_back({"model_rank00000.safetensors", "model/embedding.word_embeddings.weight", DType::F32,
                      {{0, 0}, {128, 64}, 0, 5120}});
  t.pieces.push_back({"model_rank00001.safetensors", "model/embedding.word_embeddings.weight", DType::F32,
                      {{0, 0}, {128, 64}, 5120, 8192}});
  checkpoint::TensorInfo& n = idx.tensors["model/decoder.final_layernorm.weight"];
  n.shape = {64};
  n.pieces.push_back({"model_rank00000.safetensors", "model/decoder.final_layernorm.weight", DType::F32,
                      checkpoint::Region::whole({64})});
  // Without its checksum (as an index written before it existed), so that damage reaches the
  // structural checks instead of stopping at the checksum (test_directory_safety checks that).
  json plain = json::parse(idx.to_json());
  plain.erase(checkpoint::kIndexChecksumField);
  const std::string text = plain.dump(1);
  const Outcome o = run_fuzzer("metadata", path, path, [&](int, fuzz::Rng& rng) {
    const std::string damaged = fuzz::mutate_json_text(text, rng);
    spit(path, damaged);  // only for a failure's reproducer: parse() takes the text
    const checkpoint::CheckpointIndex got = checkpoint::CheckpointIndex::parse(damaged, path);
    for (const auto& [name, info] : got.tensors)
      for (const checkpoint::PieceInfo& p : info.pieces)
        if (p.region.numel() <= (int64_t{1} << 20)) (void)checkpoint::region_runs(info.shape, p.region);
    if (!got.state.run_config_json.empty()) (void)checkpoint::run_config_from_json(got.state.run_config_json, path);
  });
  EXPECT_GT(o.refused, kFuzzIterations / 4);
  EXPECT_GT(o.accepted, 0);  // some damage (a changed number) leaves a valid index
}

TEST(FuzzParsers, HuggingFaceTokenizerJson) {
  test::TempDir dir("fuzz_tok_");
  const std::string path = dir / "tokenizer.json";
  // A byte-level BPE tokenizer: the 256 byte symbols of GPT-2's byte encoder, one merge, one
  // added token and a Split pre-tokenizer with the GPT-2 pattern.
  auto symbol = [](int b) {
    int n = 0;
    for (int x = 0; x < 256; ++x) {
      const bool printable = (x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE);
      const int code = printable ? x : 256 + n++;
      if (x == b) {
        std::string s;
        if (code < 0x80) s += static_cast<char>(code);
        else {
          s += static_cast<char>(0xC0 | (code >> 6));
          s += static_cast<char>(0x80 | (code & 0x3F));
        }
        return s;
      }
    }
    return std::string();
  };
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[symbol(b)] = b;
  vocab[symbol('h') + symbol('i')] = 256;
  const json tok = {
      {"version", "1.0"},
      {"added_tokens", {{{"id", 257}, {"content", "<|endoftext|>"}, {"special", true}}}},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"post_processor", {{"type", "ByteLevel"}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", {symbol('h') + " " + symbol('i')}}}},
  };
  const std::string text = tok.dump();
  spit(path, text);
  ASSERT_EQ(data::load_huggingface_tokenizer(path)->encode("hi"), (std::vector<int32_t>{256}));
  const Outcome o = run_fuzzer("tokenizer", path, "tokenizer.json", [&](int, fuzz::Rng& rng) {
    spit(path, fuzz::mutate_json_text(text, rng));
    const auto t = data::load_huggingface_tokenizer(path);
    for (const char* s : {"hi there", "caf\xC3\xA9 <|endoftext|> \xF0\x9F\xA4\x96", "", "\xff\xfe broken utf-8"}) {
      const std::vector<int32_t> ids = t->encode(s);
      (void)t->decode(ids);
    }
    (void)t->vocab_size();
    (void)t->eod();
  });
  EXPECT_GT(o.refused, kFuzzIterations / 4);
}

TEST(FuzzParsers, FlagFiles) {
  test::TempDir dir("fuzz_args_");
  const std::string path = dir / "run.args";
  const std::string text =
      "# a tiny diffusion LM\n--num-layers 2 --hidden-size 64 --num-attention-heads 4 --ffn-hidden-size 128\n"
      "--swiglu --normalization RMSNorm --norm-epsilon 1e-6 --qk-layernorm\n"
      "--vocab-size 128 --mask-token 127 --seq-length 64 --max-position-embeddings 64\n"
      "--micro-batch-size 4 --global-batch-size 8 --train-iters 20 --split \"969, 30, 1\"\n"
      "--lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine --lr-warmup-iters 2 --mock-data\n"
      "--cp-comm-type p2p --metrics-jsonl 'a file.jsonl' --device cpu\n";
  spit(path, text);
  ASSERT_NO_THROW(training::parse_arguments({"@" + path}, {}));
  const Outcome o = run_fuzzer("args", path, "", [&](int, fuzz::Rng& rng) {
    spit(path, fuzz::mutate_bytes(text, rng));
    (void)training::parse_arguments({"@" + path, "--dry-run"}, {});
  });
  EXPECT_GT(o.refused, kFuzzIterations / 4);
  EXPECT_GT(o.accepted, 0);
}
