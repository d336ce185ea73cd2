// The MMIDIDX format: what IndexedDatasetWriter writes is read back by an independent reader
// written here from the format's description (docs/data.md), and every corruption of E7
// is rejected with the file named.
#include <gtest/gtest.h>
#include <cstring>
#include <filesystem>
#include <fstream>
#include "megadlm/core/error.h"
#include "megadlm/data/indexed_dataset.h"

using namespace megadlm;
using namespace megadlm::data;

namespace {

std::string temp_prefix(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / ("megadlm_idx_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return (dir / name).string();
}

std::vector<char> slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

void spit(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// The independent reader: fields in order, little endian, as the format description states.
struct ParsedIndex {
  std::string magic;
  uint64_t version = 0;
  uint8_t dtype = 0;
  uint64_t sequences = 0, doc_entries = 0;
  std::vector<int32_t> lengths;
  std::vector<int64_t> pointers, documents;
  size_t trailing = 0;
};

ParsedIndex parse_index(const std::vector<char>& b) {
  ParsedIndex p;
  size_t at = 0;
  auto take = [&](void* dst, size_t n) {
    if (at + n > b.size()) throw std::runtime_error("short index");
    std::memcpy(dst, b.data() + at, n);
    at += n;
  };
  p.magic.assign(b.data(), 9);
  at = 9;
  take(&p.version, 8);
  take(&p.dtype, 1);
  take(&p.sequences, 8);
  take(&p.doc_entries, 8);
  p.lengths.resize(p.sequences);
  p.pointers.resize(p.sequences);
  p.documents.resize(p.doc_entries);
  for (auto& v : p.lengths) take(&v, 4);
  for (auto& v : p.pointers) take(&v, 8);
  for (auto& v : p.documents) take(&v, 8);
  p.trailing = b.size() - at;
  return p;
}

void write_sample_dataset(const std::string& prefix, IndexDType dtype) {
  IndexedDatasetWriter w(prefix, dtype);
  w.add_document(std::vector<int32_t>{5, 6, 7, 0});
  w.add_document(std::vector<int32_t>{1, 0});
  w.add_sequence(std::vector<int32_t>{9, 9, 9});  // a document of two sequences
  w.add_sequence(std::vector<int32_t>{65535 % 60000, 3});
  w.end_document();
  w.finalize();
}

template <typename F>
void expect_error(F&& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "expected an error mentioning " << parts.front();
  } catch (const Error& e) {
    for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(IndexedDataset, WriterOutputMatchesTheFormatDescription) {
  const std::string prefix = temp_prefix("fmt");
  write_sample_dataset(prefix, IndexDType::UInt16);
  const ParsedIndex p = parse_index(slurp(prefix + ".idx"));
  EXPECT_EQ(p.magic, std::string("MMIDIDX\0\0", 9));
  EXPECT_EQ(p.version, 1u);
  EXPECT_EQ(p.dtype, 8);  // uint16
  EXPECT_EQ(p.sequences, 4u);
  EXPECT_EQ(p.doc_entries, 4u);
  EXPECT_EQ(p.lengths, (std::vector<int32_t>{4, 2, 3, 2}));
  EXPECT_EQ(p.pointers, (std::vector<int64_t>{0, 8, 12, 18}));  // bytes: uint16 tokens
  EXPECT_EQ(p.documents, (std::vector<int64_t>{0, 1, 2, 4}));
  EXPECT_EQ(p.trailing, 0u);
  const auto bin = slurp(prefix + ".bin");
  ASSERT_EQ(bin.size(), 22u);
  uint16_t tok[11];
  std::memcpy(tok, bin.data(), 22);
  const uint16_t want[11] = {5, 6, 7, 0, 1, 0, 9, 9, 9, 5535, 3};
  for (int i = 0; i < 11; ++i) EXPECT_EQ(tok[i], want[i]) << i;
}

TEST(IndexedDataset, ReadsBackWhatTheWriterWrote) {
  for (IndexDType t : {IndexDType::UInt8, IndexDType::UInt16, IndexDType::Int32, IndexDType::Int64}) {
    const std::string prefix = temp_prefix(std::string("rt_") + index_dtype_name(t));
    IndexedDatasetWriter w(prefix, t);
    w.add_document(std::vector<int32_t>{5, 6, 7, 0});
    w.add_document(std::vector<int32_t>{1, 200, 0});
    w.finalize();
    IndexedDataset d(prefix);
    EXPECT_EQ(d.dtype(), t);
    EXPECT_EQ(d.num_sequences(), 2);
    EXPECT_EQ(d.num_documents(), 2);
    EXPECT_EQ(d.num_tokens(), 7);
    EXPECT_EQ(d.sequence(1), (std::vector<int32_t>{1, 200, 0}));
    std::vector<int32_t> part;
    d.read(0, 1, 2, part);
    EXPECT_EQ(part, (std::vector<int32_t>{6, 7}));
  }
}

TEST(IndexedDataset, OptimalDtypeFollowsMegatron) {
  EXPECT_EQ(optimal_index_dtype(50257), IndexDType::UInt16);
  EXPECT_EQ(optimal_index_dtype(65499), IndexDType::UInt16);
  EXPECT_EQ(optimal_index_dtype(65500), IndexDType::Int32);
  EXPECT_EQ(optimal_index_dtype(151936), IndexDType::Int32);
}

TEST(IndexedDataset, RejectsMissingFilesNamingThem) {
  const std::string prefix = temp_prefix("missing");
  expect_error([&] { IndexedDataset d(prefix); }, {prefix + ".idx"});
  write_sample_dataset(prefix, IndexDType::Int32);
  std::filesystem::remove(prefix + ".bin");
  expect_error([&] { IndexedDataset d(prefix); }, {prefix + ".bin"});
}

TEST(IndexedDataset, RejectsCorruptedIndexes) {
  const std::string prefix = temp_prefix("bad");
  write_sample_dataset(prefix, IndexDType::Int32);
  const auto good = slurp(prefix + ".idx");
  const std::string idx = prefix + ".idx";
  auto with = [&](auto edit, const std::vector<std::string>& parts) {
    auto b = good;
    edit(b);
    spit(idx, b);
    expect_error([&] { IndexedDataset d(prefix); }, parts);
  };
  with([](auto& b) { b[0] = 'X'; }, {idx, "MMIDIDX"});
  with([](auto& b) { b[9] = 2; }, {idx, "version 2"});
  with([](auto& b) { b[17] = 42; }, {idx, "dtype code 42"});
  with([](auto& b) { b[17] = 7; }, {idx, "float32"});
  with([](auto& b) { b.resize(20); }, {idx, "truncated"});
  with([](auto& b) { b.resize(b.size() - 8); }, {idx, "truncated"});
  with([](auto& b) { b.push_back(0); }, {idx, "corrupted"});
  with([](auto& b) { b[34] = 100; }, {idx, "starts at byte"});                // length of seq 0
  with([](auto& b) { b[34 + 12] = 5; }, {prefix + ".bin", "size mismatch"});  // length of seq 3
  with([](auto& b) { b[34 + 16] = 1; }, {idx, "starts at byte"});              // pointer of seq 0
  with([](auto& b) { b[b.size() - 8] = 3; }, {idx, "last entry"});      // document index
  spit(idx, good);
  IndexedDataset ok(prefix);  // the untouched file still opens
  EXPECT_EQ(ok.num_sequences(), 4);
}

TEST(IndexedDataset, RejectsTruncatedBinAndEmptyDatasets) {
  const std::string prefix = temp_prefix("trunc");
  write_sample_dataset(prefix, IndexDType::Int32);
  auto bin = slurp(prefix + ".bin");
  bin.resize(bin.size() - 4);
  spit(prefix + ".bin", bin);
  expect_error([&] { IndexedDataset d(prefix); }, {prefix + ".bin", "truncated"});

  const std::string empty = temp_prefix("empty");
  IndexedDatasetWriter w(empty, IndexDType::Int32);
  w.finalize();
  expect_error([&] { IndexedDataset d(empty); }, {empty + ".idx", "empty dataset"});
}

TEST(IndexedDataset, TokenIdsOutsideTheVocabularyAreNamed) {
  const std::string prefix = temp_prefix("vocab");
  write_sample_dataset(prefix, IndexDType::Int32);
  IndexedDataset d(prefix);
  d.check_token_ids(6000);
  expect_error([&] { d.check_token_ids(100); }, {prefix + ".bin", "token id 5535", "sequence 3"});
}

TEST(IndexedDatasetWriter, RejectsTokensThatDoNotFitTheDtype) {
  IndexedDatasetWriter w(temp_prefix("fit"), IndexDType::UInt16);
  EXPECT_THROW(w.add_document(std::vector<int32_t>{70000}), Error);
}
