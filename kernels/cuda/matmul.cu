// Tiled single-precision matrix multiply C = A * B, square n x n, row-major.
//
// Tunable parameters are compile-time macros (-DNAME=value):
//   BLOCK_X, BLOCK_Y      threads per block; the output tile is TILE_M x TILE_N with
//   ITEMS_PER_THREAD      outputs per thread along y: TILE_M = BLOCK_Y * ITEMS_PER_THREAD,
//                         TILE_N = BLOCK_X
//   TILE_K                k-extent of the shared-memory tiles
//   USE_SHARED            1: stage A and B tiles in shared memory; 0: read global memory
//   UNROLL                unroll factor of the inner k loop
// Launch: block (BLOCK_X, BLOCK_Y), grid (n / TILE_N, n / TILE_M); n divisible by the tiles.
#ifndef BLOCK_X
#define BLOCK_X 8
#endif
#ifndef BLOCK_Y
#define BLOCK_Y 8
#endif
#ifndef ITEMS_PER_THREAD
#define ITEMS_PER_THREAD 1
#endif
#ifndef TILE_K
#define TILE_K 8
#endif
#ifndef USE_SHARED
#define USE_SHARED 0
#endif
#ifndef UNROLL
#define UNROLL 1
#endif

#define TILE_M (BLOCK_Y * ITEMS_PER_THREAD)
#define TILE_N BLOCK_X
#define KS_PRAGMA(x) _Pragma(#x)
#define KS_UNROLL(n) KS_PRAGMA(unroll n)

extern "C" __global__ void __launch_bounds__(BLOCK_X * BLOCK_Y)
matmul_kernel(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C,
              int n)
{
    const int tx = threadIdx.x;
    const int ty = threadIdx.y;
    const int col = blockIdx.x * TILE_N + tx;
    const int row0 = blockIdx.y * TILE_M + ty;
    float acc[ITEMS_PER_THREAD];
#pragma unroll
    for (int i = 0; i < ITEMS_PER_THREAD; ++i) acc[i] = 0.0f;

#if USE_SHARED
    __shared__ float As[TILE_M][TILE_K];
    __shared__ float Bs[TILE_K][TILE_N];
    const int tid = ty * BLOCK_X + tx;
    for (int k0 = 0; k0 < n; k0 += TILE_K) {
        for (int e = tid; e < TILE_M * TILE_K; e += BLOCK_X * BLOCK_Y) {
            const int r = e / TILE_K, c = e % TILE_K;
            As[r][c] = A[(size_t)(blockIdx.y * TILE_M + r) * n + k0 + c];
        }
        for (int e = tid; e < TILE_K * TILE_N; e += BLOCK_X * BLOCK_Y) {
            const int r = e / TILE_N, c = e % TILE_N;
            Bs[r][c] = B[(size_t)(k0 + r) * n + blockIdx.x * TILE_N + c];
        }
        __syncthreads();
        KS_UNROLL(UNROLL)
        for (int k = 0; k < TILE_K; ++k) {
            const float b = Bs[k][tx];
#pragma unroll
            for (int i = 0; i < ITEMS_PER_THREAD; ++i) acc[i] += As[ty + i * BLOCK_Y][k] * b;
        }
        __syncthreads();
    }
#else
    KS_UNROLL(UNROLL)
    for (int k = 0; k < n; ++k) {
        const float b = B[(size_t)k * n + col];
#pragma unroll
        for (int i = 0; i < ITEMS_PER_THREAD; ++i)
            acc[i] += A[(size_t)(row0 + i * BLOCK_Y) * n + k] * b;
    }
#endif

#pragma unroll
    for (int i = 0; i < ITEMS_PER_THREAD; ++i) C[(size_t)(row0 + i * BLOCK_Y) * n + col] = acc[i];
}
