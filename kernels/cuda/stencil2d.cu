// 5-point Jacobi stencil on an nx x ny grid (row-major, x fastest):
//   out = 0.5*c + 0.125*(west + east + north + south) inside; boundary cells copied.
//
// Tunable parameters (-DNAME=value):
//   BLOCK_X, BLOCK_Y   threads per block
//   ITEMS_Y            output rows per thread (block covers BLOCK_Y*ITEMS_Y rows)
//   USE_SHARED         1: stage the block's tile plus a one-cell halo in shared memory
// Launch: block (BLOCK_X, BLOCK_Y), grid (nx / BLOCK_X, ny / (BLOCK_Y*ITEMS_Y)).
#ifndef BLOCK_X
#define BLOCK_X 8
#endif
#ifndef BLOCK_Y
#define BLOCK_Y 4
#endif
#ifndef ITEMS_Y
#define ITEMS_Y 1
#endif
#ifndef USE_SHARED
#define USE_SHARED 0
#endif

#define TILE_Y (BLOCK_Y * ITEMS_Y)

extern "C" __global__ void __launch_bounds__(BLOCK_X * BLOCK_Y)
stencil2d_kernel(const float* __restrict__ in, float* __restrict__ out, int nx, int ny)
{
    const int x = blockIdx.x * BLOCK_X + threadIdx.x;
    const int y0 = blockIdx.y * TILE_Y + threadIdx.y;
#if USE_SHARED
    __shared__ float s[TILE_Y + 2][BLOCK_X + 2];
    const int ox = blockIdx.x * BLOCK_X - 1;
    const int oy = blockIdx.y * TILE_Y - 1;
    for (int e = threadIdx.y * BLOCK_X + threadIdx.x; e < (TILE_Y + 2) * (BLOCK_X + 2);
         e += BLOCK_X * BLOCK_Y) {
        const int sy = e / (BLOCK_X + 2), sx = e % (BLOCK_X + 2);
        const int gx = min(max(ox + sx, 0), nx - 1);
        const int gy = min(max(oy + sy, 0), ny - 1);
        s[sy][sx] = in[(size_t)gy * nx + gx];
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < ITEMS_Y; ++i) {
        const int y = y0 + i * BLOCK_Y;
        const int sy = threadIdx.y + i * BLOCK_Y + 1, sx = threadIdx.x + 1;
        const float c = s[sy][sx];
        float r = c;
        if (x > 0 && y > 0 && x < nx - 1 && y < ny - 1)
            r = 0.5f * c + 0.125f * (s[sy][sx - 1] + s[sy][sx + 1] + s[sy - 1][sx] + s[sy + 1][sx]);
        out[(size_t)y * nx + x] = r;
    }
#else
#pragma unroll
    for (int i = 0; i < ITEMS_Y; ++i) {
        const int y = y0 + i * BLOCK_Y;
        const size_t idx = (size_t)y * nx + x;
        const float c = in[idx];
        float r = c;
        if (x > 0 && y > 0 && x < nx - 1 && y < ny - 1)
            r = 0.5f * c + 0.125f * (in[idx - 1] + in[idx + 1] + in[idx - nx] + in[idx + nx]);
        out[idx] = r;
    }
#endif
}
