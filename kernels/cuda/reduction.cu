// Sum of n floats: grid-stride partial sums, warp-shuffle block reduction, one atomicAdd
// per block into *out (which the caller zeroes before a correctness run).
//
// Tunable parameters (-DNAME=value):
//   BLOCK_SIZE         threads per block (a multiple of 32, <= 1024)
//   ITEMS_PER_THREAD   independent loads per thread per grid-stride step
//   VECTOR             floats per load: 1 (float), 2 (float2) or 4 (float4)
// The number of blocks (grid size) is a launch parameter, not a macro.
#ifndef BLOCK_SIZE
#define BLOCK_SIZE 256
#endif
#ifndef ITEMS_PER_THREAD
#define ITEMS_PER_THREAD 1
#endif
#ifndef VECTOR
#define VECTOR 1
#endif

__device__ __forceinline__ float ks_load_sum(const float* __restrict__ x, long long idx, long long n)
{
    if (idx + VECTOR <= n) {
#if VECTOR == 4
        const float4 v = *reinterpret_cast<const float4*>(x + idx);
        return (v.x + v.y) + (v.z + v.w);
#elif VECTOR == 2
        const float2 v = *reinterpret_cast<const float2*>(x + idx);
        return v.x + v.y;
#else
        return x[idx];
#endif
    }
    float s = 0.0f;
    for (long long j = idx; j < n; ++j) s += x[j];
    return s;
}

extern "C" __global__ void __launch_bounds__(BLOCK_SIZE)
reduce_sum_kernel(const float* __restrict__ x, float* __restrict__ out, long long n)
{
    __shared__ float partial[BLOCK_SIZE / 32];
    const long long chunk = (long long)BLOCK_SIZE * VECTOR;
    const long long stride = (long long)gridDim.x * chunk * ITEMS_PER_THREAD;
    float sum = 0.0f;
    for (long long base = (long long)blockIdx.x * chunk * ITEMS_PER_THREAD
                          + (long long)threadIdx.x * VECTOR;
         base < n; base += stride) {
#pragma unroll
        for (int i = 0; i < ITEMS_PER_THREAD; ++i) {
            const long long idx = base + i * chunk;
            if (idx < n) sum += ks_load_sum(x, idx, n);
        }
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_down_sync(0xffffffffu, sum, off);
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    if (lane == 0) partial[warp] = sum;
    __syncthreads();
    if (warp == 0) {
        sum = (lane < BLOCK_SIZE / 32) ? partial[lane] : 0.0f;
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) sum += __shfl_down_sync(0xffffffffu, sum, off);
        if (lane == 0) atomicAdd(out, sum);
    }
}
