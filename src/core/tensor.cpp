#include "megadlm/core/tensor.h"
#include <sys/resource.h>
#include <unistd.h>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include "core/cuda_bridge.h"
#include "megadlm/core/stream.h"

namespace megadlm {

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) {
    MDLM_CHECK(d >= 0, "negative dimension in shape ", shape_str(s));
    n *= d;
  }
  return n;
}

Storage::Storage(void* ptr, size_t bytes, Device device, std::shared_ptr<void> releaser)
    : ptr_(ptr), bytes_(bytes), device_(device), releaser_(std::move(releaser)) {}

namespace {

// Host element conversion between any two dtypes (through double for floats).
template <typename T>
double load_as_double(const void* p, int64_t i) {
  return static_cast<double>(static_cast<const T*>(p)[i]);
}

double load_element(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::F32: return load_as_double<float>(p, i);
    case DType::F64: return load_as_double<double>(p, i);
    case DType::I32: return load_as_double<int32_t>(p, i);
    case DType::I64: return load_as_double<int64_t>(p, i);
    case DType::BF16: return static_cast<const bf16_t*>(p)[i].to_float();
    case DType::F16: return static_cast<const f16_t*>(p)[i].to_float();
  }
  return 0;
}

void store_element(void* p, DType t, int64_t i, double v) {
  switch (t) {
    case DType::F32: static_cast<float*>(p)[i] = static_cast<float>(v); break;
    case DType::F64: static_cast<double*>(p)[i] = v; break;
    case DType::I32: static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v); break;
    case DType::I64: static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v); break;
    case DType::BF16: static_cast<bf16_t*>(p)[i] = bf16_t::from_float(static_cast<float>(v)); break;
    case DType::F16: static_cast<f16_t*>(p)[i] = f16_t::from_float(static_cast<float>(v)); break;
  }
}

void convert_host(const void* src, DType sdt, void* dst, DType ddt, int64_t n) {
  if (sdt == ddt) {
    std::memcpy(dst, src, static_cast<size_t>(n) * dtype_size(sdt));
    return;
  }
  if (sdt == DType::F32 && ddt == DType::BF16) {  // the hot path for uploads
    const float* s = static_cast<const float*>(src);
    bf16_t* d = static_cast<bf16_t*>(dst);
    for (int64_t i = 0; i < n; ++i) d[i] = bf16_t::from_float(s[i]);
    return;
  }
  if (sdt == DType::BF16 && ddt == DType::F32) {
    const bf16_t* s = static_cast<const bf16_t*>(src);
    float* d = static_cast<float*>(dst);
    for (int64_t i = 0; i < n; ++i) d[i] = s[i].to_float();
    return;
  }
  for (int64_t i = 0; i < n; ++i) store_element(dst, ddt, i, load_element(src, sdt, i));
}

// Bytes of the host tensors alive now (what host_bytes_in_use() reports).
std::atomic<int64_t> g_host_bytes{0};

std::string human_bytes(double b) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  size_t u = 0;
  while (b >= 1024 && u + 1 < sizeof(kUnits) / sizeof(kUnits[0])) {
    b /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f %s", b, kUnits[u]);
  return buf;
}

// "out of host memory": what was asked for, what megadlm holds, what the machine has, and what
// to change (a failed allocation said only "check failed: p != nullptr").
[[noreturn]] void fail_host_allocation(const Shape& shape, DType dtype, size_t bytes) {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  const double total = pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0.0;
  double available = -1;
  std::ifstream meminfo("/proc/meminfo");
  for (std::string key; meminfo >> key;) {
    double kib = 0;
    meminfo >> kib;
    if (key == "MemAvailable:") {
      available = kib * 1024;
      break;
    }
    meminfo.ignore(1 << 10, '\n');
  }
  std::string machine = total > 0 ? "this machine has " + human_bytes(total) : "this machine's memory is unknown";
  if (available >= 0) machine += " (" + human_bytes(available) + " available now)";
  rlimit as{};
  if (::getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY)
    machine += ", and this process may map at most " + human_bytes(static_cast<double>(as.rlim_cur)) +
               " (ulimit -v)";
  MDLM_FAIL("out of host memory: the tensor ", dtype_name(dtype), shape_str(shape), " needs ", bytes, " bytes (",
            human_bytes(static_cast<double>(bytes)), "); ", human_bytes(static_cast<double>(g_host_bytes.load())),
            " are already held by megadlm's host tensors; ", machine,
            ". To need less: a smaller --micro-batch-size or --seq-length, --recompute-activations, "
            "more ranks to shard the model and optimizer over (tensor or pipeline parallelism, "
            "--use-distributed-optimizer), or the GPU; --dry-run predicts a run's peak memory");
}

}  // namespace

int64_t host_bytes_in_use() { return g_host_bytes.load(); }

Tensor Tensor::empty(const Shape& shape, DType dtype, const Stream& stream) {
  Tensor t;
  t.shape_ = shape;
  t.numel_ = shape_numel(shape);
  t.dtype_ = dtype;
  t.device_ = stream.device();
  size_t bytes = std::max<size_t>(t.nbytes(), 1);
  if (stream.device().is_cpu()) {
    const size_t rounded = (bytes + 63) / 64 * 64;
    void* p = rounded < bytes ? nullptr : std::aligned_alloc(64, rounded);
    if (p == nullptr) fail_host_allocation(shape, dtype, rounded);
    g_host_bytes += static_cast<int64_t>(rounded);
    std::shared_ptr<void> releaser(p, [rounded](void* q) {
      g_host_bytes -= static_cast<int64_t>(rounded);
      std::free(q);
    });
    t.storage_ = std::make_shared<Storage>(p, bytes, t.device_, std::move(releaser));
  } else {
    std::shared_ptr<void> releaser;
    MDLM_CHECK(stream.cuda_resources() != nullptr, "CUDA allocation needs a CUDA stream");
    void* p = detail::cuda_malloc_async(bytes, stream.cuda_resources(), &releaser);
    t.storage_ = std::make_shared<Storage>(p, bytes, t.device_, std::move(releaser));
  }
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, const Stream& stream) {
  Tensor t = empty(shape, dtype, stream);
  if (t.is_cpu()) {
    std::memset(t.data_ptr(), 0, t.nbytes());
  } else if (t.nbytes() > 0) {
    detail::cuda_memset_zero(t.data_ptr(), t.nbytes(), stream.cuda_resources().get());
  }
  return t;
}

Tensor Tensor::from_floats(const std::vector<float>& values, const Shape& shape, DType dtype) {
  MDLM_CHECK(shape_numel(shape) == static_cast<int64_t>(values.size()), "from_floats: ",
             values.size(), " values for shape ", shape_str(shape));
  Tensor t = empty(shape, dtype, Stream::cpu());
  convert_host(values.data(), DType::F32, t.data_ptr(), dtype, t.numel());
  return t;
}

Tensor Tensor::from_ints(const std::vector<int32_t>& values, const Shape& shape) {
  MDLM_CHECK(shape_numel(shape) == static_cast<int64_t>(values.size()), "from_ints: ",
             values.size(), " values for shape ", shape_str(shape));
  Tensor t = empty(shape, DType::I32, Stream::cpu());
  if (!values.empty()) std::memcpy(t.data_ptr(), values.data(), values.size() * 4);
  return t;
}

Tensor Tensor::wrap(void* ptr, const Shape& shape, DType dtype, Device device) {
  Tensor t;
  t.shape_ = shape;
  t.numel_ = shape_numel(shape);
  t.dtype_ = dtype;
  t.device_ = device;
  t.storage_ = std::make_shared<Storage>(ptr, t.nbytes(), device, nullptr);
  return t;
}

int64_t Tensor::size(int d) const {
  int n = dim();
  if (d < 0) d += n;
  MDLM_CHECK(d >= 0 && d < n, "dimension ", d, " out of range for shape ", shape_str(shape_));
  return shape_[static_cast<size_t>(d)];
}

void* Tensor::data_ptr() const {
  MDLM_CHECK(defined(), "access to an undefined tensor");
  return static_cast<char*>(storage_->data()) + offset_;
}

Tensor Tensor::view(const Shape& shape) const {
  MDLM_CHECK(shape_numel(shape) == numel_, "view ", shape_str(shape_), " as ", shape_str(shape),
             ": element counts differ");
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

Tensor Tensor::narrow(int64_t start, int64_t length) const {
  MDLM_CHECK(dim() >= 1, "narrow on a 0-d tensor");
  MDLM_CHECK(start >= 0 && length >= 0 && start + length <= shape_[0], "narrow(", start, ", ",
             length, ") out of range for shape ", shape_str(shape_));
  int64_t row = numel_ / std::max<int64_t>(shape_[0], 1);
  Tensor t = *this;
  t.shape_[0] = length;
  t.numel_ = row * length;
  t.offset_ = offset_ + static_cast<size_t>(start * row) * dtype_size(dtype_);
  return t;
}

Tensor Tensor::slice_flat(int64_t offset, const Shape& shape) const {
  int64_t n = shape_numel(shape);
  MDLM_CHECK(offset >= 0 && offset + n <= numel_, "slice_flat(", offset, ", ", shape_str(shape),
             ") out of range for ", numel_, " elements");
  Tensor t = *this;
  t.shape_ = shape;
  t.numel_ = n;
  t.offset_ = offset_ + static_cast<size_t>(offset) * dtype_size(dtype_);
  return t;
}

void copy_tensor(const Tensor& src, Tensor& dst, const Stream& stream) {
  MDLM_CHECK(src.numel() == dst.numel(), "copy ", src.str(), " -> ", dst.str(),
             ": element counts differ");
  if (src.numel() == 0) return;
  const bool same_dtype = src.dtype() == dst.dtype();
  if (src.is_cpu() && dst.is_cpu()) {
    convert_host(src.data_ptr(), src.dtype(), dst.data_ptr(), dst.dtype(), src.numel());
    return;
  }
  auto* res = stream.cuda_resources().get();
  MDLM_CHECK(res != nullptr, "copy ", src.str(), " -> ", dst.str(), " needs a CUDA stream");
  if (src.is_cuda() && dst.is_cuda()) {
    if (same_dtype) {
      detail::cuda_copy_bytes(src.data_ptr(), src.device(), dst.data_ptr(), dst.device(),
                              src.nbytes(), res);
    } else {
      detail::cuda_convert(src.data_ptr(), src.dtype(), dst.data_ptr(), dst.dtype(), src.numel(),
                           res);
    }
    return;
  }
  if (src.is_cpu()) {  // host -> device: convert on the host first
    if (same_dtype) {
      detail::cuda_copy_bytes(src.data_ptr(), src.device(), dst.data_ptr(), dst.device(),
                              src.nbytes(), res);
    } else {
      Tensor tmp = Tensor::empty(src.shape(), dst.dtype(), Stream::cpu());
      convert_host(src.data_ptr(), src.dtype(), tmp.data_ptr(), dst.dtype(), src.numel());
      detail::cuda_copy_bytes(tmp.data_ptr(), tmp.device(), dst.data_ptr(), dst.device(),
                              tmp.nbytes(), res);
      stream.synchronize();  // tmp dies here
    }
    return;
  }
  // device -> host
  if (same_dtype) {
    detail::cuda_copy_bytes(src.data_ptr(), src.device(), dst.data_ptr(), dst.device(),
                            src.nbytes(), res);
  } else {
    Tensor tmp = Tensor::empty(src.shape(), src.dtype(), Stream::cpu());
    detail::cuda_copy_bytes(src.data_ptr(), src.device(), tmp.data_ptr(), tmp.device(),
                            src.nbytes(), res);
    convert_host(tmp.data_ptr(), src.dtype(), dst.data_ptr(), dst.dtype(), src.numel());
  }
}

Tensor Tensor::to(Device device, DType dtype, const Stream& stream) const {
  Tensor out = device.is_cpu() ? empty(shape_, dtype, Stream::cpu()) : empty(shape_, dtype, stream);
  MDLM_CHECK(device.is_cpu() || stream.device() == device, "to(", device.str(),
             ") needs a stream of that device, got one of ", stream.device().str());
  copy_tensor(*this, out, stream);
  return out;
}

std::vector<float> Tensor::to_floats(const Stream& stream) const {
  Tensor host = to(Device::cpu(), DType::F32, stream);
  const float* p = host.data<float>();
  return std::vector<float>(p, p + numel_);
}

std::vector<int32_t> Tensor::to_ints(const Stream& stream) const {
  Tensor host = to(Device::cpu(), DType::I32, stream);
  const int32_t* p = host.data<int32_t>();
  return std::vector<int32_t>(p, p + numel_);
}

std::string Tensor::str() const {
  if (!defined()) return "<undefined tensor>";
  return std::string(dtype_name(dtype_)) + shape_str(shape_) + " " + device_.str();
}

}  // namespace megadlm
