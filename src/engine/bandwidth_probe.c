/* ts_measure_read_bandwidth: the public face of the CPU backend's bandwidth probe. */
#include "backend/cpu/bandwidth.h"
#include "backend/cuda/cuda_backend.h"
#include "base/cpu.h"
#include "base/threadpool.h"

double ts_measure_read_bandwidth(int n_threads) {
    if (n_threads <= 0) n_threads = ts_cpu_count();
    ts_pool *pool;
    if (ts_pool_create(n_threads, &pool) != TS_OK) return 0.0;
    double gbs = cpu_measure_read_bandwidth(pool, (size_t)1 << 30, 5);
    ts_pool_free(pool);
    return gbs;
}

double ts_measure_device_bandwidth(int device) { return ts_backend_cuda_read_bandwidth(device); }
