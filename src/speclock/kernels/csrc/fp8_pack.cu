// fp8 (e4m3) packing of hidden states with one float32 scale per token, and unpacking.
//
// Semantics (speclock.kernels.reference.fp8_pack_reference is the oracle, bit for bit):
//   amax[t]  = max(max_h |x[t,h]|, 1e-30)        (the floor keeps all-zero rows finite)
//   inv[t]   = 448 / amax[t]                       (IEEE division, float32)
//   q[t,h]   = e4m3(x[t,h] * inv[t])               (round to nearest even, |value| <= 448)
//   scale[t] = amax[t] / 448
//   unpack:  y[t,h] = out_dtype(float(q[t,h]) * scale[t])
//
// A plain C ABI (no torch headers) so the library builds with nvcc alone on a machine without
// a GPU or a CUDA torch, and loads through ctypes next to any torch build. Every entry point
// takes the caller's stream and returns a cudaError_t (0 = success).
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#include <type_traits>

#define SPECLOCK_FP8_ABI 1

namespace {

constexpr float kFp8Max = 448.0f;
constexpr float kAmaxFloor = 1e-30f;
constexpr int kMaxThreads = 512;  // 128 registers a thread: room for 16 vectors of the row

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

// Max over the block; every thread gets the result.
__device__ __forceinline__ float block_max(float v, float* smem) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_max(v);
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  const int nwarps = (blockDim.x + 31) >> 5;
  v = (threadIdx.x < nwarps) ? smem[threadIdx.x] : 0.0f;
  if (warp == 0) v = warp_max(v);
  if (threadIdx.x == 0) smem[32] = v;
  __syncthreads();
  return smem[32];
}

__device__ __forceinline__ float abs_max8(const uint4& v) {
  const __nv_bfloat162* p = reinterpret_cast<const __nv_bfloat162*>(&v);
  __nv_bfloat162 m = __habs2(p[0]);
  m = __hmax2(m, __habs2(p[1]));
  m = __hmax2(m, __habs2(p[2]));
  m = __hmax2(m, __habs2(p[3]));
  return fmaxf(__bfloat162float(m.x), __bfloat162float(m.y));
}

__device__ __forceinline__ uint16_t quant2(__nv_bfloat162 v, float inv) {
  float2 f = __bfloat1622float2(v);
  f.x *= inv;
  f.y *= inv;
  return static_cast<uint16_t>(__nv_cvt_float2_to_fp8x2(f, __NV_SATFINITE, __NV_E4M3));
}

__device__ __forceinline__ uint2 quant8(const uint4& v, float inv) {
  const __nv_bfloat162* p = reinterpret_cast<const __nv_bfloat162*>(&v);
  uint2 out;
  out.x = static_cast<uint32_t>(quant2(p[0], inv)) | (static_cast<uint32_t>(quant2(p[1], inv)) << 16);
  out.y = static_cast<uint32_t>(quant2(p[2], inv)) | (static_cast<uint32_t>(quant2(p[3], inv)) << 16);
  return out;
}

// One block per row; the row stays in registers (VPT 16-byte vectors per thread), so each
// byte of x is read from memory once.
template <int VPT>
__global__ void __launch_bounds__(kMaxThreads) pack_rows_vec(const uint4* __restrict__ x, uint2* __restrict__ q,
                                                             float* __restrict__ scale, int nvec) {
  __shared__ float smem[33];
  const int64_t row = blockIdx.x;
  const uint4* xr = x + row * nvec;
  uint2* qr = q + row * nvec;
  uint4 v[VPT];
  float amax = 0.0f;
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    const int i = threadIdx.x + k * blockDim.x;
    if (i < nvec) {
      v[k] = __ldcs(xr + i);  // streamed: read once, keep it out of L1
      amax = fmaxf(amax, abs_max8(v[k]));
    }
  }
  amax = fmaxf(block_max(amax, smem), kAmaxFloor);
  const float inv = kFp8Max / amax;
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    const int i = threadIdx.x + k * blockDim.x;
    if (i < nvec) __stcs(qr + i, quant8(v[k], inv));
  }
  if (threadIdx.x == 0) scale[row] = amax / kFp8Max;
}

// One block per row, two passes: the first finds amax, the second re-reads the row (from L2,
// where the first pass just left it) and writes the codes. Few registers a thread, so many
// rows are in flight on each multiprocessor.
template <int UNROLL>
__global__ void __launch_bounds__(512) pack_rows_2pass(const uint4* __restrict__ x, uint2* __restrict__ q,
                                                       float* __restrict__ scale, int nvec) {
  __shared__ float smem[33];
  const int64_t row = blockIdx.x;
  const uint4* xr = x + row * nvec;
  uint2* qr = q + row * nvec;
  float amax = 0.0f;
  for (int base = threadIdx.x; base < nvec; base += blockDim.x * UNROLL) {
    uint4 v[UNROLL];
#pragma unroll
    for (int k = 0; k < UNROLL; ++k) {
      const int i = base + k * blockDim.x;
      if (i < nvec) v[k] = xr[i];  // default caching: the second pass hits L2
    }
#pragma unroll
    for (int k = 0; k < UNROLL; ++k)
      if (base + k * (int)blockDim.x < nvec) amax = fmaxf(amax, abs_max8(v[k]));
  }
  amax = fmaxf(block_max(amax, smem), kAmaxFloor);
  const float inv = kFp8Max / amax;
  for (int base = threadIdx.x; base < nvec; base += blockDim.x * UNROLL) {
    uint4 v[UNROLL];
#pragma unroll
    for (int k = 0; k < UNROLL; ++k) {
      const int i = base + k * blockDim.x;
      if (i < nvec) v[k] = __ldcs(xr + i);  // last use
    }
#pragma unroll
    for (int k = 0; k < UNROLL; ++k) {
      const int i = base + k * blockDim.x;
      if (i < nvec) __stcs(qr + i, quant8(v[k], inv));
    }
  }
  if (threadIdx.x == 0) scale[row] = amax / kFp8Max;
}

// Any width or alignment: two passes over the row, one element at a time.
__global__ void pack_rows_scalar(const __nv_bfloat16* __restrict__ x, __nv_fp8_storage_t* __restrict__ q,
                                 float* __restrict__ scale, int64_t cols) {
  __shared__ float smem[33];
  const int64_t row = blockIdx.x;
  const __nv_bfloat16* xr = x + row * cols;
  float amax = 0.0f;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) amax = fmaxf(amax, fabsf(__bfloat162float(xr[i])));
  amax = fmaxf(block_max(amax, smem), kAmaxFloor);
  const float inv = kFp8Max / amax;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x)
    q[row * cols + i] = __nv_cvt_float_to_fp8(__bfloat162float(xr[i]) * inv, __NV_SATFINITE, __NV_E4M3);
  if (threadIdx.x == 0) scale[row] = amax / kFp8Max;
}

template <typename T> struct Out;
template <> struct Out<__nv_bfloat16> {
  static __device__ __forceinline__ uint32_t pack2(float a, float b) {
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&h);
  }
  static __device__ __forceinline__ __nv_bfloat16 one(float a) { return __float2bfloat16_rn(a); }
};
template <> struct Out<__half> {
  static __device__ __forceinline__ uint32_t pack2(float a, float b) {
    __half2 h = __floats2half2_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&h);
  }
  static __device__ __forceinline__ __half one(float a) { return __float2half_rn(a); }
};

__device__ __forceinline__ float2 dequant2(uint16_t bits, float s) {
  __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(bits), __NV_E4M3);
  float2 f = __half22float2(*reinterpret_cast<__half2*>(&h));
  f.x *= s;
  f.y *= s;
  return f;
}

// One 16-byte store of outputs per item: 8 values for 2-byte outputs (an 8-byte load of codes),
// 4 for float32 (a 4-byte load). Consecutive threads touch consecutive bytes on both sides.
template <typename T> struct UnpackItem;
template <> struct UnpackItem<float> {
  using Load = uint32_t;
  static __device__ __forceinline__ uint4 convert(Load v, float s) {
    const float2 lo = dequant2(static_cast<uint16_t>(v & 0xffffu), s), hi = dequant2(static_cast<uint16_t>(v >> 16), s);
    return make_uint4(__float_as_uint(lo.x), __float_as_uint(lo.y), __float_as_uint(hi.x), __float_as_uint(hi.y));
  }
};
template <typename T> struct UnpackItem {  // bfloat16, half
  using Load = uint2;
  static __device__ __forceinline__ uint4 convert(Load v, float s) {
    const float2 a = dequant2(static_cast<uint16_t>(v.x & 0xffffu), s), b = dequant2(static_cast<uint16_t>(v.x >> 16), s);
    const float2 c = dequant2(static_cast<uint16_t>(v.y & 0xffffu), s), d = dequant2(static_cast<uint16_t>(v.y >> 16), s);
    return make_uint4(Out<T>::pack2(a.x, a.y), Out<T>::pack2(b.x, b.y), Out<T>::pack2(c.x, c.y), Out<T>::pack2(d.x, d.y));
  }
};

// grid = (rows, column tiles): no index division, one scale load a thread, UNROLL independent
// loads in flight per thread. cols % 8 == 0 on this path.
template <typename T, int UNROLL>
__global__ void unpack_rows(const uint8_t* __restrict__ q, const float* __restrict__ scale, T* __restrict__ y,
                            int64_t cols, int items) {
  using Item = UnpackItem<T>;
  using Load = typename Item::Load;
  const int64_t row = blockIdx.x;
  const float s = __ldg(scale + row);
  const Load* qr = reinterpret_cast<const Load*>(q + row * cols);
  uint4* yr = reinterpret_cast<uint4*>(y + row * cols);
  const int base = blockIdx.y * blockDim.x * UNROLL + threadIdx.x;
  Load v[UNROLL];
#pragma unroll
  for (int k = 0; k < UNROLL; ++k) {
    const int i = base + k * blockDim.x;
    if (i < items) v[k] = __ldcs(qr + i);
  }
#pragma unroll
  for (int k = 0; k < UNROLL; ++k) {
    const int i = base + k * blockDim.x;
    if (i < items) __stcs(yr + i, Item::convert(v[k], s));
  }
}

template <typename T>
__global__ void unpack_scalar(const __nv_fp8_storage_t* __restrict__ q, const float* __restrict__ scale,
                              T* __restrict__ y, int64_t n, int64_t cols) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    __half_raw h = __nv_cvt_fp8_to_halfraw(q[i], __NV_E4M3);
    const float f = __half2float(*reinterpret_cast<__half*>(&h)) * scale[i / cols];
    if constexpr (sizeof(T) == 4) {
      y[i] = f;
    } else {
      y[i] = Out<T>::one(f);
    }
  }
}

int grid_for(int64_t work, int threads) {
  int dev = 0, sms = 132;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  const int64_t blocks = (work + threads - 1) / threads;
  const int64_t cap = static_cast<int64_t>(sms) * 16;  // enough resident blocks to cover memory latency
  return static_cast<int>(blocks < cap ? (blocks > 0 ? blocks : 1) : cap);
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Which pack kernel `variant 0` picks for a row width (set from H200 measurements, docs/kernels.md).
int kPackAutoVariant(long long) { return 5; }

}  // namespace

extern "C" {

int speclock_fp8_abi_version() { return SPECLOCK_FP8_ABI; }

const char* speclock_fp8_error_string(int err) { return cudaGetErrorString(static_cast<cudaError_t>(err)); }

// x: bf16 [rows, cols] contiguous; q: fp8 e4m3 [rows, cols]; scale: float32 [rows].
// variant: 0 = choose, 1 = row in registers, 2/4/5 = two passes through L2 with up to 256/128/512
// threads a row, 3 = scalar.
int speclock_fp8_pack_bf16_variant(const void* x, void* q, float* scale, long long rows, long long cols,
                                   int variant, void* stream) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  if (rows > 0x7fffffffLL || cols > 0x7fffffffLL) return cudaErrorInvalidValue;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const dim3 grid(static_cast<unsigned>(rows));
  const int64_t nvec = cols / 8;
  const bool vec_ok = cols % 8 == 0 && aligned16(x) && (reinterpret_cast<uintptr_t>(q) & 7u) == 0;
  const uint4* xv = static_cast<const uint4*>(x);
  uint2* qv = static_cast<uint2*>(q);
  auto threads_for = [&](int vpt) { return static_cast<int>(((nvec + vpt - 1) / vpt + 31) / 32 * 32); };
  if (variant == 0) variant = kPackAutoVariant(cols);
  if (vec_ok && variant == 1) {
    // Smallest vector count per thread that fits the row in one block.
    if (threads_for(4) <= 256) {
      pack_rows_vec<4><<<grid, threads_for(4), 0, s>>>(xv, qv, scale, static_cast<int>(nvec));
      return cudaGetLastError();
    }
    if (threads_for(8) <= kMaxThreads) {
      pack_rows_vec<8><<<grid, threads_for(8), 0, s>>>(xv, qv, scale, static_cast<int>(nvec));
      return cudaGetLastError();
    }
    if (threads_for(16) <= kMaxThreads) {
      pack_rows_vec<16><<<grid, threads_for(16), 0, s>>>(xv, qv, scale, static_cast<int>(nvec));
      return cudaGetLastError();
    }
    variant = 2;
  }
  if (vec_ok && (variant == 2 || variant == 4 || variant == 5)) {
    const int cap = variant == 2 ? 256 : (variant == 4 ? 128 : 512);
    const int threads = threads_for(4) < cap ? threads_for(4) : cap;
    pack_rows_2pass<4><<<grid, threads, 0, s>>>(xv, qv, scale, static_cast<int>(nvec));
    return cudaGetLastError();
  }
  pack_rows_scalar<<<grid, 512, 0, s>>>(static_cast<const __nv_bfloat16*>(x), static_cast<__nv_fp8_storage_t*>(q),
                                        scale, cols);
  return cudaGetLastError();
}

int speclock_fp8_pack_bf16(const void* x, void* q, float* scale, long long rows, long long cols, void* stream) {
  return speclock_fp8_pack_bf16_variant(x, q, scale, rows, cols, 0, stream);
}

// out_kind: 0 = bfloat16, 1 = float16, 2 = float32.
int speclock_fp8_unpack(const void* q, const float* scale, void* y, long long rows, long long cols, int out_kind,
                        void* stream) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  if (out_kind < 0 || out_kind > 2 || rows > 0x7fffffffLL || cols > 0x7fffffffLL) return cudaErrorInvalidValue;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (cols % 8 == 0 && (reinterpret_cast<uintptr_t>(q) & 7u) == 0 && aligned16(y)) {
    constexpr int kUnroll = 8;
    const uint8_t* qb = static_cast<const uint8_t*>(q);
    auto launch = [&](auto* out, int vals) {
      using T = std::remove_pointer_t<decltype(out)>;
      const int items = static_cast<int>(cols / vals);
      int threads = ((items + kUnroll - 1) / kUnroll + 31) / 32 * 32;
      threads = threads < 256 ? threads : 256;
      const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>((items + threads * kUnroll - 1) / (threads * kUnroll)));
      unpack_rows<T, kUnroll><<<grid, threads, 0, s>>>(qb, scale, out, cols, items);
    };
    if (out_kind == 0)
      launch(static_cast<__nv_bfloat16*>(y), 8);
    else if (out_kind == 1)
      launch(static_cast<__half*>(y), 8);
    else
      launch(static_cast<float*>(y), 4);
    return cudaGetLastError();
  }
  const int threads = 256;
  const int64_t n = rows * cols;
  const int grid = grid_for(n, threads);
  const __nv_fp8_storage_t* qb = static_cast<const __nv_fp8_storage_t*>(q);
  if (out_kind == 0)
    unpack_scalar<__nv_bfloat16><<<grid, threads, 0, s>>>(qb, scale, static_cast<__nv_bfloat16*>(y), n, cols);
  else if (out_kind == 1)
    unpack_scalar<__half><<<grid, threads, 0, s>>>(qb, scale, static_cast<__half*>(y), n, cols);
  else
    unpack_scalar<float><<<grid, threads, 0, s>>>(qb, scale, static_cast<float*>(y), n, cols);
  return cudaGetLastError();
}

}  // extern "C"
