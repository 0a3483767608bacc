/* A decode step launched before the host has seen the previous step's tokens, behind a gate the
 * host opens, measured apart from tessera (a probe for "the host between steps" in the CUDA
 * README, not built with the project):
 *
 *   nvcc -arch=sm_90 -O2 -o cuda_gate_probe bench/cuda_gate_probe.cu
 *   ./cuda_gate_probe [kernels=124] [ns_a_kernel=4000] [preset]
 *
 * The step stands in as a chain of kernels (132 blocks, each spinning ns_a_kernel), linked by
 * plain edges and then by programmatic ones as tessera's graphs are. Two ways to run it:
 * - plain: launch the graph, wait for it, launch again (what tessera does, less its host work);
 * - gated: a graph of a one-thread gate kernel and an IF conditional node whose body is the
 *   chain. The gate spins on a counter in mapped host memory and sets the condition: open
 *   (the host wrote the step's number there) or dropped (the host wrote it to the drop counter:
 *   the body must not run). The host launches step k + 1 gated, waits for step k, opens k + 1.
 *   With "preset" the gate finds itself open at once.
 * A watchdog ends the probe (exit 3, "HANG") where nothing moves for 6 s. */
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#include <thread>
#include <unistd.h>

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            printf("CUDA %s at %d\n", cudaGetErrorString(e_), __LINE__);                           \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static std::atomic<int> progress{0};

__device__ static unsigned long long global_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__global__ static void work(float *buf, int i, long ns, int pdl) {
    if (pdl) cudaGridDependencySynchronize();
    unsigned long long t0 = global_ns();
    while (global_ns() - t0 < (unsigned long long)ns) {
    }
    if (threadIdx.x == 0) buf[blockIdx.x] += i;
    if (pdl) cudaTriggerProgrammaticLaunchCompletion();
}

__device__ static unsigned gate_launches;

__global__ static void gate(cudaGraphConditionalHandle h, volatile unsigned *open,
                            volatile unsigned *drop) {
    unsigned me = ++gate_launches;
    for (;;) {
        if ((int)(*open - me) >= 0) {
            cudaGraphSetConditional(h, 1);
            return;
        }
        if ((int)(*drop - me) >= 0) {
            cudaGraphSetConditional(h, 0);
            return;
        }
    }
}

static void add_chain(cudaGraph_t g, float *buf, int n, long ns, int pdl) {
    cudaGraphNode_t prev = nullptr;
    for (int i = 0; i < n; i++) {
        void *args[] = {&buf, &i, &ns, &pdl};
        cudaKernelNodeParams p = {};
        p.func = (void *)work, p.gridDim = dim3(132), p.blockDim = dim3(128), p.kernelParams = args;
        cudaGraphNode_t node;
        if (pdl && prev) {
            CK(cudaGraphAddKernelNode(&node, g, nullptr, 0, &p));
            cudaGraphEdgeData e = {};
            e.from_port = cudaGraphKernelNodePortProgrammatic;
            e.type = cudaGraphDependencyTypeProgrammatic;
            CK(cudaGraphAddDependencies(g, &prev, &node, &e, 1));
        } else {
            CK(cudaGraphAddKernelNode(&node, g, prev ? &prev : nullptr, prev ? 1 : 0, &p));
        }
        prev = node;
    }
}

static double now_us() {
    using namespace std::chrono;
    return duration<double, std::micro>(steady_clock::now().time_since_epoch()).count();
}

static void set_counter(unsigned *at, unsigned v) { __atomic_store_n(at, v, __ATOMIC_SEQ_CST); }

int main(int argc, char **argv) {
    setvbuf(stdout, nullptr, _IONBF, 0);
    int n = argc > 1 ? atoi(argv[1]) : 124;
    long ns = argc > 2 ? atol(argv[2]) : 4000;
    bool preset = argc > 3;
    const int iters = 300;
    std::thread([] {
        for (int last = -1;;) {
            std::this_thread::sleep_for(std::chrono::seconds(6));
            int now = progress.load();
            if (now == last) {
                printf("HANG (nothing moved for 6 s at mark %d)\n", now);
                _exit(3);
            }
            last = now;
        }
    }).detach();
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    float *buf;
    CK(cudaMalloc(&buf, 4096));
    CK(cudaMemset(buf, 0, 4096));
    unsigned *ctr, *dctr; /* [0] open up to, [1] dropped up to */
    CK(cudaHostAlloc((void **)&ctr, 64, cudaHostAllocMapped));
    CK(cudaHostGetDevicePointer((void **)&dctr, ctr, 0));
    ctr[0] = preset ? 1u << 30 : 0, ctr[1] = 0;
    unsigned launched = 0;
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    for (int pdl = 0; pdl < 2; pdl++) {
        cudaGraph_t g;
        cudaGraphExec_t ex;
        CK(cudaGraphCreate(&g, 0));
        add_chain(g, buf, n, ns, pdl);
        CK(cudaGraphInstantiate(&ex, g, 0));
        for (int w = 0; w < 20; w++) {
            CK(cudaGraphLaunch(ex, s));
            CK(cudaStreamSynchronize(s));
        }
        double t0 = now_us(), call = 0;
        for (int it = 0; it < iters; it++) {
            double c0 = now_us();
            CK(cudaGraphLaunch(ex, s));
            call += now_us() - c0;
            CK(cudaStreamSynchronize(s));
        }
        double plain = (now_us() - t0) / iters;
        float ms;
        CK(cudaEventRecord(a, s));
        CK(cudaGraphLaunch(ex, s));
        CK(cudaEventRecord(b, s));
        CK(cudaEventSynchronize(b));
        CK(cudaEventElapsedTime(&ms, a, b));
        printf("%s edges: a replay %.1f us (launch call %.1f us), plain loop %.1f us a step\n",
               pdl ? "programmatic" : "plain", ms * 1e3, call / iters, plain);
        progress++;

        cudaGraph_t gg;
        CK(cudaGraphCreate(&gg, 0));
        cudaGraphConditionalHandle h;
        CK(cudaGraphConditionalHandleCreate(&h, gg, 0, cudaGraphCondAssignDefault));
        unsigned *open = dctr, *drop = dctr + 1;
        void *gargs[] = {&h, &open, &drop};
        cudaKernelNodeParams p = {};
        p.func = (void *)gate, p.gridDim = dim3(1), p.blockDim = dim3(1), p.kernelParams = gargs;
        cudaGraphNode_t gn, cn;
        CK(cudaGraphAddKernelNode(&gn, gg, nullptr, 0, &p));
        cudaGraphNodeParams cp = {};
        cp.type = cudaGraphNodeTypeConditional;
        cp.conditional.handle = h, cp.conditional.type = cudaGraphCondTypeIf;
        cp.conditional.size = 1;
        CK(cudaGraphAddNode(&cn, gg, &gn, nullptr, 1, &cp));
        add_chain(cp.conditional.phGraph_out[0], buf, n, ns, pdl);
        cudaGraphExec_t gex;
        cudaError_t ie = cudaGraphInstantiate(&gex, gg, 0);
        if (ie != cudaSuccess) {
            printf("  gated: instantiate: %s\n", cudaGetErrorString(ie));
            continue;
        }
        CK(cudaEventRecord(a, s));
        CK(cudaGraphLaunch(gex, s));
        CK(cudaEventRecord(b, s));
        if (!preset)
            set_counter(&ctr[0], ++launched);
        else
            launched++;
        progress++;
        CK(cudaEventSynchronize(b));
        CK(cudaEventElapsedTime(&ms, a, b));
        printf("  gated: the first replay %.1f us\n", ms * 1e3);
        if (preset) continue;
        /* steady state: step k gated and open; launch k + 1 gated, wait for k, open k + 1 */
        cudaEvent_t done[2];
        CK(cudaEventCreateWithFlags(&done[0], cudaEventDisableTiming));
        CK(cudaEventCreateWithFlags(&done[1], cudaEventDisableTiming));
        CK(cudaGraphLaunch(gex, s));
        CK(cudaEventRecord(done[++launched & 1], s));
        set_counter(&ctr[0], launched);
        double t1 = 0;
        for (int it = 0; it < iters + 20; it++) {
            if (it == 20) t1 = now_us();
            CK(cudaGraphLaunch(gex, s));
            CK(cudaEventRecord(done[++launched & 1], s));
            CK(cudaEventSynchronize(done[(launched - 1) & 1]));
            set_counter(&ctr[0], launched);
            progress++;
        }
        CK(cudaEventSynchronize(done[launched & 1]));
        double gated = (now_us() - t1) / iters;
        /* a dropped step: its body must not run */
        float before, after;
        CK(cudaMemcpy(&before, buf, 4, cudaMemcpyDeviceToHost));
        CK(cudaGraphLaunch(gex, s));
        set_counter(&ctr[1], ++launched);
        CK(cudaStreamSynchronize(s));
        CK(cudaMemcpy(&after, buf, 4, cudaMemcpyDeviceToHost));
        printf("  gated loop %.1f us a step; a dropped step's body ran: %s\n", gated,
               before != after ? "YES" : "no");
        progress++;
    }
    return 0;
}
