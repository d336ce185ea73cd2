// The checkpoint building blocks on their own: SHA-256 against the FIPS 180-4 vectors, the
// safetensors reader and writer (round trip, a file written byte by byte from the spec, and
// every kind of damage the reader must name), the box + flat-range geometry against a
// brute-force element enumeration, and the index's JSON form.
#include <gtest/gtest.h>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include "megadlm/core/stream.h"
#include "megadlm/training/checkpoint/file_io.h"
#include "megadlm/training/checkpoint/format.h"
#include "megadlm/training/checkpoint/safetensors.h"
#include "megadlm/training/checkpoint/sha256.h"
#include "support/scratch.h"

using namespace megadlm;
using test::TempDir;
using namespace megadlm::checkpoint;
namespace fs = std::filesystem;

namespace {

std::string sha(const std::string& s) {
  Sha256 h;
  h.update(s.data(), s.size());
  return h.hex_digest();
}

// A fresh directory per test, removed afterwards.
std::string file_bytes(const std::string& path) { return read_text_file(path); }

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

template <typename Fn>
void expect_error(Fn&& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one mentioning " << parts.front();
  } catch (const Error& e) {
    for (const std::string& p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << "missing '" << p << "' in: " << e.what();
  }
}

}  // namespace

TEST(Sha256, MatchesTheFipsVectors) {
  EXPECT_EQ(sha(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(sha(std::string(1000000, 'a')),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, GivesTheSameDigestForAnySplitOfTheInput) {
  std::string data(10007, '\0');
  std::mt19937 rng(7);
  for (char& c : data) c = static_cast<char>(rng());
  const std::string whole = sha(data);
  for (size_t step : {1, 3, 63, 64, 65, 1000}) {
    Sha256 h;
    for (size_t i = 0; i < data.size(); i += step) h.update(data.data() + i, std::min(step, data.size() - i));
    EXPECT_EQ(h.hex_digest(), whole) << "chunks of " << step;
  }
}

TEST(Sha256, TheCpuInstructionsAndThePortableCodeAgree) {
  if (!Sha256::hardware_available()) GTEST_SKIP() << "this CPU has no SHA instructions; only the portable code runs";
  std::mt19937 rng(99);
  for (size_t n : {0, 1, 55, 56, 63, 64, 65, 127, 128, 1000, 65536 + 17}) {
    std::string data(n, '\0');
    for (char& c : data) c = static_cast<char>(rng());
    Sha256 hw(Sha256::Engine::Best), sw(Sha256::Engine::Portable);
    hw.update(data.data(), data.size());
    sw.update(data.data(), data.size());
    EXPECT_EQ(hw.hex_digest(), sw.hex_digest()) << n << " bytes";
  }
  Sha256 sw(Sha256::Engine::Portable);
  sw.update("abc", 3);
  EXPECT_EQ(sw.hex_digest(), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(Safetensors, RoundTripsTensorsOfEveryDtypeWithMetadata) {
  TempDir dir;
  std::vector<float> f = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, -1.0f};
  std::vector<bf16_t> b = {bf16_t::from_float(1.0f), bf16_t::from_float(-0.5f), bf16_t::from_float(3.0f)};
  std::vector<int64_t> l = {1, -2, 1LL << 40};
  std::vector<double> d = {0.1, 0.2};
  std::vector<int32_t> i = {5};
  const WrittenFile w = write_safetensors(dir / "a.safetensors",
                                          {{"f", DType::F32, {2, 3}, f.data()},
                                           {"b", DType::BF16, {3}, b.data()},
                                           {"l", DType::I64, {3}, l.data()},
                                           {"d", DType::F64, {1, 2}, d.data()},
                                           {"i", DType::I32, {}, i.data()},
                                           {"empty", DType::F32, {0, 4}, nullptr}},
                                          {{"format", "test"}});
  EXPECT_EQ(w.sha256, sha256_file(dir / "a.safetensors"));
  EXPECT_EQ(static_cast<int64_t>(w.bytes), file_size_or_missing(dir / "a.safetensors"));
  // The header length makes the data start 8-byte aligned.
  const std::string bytes = file_bytes(dir / "a.safetensors");
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ((8 + n) % 8, 0u);

  SafetensorsFile r(dir / "a.safetensors");
  EXPECT_EQ(r.metadata().at("format"), "test");
  EXPECT_EQ(r.entries().size(), 6u);
  Tensor tf = r.read("f");
  EXPECT_EQ(tf.shape(), (Shape{2, 3}));
  EXPECT_EQ(std::memcmp(tf.data_ptr(), f.data(), f.size() * 4), 0);
  Tensor tb = r.read("b");
  EXPECT_EQ(tb.dtype(), DType::BF16);
  EXPECT_EQ(std::memcmp(tb.data_ptr(), b.data(), b.size() * 2), 0);
  EXPECT_EQ(r.read("l").data<int64_t>()[2], 1LL << 40);
  EXPECT_EQ(r.read("d").data<double>()[1], 0.2);
  EXPECT_EQ(r.read("i").data<int32_t>()[0], 5);
  EXPECT_EQ(r.entry("empty").numel(), 0);
  float two[2];
  r.read_elements("f", 3, 2, two);
  EXPECT_EQ(two[0], 0.0f);
  EXPECT_EQ(two[1], 7.0f);
}

TEST(Safetensors, ReadsAFileWrittenByteByByteFromTheSpecification) {
  // What any other writer may produce: keys in any order, no metadata, no padding.
  TempDir dir;
  const std::string header =
      R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},"v":{"dtype":"F16","shape":[4],"data_offsets":[0,8]}})";
  std::string file(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(file.data(), &n, 8);
  file += header;
  const uint16_t halfs[4] = {0x3c00, 0x4000, 0xbc00, 0x0000};  // 1, 2, -1, 0
  file.append(reinterpret_cast<const char*>(halfs), 8);
  const float w[2] = {4.0f, 5.0f};
  file.append(reinterpret_cast<const char*>(w), 8);
  write_bytes(dir / "x.safetensors", file);
  SafetensorsFile r(dir / "x.safetensors");
  EXPECT_EQ(r.read("w").data<float>()[1], 5.0f);
  const std::vector<float> v = r.read("v").to_floats(Stream::cpu());
  EXPECT_EQ(v, (std::vector<float>{1.0f, 2.0f, -1.0f, 0.0f}));
}

TEST(Safetensors, RejectsDamagedFilesNamingFileAndTensor) {
  TempDir dir;
  std::vector<float> f(16, 1.0f);
  write_safetensors(dir / "a.safetensors", {{"x", DType::F32, {16}, f.data()}, {"y", DType::F32, {4}, f.data()}});
  const std::string good = file_bytes(dir / "a.safetensors");
  const std::string path = dir / "bad.safetensors";

  write_bytes(path, good.substr(0, good.size() - 5));
  expect_error([&] { SafetensorsFile r(path); }, {path, "truncated"});
  write_bytes(path, good.substr(0, 5));
  expect_error([&] { SafetensorsFile r(path); }, {path, "fewer than the 8-byte header length"});
  std::string huge = good;
  huge[7] = 0x7f;  // a header length far past the end of the file
  write_bytes(path, huge);
  expect_error([&] { SafetensorsFile r(path); }, {path, "header length"});
  write_bytes(path, good + "xyz");
  expect_error([&] { SafetensorsFile r(path); }, {path, "trailing bytes"});

  auto with_header = [&](const std::string& header, size_t data_bytes) {
    std::string file(8, '\0');
    const uint64_t n = header.size();
    std::memcpy(file.data(), &n, 8);
    write_bytes(path, file + header + std::string(data_bytes, '\0'));
  };
  with_header(R"({"x":{"dtype":"F32","shape":[4],"data_offsets":[0,12]}})", 12);
  expect_error([&] { SafetensorsFile r(path); }, {path, "tensor x", "needs 16"});
  with_header(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"y":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12);
  expect_error([&] { SafetensorsFile r(path); }, {path, "overlaps"});
  with_header(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12);
  expect_error([&] { SafetensorsFile r(path); }, {path, "hole"});
  with_header(R"({"x":{"dtype":"Q4","shape":[2],"data_offsets":[0,8]}})", 8);
  expect_error([&] { SafetensorsFile r(path); }, {path, "tensor x", "unknown dtype Q4"});
  with_header(R"({"x": [1, 2)", 0);
  expect_error([&] { SafetensorsFile r(path); }, {path, "not valid JSON"});
  with_header(R"({"x":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}})", 8);
  SafetensorsFile u8(path);  // a dtype megadlm cannot hold parses, but reading it says so
  expect_error([&] { u8.read("x"); }, {path, "U8"});
}

// ------------------------------------------------------------------------------ geometry

namespace {

// Global flat index -> local position, by enumerating the region element by element.
std::map<int64_t, int64_t> brute_force(const Shape& g, const Region& r) {
  std::map<int64_t, int64_t> out;
  const int n = static_cast<int>(g.size());
  for (int64_t local = r.begin; local < r.end; ++local) {
    int64_t rem = local, global = 0, stride = 1;
    std::vector<int64_t> idx(static_cast<size_t>(n));
    for (int d = n - 1; d >= 0; --d) {
      idx[static_cast<size_t>(d)] = rem % r.extent[static_cast<size_t>(d)];
      rem /= r.extent[static_cast<size_t>(d)];
    }
    for (int d = n - 1; d >= 0; --d) {
      global += (r.offset[static_cast<size_t>(d)] + idx[static_cast<size_t>(d)]) * stride;
      stride *= g[static_cast<size_t>(d)];
    }
    out[global] = local - r.begin;
  }
  return out;
}

Region random_region(const Shape& g, std::mt19937& rng) {
  Region r;
  for (int64_t size : g) {
    const int64_t a = static_cast<int64_t>(rng() % static_cast<uint32_t>(size));
    const int64_t b = static_cast<int64_t>(rng() % static_cast<uint32_t>(size));
    // Whole dimensions often, as real slices do.
    if (rng() % 2) {
      r.offset.push_back(0);
      r.extent.push_back(size);
    } else {
      r.offset.push_back(std::min(a, b));
      r.extent.push_back(std::max(a, b) - std::min(a, b) + 1);
    }
  }
  const int64_t total = shape_numel(r.extent);
  const int64_t a = static_cast<int64_t>(rng() % static_cast<uint32_t>(total + 1));
  const int64_t b = static_cast<int64_t>(rng() % static_cast<uint32_t>(total + 1));
  r.begin = rng() % 3 == 0 ? 0 : std::min(a, b);
  r.end = rng() % 3 == 0 ? total : std::max(a, b);
  return r;
}

}  // namespace

TEST(Region, WholeTensorsAndFullWidthSlicesAreOneRun) {
  const Shape g = {6, 4, 5};
  EXPECT_EQ(region_runs(g, Region::whole(g)).size(), 1u);
  Region rows{{2, 0, 0}, {3, 4, 5}, 7, 41};  // rows 2..4, a shard inside them
  const auto runs = region_runs(g, rows);
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].global, 2 * 20 + 7);
  EXPECT_EQ(runs[0].count, 34);
  Region cols{{0, 0, 1}, {6, 4, 2}, 0, 48};  // a column slice: one run per row
  EXPECT_EQ(region_runs(g, cols).size(), 24u);
}

TEST(Region, RunsAndIntersectionsMatchBruteForceEnumeration) {
  std::mt19937 rng(1234);
  const std::vector<Shape> shapes = {{37}, {5, 7}, {4, 1, 6}, {3, 5, 2, 4}};
  for (int trial = 0; trial < 400; ++trial) {
    const Shape& g = shapes[static_cast<size_t>(trial) % shapes.size()];
    const Region a = random_region(g, rng), b = random_region(g, rng);
    validate_region(g, a, "a");
    // Runs cover exactly the region's elements, in local order.
    const auto ea = brute_force(g, a), eb = brute_force(g, b);
    std::map<int64_t, int64_t> from_runs;
    int64_t expect_local = 0;
    for (const FlatRun& r : region_runs(g, a)) {
      EXPECT_EQ(r.local, expect_local);
      expect_local += r.count;
      for (int64_t i = 0; i < r.count; ++i) from_runs[r.global + i] = r.local + i;
    }
    ASSERT_EQ(from_runs, ea) << "trial " << trial;
    // Intersection: exactly the shared elements, each with both local positions.
    std::map<int64_t, int64_t> shared;  // a-local -> b-local
    for (const auto& [global, la] : ea) {
      auto it = eb.find(global);
      if (it != eb.end()) shared[la] = it->second;
    }
    std::map<int64_t, int64_t> got;
    for (const Overlap& o : intersect_runs(region_runs(g, a), region_runs(g, b)))
      for (int64_t i = 0; i < o.count; ++i) got[o.src + i] = o.dst + i;
    ASSERT_EQ(got, shared) << "trial " << trial;
  }
}

TEST(Region, TheWorkedExampleOfTheDocsHolds) {
  // docs/checkpoints.md: linear_fc2.weight [64, 128], TP=2 row-parallel, rank 1's box is columns
  // 64..127; a distributed-optimizer shard of it starts 3000 elements in.
  const Region r{{0, 64}, {64, 64}, 3000, 4096};
  const auto runs = region_runs({64, 128}, r);
  ASSERT_EQ(runs.size(), 18u);  // the rest of local row 46, then rows 47..63
  EXPECT_EQ(runs[0].global, 46 * 128 + 120);
  EXPECT_EQ(runs[0].count, 8);
  EXPECT_EQ(runs[1].global, 47 * 128 + 64);
  EXPECT_EQ(runs[1].local, 8);
  EXPECT_EQ(runs.back().global, 63 * 128 + 64);
  EXPECT_EQ(runs.back().count, 64);
}

TEST(Region, ValidationNamesWhatLeavesTheTensor) {
  expect_error([] { validate_region({4, 4}, Region{{2, 0}, {3, 4}, 0, 12}, "tensor t"); },
               {"tensor t", "dimension 0"});
  expect_error([] { validate_region({4, 4}, Region{{0, 0}, {2, 4}, 0, 9}, "tensor t"); },
               {"tensor t", "range [0, 9)"});
}

TEST(CheckpointIndex, RoundTripsThroughJsonAndRejectsForeignOrNewerFiles) {
  CheckpointIndex idx;
  idx.state.iteration = 100;
  idx.state.consumed_samples = 800;
  idx.state.optimizer_steps = 99;
  idx.state.skipped_iterations = 1;
  idx.state.has_optimizer = true;
  idx.state.rng_seed = 18446744073709551615ull;
  idx.state.model_args = {"--num-layers", "2"};
  idx.files["model_rank00000.safetensors"] = {1234, std::string(64, 'a')};
  TensorInfo t;
  t.shape = {8, 4};
  t.pieces.push_back({"model_rank00000.safetensors", "model/w", DType::F32, Region{{0, 0}, {8, 4}, 0, 16}});
  t.pieces.push_back({"model_rank00000.safetensors", "model/w#1", DType::BF16, Region{{0, 0}, {8, 4}, 16, 32}});
  idx.tensors["model/w"] = t;
  const CheckpointIndex back = CheckpointIndex::parse(idx.to_json(), "m.json");
  EXPECT_EQ(back.state.iteration, 100);
  EXPECT_EQ(back.state.consumed_samples, 800);
  EXPECT_EQ(back.state.optimizer_steps, 99);
  EXPECT_EQ(back.state.skipped_iterations, 1);
  EXPECT_EQ(*back.state.rng_seed, 18446744073709551615ull);
  EXPECT_EQ(back.state.model_args, idx.state.model_args);
  EXPECT_EQ(back.files.at("model_rank00000.safetensors").bytes, 1234u);
  ASSERT_EQ(back.tensors.at("model/w").pieces.size(), 2u);
  EXPECT_EQ(back.tensors.at("model/w").pieces[1].region, t.pieces[1].region);
  EXPECT_EQ(back.tensors.at("model/w").pieces[1].dtype, DType::BF16);

  expect_error([] { CheckpointIndex::parse(R"({"format": "other"})", "m.json"); }, {"m.json", "not a megadlm checkpoint index"});
  expect_error([] { CheckpointIndex::parse(R"({"format": "megadlm-checkpoint", "version": 99})", "m.json"); },
               {"m.json", "format version 99"});
  expect_error([] { CheckpointIndex::parse("{not json", "m.json"); }, {"m.json", "not valid JSON"});
  CheckpointIndex bad = idx;
  bad.tensors["model/w"].pieces[0].region.extent = {9, 4};  // leaves the [8, 4] tensor
  expect_error([&] { CheckpointIndex::parse(bad.to_json(), "m.json"); }, {"m.json", "tensor model/w", "dimension 0"});
  bad = idx;
  bad.tensors["model/w"].pieces[0].file = "gone.safetensors";
  expect_error([&] { CheckpointIndex::parse(bad.to_json(), "m.json"); }, {"m.json", "gone.safetensors", "does not list"});
}

TEST(CheckpointIndex, IterationDirectoriesFollowMegatron) {
  EXPECT_EQ(iteration_dir_name(100), "iter_0000100");
  EXPECT_EQ(iteration_dir_name(12345678), "iter_12345678");
  TempDir dir;
  EXPECT_FALSE(read_latest(dir.str()).has_value());
  write_bytes(dir / kLatestFileName, "42\n");
  EXPECT_EQ(*read_latest(dir.str()), "42");
  EXPECT_EQ(checkpoint_dir(dir.str(), "42"), dir / "iter_0000042");
  write_bytes(dir / kLatestFileName, "release");
  EXPECT_EQ(checkpoint_dir(dir.str(), *read_latest(dir.str())), dir / "release");
  write_bytes(dir / kLatestFileName, "garbage");
  expect_error([&] { read_latest(dir.str()); }, {kLatestFileName, "garbage"});
}
