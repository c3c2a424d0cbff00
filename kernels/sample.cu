// sample.cu: the sampler's per-step update on the GPU (the pipeline's GPU mode).
//
// advance_step: the first kernel of a step; moves *counter to this step (it starts at -1), points
//   the U-Net's per-sample timestep array at it (t_idx[b] = t_of_step[s]) and copies the step's
//   coefficients and noise row to *cur (float4: c_x, c_eps, sigma, row as int bits). The executor
//   runs it on a side branch, joined before the first kernel that reads t_idx (GpuExecutor.run
//   t_writer): its latency chain (counter, then the tables) overlaps init_conv instead of adding to
//   the step.
// The step itself, x = c_x * x + c_eps * eps + sigma * z (the affine step (S) of
//   runtime/schedule.py, reference schedule.p_sample), is taken by the U-Net's last kernel,
//   final_conv (kernels/io.cu), on the eps values it has just computed.
// advance_step reads the step from device memory, so one captured CUDA graph (advance, U-Net)
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
