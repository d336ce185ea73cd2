#include "megadlm/training/checkpoint/safetensors.h"
#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include "megadlm/core/error.h"
#include "megadlm/core/stream.h"
#include "megadlm/training/checkpoint/file_io.h"

namespace megadlm::checkpoint {

namespace {

// The reference implementation refuses larger headers; so do we (a corrupt length field must
// not make us allocate gigabytes).
constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;

struct DTypeName {
  const char* name;
  size_t bytes;
  std::optional<DType> dtype;
};

const DTypeName kDTypes[] = {
    {"F32", 4, DType::F32},  {"BF16", 2, DType::BF16}, {"F16", 2, DType::F16},
    {"F64", 8, DType::F64},  {"I32", 4, DType::I32},   {"I64", 8, DType::I64},
    {"BOOL", 1, std::nullopt}, {"U8", 1, std::nullopt},  {"I8", 1, std::nullopt},
    {"I16", 2, std::nullopt},  {"U16", 2, std::nullopt}, {"U32", 4, std::nullopt},
    {"U64", 8, std::nullopt},  {"F8_E4M3", 1, std::nullopt}, {"F8_E5M2", 1, std::nullopt}};

const DTypeName* find_dtype(const std::string& name) {
  for (const DTypeName& d : kDTypes)
    if (name == d.name) return &d;
  return nullptr;
}

}  // namespace

const char* safetensors_dtype_name(DType t) {
  for (const DTypeName& d : kDTypes)
    if (d.dtype == t) return d.name;
  MDLM_FAIL("dtype ", dtype_name(t), " has no safetensors name");
}

std::optional<DType> dtype_from_safetensors(const std::string& name) {
  const DTypeName* d = find_dtype(name);
  return d ? d->dtype : std::nullopt;
}

WrittenFile write_safetensors(const std::string& path, const std::vector<SafetensorsEntry>& entries,
                              const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const SafetensorsEntry& e : entries) {
    MDLM_CHECK(e.key != "__metadata__" && !header.contains(e.key), path, ": duplicate or reserved key ",
               e.key);
    const uint64_t bytes = static_cast<uint64_t>(shape_numel(e.shape)) * dtype_size(e.dtype);
    MDLM_CHECK(bytes == 0 || e.data != nullptr, path, ": no data for ", e.key);
    header[e.key] = {{"dtype", safetensors_dtype_name(e.dtype)},
                     {"shape", e.shape},
                     {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - (text.size() % 8)) % 8, ' ');  // data starts 8-byte aligned
  OutputFile f(path);
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(uint64_t{text.size()} >> (8 * i));
  f.write(len, 8);
  f.write(text.data(), text.size());
  for (const SafetensorsEntry& e : entries)
    f.write(e.data, static_cast<size_t>(shape_numel(e.shape)) * dtype_size(e.dtype));
  WrittenFile out;
  out.path = path;
  out.bytes = f.bytes();
  out.sha256 = f.finish();
  return out;
}

SafetensorsFile::SafetensorsFile(const std::string& path)
    : file_(std::make_unique<InputFile>(path)) {
  const uint64_t size = file_->size();
  if (size < 8) MDLM_FAIL(path, " is not a safetensors file: ", size, " bytes, fewer than the 8-byte header length");
  uint8_t len[8];
  file_->read(0, len, 8);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t{len[i]} << (8 * i);
  if (n > kMaxHeaderBytes || n + 8 > size)
    MDLM_FAIL(path, " is truncated or not a safetensors file: header length ", n, " but the file holds ",
              size, " bytes");
  std::string text(static_cast<size_t>(n), '\0');
  file_->read(8, text.data(), text.size());
  data_start_ = 8 + n;
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    MDLM_FAIL(path, ": the safetensors header is not valid JSON (", e.what(), ")");
  }
  if (!header.is_object()) MDLM_FAIL(path, ": the safetensors header is not a JSON object");
  const uint64_t data_bytes = size - data_start_;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& key = it.key();
    const nlohmann::json& v = it.value();
    if (key == "__metadata__") {
      if (!v.is_object()) MDLM_FAIL(path, ": __metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) MDLM_FAIL(path, ": __metadata__ value of ", m.key(), " is not a string");
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    // Problems with one entry, reported below with the file and key.
    struct Bad {
      std::string what;
    };
    auto bad = [](auto&&... parts) { throw Bad{detail::concat(parts...)}; };
    try {
      Entry e;
      e.dtype_name = v.at("dtype").get<std::string>();
      const DTypeName* d = find_dtype(e.dtype_name);
      if (d == nullptr) bad("unknown dtype ", e.dtype_name);
      e.dtype = d->dtype;
      for (const auto& s : v.at("shape")) {
        const int64_t dim = s.get<int64_t>();
        if (dim < 0) bad("negative dimension in shape ", v.at("shape").dump());
        e.shape.push_back(dim);
      }
      const auto& off = v.at("data_offsets");
      if (!off.is_array() || off.size() != 2) bad("data_offsets is not [begin, end]");
      e.begin = off[0].get<uint64_t>();
      e.end = off[1].get<uint64_t>();
      const uint64_t want = static_cast<uint64_t>(shape_numel(e.shape)) * d->bytes;
      if (e.end < e.begin || e.end - e.begin != want)
        bad("data_offsets [", e.begin, ", ", e.end, ") hold ", e.end - e.begin, " bytes, but ",
            e.dtype_name, shape_str(e.shape), " needs ", want);
      if (e.end > data_bytes)
        bad("its data ends at byte ", e.end, " but the file holds ", data_bytes,
            " data bytes (the file is truncated)");
      ranges.emplace_back(e.begin, e.end);
      entries_[key] = std::move(e);
    } catch (const nlohmann::json::exception& ex) {
      MDLM_FAIL(path, ": tensor ", key, ": malformed header entry ", v.dump(), " (", ex.what(), ")");
    } catch (const Bad& ex) {
      MDLM_FAIL(path, ": tensor ", key, ": ", ex.what);
    }
  }
  std::sort(ranges.begin(), ranges.end());
  uint64_t pos = 0;
  for (const auto& [b, e] : ranges) {
    if (b != pos)
      MDLM_FAIL(path, ": tensor data ", b < pos ? "overlaps" : "has a hole", " at byte ", std::min(b, pos));
    pos = e;
  }
  if (pos != data_bytes)
    MDLM_FAIL(path, ": the header describes ", pos, " data bytes but the file holds ", data_bytes,
              pos > data_bytes ? " (truncated)" : " (trailing bytes)");
}

SafetensorsFile::~SafetensorsFile() = default;

const std::string& SafetensorsFile::path() const { return file_->path(); }

const SafetensorsFile::Entry& SafetensorsFile::entry(const std::string& key) const {
  auto it = entries_.find(key);
  if (it == entries_.end()) MDLM_FAIL(path(), " has no tensor ", key);
  return it->second;
}

void SafetensorsFile::read_elements(const std::string& key, int64_t first, int64_t count,
                                    void* dst) const {
  const Entry& e = entry(key);
  MDLM_CHECK(first >= 0 && count >= 0 && first + count <= e.numel(), path(), ": tensor ", key,
             ": elements [", first, ", ", first + count, ") outside its ", e.numel());
  if (count == 0) return;
  const size_t esize = find_dtype(e.dtype_name)->bytes;
  file_->read(data_start_ + e.begin + static_cast<uint64_t>(first) * esize, dst,
              static_cast<size_t>(count) * esize);
}

Tensor SafetensorsFile::read(const std::string& key) const {
  const Entry& e = entry(key);
  if (!e.dtype) MDLM_FAIL(path(), ": tensor ", key, " has dtype ", e.dtype_name, ", which megadlm cannot hold");
  Tensor t = Tensor::empty(e.shape, *e.dtype, Stream::cpu());
  read_elements(key, 0, e.numel(), t.data_ptr());
  return t;
}

}  // namespace megadlm::checkpoint
