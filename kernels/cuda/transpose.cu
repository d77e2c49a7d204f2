// Out-of-place transpose: in is rows x cols (row-major), out is cols x rows.
//
// Tunable parameters (-DNAME=value):
//   TILE_DIM          square tile edge; the block is TILE_DIM x BLOCK_ROWS threads
//   BLOCK_ROWS        thread rows; each thread moves TILE_DIM / BLOCK_ROWS elements
//   USE_SHARED        1: stage the tile in shared memory so reads and writes are both
//                     coalesced; 0: naive, coalesced reads and strided (uncoalesced) writes
//   PAD               1: pad the shared tile by one column to avoid bank conflicts
//   TILES_PER_BLOCK   consecutive tiles along x one block processes
// Launch: block (TILE_DIM, BLOCK_ROWS), grid (cols / (TILE_DIM*TILES_PER_BLOCK), rows / TILE_DIM).
#ifndef TILE_DIM
#define TILE_DIM 32
#endif
#ifndef BLOCK_ROWS
#define BLOCK_ROWS 8
#endif
#ifndef USE_SHARED
#define USE_SHARED 0
#endif
#ifndef PAD
#define PAD 0
#endif
#ifndef TILES_PER_BLOCK
#define TILES_PER_BLOCK 1
#endif

extern "C" __global__ void __launch_bounds__(TILE_DIM * BLOCK_ROWS)
transpose_kernel(const float* __restrict__ in, float* __restrict__ out, int rows, int cols)
{
#if USE_SHARED
    __shared__ float tile[TILE_DIM][TILE_DIM + PAD];
#endif
    for (int t = 0; t < TILES_PER_BLOCK; ++t) {
        const int tile_x = blockIdx.x * TILES_PER_BLOCK + t;
        const int x = tile_x * TILE_DIM + threadIdx.x;
        const int y = blockIdx.y * TILE_DIM + threadIdx.y;
#if USE_SHARED
#pragma unroll
        for (int j = 0; j < TILE_DIM; j += BLOCK_ROWS)
            tile[threadIdx.y + j][threadIdx.x] = in[(size_t)(y + j) * cols + x];
        __syncthreads();
        const int ox = blockIdx.y * TILE_DIM + threadIdx.x;
        const int oy = tile_x * TILE_DIM + threadIdx.y;
#pragma unroll
        for (int j = 0; j < TILE_DIM; j += BLOCK_ROWS)
            out[(size_t)(oy + j) * rows + ox] = tile[threadIdx.x][threadIdx.y + j];
        __syncthreads();
#else
#pragma unroll
        for (int j = 0; j < TILE_DIM; j += BLOCK_ROWS)
            out[(size_t)x * rows + (y + j)] = in[(size_t)(y + j) * cols + x];
#endif
    }
}
