/* Device memory read bandwidth, for the decode roofline of `tessera bench --device cuda`: a grid
 * that streams a buffer much larger than L2 with 16-byte loads (the way the GEMV kernels read
 * weights), timed with events; the best of several passes. */
#include "backend/cuda/cuda_int.cuh"

__global__ static void k_read(const uint4 *p, size_t n, unsigned *sink) {
    uint32_t acc = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint4 v = p[i];
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9e3779b9u) *sink = acc; /* keeps the loads */
}

extern "C" double ts_backend_cuda_read_bandwidth(int device) {
    if (cudaSetDevice(device) != cudaSuccess) return 0.0;
    size_t bytes = (size_t)2 << 30;
    void *buf = NULL;
    unsigned *sink = NULL;
    if (cudaMalloc(&buf, bytes) != cudaSuccess || cudaMalloc(&sink, sizeof *sink) != cudaSuccess ||
        cudaMemset(buf, 1, bytes) != cudaSuccess) {
        cudaGetLastError();
        cudaFree(buf);
        cudaFree(sink);
        return 0.0;
    }
    int sms = 1;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    double best = 0.0;
    for (int r = 0; r < 6; r++) {
        cudaEventRecord(a);
        k_read<<<sms * 8, 256>>>((const uint4 *)buf, bytes / 16, sink);
        cudaEventRecord(b);
        cudaEventSynchronize(b);
        float ms = 0;
        if (cudaEventElapsedTime(&ms, a, b) == cudaSuccess && ms > 0) {
            double gbs = bytes / (ms * 1e-3) / 1e9;
            if (gbs > best) best = gbs;
        }
    }
    cudaGetLastError();
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    cudaFree(buf);
    cudaFree(sink);
    return best;
}
