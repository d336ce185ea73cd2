// SFT data: the sample layout (filler, prompt, response + EOS, EOS padding), prompt lengths,
// truncation and dropping, both chat templates, and the epoch order.
#include <gtest/gtest.h>
#include <fstream>
#include <set>
#include "megadlm/data/sft_dataset.h"
#include "support/scratch.h"

using namespace megadlm;
using namespace megadlm::data;

namespace {

// Bytes as ids: enough to see what text a template produced.
class ByteTokenizer : public Tokenizer {
 public:
  std::vector<int32_t> encode(std::string_view t) const override { return {t.begin(), t.end()}; }
  std::string decode(std::span<const int32_t> ids) const override { return {ids.begin(), ids.end()}; }
  int64_t vocab_size() const override { return 256; }
  int32_t eod() const override { return 0; }
  std::string describe() const override { return "bytes"; }
};

std::string write(const test::TempDir& d, const std::string& text) {
  const std::string p = d / "sft.jsonl";
  std::ofstream(p) << text;
  return p;
}

}  // namespace

TEST(SftDataset, SamplesArePromptThenResponseThenEosPadding) {
  test::TempDir d;
  const std::string p = write(d, "{\"prompt_ids\": [5, 6, 7], \"response_ids\": [8, 9]}\n"
                                 "{\"prompt_ids\": [1, 2, 3, 4, 5, 6, 7, 8, 9], \"response_ids\": [10, 11, 12]}\n"
                                 "{\"prompt_ids\": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], \"response_ids\": [1]}\n");
  SftOptions o;
  o.seq_length = 10;
  o.eos = 99;
  SftDataset ds({p}, nullptr, o);
  EXPECT_EQ(ds.num_examples(), 2);
  EXPECT_EQ(ds.dropped(), 1);    // a 10-token prompt leaves no room
  EXPECT_EQ(ds.truncated(), 1);  // 9 + 3 + EOS > 10
  std::set<int64_t> seen;
  for (int64_t i = 0; i < 2; ++i) {
    const std::vector<int32_t> s = ds.sample(i);
    ASSERT_EQ(s.size(), 11u);
    seen.insert(ds.example_of(i));
    if (ds.example_of(i) == 0) {
      EXPECT_EQ(s, (std::vector<int32_t>{99, 5, 6, 7, 8, 9, 99, 99, 99, 99, 99}));
      EXPECT_EQ(ds.prompt_length(i), 3);
    } else {
      EXPECT_EQ(s, (std::vector<int32_t>{99, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10}));
      EXPECT_EQ(ds.prompt_length(i), 9);
    }
  }
  EXPECT_EQ(seen.size(), 2u);  // an epoch shows every example once
}

TEST(SftDataset, ChatTemplatesRenderThePromptTurns) {
  test::TempDir d;
  const std::string p = write(d, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, "
                                 "{\"role\": \"assistant\", \"content\": \"yo\"}]}\n{\"prompt\": \"q\", \"response\": \"a\"}\n");
  ByteTokenizer tok;
  SftOptions o;
  o.seq_length = 200;
  o.eos = 0;
  SftDataset plain({p}, &tok, o);
  EXPECT_EQ(tok.decode(plain.prompt_tokens(0)), "user: hi\nassistant: ");
  EXPECT_EQ(plain.response_tokens(0), (std::vector<int32_t>{'y', 'o', 0}));
  EXPECT_EQ(tok.decode(plain.prompt_tokens(1)), "q");
  o.chat_template = "llada";
  SftDataset llada({p}, &tok, o);
  EXPECT_EQ(tok.decode(llada.prompt_tokens(0)),
            "<|startoftext|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(SftDataset, BadRecordsNameTheFileAndLine) {
  test::TempDir d;
  const std::string p = write(d, "{\"prompt_ids\": [1], \"response_ids\": [2]}\n{\"question\": 1}\n");
  SftOptions o;
  o.seq_length = 8;
  o.eos = 3;
  const std::string msg = test::error_of([&] { SftDataset ds({p}, nullptr, o); });
  EXPECT_NE(msg.find(p + " line 2"), std::string::npos) << msg;
}
