// sample.cu: the sampler's per-step update on the GPU (the pipeline's GPU mode).
//
// advance_step: the first kernel of a step; moves *counter to this step (it starts at -1), points
//   the U-Net's per-sample timestep array at it (t_idx[b] = t_of_step[s]) and copies the step's
//   coefficients and noise row to *cur (float4: c_x, c_eps, sigma, row as int bits). The executor
//   runs it on a side branch, joined before the first kernel that reads t_idx (GpuExecutor.run
//   t_writer): its latency chain (counter, then the tables) overlaps init_conv instead of adding to
//   the step.
// p_sample_f32: x = c_x * x + c_eps * eps + sigma * z, the affine step (S) of runtime/schedule.py,
//   with (c_x, c_eps, sigma, row) from *cur; z = noise row `row` (-1: no noise for that step). x and
//   eps are fp32 NHWC, n elements each; each noise row is fp32 NCHW (C channels, hw pixels), exactly
//   as the host's generator fills it, so the host draws straight into pinned memory with no
//   transpose pass (at batch 16 the transpose made the noise thread, not the GPU, the bottleneck).
//   Launch: grid ceil(n / 256) (capped), block 256, grid-stride loop. Reference: schedule.p_sample.
// Both read the step from device memory, so one captured CUDA graph (advance, U-Net, p_sample)
// serves every step of a run: replaying it advances the loop.
#include "common.cuh"

extern "C" __global__ void advance_step(int *counter, int *t_idx, float4 *cur, const int *__restrict__ t_of_step,
                                        const float *__restrict__ coef, const int *__restrict__ noise_row,
                                        int batch, int n_steps) {
    const int s = *counter + 1;
    __syncthreads();   // every thread has read *counter before thread 0 writes it
    if (s < n_steps) {
        for (int b = threadIdx.x; b < batch; b += blockDim.x) t_idx[b] = t_of_step[s];
        if (threadIdx.x == 0)
            *cur = make_float4(coef[3 * s], coef[3 * s + 1], coef[3 * s + 2], __int_as_float(noise_row[s]));
    }
    if (threadIdx.x == 0) *counter = s;
}

extern "C" __global__ void p_sample_f32(float *__restrict__ x, const float *__restrict__ eps,
                                        const float *__restrict__ noise, const float4 *__restrict__ cur,
                                        long long n, int C, long long hw) {
    const float4 k = *cur;
    const float cx = k.x, ce = k.y, sg = k.z;
    const int row = __float_as_int(k.w);
    const float *z = row >= 0 ? noise + (long long)row * n : nullptr;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        float v = fmaf(cx, x[i], ce * eps[i]);
        if (z) {   // NHWC element i = (q = b*hw + pixel, c) reads the NCHW noise at (b*C + c)*hw + pixel
            const long long q = i / C, b = q / hw;
            v = fmaf(sg, z[(b * C + (i - q * C)) * hw + (q - b * hw)], v);
        }
        x[i] = v;
    }
}
