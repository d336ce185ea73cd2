#include "megadlm/training/arguments/config_agreement.h"
#include <sstream>
#include <vector>
#include "megadlm/core/error.h"
#include "megadlm/core/tensor.h"
#include "megadlm/training/checkpoint/checkpoint.h"

#ifndef MEGADLM_BUILD_ID
#define MEGADLM_BUILD_ID "megadlm (git unknown)"
#endif

namespace megadlm::training {

namespace {

constexpr const char* kBuildLine = "megadlm build";
constexpr size_t kMaxListed = 8;

// "name = value" lines into a map (the text configuration_text wrote).
std::map<std::string, std::string> lines_of(const std::string& text) {
  std::map<std::string, std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    const size_t eq = line.find(" = ");
    if (eq != std::string::npos) out[line.substr(0, eq)] = line.substr(eq + 3);
  }
  return out;
}

// Rank 0's text on every rank: its length, then its bytes packed four to an int32 (the
// communicators move i32 on every backend).
std::string broadcast_text(comm::Communicator& world, const std::string& mine, const Stream& s) {
  const bool root = world.rank() == 0;
  Tensor len = Tensor::from_ints({root ? static_cast<int32_t>(mine.size()) : 0}, {1});
  if (!world.device().is_cpu()) len = len.to(world.device(), s);
  world.broadcast(len, 0, s);
  world.synchronize(s);
  const int32_t n = len.to_ints(s)[0];
  std::vector<int32_t> words(static_cast<size_t>((n + 3) / 4 + 1), 0);
  if (root)
    for (size_t i = 0; i < mine.size(); ++i)
      words[i / 4] |= static_cast<int32_t>(static_cast<uint32_t>(static_cast<unsigned char>(mine[i])) << (8 * (i % 4)));
  Tensor t = Tensor::from_ints(words, {static_cast<int64_t>(words.size())});
  if (!world.device().is_cpu()) t = t.to(world.device(), s);
  world.broadcast(t, 0, s);
  world.synchronize(s);
  const std::vector<int32_t> got = t.to_ints(s);
  std::string text(static_cast<size_t>(n), '\0');
  for (size_t i = 0; i < text.size(); ++i)
    text[i] = static_cast<char>((static_cast<uint32_t>(got[i / 4]) >> (8 * (i % 4))) & 0xFF);
  return text;
}

}  // namespace

const char* build_id() { return MEGADLM_BUILD_ID; }

std::string configuration_text(const std::map<std::string, std::string>& values) {
  std::string text;
  for (const auto& [name, value] : values) {
    if (name == "rank" || name == "local_rank") continue;  // differ by design
    text += name + " = " + value + "\n";
  }
  return text + kBuildLine + " = " + build_id() + "\n";
}

void check_same_configuration(comm::Communicator& world, const std::string& text, const Stream& stream) {
  if (world.size() == 1) return;
  const std::string reference = broadcast_text(world, text, stream);
  std::string error;
  if (reference != text) {
    const std::map<std::string, std::string> theirs = lines_of(reference), mine = lines_of(text);
    std::vector<std::string> differences;
    const std::string me = "rank " + std::to_string(world.global_rank(world.rank()));
    auto note = [&](const std::string& name, const std::string& here, const std::string& there) {
      differences.push_back(name + ": " + here + " on " + me + ", " + there + " on rank 0");
    };
    for (const auto& [name, value] : mine) {
      const auto it = theirs.find(name);
      if (it == theirs.end()) note(name, value, "absent");
      else if (it->second != value) note(name, value, it->second);
    }
    for (const auto& [name, value] : theirs)
      if (mine.count(name) == 0) note(name, "absent", value);
    std::ostringstream msg;
    msg << "this rank runs another configuration than rank 0 (" << differences.size()
        << " difference(s); every rank must get the same flags and the same megadlm build):";
    for (size_t i = 0; i < differences.size() && i < kMaxListed; ++i) msg << "\n  " << differences[i];
    if (differences.size() > kMaxListed) msg << "\n  ... and " << differences.size() - kMaxListed << " more";
    error = msg.str();
  }
  checkpoint::agree(&world, stream, error, "checking that every rank has the same configuration");
}

}  // namespace megadlm::training
