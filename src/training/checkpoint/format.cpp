#include "megadlm/training/checkpoint/format.h"
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include "megadlm/core/error.h"
#include "megadlm/training/checkpoint/file_io.h"
#include "megadlm/training/checkpoint/safetensors.h"
#include "megadlm/training/checkpoint/sha256.h"

namespace megadlm::checkpoint {

using nlohmann::json;

namespace {

// SHA-256 of the index without its checksum field, in nlohmann's compact form (keys sorted,
// numbers printed so that they parse back to the same value): the same text whatever the file's
// whitespace, different as soon as any value changes.
std::string index_digest(json j) {
  j.erase(kIndexChecksumField);
  const std::string canonical = j.dump();
  Sha256 h;
  h.update(canonical.data(), canonical.size());
  return h.hex_digest();
}

}  // namespace

std::string iteration_dir_name(int64_t iteration) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "iter_%07lld", static_cast<long long>(iteration));
  return buf;
}

Region Region::whole(const Shape& shape) {
  Region r;
  r.offset.assign(shape.size(), 0);
  r.extent = shape;
  r.begin = 0;
  r.end = shape_numel(shape);
  return r;
}

void validate_region(const Shape& g, const Region& r, const std::string& what) {
  if (r.offset.size() != g.size() || r.extent.size() != g.size())
    MDLM_FAIL(what, ": a piece's box has ", r.offset.size(), "/", r.extent.size(),
              " dimensions, the tensor ", g.size(), " (global shape ", shape_str(g), ")");
  for (size_t d = 0; d < g.size(); ++d)
    if (r.offset[d] < 0 || r.extent[d] < 0 || r.offset[d] + r.extent[d] > g[d])
      MDLM_FAIL(what, ": a piece's box [", shape_str(r.offset), " + ", shape_str(r.extent),
                ") leaves the tensor's global shape ", shape_str(g), " in dimension ", d);
  if (r.begin < 0 || r.end < r.begin || r.end > shape_numel(r.extent))
    MDLM_FAIL(what, ": a piece's range [", r.begin, ", ", r.end, ") leaves its box of ",
              shape_numel(r.extent), " elements");
}

std::vector<FlatRun> region_runs(const Shape& g, const Region& r) {
  std::vector<FlatRun> out;
  if (r.begin >= r.end) return out;
  const int n = static_cast<int>(g.size());
  // Trailing dimensions the box spans completely are one contiguous chunk of the global tensor.
  int d = n;
  int64_t chunk = 1;
  while (d > 0 && r.offset[static_cast<size_t>(d - 1)] == 0 &&
         r.extent[static_cast<size_t>(d - 1)] == g[static_cast<size_t>(d - 1)]) {
    chunk *= g[static_cast<size_t>(d - 1)];
    --d;
  }
  if (d == 0) return {{r.begin, 0, r.end - r.begin}};  // the box is the whole tensor
  // Dimension d-1 is cut: a "row" is its extent times the chunk, contiguous in the global
  // tensor; rows are indexed by the box's dimensions [0, d-1).
  const int64_t row_len = r.extent[static_cast<size_t>(d - 1)] * chunk;
  std::vector<int64_t> gstride(static_cast<size_t>(n), 1);
  for (int k = n - 2; k >= 0; --k) gstride[static_cast<size_t>(k)] = gstride[static_cast<size_t>(k + 1)] * g[static_cast<size_t>(k + 1)];
  const int64_t base = r.offset[static_cast<size_t>(d - 1)] * chunk;
  for (int64_t row = r.begin / row_len; row * row_len < r.end; ++row) {
    int64_t global = base, rem = row;
    for (int k = d - 2; k >= 0; --k) {
      const int64_t e = r.extent[static_cast<size_t>(k)];
      global += (r.offset[static_cast<size_t>(k)] + rem % e) * gstride[static_cast<size_t>(k)];
      rem /= e;
    }
    const int64_t lo = std::max(r.begin, row * row_len), hi = std::min(r.end, (row + 1) * row_len);
    const FlatRun run{global + (lo - row * row_len), lo - r.begin, hi - lo};
    if (!out.empty() && out.back().global + out.back().count == run.global &&
        out.back().local + out.back().count == run.local) {
      out.back().count += run.count;
    } else {
      out.push_back(run);
    }
  }
  return out;
}

std::vector<Overlap> intersect_runs(const std::vector<FlatRun>& a, const std::vector<FlatRun>& b) {
  std::vector<Overlap> out;
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const int64_t a_end = a[i].global + a[i].count, b_end = b[j].global + b[j].count;
    const int64_t lo = std::max(a[i].global, b[j].global), hi = std::min(a_end, b_end);
    if (lo < hi) out.push_back({a[i].local + (lo - a[i].global), b[j].local + (lo - b[j].global), hi - lo});
    if (a_end <= b_end) ++i;
    else ++j;
  }
  return out;
}

std::string CheckpointIndex::to_json() const {
  json j;
  j["format"] = kFormatName;
  j["version"] = kFormatVersion;
  j["iteration"] = state.iteration;
  j["consumed_samples"] = state.consumed_samples;
  j["optimizer_steps"] = state.optimizer_steps;
  j["skipped_iterations"] = state.skipped_iterations;
  j["nan_iterations"] = state.nan_iterations;
  j["has_optimizer"] = state.has_optimizer;
  j["rng"] = state.rng_seed ? json{{"seed", *state.rng_seed}} : json(nullptr);
  j["run_config"] = state.run_config_json.empty() ? json(nullptr) : json::parse(state.run_config_json);
  j["model_args"] = state.model_args;
  j["saved_under"] = state.saved_under;
  j["created_by"] = state.created_by;
  if (!state.trajectory.empty()) j["trajectory"] = state.trajectory;
  json& files_j = j["files"] = json::object();
  for (const auto& [name, f] : files) files_j[name] = {{"bytes", f.bytes}, {"sha256", f.sha256}};
  json& tensors_j = j["tensors"] = json::object();
  for (const auto& [name, t] : tensors) {
    json pieces = json::array();
    for (const PieceInfo& p : t.pieces)
      pieces.push_back({{"file", p.file},
                        {"key", p.key},
                        {"dtype", safetensors_dtype_name(p.dtype)},
                        {"offset", p.region.offset},
                        {"extent", p.region.extent},
                        {"range", {p.region.begin, p.region.end}}});
    tensors_j[name] = {{"shape", t.shape}, {"pieces", pieces}};
  }
  j[kIndexChecksumField] = index_digest(j);
  return j.dump(1);
}

CheckpointIndex CheckpointIndex::parse(const std::string& text, const std::string& path) {
  CheckpointIndex idx;
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    MDLM_FAIL(path, " is not valid JSON (", e.what(), "); the checkpoint is damaged");
  }
  try {
    if (!j.is_object() || j.value("format", std::string()) != kFormatName)
      MDLM_FAIL(path, " is not a megadlm checkpoint index (no \"format\": \"", kFormatName, "\")");
    const int version = j.at("version").get<int>();
    if (version > kFormatVersion || version < 1)
      MDLM_FAIL(path, " has format version ", version, "; this megadlm reads versions 1 to ",
                kFormatVersion, " (a newer megadlm wrote it?)");
    // The index is the checkpoint's state (iteration, data position, seed, ...): an edit of any
    // value would resume a different run without a word, so it carries its own checksum.
    // Indices written before the checksum existed have none and are read as they are.
    if (j.contains(kIndexChecksumField)) {
      const std::string expected = j.at(kIndexChecksumField).get<std::string>();
      const std::string actual = index_digest(j);
      if (actual != expected)
        MDLM_FAIL(path, " was modified after it was saved: the SHA-256 of its content is ", actual, ", its ",
                  kIndexChecksumField, " field says ", expected, ". A value changed by hand (consumed_samples, "
                  "the seed, the iteration, ...) would resume a different run silently. Restore the file "
                  "from a copy; change a run with flags instead (--seed with --no-load-rng, "
                  "--override-opt_param-scheduler), not in the index");
      idx.checksummed = true;
    }
    CheckpointState& s = idx.state;
    s.iteration = j.at("iteration").get<int64_t>();
    s.consumed_samples = j.at("consumed_samples").get<int64_t>();
    s.optimizer_steps = j.at("optimizer_steps").get<int64_t>();
    s.skipped_iterations = j.value("skipped_iterations", int64_t{0});
    s.nan_iterations = j.value("nan_iterations", int64_t{0});
    s.has_optimizer = j.at("has_optimizer").get<bool>();
    if (j.contains("rng") && !j.at("rng").is_null()) s.rng_seed = j.at("rng").at("seed").get<uint64_t>();
    if (j.contains("run_config") && !j.at("run_config").is_null()) s.run_config_json = j.at("run_config").dump(2);
    if (j.contains("model_args")) s.model_args = j.at("model_args").get<std::vector<std::string>>();
    s.saved_under = j.value("saved_under", std::string());
    s.created_by = j.value("created_by", std::string());
    s.trajectory = j.value("trajectory", std::string());
    for (const auto& [name, f] : j.at("files").items())
      idx.files[name] = FileInfo{f.at("bytes").get<uint64_t>(), f.at("sha256").get<std::string>()};
    for (const auto& [name, t] : j.at("tensors").items()) {
      TensorInfo& info = idx.tensors[name];
      info.shape = t.at("shape").get<Shape>();
      for (const json& p : t.at("pieces")) {
        PieceInfo piece;
        piece.file = p.at("file").get<std::string>();
        piece.key = p.at("key").get<std::string>();
        const std::string dt = p.at("dtype").get<std::string>();
        const std::optional<DType> dtype = dtype_from_safetensors(dt);
        if (!dtype) MDLM_FAIL(path, ": tensor ", name, " has a piece of dtype ", dt, ", which megadlm cannot load");
        piece.dtype = *dtype;
        piece.region.offset = p.at("offset").get<Shape>();
        piece.region.extent = p.at("extent").get<Shape>();
        const auto range = p.at("range").get<std::vector<int64_t>>();
        if (range.size() != 2) MDLM_FAIL(path, ": tensor ", name, ": a piece's range is not [begin, end]");
        piece.region.begin = range[0];
        piece.region.end = range[1];
        validate_region(info.shape, piece.region, path + ": tensor " + name);
        if (idx.files.count(piece.file) == 0)
          MDLM_FAIL(path, ": tensor ", name, " has a piece in ", piece.file, ", which the index does not list");
        info.pieces.push_back(std::move(piece));
      }
    }
  } catch (const json::exception& e) {
    MDLM_FAIL(path, " is missing a field or has one of the wrong type (", e.what(), "); the checkpoint is damaged");
  }
  return idx;
}

std::optional<std::string> read_latest(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / kLatestFileName).string();
  if (file_size_or_missing(path) < 0) return std::nullopt;
  std::string text = read_text_file(path);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
  size_t start = 0;
  while (start < text.size() && std::isspace(static_cast<unsigned char>(text[start]))) ++start;
  text = text.substr(start);
  if (text == kReleaseDirName) return text;
  const bool digits = !text.empty() && text.size() < 19 &&
                      std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (!digits)
    MDLM_FAIL(path, " holds '", text.substr(0, 40), "'; expected an iteration number or 'release'");
  return text;
}

std::string checkpoint_dir(const std::string& dir, const std::string& tag) {
  const std::string name = tag == kReleaseDirName ? std::string(kReleaseDirName)
                                                  : iteration_dir_name(std::stoll(tag));
  return (std::filesystem::path(dir) / name).string();
}

}  // namespace megadlm::checkpoint
