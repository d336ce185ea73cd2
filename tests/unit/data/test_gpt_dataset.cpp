// GPT sample construction: Megatron's indices (numpy RandomState shuffles), coverage of an
// epoch, determinism under the seed, the index cache, --split and blending.
#include <gtest/gtest.h>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <sstream>
#include "megadlm/core/error.h"
#include "megadlm/data/gpt_dataset.h"

using namespace megadlm;
using namespace megadlm::data;

namespace {

std::string temp_dir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() /
             ("megadlm_gpt_" + std::to_string(::getpid())) / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

// Document d has lengths[d] tokens 1000*d + 0, 1, ...: every token says where it came from.
std::shared_ptr<const IndexedDataset> make_dataset(const std::string& prefix,
                                                   const std::vector<int32_t>& lengths) {
  IndexedDatasetWriter w(prefix, IndexDType::Int32);
  for (size_t d = 0; d < lengths.size(); ++d) {
    std::vector<int32_t> t(static_cast<size_t>(lengths[d]));
    for (int32_t k = 0; k < lengths[d]; ++k) t[static_cast<size_t>(k)] = static_cast<int32_t>(1000 * d) + k;
    w.add_document(t);
  }
  w.finalize();
  return std::make_shared<const IndexedDataset>(prefix);
}

const std::vector<int32_t> kLengths = {5, 3, 8, 2, 7, 4, 6, 1, 9, 3};

}  // namespace

TEST(NumpyRandomState, ShuffleMatchesNumpy) {
  // /usr/bin/python3 -c "import numpy as np; r=np.random.RandomState(1234);
  //   a=np.arange(10,dtype=np.int32); r.shuffle(a); print(a.tolist())"   (numpy 1.24.2)
  NumpyRandomState r(1234);
  std::vector<int32_t> a(10);
  std::iota(a.begin(), a.end(), 0);
  r.shuffle(a);
  EXPECT_EQ(a, (std::vector<int32_t>{7, 2, 9, 1, 0, 8, 4, 5, 6, 3}));
}

// Expected indices: tests/golden/gpt_indices.py (numpy's RandomState following Megatron-Core's
// GPTDataset), run as `/usr/bin/python3 tests/golden/gpt_indices.py` with numpy 1.24.2.
TEST(GptDataset, IndicesMatchMegatronTwoEpochs) {
  GptDatasetOptions o;
  o.seq_length = 4;
  o.seed = 1234;
  auto data = make_dataset(temp_dir("two") + "/d", kLengths);
  GptDataset ds(data, Split::Train, 0, 10, 20, o);
  EXPECT_EQ(ds.num_epochs(), 2);
  EXPECT_EQ(ds.document_index(),
            (std::vector<int32_t>{3, 3, 2, 6, 4, 5, 4, 0, 8, 8, 7, 1, 0, 9, 7, 1, 9, 2, 6, 5}));
  EXPECT_EQ(ds.shuffle_index(), (std::vector<int64_t>{22, 21, 13, 20, 1, 4, 8, 17, 14, 19, 9, 0,
                                                      11, 7, 3, 10, 6, 2, 5, 12, 16, 18, 15}));
}

TEST(GptDataset, IndicesMatchMegatronSeparateFinalEpoch) {
  GptDatasetOptions o;
  o.seq_length = 4;
  o.seed = 1234;
  auto data = make_dataset(temp_dir("sep") + "/d", kLengths);
  GptDataset ds(data, Split::Train, 0, 10, 13, o);
  EXPECT_EQ(ds.num_epochs(), 2);
  EXPECT_EQ(ds.document_index(),
            (std::vector<int32_t>{7, 2, 9, 1, 0, 8, 4, 5, 6, 3, 7, 3, 5, 1, 4, 8, 0, 2, 6, 9}));
  EXPECT_EQ(ds.shuffle_index(), (std::vector<int64_t>{8, 1, 7, 10, 9, 5, 4, 3, 0, 2, 6, 19, 16,
                                                      17, 12, 15, 22, 13, 14, 21, 20, 11, 18}));
}

TEST(GptDataset, OneEpochUsesEveryTokenOnceAndSamplesOverlapByOne) {
  GptDatasetOptions o;
  o.seq_length = 6;
  o.seed = 7;
  std::vector<int32_t> lengths;
  for (int d = 0; d < 40; ++d) lengths.push_back(1 + (d * 7) % 13);
  auto data = make_dataset(temp_dir("cover") + "/d", lengths);
  GptDataset ds(data, Split::Train, 0, 40, std::nullopt, o);
  const int64_t tokens = data->num_tokens();
  ASSERT_EQ(ds.size(), (tokens - 1) / 6);
  // Unshuffle: stream sample k is dataset sample i with shuffle[i] == k.
  std::vector<int64_t> where(static_cast<size_t>(ds.size()));
  for (int64_t i = 0; i < ds.size(); ++i) where[static_cast<size_t>(ds.shuffle_index()[static_cast<size_t>(i)])] = i;
  std::map<int32_t, int> seen;
  std::vector<int32_t> previous;
  for (int64_t k = 0; k < ds.size(); ++k) {
    auto s = ds.sample(where[static_cast<size_t>(k)]);
    ASSERT_EQ(s.size(), 7u);
    if (!previous.empty()) {
      EXPECT_EQ(s.front(), previous.back());
    }
    for (size_t t = 0; t + 1 < s.size(); ++t) ++seen[s[t]];  // first S tokens of each sample
    previous = s;
  }
  // Every token of the epoch is the input of exactly one sample, except the tail that does
  // not fill a sample.
  int64_t once = 0;
  for (auto& [tok, n] : seen) {
    EXPECT_EQ(n, 1) << "token " << tok;
    ++once;
  }
  EXPECT_EQ(once, ds.size() * 6);
  EXPECT_GT(once, tokens - 7);
}

TEST(GptDataset, DeterministicUnderTheSeedAndDifferentAcrossSeeds) {
  auto data = make_dataset(temp_dir("det") + "/d", kLengths);
  GptDatasetOptions o;
  o.seq_length = 4;
  o.seed = 99;
  GptDataset a(data, Split::Train, 0, 10, 30, o), b(data, Split::Train, 0, 10, 30, o);
  o.seed = 100;
  GptDataset c(data, Split::Train, 0, 10, 30, o);
  for (int64_t i = 0; i < 30; ++i) EXPECT_EQ(a.sample(i), b.sample(i));
  EXPECT_NE(a.shuffle_index(), c.shuffle_index());
}

TEST(GptDataset, CacheIsReusedOnlyForTheSameParameters) {
  const std::string dir = temp_dir("cache");
  auto data = make_dataset(dir + "/d", kLengths);
  GptDatasetOptions o;
  o.seq_length = 4;
  o.cache_dir = dir + "/cache";
  GptDataset first(data, Split::Train, 0, 10, 20, o);
  EXPECT_FALSE(first.loaded_from_cache());
  GptDataset again(data, Split::Train, 0, 10, 20, o);
  EXPECT_TRUE(again.loaded_from_cache());
  EXPECT_EQ(again.shuffle_index(), first.shuffle_index());
  EXPECT_EQ(again.sample_index(), first.sample_index());
  o.seed = 5;  // other parameters: a different cache entry, built anew
  GptDataset other(data, Split::Train, 0, 10, 20, o);
  EXPECT_FALSE(other.loaded_from_cache());
  GptDataset longer(data, Split::Train, 0, 10, 40, o);
  EXPECT_FALSE(longer.loaded_from_cache());
  // A damaged cache file is detected and rebuilt, not trusted.
  for (auto& f : std::filesystem::directory_iterator(o.cache_dir))
    if (f.path().string().find("shuffle_index") != std::string::npos) std::filesystem::resize_file(f.path(), 20);
  o.seed = 1234;
  GptDataset rebuilt(data, Split::Train, 0, 10, 20, o);
  EXPECT_FALSE(rebuilt.loaded_from_cache());
  EXPECT_EQ(rebuilt.shuffle_index(), first.shuffle_index());
}

namespace {

// Overwrites element `at` of an .npy file of T's written by the cache (header, then the data).
template <typename T>
void poke_npy(const std::string& path, int64_t at, T value) {
  std::fstream f(path, std::ios::binary | std::ios::in | std::ios::out);
  char head[10];
  f.read(head, 10);
  const uint16_t len = static_cast<uint16_t>(static_cast<uint8_t>(head[8]) | (static_cast<uint8_t>(head[9]) << 8));
  f.seekp(10 + len + at * static_cast<int64_t>(sizeof(T)));
  f.write(reinterpret_cast<const char*>(&value), sizeof(T));
  ASSERT_TRUE(f.good()) << path;
}

std::string cache_file(const std::string& dir, const std::string& ending) {
  for (auto& f : std::filesystem::directory_iterator(dir)) {
    const std::string p = f.path().string();
    if (p.size() >= ending.size() && p.compare(p.size() - ending.size(), ending.size(), ending) == 0) return p;
  }
  ADD_FAILURE() << "no cache file *" << ending << " in " << dir;
  return {};
}

}  // namespace

// One out-of-range value in a --data-cache-path index file crashed the run
// (SIGSEGV, no message). Every index read from the cache is checked (ranges, monotonicity,
// sizes); a damaged file is named in a warning and the indices are rebuilt (and rewritten).
TEST(GptDataset, DamagedCachedIndicesAreDetectedAndRebuilt) {
  const std::string dir = temp_dir("damaged");
  auto data = make_dataset(dir + "/d", kLengths);
  GptDatasetOptions o;
  o.seq_length = 4;
  o.cache_dir = dir + "/cache";
  const GptDataset first(data, Split::Train, 0, 10, 20, o);
  std::vector<std::vector<int32_t>> want;
  for (int64_t i = 0; i < first.size(); ++i) want.push_back(first.sample(i));
  struct Damage {
    const char* file;
    int64_t at;
    int64_t value;
  };
  // Out of range, negative, huge; a sample index that goes backwards or points past its
  // document; a shuffle index that repeats a sample.
  for (const Damage& d : {Damage{"document_index.npy", 3, 1000000}, Damage{"document_index.npy", 0, -1},
                          Damage{"document_index.npy", 5, 7},  // a document twice in an epoch
                          Damage{"sample_index.npy", 6, int64_t{1} << 40}, Damage{"sample_index.npy", 7, 1000},
                          Damage{"sample_index.npy", 4, 0}, Damage{"sample_index.npy", 1, -3},
                          Damage{"shuffle_index.npy", 2, 23}, Damage{"shuffle_index.npy", 2, -1},
                          Damage{"shuffle_index.npy", 2, first.shuffle_index()[3]}}) {
    SCOPED_TRACE(std::string(d.file) + "[" + std::to_string(d.at) + "] = " + std::to_string(d.value));
    const std::string path = cache_file(o.cache_dir, d.file);
    if (std::string(d.file) == "document_index.npy") poke_npy<int32_t>(path, d.at, static_cast<int32_t>(d.value));
    else poke_npy<int64_t>(path, d.at, d.value);
    std::ostringstream log;
    o.log = &log;
    const GptDataset again(data, Split::Train, 0, 10, 20, o);
    EXPECT_FALSE(again.loaded_from_cache());
    EXPECT_NE(log.str().find(path), std::string::npos) << log.str();  // the file is named
    ASSERT_EQ(again.size(), first.size());
    for (int64_t i = 0; i < again.size(); ++i) EXPECT_EQ(again.sample(i), want[static_cast<size_t>(i)]);
    // ...and rewritten: the next run loads it.
    const GptDataset third(data, Split::Train, 0, 10, 20, o);
    EXPECT_TRUE(third.loaded_from_cache());
  }
}

TEST(BlendedDataset, DamagedCachedIndicesAreDetectedAndRebuilt) {
  const std::string dir = temp_dir("damaged_blend");
  std::vector<int32_t> many(60, 20);
  make_dataset(dir + "/a", many);
  make_dataset(dir + "/b", many);
  GptDatasetOptions o;
  o.seq_length = 8;
  o.cache_dir = dir + "/cache";
  DataSources src;
  src.blend = parse_blend({"0.25", dir + "/a", "0.75", dir + "/b"}, "--data-path");
  src.split = "100,0,0";
  const auto first = build_gpt_datasets(src, {100, std::nullopt, std::nullopt}, o).train();
  std::vector<std::vector<int32_t>> want;
  for (int64_t i = 0; i < first->num_samples(); ++i) want.push_back(first->sample(i));
  struct Damage {
    const char* file;
    int64_t at;
    int64_t value;
  };
  for (const Damage& d : {Damage{"dataset_index.npy", 5, 7}, Damage{"dataset_index.npy", 5, -1},
                          Damage{"dataset_sample_index.npy", 9, int64_t{1} << 40},
                          Damage{"dataset_sample_index.npy", 9, -2}, Damage{"dataset_sample_index.npy", 9, 0}}) {
    SCOPED_TRACE(std::string(d.file) + "[" + std::to_string(d.at) + "] = " + std::to_string(d.value));
    const std::string path = cache_file(o.cache_dir, std::string("BlendedDataset-train-") + d.file);
    if (std::string(d.file) == "dataset_index.npy") poke_npy<int16_t>(path, d.at, static_cast<int16_t>(d.value));
    else poke_npy<int64_t>(path, d.at, d.value);
    std::ostringstream log;
    o.log = &log;
    const auto again = build_gpt_datasets(src, {100, std::nullopt, std::nullopt}, o).train();
    EXPECT_NE(log.str().find(path), std::string::npos) << log.str();
    ASSERT_EQ(again->num_samples(), first->num_samples());
    for (int64_t i = 0; i < again->num_samples(); ++i) EXPECT_EQ(again->sample(i), want[static_cast<size_t>(i)]);
  }
}

TEST(Split, ParsesLikeMegatron) {
  SplitMatrix m = parse_split("969, 30, 1");
  ASSERT_TRUE(m[0] && m[1] && m[2]);
  EXPECT_DOUBLE_EQ(m[0]->second, 0.969);
  EXPECT_DOUBLE_EQ(m[1]->second, 0.999);
  m = parse_split("98,2");
  EXPECT_TRUE(m[0] && m[1]);
  EXPECT_FALSE(m[2]);
  m = parse_split("1");
  EXPECT_TRUE(m[0]);
  EXPECT_FALSE(m[1]);
  EXPECT_THROW(parse_split("a,b"), Error);
  EXPECT_THROW(parse_split("0,0,0"), Error);
}

// Megatron reads the numbers with the pattern [.0-9]+, so "100,-5,5" lost its
// minus sign and "nan,5,5" its first proportion: the splits then did not say what was typed.
// Each proportion is read whole and must be a finite number >= 0.
TEST(Split, RefusesNegativeAndNonFiniteProportions) {
  struct Case {
    const char* split;
    const char* says;
  };
  for (const Case& c : {Case{"100,-5,5", "\"-5\" is negative"}, Case{"nan,5,5", "\"nan\" is not a finite number"},
                        Case{"5,inf,5", "\"inf\" is not a finite number"},
                        Case{"1e999,1,1", "\"1e999\" is not a finite number"},
                        Case{"90,5x,5", "cannot read \"5x\" as a number"},
                        Case{"1,2,3,4", "expected 1 to 3"}}) {
    try {
      parse_split(c.split);
      ADD_FAILURE() << c.split << " was accepted";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(std::string("--split \"") + c.split + "\""), std::string::npos) << what;
      EXPECT_NE(what.find(c.says), std::string::npos) << what;
      EXPECT_NE(what.find("969,30,1"), std::string::npos) << what;  // what would be valid
    }
  }
  // The separators Megatron's pattern let through still work: commas, slashes, spaces.
  for (const char* ok : {"969, 30, 1", "969/30/1", "969 30 1", " 969,30,1 ", "9.69e2,30,1"}) {
    const SplitMatrix m = parse_split(ok);
    ASSERT_TRUE(m[0] && m[1] && m[2]) << ok;
    EXPECT_DOUBLE_EQ(m[0]->second, 0.969) << ok;
    EXPECT_DOUBLE_EQ(m[1]->second, 0.999) << ok;
  }
}

TEST(Blend, ParsesPrefixesAndWeightedPairs) {
  Blend b = parse_blend({"A"}, "--data-path");
  EXPECT_EQ(b.prefixes, (std::vector<std::string>{"A"}));
  EXPECT_TRUE(b.weights.empty());
  b = parse_blend({"0.3", "A", "0.7", "B"}, "--data-path");
  EXPECT_EQ(b.prefixes, (std::vector<std::string>{"A", "B"}));
  EXPECT_EQ(b.weights, (std::vector<double>{0.3, 0.7}));
  b = parse_blend({"A", "B"}, "--data-path");
  EXPECT_EQ(b.prefixes.size(), 2u);
  EXPECT_TRUE(b.weights.empty());
  try {
    parse_blend({"0.3", "A", "x7", "B"}, "--data-path");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unparsable blend weight(s) \"x7\""), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_blend({"-1", "A"}, "--data-path"), Error);
  // Any odd count is prefixes only (Megatron's rule)...
  b = parse_blend({"A", "0.3", "B"}, "--data-path");
  EXPECT_EQ(b.prefixes, (std::vector<std::string>{"A", "0.3", "B"}));
  EXPECT_TRUE(b.weights.empty());
  // ...unless it starts with a weight: then a weight or a prefix is missing.
  try {
    parse_blend({"0.3", "A", "0.7"}, "--data-path");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--data-path: 3 words starting with the weight 0.3: a "
                                         "weighted blend is `weight prefix` pairs"),
              std::string::npos) << e.what();
  }
}

// Weights whose sum overflows a double normalise to 0 and NaN; the error then
// came from the sample counts. The weights are named instead.
TEST(Blend, RefusesWeightsWhoseSumOverflows) {
  try {
    parse_blend({"1e308", "A", "1e308", "B"}, "--data-path");
    ADD_FAILURE();
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("--data-path: the blend weights 1e308 (A), 1e308 (B) add up to more than "
                        "the largest number"), std::string::npos) << what;
    EXPECT_NE(what.find("only their ratios matter"), std::string::npos) << what;
  }
  // Large weights whose sum is finite are fine: only the ratios count.
  const Blend b = parse_blend({"1e300", "A", "3e300", "B"}, "--data-path");
  EXPECT_EQ(b.weights.size(), 2u);
}

TEST(Blend, GreedyIndicesFollowTheWeights) {
  // Worked by hand from the rule: sample i goes to argmax_d w_d * max(i, 1) - taken_d.
  std::vector<int16_t> di;
  std::vector<int64_t> dsi;
  build_blending_indices({0.3, 0.7}, 10, di, dsi);
  EXPECT_EQ(di, (std::vector<int16_t>{1, 0, 1, 1, 0, 1, 1, 0, 1, 1}));
  EXPECT_EQ(dsi, (std::vector<int64_t>{0, 0, 1, 2, 1, 3, 4, 2, 5, 6}));
}

TEST(BuildGptDatasets, SplitsAndBlendsDrawFromTheRightFiles) {
  const std::string dir = temp_dir("build");
  std::vector<int32_t> many(200, 20);
  make_dataset(dir + "/a", many);
  make_dataset(dir + "/b", many);
  GptDatasetOptions o;
  o.seq_length = 8;
  DataSources src;
  src.blend = parse_blend({"0.25", dir + "/a", "0.75", dir + "/b"}, "--data-path");
  src.split = "90,10,0";
  auto splits = build_gpt_datasets(src, {1000, 40, 8}, o);
  ASSERT_TRUE(splits.train() && splits.valid());
  EXPECT_FALSE(splits.test());
  auto* blend = dynamic_cast<const BlendedDataset*>(splits.train().get());
  ASSERT_NE(blend, nullptr);
  EXPECT_EQ(blend->size(), 1000);
  int from_a = 0;
  for (int16_t d : blend->dataset_index()) from_a += d == 0;
  EXPECT_EQ(from_a, 250);
  // Train samples come from documents 0..179, valid ones from 180..199 (tokens 1000*d + k).
  for (int64_t i = 0; i < 50; ++i)
    for (int32_t t : splits.train()->sample(i)) EXPECT_LT(t / 1000, 180);
  for (int64_t i = 0; i < 40; ++i)
    for (int32_t t : splits.valid()->sample(i)) EXPECT_GE(t / 1000, 180);

  DataSources per;
  per.per_split[0] = parse_blend({dir + "/a"}, "--train-data-path");
  per.per_split[1] = parse_blend({dir + "/b"}, "--valid-data-path");
  auto s2 = build_gpt_datasets(per, {100, 10, std::nullopt}, o);
  EXPECT_TRUE(s2.train() && s2.valid());
  EXPECT_FALSE(s2.test());
}

// --renormalize-blend-weights weighs each dataset by the samples it was asked
// for (Megatron-Core's sizes_per_dataset: ceil(n * w * 1.005)), not by the whole epochs it
// built. Both datasets here build one epoch of the same size, so weighing by built samples
// would turn the 0.3/0.7 blend into 200/200.
TEST(BuildGptDatasets, RenormalizedBlendWeightsAreTheRequestedSampleCounts) {
  const std::string dir = temp_dir("renormalize");
  std::vector<int32_t> many(200, 20);
  make_dataset(dir + "/a", many);
  make_dataset(dir + "/b", many);
  GptDatasetOptions o;
  o.seq_length = 8;
  o.renormalize_blend_weights = true;
  DataSources src;
  src.blend = parse_blend({"0.3", dir + "/a", "0.7", dir + "/b"}, "--data-path");
  src.split = "90,10,0";
  auto splits = build_gpt_datasets(src, {400, 20, std::nullopt}, o);
  auto* blend = dynamic_cast<const BlendedDataset*>(splits.train().get());
  ASSERT_NE(blend, nullptr);
  const int64_t asked_a = 121, asked_b = 282;  // ceil(400 * 0.3 * 1.005), ceil(400 * 0.7 * 1.005)
  ASSERT_EQ(blend->size(), 400);
  int64_t from_a = 0;
  for (int16_t d : blend->dataset_index()) from_a += d == 0;
  // Greedy blending keeps every prefix within one sample of its share.
  const double share_a = 400.0 * asked_a / (asked_a + asked_b);  // 120.1
  EXPECT_LE(std::abs(static_cast<double>(from_a) - share_a), 1.0) << from_a << " samples from a";
}

TEST(BuildGptDatasets, TokenIdsOutsideTheVocabularyStopTheBuild) {
  const std::string dir = temp_dir("vocab");
  make_dataset(dir + "/a", std::vector<int32_t>(10, 20));
  GptDatasetOptions o;
  o.seq_length = 8;
  o.vocab_size = 5000;
  DataSources src;
  src.blend = parse_blend({dir + "/a"}, "--data-path");
  try {
    build_gpt_datasets(src, {10, 2, 2}, o);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(dir + "/a.bin"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("token id 5000"), std::string::npos) << e.what();
  }
}
