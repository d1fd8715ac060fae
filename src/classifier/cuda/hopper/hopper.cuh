#pragma once

// Hopper (sm_90a) building blocks for the fused classifier: mbarriers, bulk tensor copies (TMA),
// asynchronous copies (cp.async), exchanges within a cluster, and warpgroup MMAs (wgmma) on
// 128-byte-swizzled K-major tiles. Inline PTX, so that no CUTLASS
// is needed; every wrapper is exercised by the fused kernels' tests against float64 references.

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace myriad::cuda::hopper {

// A tile row of a 128-byte swizzle holds 64 bf16 elements; 8 rows make the 1024-byte atom that
// descriptors stride over, so tiles start on 1024-byte boundaries.
constexpr int kSwizzleElements = 64;
constexpr int kSwizzleAtomBytes = 1024;

__device__ inline uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ inline void barrier_init(uint64_t* bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(shared_address(bar)),
               "r"(arrivals));
}

// Makes the barriers' initialisation visible to the copy engine before any copy uses them.
__device__ inline void barrier_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// This thread's arrival, announcing `bytes` that copies will deliver to the barrier.
__device__ inline void barrier_arrive_expect(uint64_t* bar, uint32_t bytes) {
  asm volatile(
      "mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(shared_address(bar)),
      "r"(bytes)
      : "memory");
}

__device__ inline void barrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(shared_address(bar)) : "memory");
}

// Waits for the barrier's phase `parity` (0, 1, 0, ...) to complete.
__device__ inline void barrier_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\nWAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n}\n" ::"r"(shared_address(bar)),
      "r"(parity)
      : "memory");
}

// Named barriers 1-15 among `threads` threads (a multiple of 32): sync waits for the count,
// arrive counts this warp without waiting.
__device__ inline void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ inline void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Copies the box at (inner, outer) of a 2-D tensor map into shared memory; its bytes complete
// on `bar`.
__device__ inline void tma_load_2d(void* dst, const CUtensorMap* map, int inner, int outer,
                                   uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, "
      "{%2, %3}], [%4];\n" ::"r"(shared_address(dst)),
      "l"(map), "r"(inner), "r"(outer), "r"(shared_address(bar))
      : "memory");
}

// Stores four 8x8 b16 matrices transposed, from the m16n8 accumulator layout (register k of a
// thread: matrix k's row lane / 4, columns 2 (lane % 4) and + 1), to shared memory: lane l
// gives the address of row l % 8 of matrix l / 8 of the result (16 bytes, one column of the
// original).
__device__ inline void stmatrix_x4_trans(void* row, uint32_t r0, uint32_t r1, uint32_t r2,
                                         uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(
                   shared_address(row)),
               "r"(r0), "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}

// Stores the shared-memory box `src` at (inner, outer) of a 2-D tensor map, in this thread's bulk
// group; what falls outside the tensor is not written.
__device__ inline void tma_store_2d(const CUtensorMap* map, int inner, int outer, const void* src) {
  asm volatile(
      "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\n" ::"l"(map),
      "r"(inner), "r"(outer), "r"(shared_address(src))
      : "memory");
}
__device__ inline void bulk_commit() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
// Waits until all but the last kPending of this thread's bulk store groups have read their
// shared memory (it may be written again).
template <int kPending>
__device__ inline void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
}
// Waits until this thread's bulk stores are complete.
__device__ inline void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}
// Makes this thread's ordinary shared-memory writes visible to the copy engine.
__device__ inline void fence_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// The matrix descriptor of a K-major bf16 tile with 128-byte swizzle at `tile` (1024-byte
// aligned): start address, leading offset 1 (unused by this layout), stride 1024 bytes between
// 8-row groups, swizzle mode 1. Advancing K by 16 elements adds 32 bytes, (32 >> 4) to the
// descriptor.
__device__ inline uint64_t descriptor_k_major_sw128(const void* tile) {
  const uint64_t address = shared_address(tile);
  return ((address & 0x3FFFF) >> 4) | (uint64_t{1} << 16) |
         (uint64_t{kSwizzleAtomBytes >> 4} << 32) | (uint64_t{1} << 62);
}
constexpr uint64_t kDescriptorK16Step = 32 >> 4;

// 2^x in the special-function unit (flushes denormal results to zero, 2 ulp).
__device__ inline float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Orders this thread's register accesses before the warpgroup's next wgmma.
__device__ inline void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ inline void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
// Waits until at most `kPending` committed groups of this warpgroup are still running.
template <int kPending>
__device__ inline void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// The m64nNk16 accumulator layout: register i of thread t of the warpgroup holds
// (fragment_row(t, i), fragment_col(t, i)).
__device__ inline int fragment_row(int thread, int i) {
  return (thread / 32) * 16 + (thread % 32) / 4 + 8 * ((i / 2) % 2);
}
__device__ inline int fragment_col(int thread, int i) {
  return 8 * (i / 4) + 2 * (thread % 4) + i % 2;
}

// D[64 x 128] (+)= A[64 x 16] . B[16 x 128], bf16 operands in shared memory (both K-major, 128-byte
// swizzle), float32 accumulators in the fragment layout of PTX's m64nNk16 (see fragment_row/col).
// `accumulate` false overwrites D.
__device__ inline void wgmma_m64n128k16_bf16(float (&d)[64], uint64_t desc_a, uint64_t desc_b,
                                             bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%"
      "25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%"
      "48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p, 1, 1, 0, "
      "0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
        "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate)));
}

// One K block of 64 on the tensor cores, asynchronously: acc[q] (+)= A_q . B_q for each of the
// kBlocks blocks, with A_q and B_q the 128-byte-swizzled K-major tiles whose descriptors a(q) and
// b(q) give (M 64, N 128); `accumulate` false overwrites acc. Returns once the previous K block's
// products are done, so that its stage may be released, and this one's at most still run.
template <int kBlocks, class A, class B>
__device__ __forceinline__ void wgmma_k_block(float (&acc)[kBlocks][64], A a, B b,
                                              bool accumulate) {
  wgmma_fence();
#pragma unroll
  for (int q = 0; q < kBlocks; ++q) {
    const uint64_t desc_a = a(q), desc_b = b(q);
#pragma unroll
    for (int k = 0; k < kSwizzleElements / 16; ++k)
      wgmma_m64n128k16_bf16(acc[q], desc_a + k * kDescriptorK16Step,
                            desc_b + k * kDescriptorK16Step, accumulate || k > 0);
  }
  wgmma_commit();
  wgmma_wait<1>();
}

__device__ inline void cp_async_16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(shared_address(dst)), "l"(src)
               : "memory");
}
__device__ inline void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Waits until at most kPending of this thread's committed groups of copies are still landing.
template <int kPending>
__device__ inline void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}
// One arrival on `bar` once this thread's earlier cp.async copies have landed (counted in the
// barrier's initial count).
__device__ inline void cp_async_arrive(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(shared_address(bar))
               : "memory");
}

// The address of the place of `p` in the shared memory of the cluster's CTA `rank`.
__device__ inline uint32_t remote_address(const void* p, int rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n"
               : "=r"(remote)
               : "r"(shared_address(p)), "r"(rank));
  return remote;
}
// Stores v at the place of `p` in CTA `rank`'s shared memory.
__device__ inline void store_remote(float2* p, int rank, float2 v) {
  asm volatile("st.shared::cluster.v2.f32 [%0], {%1, %2};\n" ::"r"(remote_address(p, rank)),
               "f"(v.x), "f"(v.y)
               : "memory");
}
// An arrival on the barrier at the place of `bar` in CTA `rank`'s shared memory, after (release)
// this thread's earlier writes to it.
__device__ inline void arrive_remote(uint64_t* bar, int rank) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(
                   remote_address(bar, rank))
               : "memory");
}
// Waits for the barrier's phase `parity`, seeing (acquire) what the cluster wrote before arriving.
__device__ inline void barrier_wait_cluster(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\nWAIT:\n"
      "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n}\n" ::"r"(shared_address(bar)),
      "r"(parity)
      : "memory");
}

// Every thread of every CTA of the cluster meets here; shared-memory writes before it are
// visible to the cluster's reads after it.
__device__ inline void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}

// The dynamic shared memory as an S, started on a 1024-byte boundary (launches ask for
// sizeof(S) + kSwizzleAtomBytes).
// The offset is added to the array itself, not to an integer made of its address, so that the
// compiler still knows the result for shared memory and reads it with shared loads rather than
// generic ones.
template <class S>
__device__ inline S& shared_storage() {
  extern __shared__ uint8_t raw[];
  const uint32_t misalignment = shared_address(raw) % kSwizzleAtomBytes;
  return *reinterpret_cast<S*>(raw + (kSwizzleAtomBytes - misalignment) % kSwizzleAtomBytes);
}

// Pins the compiler's reads and writes of `acc` at this point: registers that a wgmma writes
// asynchronously are touched only after the wait that precedes this.
template <int kBlocks>
__device__ inline void fence_registers(float (&acc)[kBlocks][64]) {
#pragma unroll
  for (int q = 0; q < kBlocks; ++q)
#pragma unroll
    for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(acc[q][i])::"memory");
}

// Tensor maps, made on the host through the driver's entry point (no link to libcuda).
inline cudaError_t driver_encode(CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank,
                                 const void* data, const cuuint64_t* sizes,
                                 const cuuint64_t* strides, const cuuint32_t* box,
                                 CUtensorMapSwizzle swizzle) {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
  if (encode == nullptr) {
    cudaDriverEntryPointQueryResult found;
    const cudaError_t rc = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled",
                                                            reinterpret_cast<void**>(&encode),
                                                            12000, cudaEnableDefault, &found);
    if (rc != cudaSuccess) return rc;
    if (found != cudaDriverEntryPointSuccess) return cudaErrorSymbolNotFound;
  }
  const cuuint32_t steps[2] = {1, 1};
  const CUresult rc = encode(map, type, rank, const_cast<void*>(data), sizes, strides, box, steps,
                             CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return rc == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

// A 2-D tensor map over a row-major bf16 matrix [rows, dim], in boxes of 64 elements x box_rows
// with the 128-byte swizzle; what lies outside the matrix reads as zeros.
inline cudaError_t matrix_map(CUtensorMap* map, const void* data, int64_t rows, int dim,
                              int box_rows) {
  const cuuint64_t sizes[2] = {static_cast<cuuint64_t>(dim), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(dim) * 2};
  const cuuint32_t box[2] = {kSwizzleElements, static_cast<cuuint32_t>(box_rows)};
  return driver_encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, data, sizes, strides, box,
                       CU_TENSOR_MAP_SWIZZLE_128B);
}

}  // namespace myriad::cuda::hopper
