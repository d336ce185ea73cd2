#include "megadlm/training/checkpoint/checkpoint.h"
#include <algorithm>
#include <atomic>
#include <cstring>
#include <cstdio>
#include <fcntl.h>
#include <filesystem>
#include <functional>
#include <set>
#include <thread>
#include <nlohmann/json.hpp>
#include "megadlm/core/error.h"
#include "megadlm/training/checkpoint/file_io.h"
#include "megadlm/training/checkpoint/safetensors.h"
#include "megadlm/training/checkpoint/sha256.h"

namespace megadlm::checkpoint {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr int kMaxMessage = 4096;  // characters of a failing rank's message sent to the others

// "model_rank00003.safetensors", or with several shards "model_rank00003-00002-of-00007.safetensors".
std::string rank_file(const char* kind, int rank, int shard, int shards) {
  char buf[96];
  if (shards == 1) std::snprintf(buf, sizeof buf, "%s_rank%05d.safetensors", kind, rank);
  else std::snprintf(buf, sizeof buf, "%s_rank%05d-%05d-of-%05d.safetensors", kind, rank, shard + 1, shards);
  return buf;
}

std::string manifest_name(int rank) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "rank%05d.json", rank);
  return buf;
}

bool single(const comm::Communicator* c) { return c == nullptr || c->size() == 1; }

bool is_iteration_dir_name(const std::string& n) {
  if (n.size() <= 5 || n.size() > 23 || n.rfind("iter_", 0) != 0) return false;  // stoll-safe
  return std::all_of(n.begin() + 5, n.end(), [](char c) { return c >= '0' && c <= '9'; });
}

/// One f64 reduced over the group (identity on one rank).
double all_reduce_scalar(comm::Communicator* c, const Stream& s, double v, comm::ReduceOp op) {
  if (single(c)) return v;
  Tensor t = Tensor::from_floats({0.0f}, {1}, DType::F64);
  t.data<double>()[0] = v;
  if (!c->device().is_cpu()) t = t.to(c->device(), s);
  c->all_reduce(t, op, s);
  c->synchronize(s);
  if (!t.is_cpu()) t = t.to(Device::cpu(), s);
  return t.data<double>()[0];
}

json region_json(const Region& r) {
  return {{"offset", r.offset}, {"extent", r.extent}, {"range", {r.begin, r.end}}};
}

Region region_from_json(const json& j) {
  Region r;
  r.offset = j.at("offset").get<Shape>();
  r.extent = j.at("extent").get<Shape>();
  const auto range = j.at("range").get<std::vector<int64_t>>();
  MDLM_CHECK(range.size() == 2, "a piece's range is not [begin, end]");
  r.begin = range[0];
  r.end = range[1];
  return r;
}

}  // namespace

void agree(comm::Communicator* c, const Stream& s, const std::string& error, const std::string& what) {
  if (single(c)) {
    if (!error.empty()) throw Error(what + ": " + error);
    return;
  }
  const int size = c->size();
  const double first = all_reduce_scalar(c, s, error.empty() ? size : c->rank(), comm::ReduceOp::Min);
  const int root = static_cast<int>(first);
  if (root >= size) return;
  // The lowest failing rank tells everyone why, so that whichever rank reports it (and the
  // first to exit may take the others down) prints the real cause.
  Tensor msg = Tensor::zeros({kMaxMessage}, DType::I32, Stream::cpu());
  if (c->rank() == root) {
    int32_t* p = msg.data<int32_t>();
    for (size_t i = 0; i < error.size() && i + 1 < kMaxMessage; ++i)
      p[i] = static_cast<unsigned char>(error[i]);
  }
  if (!c->device().is_cpu()) msg = msg.to(c->device(), s);
  c->broadcast(msg, root, s);
  c->synchronize(s);
  if (!msg.is_cpu()) msg = msg.to(Device::cpu(), s);
  std::string text;
  for (int i = 0; i < kMaxMessage && msg.data<int32_t>()[i] != 0; ++i)
    text += static_cast<char>(msg.data<int32_t>()[i]);
  throw Error(what + " failed on rank " + std::to_string(c->global_rank(root)) + ": " + text);
}

// ------------------------------------------------------------------------------------ writer

struct CheckpointWriter::Job {
  std::string dir, tag, final_dir, tmp_dir;
  CheckpointState state;
  std::vector<OutgoingPiece> pieces;
  std::shared_ptr<const void> keep_alive;
  int rank = 0;
  uint64_t file_bytes = 0;
  std::thread thread;
  std::atomic<bool> done{false};
  std::string error;  // set by the writing thread before `done`
  std::function<void()> after_commit;
};

namespace {

std::string error_text(const std::exception& e) { return e.what(); }

// One file of a rank: write it, then read back what the file system now holds, so that a
// short or damaged write fails here, before the checkpoint can become "latest".
WrittenFile write_and_verify(const std::string& path, const std::vector<SafetensorsEntry>& entries,
                             const std::map<std::string, std::string>& metadata) {
  const WrittenFile w = write_safetensors(path, entries, metadata);
  const std::string back = sha256_file(path);
  if (back != w.sha256 || file_size_or_missing(path) != static_cast<int64_t>(w.bytes))
    MDLM_FAIL(path, ": read-back verification failed (wrote ", w.bytes, " bytes with SHA-256 ", w.sha256,
              ", read ", file_size_or_missing(path), " bytes with SHA-256 ", back, ")");
  return w;
}

// This rank's files and its manifest (the pieces and files, for rank 0 to merge). The model
// and the optimizer pieces are each spread over files of about `file_bytes`.
void write_rank_files(const std::string& tmp, int rank, const std::string& tag,
                      const std::vector<OutgoingPiece>& pieces, uint64_t file_bytes) {
  if (pieces.empty()) return;  // a replica: nothing to write, no manifest
  json manifest = {{"rank", rank}, {"files", json::object()}, {"tensors", json::object()}};
  struct FileJob {
    std::string name;
    std::vector<SafetensorsEntry> entries;
    WrittenFile written;
  };
  std::vector<FileJob> jobs;
  for (const bool optimizer : {false, true}) {
    // Pieces in order, cut into shards of about file_bytes.
    std::vector<std::vector<const OutgoingPiece*>> shards;
    uint64_t shard_bytes = 0;
    for (const OutgoingPiece& p : pieces) {
      if (p.optimizer != optimizer) continue;
      const uint64_t bytes = static_cast<uint64_t>(p.region.numel()) * dtype_size(p.dtype);
      if (shards.empty() || (shard_bytes > 0 && shard_bytes + bytes > file_bytes)) {
        shards.emplace_back();
        shard_bytes = 0;
      }
      shards.back().push_back(&p);
      shard_bytes += bytes;
    }
    for (size_t k = 0; k < shards.size(); ++k) {
      FileJob job;
      job.name = rank_file(optimizer ? "optim" : "model", rank, static_cast<int>(k), static_cast<int>(shards.size()));
      std::map<std::string, int> used;
      for (const OutgoingPiece* p : shards[k]) {
        std::string key = p->tensor;
        if (used[p->tensor]++ > 0) {  // (two appends: GCC 12 warns falsely on "#" + to_string)
          key += '#';
          key += std::to_string(used[p->tensor] - 1);
        }
        job.entries.push_back({key, p->dtype, {p->region.numel()}, p->data});
        json& t = manifest["tensors"][p->tensor];
        t["shape"] = p->global_shape;
        json piece = region_json(p->region);
        piece["file"] = job.name;
        piece["key"] = key;
        piece["dtype"] = safetensors_dtype_name(p->dtype);
        t["pieces"].push_back(piece);
      }
      jobs.push_back(std::move(job));
    }
  }
  const std::map<std::string, std::string> metadata = {{"format", kFormatName}, {"rank", std::to_string(rank)},
                                                       {"tag", tag}};
  run_io_tasks(jobs.size(), [&](size_t i) {
    jobs[i].written = write_and_verify((fs::path(tmp) / jobs[i].name).string(), jobs[i].entries, metadata);
  });
  for (const FileJob& job : jobs)
    manifest["files"][job.name] = {{"bytes", job.written.bytes}, {"sha256", job.written.sha256}};
  write_file_atomic((fs::path(tmp) / manifest_name(rank)).string(), manifest.dump());
}

// Rank 0, after every rank has written: the index, then the rename, then "latest".
void commit(const std::string& dir, const std::string& tag, const std::string& tmp,
            const std::string& final_dir, const CheckpointState& state, int64_t writers) {
  CheckpointIndex idx;
  idx.state = state;
  int64_t manifests = 0;
  std::vector<fs::path> manifest_paths;
  for (const auto& e : fs::directory_iterator(tmp)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("rank", 0) != 0 || e.path().extension() != ".json") continue;
    manifest_paths.push_back(e.path());
    ++manifests;
    const json m = json::parse(read_text_file(e.path().string()));
    for (const auto& [fname, f] : m.at("files").items()) {
      if (idx.files.count(fname)) MDLM_FAIL("two ranks wrote ", fname);
      idx.files[fname] = FileInfo{f.at("bytes").get<uint64_t>(), f.at("sha256").get<std::string>()};
    }
    for (const auto& [tname, t] : m.at("tensors").items()) {
      TensorInfo& info = idx.tensors[tname];
      const Shape shape = t.at("shape").get<Shape>();
      if (!info.shape.empty() && info.shape != shape)
        MDLM_FAIL("tensor ", tname, ": ranks disagree on its global shape (", shape_str(info.shape),
                  " vs ", shape_str(shape), ")");
      info.shape = shape;
      for (const json& p : t.at("pieces")) {
        PieceInfo piece;
        piece.file = p.at("file").get<std::string>();
        piece.key = p.at("key").get<std::string>();
        piece.dtype = *dtype_from_safetensors(p.at("dtype").get<std::string>());
        piece.region = region_from_json(p);
        info.pieces.push_back(std::move(piece));
      }
    }
  }
  if (manifests != writers)
    MDLM_FAIL(writers, " ranks wrote pieces but ", manifests, " manifests are in ", tmp);
  for (const auto& [fname, f] : idx.files) {
    const int64_t size = file_size_or_missing((fs::path(tmp) / fname).string());
    if (size != static_cast<int64_t>(f.bytes))
      MDLM_FAIL(fname, " has ", size, " bytes after writing, expected ", f.bytes);
  }
  // Every element of every tensor stored exactly once: a replica that also wrote, or a missing
  // writer, is a bug to catch now rather than at load time.
  for (const auto& [tname, t] : idx.tensors) {
    int64_t held = 0;
    for (const PieceInfo& p : t.pieces) {
      validate_region(t.shape, p.region, "tensor " + tname);
      held += p.region.numel();
    }
    if (held != shape_numel(t.shape))
      MDLM_FAIL("tensor ", tname, ": the ranks' pieces hold ", held, " elements, the tensor has ",
                shape_numel(t.shape), " (a replica wrote too, or a writer is missing)");
  }
  write_file_atomic((fs::path(tmp) / kIndexFileName).string(), idx.to_json());
  for (const fs::path& p : manifest_paths) fs::remove(p);
  fsync_directory(tmp);
  std::error_code ec;
  if (fs::exists(final_dir)) {
    // Replacing a checkpoint of the same name (a run resumed and saved the same iteration
    // again): swap atomically where the file system can, so "latest" never names a gap.
    if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) == 0) {
      fs::remove_all(tmp, ec);
    } else {
      const std::string old = final_dir + ".replaced";
      fs::remove_all(old, ec);
      fs::rename(final_dir, old);
      fs::rename(tmp, final_dir);
      fs::remove_all(old, ec);
    }
  } else {
    fs::rename(tmp, final_dir);
  }
  fsync_directory(dir);
  write_file_atomic((fs::path(dir) / kLatestFileName).string(), tag + "\n");
}

}  // namespace

CheckpointWriter::CheckpointWriter(std::shared_ptr<comm::Communicator> world, Stream stream)
    : world_(std::move(world)), stream_(std::move(stream)), rank_(world_ ? world_->rank() : 0) {}

CheckpointWriter::~CheckpointWriter() {
  if (job_ && job_->thread.joinable()) job_->thread.join();
}

void CheckpointWriter::set_target_file_bytes(uint64_t bytes) {
  MDLM_CHECK(bytes > 0, "checkpoint files need a positive target size");
  file_bytes_ = bytes;
}

bool CheckpointWriter::pending() const { return job_ != nullptr; }

void CheckpointWriter::save(const std::string& dir, const std::string& tag,
                            const CheckpointState& state, std::vector<OutgoingPiece> pieces,
                            std::shared_ptr<const void> keep_alive, bool async,
                            std::function<void()> after_commit) {
  wait();
  auto job = std::make_unique<Job>();
  job->dir = dir;
  job->tag = tag;
  job->final_dir = checkpoint_dir(dir, tag);
  job->tmp_dir = job->final_dir + kIncompleteSuffix;
  job->state = state;
  job->pieces = std::move(pieces);
  job->keep_alive = std::move(keep_alive);
  job->after_commit = std::move(after_commit);
  job->rank = world_ ? world_->global_rank(world_->rank()) : 0;
  job->file_bytes = file_bytes_;
  for (const OutgoingPiece& p : job->pieces)
    validate_region(p.global_shape, p.region, "saving tensor " + p.tensor);
  std::string error;
  if (rank_ == 0) {
    try {
      fs::create_directories(dir);
      // Leftovers of interrupted saves are garbage: no "latest" ever names them.
      for (const auto& e : fs::directory_iterator(dir)) {
        const std::string n = e.path().filename().string();
        if (e.is_directory() && n.size() > std::strlen(kIncompleteSuffix) && n.ends_with(kIncompleteSuffix))
          fs::remove_all(e.path());
      }
      fs::create_directory(job->tmp_dir);
    } catch (const std::exception& e) {
      error = error_text(e);
    }
  }
  agree(world_.get(), stream_, error, "preparing checkpoint " + job->tmp_dir);
  Job* j = job.get();
  auto body = [j] {
    try {
      write_rank_files(j->tmp_dir, j->rank, j->tag, j->pieces, j->file_bytes);
    } catch (const std::exception& e) {
      j->error = error_text(e);
    }
    j->done.store(true, std::memory_order_release);
  };
  job_ = std::move(job);
  if (async) {
    j->thread = std::thread(body);
  } else {
    body();
    finish(*j);
  }
}

bool CheckpointWriter::poll() {
  if (!job_) return false;
  const bool mine = job_->done.load(std::memory_order_acquire);
  if (all_reduce_scalar(world_.get(), stream_, mine ? 1.0 : 0.0, comm::ReduceOp::Min) < 1.0)
    return false;
  finish(*job_);
  return true;
}

void CheckpointWriter::wait() {
  if (job_) finish(*job_);
}

void CheckpointWriter::finish(Job& job) {
  if (job.thread.joinable()) job.thread.join();
  // The job is over whatever happens next: a failed save is not retried by the next one.
  std::unique_ptr<Job> owned = std::move(job_);
  agree(world_.get(), stream_, job.error, "writing checkpoint " + job.final_dir);
  const int64_t writers = static_cast<int64_t>(
      all_reduce_scalar(world_.get(), stream_, job.pieces.empty() ? 0.0 : 1.0, comm::ReduceOp::Sum));
  std::string error;
  if (rank_ == 0) {
    try {
      commit(job.dir, job.tag, job.tmp_dir, job.final_dir, job.state, writers);
    } catch (const std::exception& e) {
      error = error_text(e);
    }
  }
  agree(world_.get(), stream_, error, "committing checkpoint " + job.final_dir);
  last_committed_ = job.final_dir;
  if (rank_ == 0 && job.after_commit) job.after_commit();
}

namespace {

// Removes the iter_* directories of `dir` that `doomed` names: each is renamed out of the iter_*
// namespace first (one atomic rename), then deleted, so a crash half-way leaves no partial
// iter_*; leftovers of an earlier interrupted removal go too.
std::vector<std::string> remove_iteration_dirs(const std::string& dir, std::vector<fs::path> doomed) {
  static constexpr const char* kRemovingSuffix = ".removing";
  std::vector<fs::path> leftovers;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (!e.is_directory()) continue;
    const std::string n = e.path().filename().string();
    if (n.size() > std::strlen(kRemovingSuffix) && n.ends_with(kRemovingSuffix)) leftovers.push_back(e.path());
  }
  std::sort(doomed.begin(), doomed.end());
  std::vector<std::string> removed;
  for (const fs::path& p : leftovers) fs::remove_all(p);
  for (const fs::path& p : doomed) {
    const fs::path gone = p.string() + kRemovingSuffix;
    fs::remove_all(gone);
    fs::rename(p, gone);
    fs::remove_all(gone);
    removed.push_back(p.string());
  }
  if (!doomed.empty()) fsync_directory(dir);
  return removed;
}

// (iteration, directory name) of the complete iter_* checkpoints of `dir`, ascending.
std::vector<std::pair<int64_t, std::string>> complete_iteration_dirs(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (!is_iteration_dir_name(n)) continue;
    if (file_size_or_missing((e.path() / kIndexFileName).string()) < 0) continue;  // not complete
    out.emplace_back(std::stoll(n.substr(5)), n);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string latest_dir_name(const std::string& dir) {
  const std::optional<std::string> latest = read_latest(dir);
  return latest ? fs::path(checkpoint_dir(dir, *latest)).filename().string() : std::string();
}

}  // namespace

std::vector<std::string> remove_older_checkpoints(const std::string& dir, const std::string& keep_tag) {
  const std::set<std::string> keep = {fs::path(checkpoint_dir(dir, keep_tag)).filename().string(),
                                      latest_dir_name(dir)};
  std::vector<fs::path> doomed;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (e.is_directory() && is_iteration_dir_name(n) && keep.count(n) == 0) doomed.push_back(e.path());
  }
  return remove_iteration_dirs(dir, std::move(doomed));
}

std::optional<std::string> read_trajectory(const std::string& checkpoint_dir) {
  try {
    const json j = json::parse(read_text_file((fs::path(checkpoint_dir) / kIndexFileName).string()));
    if (!j.is_object()) return std::nullopt;
    return j.value("trajectory", std::string());
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

std::vector<std::string> remove_checkpoints_beyond(const std::string& dir, int64_t keep,
                                                   const std::optional<std::string>& trajectory,
                                                   const std::vector<std::string>& protect) {
  MDLM_CHECK(keep >= 1, "--keep-last-n-checkpoints must keep at least one checkpoint, got ", keep);
  std::vector<std::pair<int64_t, std::string>> ranked;  // ascending
  for (const auto& c : complete_iteration_dirs(dir)) {
    // Another trajectory's checkpoints (a run that was rewound, whose later checkpoints stay)
    // are neither ranked nor removed; an unreadable index is left alone too.
    if (trajectory && read_trajectory((fs::path(dir) / c.second).string()) != *trajectory) continue;
    ranked.push_back(c);
  }
  std::set<std::string> kept_names(protect.begin(), protect.end());
  kept_names.insert(latest_dir_name(dir));
  std::vector<fs::path> doomed;
  const size_t n = ranked.size(), kept = static_cast<size_t>(std::min<int64_t>(keep, static_cast<int64_t>(n)));
  for (size_t i = 0; i + kept < n; ++i)
    if (kept_names.count(ranked[i].second) == 0) doomed.push_back(fs::path(dir) / ranked[i].second);
  return remove_iteration_dirs(dir, std::move(doomed));
}

std::vector<int64_t> list_checkpoint_iterations(const std::string& dir) {
  std::vector<int64_t> out;
  for (const auto& [iteration, name] : complete_iteration_dirs(dir)) out.push_back(iteration);
  return out;
}

// ------------------------------------------------------------------------------------ reader

std::optional<std::string> find_checkpoint(const std::string& dir, std::optional<int64_t> step) {
  if (file_size_or_missing((fs::path(dir) / kIndexFileName).string()) >= 0 && !step) return dir;
  if (step) {
    const std::string path = checkpoint_dir(dir, std::to_string(*step));
    if (!fs::is_directory(path)) MDLM_FAIL("--ckpt-step ", *step, ": ", path, " does not exist");
    return path;
  }
  const std::optional<std::string> latest = read_latest(dir);
  if (!latest) {
    const std::vector<int64_t> found = list_checkpoint_iterations(dir);
    if (found.empty()) return std::nullopt;
    std::string names;
    for (size_t i = 0; i < found.size() && i < 8; ++i)
      names += (i ? ", " : "") + iteration_dir_name(found[i]);
    if (found.size() > 8) names += ", ... (" + std::to_string(found.size()) + " in all)";
    MDLM_FAIL(dir, " has no ", kLatestFileName, " but holds the checkpoint(s) ", names,
              ": starting from scratch would overwrite them. Pick one with --ckpt-step (the newest: "
              "--ckpt-step ", found.back(), "), or restore ", kLatestFileName, " (it holds the iteration "
              "number)");
  }
  const std::string path = checkpoint_dir(dir, *latest);
  if (!fs::is_directory(path))
    MDLM_FAIL((fs::path(dir) / kLatestFileName).string(), " names ", *latest, ", but ", path,
              " does not exist");
  return path;
}

CheckpointReader::CheckpointReader(std::string dir) : dir_(std::move(dir)) {
  const std::string path = (fs::path(dir_) / kIndexFileName).string();
  if (file_size_or_missing(path) < 0)
    MDLM_FAIL(dir_, " has no ", kIndexFileName, ": it is not a complete megadlm checkpoint");
  index_ = CheckpointIndex::parse(read_text_file(path), path);
  // The folder's number is what "latest" and --ckpt-step go by; the index's iteration is what a
  // resume continues from. They must be the same checkpoint.
  fs::path p = fs::path(dir_).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  const std::string name = p.filename().string();
  if (is_iteration_dir_name(name) && std::stoll(name.substr(5)) != index_.state.iteration)
    MDLM_FAIL(path, " records iteration ", index_.state.iteration, ", but its folder is ", name,
              " (the number ", kLatestFileName, " and --ckpt-step go by): the folder was renamed or the "
              "index belongs to another checkpoint. Rename the folder back (",
              iteration_dir_name(index_.state.iteration), ") or restore its own ", kIndexFileName);
}

CheckpointReader::~CheckpointReader() = default;

std::vector<std::string> CheckpointReader::files_with(const std::vector<std::string>& prefixes) const {
  std::vector<std::string> out;
  for (const auto& [name, t] : index_.tensors) {
    bool match = false;
    for (const std::string& p : prefixes) match = match || name.rfind(p, 0) == 0;
    if (!match) continue;
    for (const PieceInfo& p : t.pieces)
      if (std::find(out.begin(), out.end(), p.file) == out.end()) out.push_back(p.file);
  }
  std::sort(out.begin(), out.end());
  return out;
}

void CheckpointReader::verify_file(const std::string& name) const {
  const auto it = index_.files.find(name);
  MDLM_CHECK(it != index_.files.end(), dir_, ": ", name, " is not listed in the index");
  const std::string path = (fs::path(dir_) / name).string();
  const int64_t size = file_size_or_missing(path);
  if (size < 0) MDLM_FAIL(path, " is missing (the index lists it with ", it->second.bytes, " bytes)");
  if (size != static_cast<int64_t>(it->second.bytes))
    MDLM_FAIL(path, " has ", size, " bytes, the index expects ", it->second.bytes,
              size < static_cast<int64_t>(it->second.bytes) ? " (truncated)" : "");
  const std::string actual = sha256_file(path);
  if (actual != it->second.sha256)
    MDLM_FAIL(path, " is corrupted: SHA-256 expected ", it->second.sha256, ", actual ", actual);
}

void CheckpointReader::verify_files(const std::vector<std::string>& files, comm::Communicator* world,
                                    const Stream& stream) const {
  const int rank = world ? world->rank() : 0, size = world ? world->size() : 1;
  std::string error;
  try {
    std::vector<std::string> mine;
    for (size_t i = static_cast<size_t>(rank); i < files.size(); i += static_cast<size_t>(size))
      mine.push_back(files[i]);
    run_io_tasks(mine.size(), [&](size_t i) { verify_file(mine[i]); });
  } catch (const std::exception& e) {
    error = error_text(e);
  }
  agree(world, stream, error, "verifying checkpoint " + dir_);
}

const SafetensorsFile& CheckpointReader::file(const std::string& name) const {
  const std::lock_guard<std::mutex> lock(files_mutex_);  // reads run on several threads
  auto it = files_.find(name);
  if (it == files_.end())
    it = files_.emplace(name, std::make_unique<SafetensorsFile>((fs::path(dir_) / name).string())).first;
  return *it->second;
}

void CheckpointReader::read(const std::string& name, const Shape& global_shape, const Region& region,
                            Tensor& dst) const {
  const auto it = index_.tensors.find(name);
  if (it == index_.tensors.end())
    MDLM_FAIL("checkpoint ", dir_, " has no tensor ", name, " (",
              name.rfind("optimizer/", 0) == 0 ? "saved without optimizer state? use --no-load-optim or --finetune"
                                               : "a different model architecture?", ")");
  const TensorInfo& t = it->second;
  if (t.shape != global_shape)
    MDLM_FAIL("tensor ", name, ": checkpoint ", dir_, " holds global shape ", shape_str(t.shape),
              ", this model needs ", shape_str(global_shape));
  validate_region(global_shape, region, "loading tensor " + name);
  MDLM_CHECK(dst.is_cpu() && dst.numel() == region.numel(), "read of ", name, " into ", dst.str());
  const std::vector<FlatRun> wanted = region_runs(global_shape, region);
  int64_t covered = 0;
  std::vector<char> buf;
  for (const PieceInfo& p : t.pieces) {
    const std::vector<Overlap> overlaps = intersect_runs(region_runs(global_shape, p.region), wanted);
    if (overlaps.empty()) continue;
    const SafetensorsFile& f = file(p.file);
    const SafetensorsFile::Entry& e = f.entry(p.key);
    if (e.dtype != p.dtype || e.numel() != p.region.numel())
      MDLM_FAIL(f.path(), ": tensor ", p.key, " is ", e.dtype_name, shape_str(e.shape), " but the index ",
                "expects ", safetensors_dtype_name(p.dtype), "[", p.region.numel(),
                "] (the index and the file are from different saves)");
    for (const Overlap& o : overlaps) {
      buf.resize(static_cast<size_t>(o.count) * dtype_size(p.dtype));
      f.read_elements(p.key, o.src, o.count, buf.data());
      Tensor src = Tensor::wrap(buf.data(), {o.count}, p.dtype, Device::cpu());
      Tensor out = dst.slice_flat(o.dst, {o.count});
      copy_tensor(src, out, Stream::cpu());
      covered += o.count;
    }
  }
  if (covered != region.numel())
    MDLM_FAIL("tensor ", name, ": checkpoint ", dir_, " ", covered > region.numel() ? "has overlapping pieces for" : "covers only",
              " ", covered, " of the ", region.numel(), " elements this rank needs");
}

Tensor CheckpointReader::read_whole(const std::string& name) const {
  const auto it = index_.tensors.find(name);
  if (it == index_.tensors.end()) MDLM_FAIL("checkpoint ", dir_, " has no tensor ", name);
  const DType dtype = it->second.pieces.empty() ? DType::F32 : it->second.pieces.front().dtype;
  Tensor out = Tensor::empty(it->second.shape, dtype, Stream::cpu());
  read(name, it->second.shape, Region::whole(it->second.shape), out);
  return out;
}

}  // namespace megadlm::checkpoint
