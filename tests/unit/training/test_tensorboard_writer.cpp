// TensorBoard event files: the CRC-32C check value, the masked CRC, and the exact bytes of one
// scalar record as TensorBoard's event format spells the encoding out (independent of the writer).
#include <gtest/gtest.h>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include "megadlm/training/tensorboard_writer.h"
#include "support/scratch.h"

using namespace megadlm;
using namespace megadlm::training;

TEST(TensorBoard, Crc32cHasItsStandardCheckValue) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(crc32c("", 0), 0u);
  const uint32_t c = 0xE3069283u;
  EXPECT_EQ(masked_crc32c("123456789", 9), ((c >> 15) | (c << 17)) + 0xA282EAD8u);
}

TEST(TensorBoard, WritesTheVersionEventThenOneRecordPerScalar) {
  test::TempDir dir;
  std::string path;
  {
    TensorBoardWriter w(dir / "tb");
    path = w.path();
    w.add_scalar("lm loss", 2.5, 300);
    w.flush();
  }
  EXPECT_NE(std::filesystem::path(path).filename().string().find("events.out.tfevents."), std::string::npos);
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // Record 1: Event{wall_time, file_version "brain.Event:2"} = 9 + 2 + 13 bytes.
  uint64_t len1 = 0;
  std::memcpy(&len1, bytes.data(), 8);
  ASSERT_EQ(len1, 24u);
  EXPECT_EQ(bytes.substr(12 + 9, 2), std::string("\x1A\x0D", 2));
  EXPECT_EQ(bytes.substr(12 + 11, 13), "brain.Event:2");
  uint32_t crc = 0;
  std::memcpy(&crc, bytes.data() + 8, 4);
  EXPECT_EQ(crc, masked_crc32c(bytes.data(), 8));
  std::memcpy(&crc, bytes.data() + 12 + len1, 4);
  EXPECT_EQ(crc, masked_crc32c(bytes.data() + 12, len1));
  // Record 2: 09 <f64> 10 <varint 300 = AC 02> 2A <len> [0A <len> [0A 07 "lm loss" 15 <f32 2.5>]].
  const size_t r2 = 16 + len1;
  uint64_t len2 = 0;
  std::memcpy(&len2, bytes.data() + r2, 8);
  const std::string e = bytes.substr(r2 + 12, len2);
  ASSERT_EQ(e.size(), 9u + 3u + 2u + 2u + 2u + 7u + 5u);
  EXPECT_EQ(e[0], '\x09');
  EXPECT_EQ(e.substr(9, 3), std::string("\x10\xAC\x02", 3));
  EXPECT_EQ(e.substr(12, 6), std::string("\x2A\x10\x0A\x0E\x0A\x07", 6));
  EXPECT_EQ(e.substr(18, 7), "lm loss");
  float v = 0;
  EXPECT_EQ(e[25], '\x15');
  std::memcpy(&v, e.data() + 26, 4);
  EXPECT_EQ(v, 2.5f);
  EXPECT_EQ(bytes.size(), r2 + 16 + len2);
}

TEST(TensorBoard, UnwritableDirectoryNamesTheFlag) {
  test::TempDir dir;
  std::ofstream(dir / "file") << "x";
  try {
    TensorBoardWriter w(dir / "file/tb");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--tensorboard-dir"), std::string::npos) << e.what();
  }
}
