#pragma once
// RAII owners for CUDA objects: device memory, streams, events, graphs, the cuBLAS handle. Each is
// created once at start (Create returns a Status) and freed in its destructor.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <utility>

#include "absl/status/statusor.h"
#include "worker/backends/cuda/cuda_check.h"

namespace tailserve {

template <typename Handle, typename Deleter>
class CudaOwned {
 public:
  CudaOwned() = default;
  explicit CudaOwned(Handle h) : h_(h) {}
  ~CudaOwned() { reset(); }
  CudaOwned(CudaOwned&& o) noexcept : h_(std::exchange(o.h_, Handle{})) {}
  CudaOwned& operator=(CudaOwned&& o) noexcept {
    if (this != &o) {
      reset();
      h_ = std::exchange(o.h_, Handle{});
    }
    return *this;
  }
  CudaOwned(const CudaOwned&) = delete;
  CudaOwned& operator=(const CudaOwned&) = delete;
  Handle get() const { return h_; }
  explicit operator bool() const { return h_ != Handle{}; }
  void reset() {
    if (h_ != Handle{}) Deleter()(h_);
    h_ = Handle{};
  }

 private:
  Handle h_{};
};

struct StreamDeleter {
  void operator()(cudaStream_t s) const { cudaStreamDestroy(s); }
};
struct EventDeleter {
  void operator()(cudaEvent_t e) const { cudaEventDestroy(e); }
};
struct GraphExecDeleter {
  void operator()(cudaGraphExec_t g) const { cudaGraphExecDestroy(g); }
};
struct GraphDeleter {
  void operator()(cudaGraph_t g) const { cudaGraphDestroy(g); }
};
struct CublasLtDeleter {
  void operator()(cublasLtHandle_t h) const { cublasLtDestroy(h); }
};
struct DeviceFree {
  void operator()(void* p) const { cudaFree(p); }
};

struct PinnedFree {
  void operator()(void* p) const { cudaFreeHost(p); }
};

using CudaStream = CudaOwned<cudaStream_t, StreamDeleter>;
using CudaEvent = CudaOwned<cudaEvent_t, EventDeleter>;
using CudaGraph = CudaOwned<cudaGraph_t, GraphDeleter>;
using CudaGraphExec = CudaOwned<cudaGraphExec_t, GraphExecDeleter>;
using CublasLtHandle = CudaOwned<cublasLtHandle_t, CublasLtDeleter>;
using DeviceMemory = CudaOwned<void*, DeviceFree>;
using PinnedMemory = CudaOwned<void*, PinnedFree>;  // page-locked host memory for fast async copies

inline absl::StatusOr<CudaStream> MakeStream() {
  cudaStream_t s;
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return CudaStream(s);
}

inline absl::StatusOr<CudaEvent> MakeEvent() {
  cudaEvent_t e;
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaEventCreate(&e));
  return CudaEvent(e);
}

inline absl::StatusOr<CublasLtHandle> MakeCublasLt() {
  cublasLtHandle_t h;
  TAILSERVE_CUDA_RETURN_IF_ERROR(cublasLtCreate(&h));
  return CublasLtHandle(h);
}

inline absl::StatusOr<DeviceMemory> DeviceAlloc(size_t bytes) {
  void* p = nullptr;
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, bytes));
  return DeviceMemory(p);
}

// Pinned and mapped: kernels may read and write it through MappedDevicePointer.
inline absl::StatusOr<PinnedMemory> PinnedAlloc(size_t bytes) {
  void* p = nullptr;
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&p, bytes, cudaHostAllocMapped));
  return PinnedMemory(p);
}

inline absl::StatusOr<void*> MappedDevicePointer(const PinnedMemory& host) {
  void* d = nullptr;
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaHostGetDevicePointer(&d, host.get(), 0));
  return d;
}

// Hands out aligned slices of one allocation: everything the engine needs is carved from a few
// allocations made at start, so nothing is allocated on the serving path.
class DeviceArena {
 public:
  explicit DeviceArena(void* base = nullptr, size_t size = 0) : base_(static_cast<char*>(base)), size_(size) {}
  template <typename T>
  T* Take(size_t count) {
    used_ = (used_ + 255) & ~size_t{255};
    const size_t bytes = count * sizeof(T);
    if (used_ + bytes > size_) return nullptr;
    T* p = reinterpret_cast<T*>(base_ + used_);
    used_ += bytes;
    return p;
  }
  size_t used() const { return used_; }

 private:
  char* base_;
  size_t size_;
  size_t used_ = 0;
};

}  // namespace tailserve
