/* The launch queue and its graph cache (see cuda_queue.cuh for why). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <atomic>
#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "backend/cuda/cuda_int.cuh"

/* Graphs kept: a decode step per batch shape in use, and the odd one beside. */
#define CQ_GRAPHS 8
/* Submissions whose shapes a new one is compared with: one whose shape is among them repeats,
 * and becomes a graph. More than the last one: a step with log-probabilities is three
 * submissions of three shapes (the forward with its draw, the log-probability pass, the drawn
 * token's logit), none the same as the one before it, so with only the last one compared it
 * never became a graph and ran its ~130 kernels one by one (bench/RESULTS.md). */
#define CQ_RECENT 4
/* Pinned staging for host-to-device copies of one submission: token rows and positions. */
#define CQ_STAGE_BYTES ((size_t)16 << 20)
/* Device memory for the tables of one submission (run descriptors: 32 bytes each). */
#define CQ_TABLE_BYTES ((size_t)1 << 20)

struct cq_graph {
    uint64_t sig = 0;
    uint64_t last_use = 0;
    std::vector<cq_op> ops; /* as last launched: arguments are compared against these */
    std::vector<cudaGraphNode_t> nodes;
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    /* A copy or memset node holds on to the allocation its pointer was in when it was set:
     * launched after that buffer was freed - even with a new buffer at the same address -
     * it crashed the driver inside cudaGraphLaunch (H200, driver 580). So a graph with such
     * nodes is built again when any device buffer was freed since it was built (frees: the
     * context's count then). The steady decode step frees nothing. */
    int n_copies = 0; /* its copy and memset nodes, the tables' copy included */
    unsigned long frees = 0;
    size_t table_bytes = 0; /* the submission's tables, copied at the graph's start */
};

struct cq_prof {
    double ms = 0;
    long n = 0;
};

struct cq_state {
    bool graphs;
    /* TESSERA_CUDA_PROFILE=1: ops run one by one between events; time per op name, printed
     * when the backend is destroyed (the gaps between kernels are counted with the kernel) */
    bool profile, profile_graphs; /* =graph: time each graph replay instead, and the host */
    /* =graph: the host's side of each submission - queueing the ops (the time since the last
     * flush returned: the model code and whatever the caller did between steps), updating the
     * cached graph, the launch call, the wait - and which nodes' arguments changed */
    std::map<std::string, cq_prof> host;
    double last_flush_end = 0;
    /* =steps: the graph replays timed as they run, nothing synchronized that would not be: an
     * event before each launch call and one after, read just after the next launch call (the
     * device busy with that replay) - the replay (launch call included) and the device's idle
     * time between its end and the next one's first event (the host's wake-up and its work
     * between two steps) */
    bool profile_steps;
    cudaEvent_t step_ev[2][2] = {};
    int step_prev = -1;   /* the pair of the replay launched last, not yet read */
    double step_woke = 0; /* when the last wait returned */
    /* TESSERA_CUDA_PROFILE_DROP=name: kernels of that name are not launched at all - the
     * results are wrong, the step's time without them is what a measurement wants: a kind of
     * kernel's share of a replayed step, launch gaps and overlap included */
    const char *drop = nullptr;
    /* programmatic edges between a graph's kernels (compute capability 9.0 and up;
     * TESSERA_CUDA_PDL=0 turns them off, for comparison) */
    bool pdl;
    long n_profiled = 0;
    std::map<std::string, cq_prof> prof;
    std::vector<cudaEvent_t> events;
    std::vector<cq_op> ops;
    uint64_t recent_sig[CQ_RECENT] = {0}, clock = 0; /* the last submissions' shapes */
    unsigned recent_next = 0;
    cq_graph cache[CQ_GRAPHS];
    unsigned char *stage = nullptr;
    size_t stage_used = 0;
    unsigned char *table = nullptr; /* device */
    size_t table_used = 0;
    /* Pinned mirror of the tables: while the ops queue (graphs on), cuda_table writes here
     * and the flush copies [0, table_pending) up in one copy ahead of the submission's ops - a
     * decode step of 8 sequences of the 0.8B has 42 tables, 42 copies before. */
    unsigned char *table_host = nullptr;
    bool table_host_tried = false;
    size_t table_pending = 0;
    cudaStream_t cap_stream = nullptr;
    long n_replays = 0, n_builds = 0, n_updates = 0; /* n_updates: nodes updated */
    int last_copies = -1;          /* the copy and memset nodes of the graph replayed last */
    std::vector<uint32_t> changed; /* graph_matches' result, kept to reuse its memory */
    unsigned long epoch = 0; /* flushes so far */
    /* TESSERA_CUDA_HOIST=0: fresh uploads stay in the chain (for comparison) */
    bool hoist = true;
    /* shapes a graph could not be made of (not tried again), and whether that was said */
    uint64_t no_graph[8] = {0};
    int no_graph_next = 0;
    bool warned_build = false;
    /* Decoding ahead (cq_launch in cuda_queue.cuh). in_flight: a submission launched and not
     * waited for. hold: queued ops wait for the next cq_launch, their host bytes written to
     * the shadow arenas and copied into the real ones just before that launch - the graph's
     * copies keep reading the same addresses, so a held step replays with no node updated.
     * broken: a flush came while ops were held; they (and any queued after) were dropped. */
    bool in_flight = false, hold = false, broken = false;
    unsigned char *stage_shadow = nullptr, *table_shadow = nullptr;
    /* cq_seal's graph for the held ops (nullptr: they run op by op) and their shape */
    bool sealed = false;
    cq_graph *sealed_hit = nullptr;
    uint64_t sealed_sig = 0;
    /* host work for after the queued submission and for after the launched one */
    std::vector<cq_defer> defer_queued, defer_launched;
    /* cq_wait_keys: the keys the queued submission and the launched one write into the
     * staging arena, where those are all their results for the host (else empty) */
    struct keys_at {
        const unsigned long long *at;
        int n;
    };
    std::vector<keys_at> keys_queued, keys_launched;
    /* TESSERA_CUDA_EARLY_WAIT=0, or profiling (=1, =graph): cq_wait_keys does nothing */
    bool early_wait;
    long n_early_waits = 0; /* waits that returned on the keys (tests) */
};

static void steps_last(cq_state *q);

static double now_ms() {
    using namespace std::chrono;
    return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

static void host_add(cq_state *q, const char *what, double ms, long n = 1) {
    cq_prof &p = q->host[what];
    p.ms += ms;
    p.n += n;
}

static cq_state *state_of(cuda_ctx *c) {
    if (c->q) return c->q;
    cq_state *q = new (std::nothrow) cq_state;
    if (!q) return nullptr;
    q->graphs = !cuda_env_off("TESSERA_CUDA_GRAPHS");
    const char *pe = getenv("TESSERA_CUDA_PROFILE");
    q->profile = pe && strcmp(pe, "1") == 0;
    q->profile_graphs = pe && strcmp(pe, "graph") == 0;
    q->profile_steps = pe && strcmp(pe, "steps") == 0;
    if (q->profile) q->graphs = false;
    int major = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, c->device);
    q->pdl = major >= 9 && !cuda_env_off("TESSERA_CUDA_PDL");
    q->hoist = !cuda_env_off("TESSERA_CUDA_HOIST");
    q->early_wait = !cuda_env_off("TESSERA_CUDA_EARLY_WAIT") && !q->profile && !q->profile_graphs;
    q->drop = getenv("TESSERA_CUDA_PROFILE_DROP");
    if (cudaMallocHost((void **)&q->stage, CQ_STAGE_BYTES) != cudaSuccess) {
        cudaGetLastError();
        q->stage = nullptr; /* uploads then go synchronously */
    }
    if (cudaStreamCreateWithFlags(&q->cap_stream, cudaStreamNonBlocking) != cudaSuccess) {
        cudaGetLastError();
        q->cap_stream = nullptr;
        q->graphs = false;
    }
    c->q = q;
    return q;
}

static void graph_drop(cq_graph *g) {
    if (g->exec) cudaGraphExecDestroy(g->exec);
    if (g->graph) cudaGraphDestroy(g->graph);
    g->exec = nullptr;
    g->graph = nullptr;
    g->ops.clear();
    g->nodes.clear();
    g->sig = 0;
}

void cq_free(cuda_ctx *c) {
    cq_state *q = c->q;
    if (!q) return;
    if (q->profile_steps) steps_last(q);
    if (q->profile || q->profile_graphs || q->profile_steps) {
        double total = 0;
        for (auto &kv : q->prof) total += kv.second.ms;
        fprintf(stderr, "tessera: cuda profile (%.1f ms in all):\n", total);
        for (auto &kv : q->prof)
            fprintf(stderr, "  %-24s %8ld ops %10.3f ms %6.1f%% %8.2f us/op\n", kv.first.c_str(),
                    kv.second.n, kv.second.ms, 100 * kv.second.ms / (total > 0 ? total : 1),
                    1e3 * kv.second.ms / (double)kv.second.n);
        if (!q->host.empty()) fprintf(stderr, "tessera: cuda host side of the graph replays:\n");
        for (auto &kv : q->host)
            fprintf(stderr, "  %-32s %8ld %10.3f ms %8.2f us each\n", kv.first.c_str(),
                    kv.second.n, kv.second.ms, 1e3 * kv.second.ms / (double)kv.second.n);
    }
    for (cudaEvent_t e : q->events) cudaEventDestroy(e);
    for (auto &pair : q->step_ev)
        for (cudaEvent_t e : pair)
            if (e) cudaEventDestroy(e);
    for (auto &g : q->cache) graph_drop(&g);
    if (q->stage) cudaFreeHost(q->stage);
    if (q->stage_shadow) cudaFreeHost(q->stage_shadow);
    if (q->table) cudaFree(q->table);
    if (q->table_host) cudaFreeHost(q->table_host);
    if (q->table_shadow) cudaFreeHost(q->table_shadow);
    if (q->cap_stream) cudaStreamDestroy(q->cap_stream);
    delete q;
    c->q = nullptr;
}

static void kernel_params(const cq_op *op, void **params) {
    for (int i = 0; i < op->nargs; i++) params[i] = (void *)(op->args + op->off[i]);
}

/* A graph node's parameters for a queued kernel (params: CQ_MAX_ARGS slots the node points
 * into, alive until the node is added or updated) and for a queued memset. */
static cudaKernelNodeParams kernel_node(const cq_op *op, void **params) {
    kernel_params(op, params);
    cudaKernelNodeParams p = {};
    p.func = (void *)op->func;
    p.gridDim = op->grid;
    p.blockDim = op->block;
    p.sharedMemBytes = op->smem;
    p.kernelParams = params;
    return p;
}

static cudaMemsetParams memset_node(const cq_op *op) {
    cudaMemsetParams p = {};
    p.dst = op->dst;
    p.value = 0;
    p.elementSize = 1;
    p.width = op->bytes;
    p.height = 1;
    return p;
}

static void run_op(cuda_ctx *c, const cq_op *op, cudaStream_t s) {
    switch (op->kind) {
    case CQ_KERNEL: {
        void *params[CQ_MAX_ARGS];
        kernel_params(op, params);
        cuda_check(c, cudaLaunchKernel(op->func, op->grid, op->block, params, op->smem, s),
                   op->what);
        break;
    }
    case CQ_COPY:
        cuda_check(c, cudaMemcpyAsync(op->dst, op->src, op->bytes, op->dir, s), op->what);
        break;
    case CQ_MEMSET:
        cuda_check(c, cudaMemsetAsync(op->dst, 0, op->bytes, s), op->what);
        break;
    case CQ_CALL:
        op->call(c, s, op->args);
        break;
    }
}

void cq_submit(cuda_ctx *c, const cq_op *op) {
    c->ops_submitted++;
    cq_state *q = state_of(c);
    if (!q) {
        cuda_check(c, cudaErrorMemoryAllocation, "launch queue");
        return;
    }
    if (c->failed) return; /* after a failure nothing more runs: download reports it */
    if (q->broken) return; /* a held step that a flush broke: it is dropped whole */
    q->sealed = false;
    if (q->drop && op->kind == CQ_KERNEL && op->what && strcmp(op->what, q->drop) == 0) return;
    if (q->profile) {
        /* the op runs at once between two events; flush reads them */
        if (q->events.empty()) {
            cudaEvent_t e0;
            if (cudaEventCreate(&e0) != cudaSuccess) return;
            cudaEventRecord(e0, c->stream);
            q->events.push_back(e0);
        }
        run_op(c, op, c->stream);
        cudaEvent_t e;
        if (cudaEventCreate(&e) != cudaSuccess) return;
        cudaEventRecord(e, c->stream);
        q->events.push_back(e);
        q->ops.push_back(*op); /* only for its name */
        return;
    }
    if (!q->graphs) {
        run_op(c, op, c->stream);
        return;
    }
    q->ops.push_back(*op);
}

/* The shape of a submission: what must be equal for a graph to be replayed with updated
 * arguments. Kernels: function and launch geometry; copies and memsets: direction and size;
 * calls: everything. */
static bool same_shape(const cq_op *a, const cq_op *b) {
    if (a->kind != b->kind) return false;
    switch (a->kind) {
    case CQ_KERNEL:
        return a->func == b->func && a->grid.x == b->grid.x && a->grid.y == b->grid.y &&
               a->grid.z == b->grid.z && a->block.x == b->block.x && a->block.y == b->block.y &&
               a->block.z == b->block.z && a->smem == b->smem && a->nargs == b->nargs;
    case CQ_COPY:
        return a->dir == b->dir && a->bytes == b->bytes && a->hoist == b->hoist;
    case CQ_MEMSET:
        return a->bytes == b->bytes;
    case CQ_CALL:
        return a->call == b->call && a->args_len == b->args_len &&
               memcmp(a->args, b->args, a->args_len) == 0;
    }
    return false;
}

static uint64_t mix(uint64_t h, uint64_t v) { return (h ^ v) * 0x100000001b3ull; }

static uint64_t shape_sig(const std::vector<cq_op> &ops) {
    uint64_t h = 0xcbf29ce484222325ull ^ ops.size();
    for (const cq_op &o : ops) {
        h = mix(h, (uint64_t)o.kind);
        switch (o.kind) {
        case CQ_KERNEL:
            h = mix(h, (uint64_t)(uintptr_t)o.func);
            h = mix(h, ((uint64_t)o.grid.x << 32) ^ ((uint64_t)o.grid.y << 16) ^ o.grid.z);
            h = mix(h, ((uint64_t)o.block.x << 32) ^ ((uint64_t)o.block.y << 16) ^ o.smem);
            break;
        case CQ_COPY:
        case CQ_MEMSET:
            h = mix(h, (uint64_t)o.bytes ^ ((uint64_t)o.dir << 56) ^ ((uint64_t)o.hoist << 60));
            break;
        case CQ_CALL:
            h = mix(h, (uint64_t)(uintptr_t)o.call);
            for (size_t i = 0; i < o.args_len; i++) h = mix(h, o.args[i]);
            break;
        }
    }
    return h ? h : 1;
}

/* Whether a cached op's node needs this submission's arguments (the op being of its shape). */
static bool args_differ(const cq_op *old, const cq_op *o) {
    switch (o->kind) {
    case CQ_KERNEL:
        return o->args_len != old->args_len || memcmp(o->args, old->args, o->args_len) != 0;
    case CQ_COPY:
        return o->dst != old->dst || o->src != old->src;
    case CQ_MEMSET:
        return o->dst != old->dst;
    case CQ_CALL:
        return false; /* equal by shape */
    }
    return true;
}

/* Whether the cached graph g has this submission's shape; if so, changed holds the ops whose
 * nodes need new arguments (one pass over the ops: a decode step has hundreds, and this runs
 * on the host while the GPU waits). */
static bool graph_matches(const cq_graph *g, uint64_t sig, const std::vector<cq_op> &ops,
                          size_t table_bytes, std::vector<uint32_t> *changed) {
    if (!g->exec || g->sig != sig || g->ops.size() != ops.size() || g->table_bytes != table_bytes)
        return false;
    changed->clear();
    for (size_t i = 0; i < ops.size(); i++) {
        if (!same_shape(&g->ops[i], &ops[i])) return false;
        if (args_differ(&g->ops[i], &ops[i])) changed->push_back((uint32_t)i);
    }
    return true;
}

/* Brings a cached graph's changed nodes to this submission's arguments. */
static bool graph_update(cuda_ctx *c, cq_state *q, cq_graph *g, const std::vector<cq_op> &ops,
                         const std::vector<uint32_t> &changed) {
    for (uint32_t i : changed) {
        const cq_op *o = &ops[i];
        double t0 = q->profile_graphs ? now_ms() : 0;
        cudaError_t err = cudaSuccess;
        switch (o->kind) {
        case CQ_KERNEL: {
            void *params[CQ_MAX_ARGS];
            cudaKernelNodeParams p = kernel_node(o, params);
            err = cudaGraphExecKernelNodeSetParams(g->exec, g->nodes[i], &p);
            break;
        }
        case CQ_COPY:
            err = cudaGraphExecMemcpyNodeSetParams1D(g->exec, g->nodes[i], o->dst, o->src,
                                                     o->bytes, o->dir);
            break;
        case CQ_MEMSET: {
            cudaMemsetParams p = memset_node(o);
            err = cudaGraphExecMemsetNodeSetParams(g->exec, g->nodes[i], &p);
            break;
        }
        case CQ_CALL:
            break;
        }
        q->n_updates++;
        if (q->profile_graphs) {
            std::string name = std::string("update: ") + (o->what ? o->what : "?");
            host_add(q, name.c_str(), now_ms() - t0);
        }
        if (!cuda_check(c, err, "graph update")) return false;
        g->ops[i] = *o;
    }
    return true;
}

/* Whether op i can run at the start of its graph: a fresh upload (cq_op.hoist) whose
 * destination no other copy or memset of the submission touches. Between two kernels a copy
 * node costs the chain a few microseconds (the copy engine's round trip, and the programmatic
 * launch of the kernel after it is lost); a decode step of several sequences uploads a run
 * table for each sequence-mixing layer. */
static bool hoistable(const cq_state *q, const std::vector<cq_op> &ops, size_t i) {
    const cq_op *o = &ops[i];
    if (!q->hoist || o->kind != CQ_COPY || !o->hoist || o->dir != cudaMemcpyHostToDevice)
        return false;
    uintptr_t b = (uintptr_t)o->dst, e = b + o->bytes;
    for (size_t j = 0; j < ops.size(); j++) {
        const cq_op *p = &ops[j];
        if (j == i || (p->kind != CQ_COPY && p->kind != CQ_MEMSET)) continue;
        uintptr_t pb = (uintptr_t)p->dst, pe = pb + p->bytes;
        if (pb < e && b < pe) return false;
        if (p->kind == CQ_COPY && (uintptr_t)p->src < e && b < (uintptr_t)p->src + p->bytes)
            return false;
    }
    return true;
}

/* A copy with no dependencies (a root of the graph) into *node, appended to roots. */
static bool add_root_copy(cq_graph *g, cudaGraphNode_t *node, void *dst, const void *src,
                          size_t bytes, cudaMemcpyKind dir, std::vector<cudaGraphNode_t> *roots) {
    if (cudaGraphAddMemcpyNode1D(node, g->graph, nullptr, 0, dst, src, bytes, dir) !=
        cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    roots->push_back(*node);
    return true;
}

/* Builds a graph of the submission: the hoistable uploads as its roots, then a chain of the
 * other nodes in queue order whose first node depends on those roots. */
static bool graph_build(cuda_ctx *c, cq_state *q, cq_graph *g, uint64_t sig,
                        const std::vector<cq_op> &ops) {
    graph_drop(g);
    if (!cuda_check(c, cudaGraphCreate(&g->graph, 0), "graph create")) return false;
    g->nodes.assign(ops.size(), nullptr);
    std::vector<bool> root(ops.size());
    /* the nodes the next one depends on: the previous op's node, or the last nodes of a
     * captured call; at first the roots: the tables (one copy, see cq_state), the hoistable
     * uploads */
    std::vector<cudaGraphNode_t> tails;
    cudaGraphNode_t tn;
    bool ok = !q->table_pending || add_root_copy(g, &tn, q->table, q->table_host,
                                                 q->table_pending, cudaMemcpyHostToDevice, &tails);
    for (size_t i = 0; ok && i < ops.size(); i++)
        if ((root[i] = hoistable(q, ops, i)))
            ok = add_root_copy(g, &g->nodes[i], ops[i].dst, ops[i].src, ops[i].bytes, ops[i].dir,
                               &tails);
    if (!ok) {
        graph_drop(g);
        return false;
    }
    const cq_op *prev = nullptr; /* the last op of the chain */
    for (size_t i = 0; i < ops.size(); i++) {
        if (root[i]) continue;
        const cq_op *o = &ops[i];
        cudaGraphNode_t *node = &g->nodes[i];
        /* kernel after kernel: a programmatic edge (see cuda_pdl_entry), added below */
        bool pdl = q->pdl && prev && o->kind == CQ_KERNEL && prev->kind == CQ_KERNEL &&
                   tails.size() == 1;
        prev = o;
        const cudaGraphNode_t *dep = pdl ? nullptr : tails.data();
        size_t nd = pdl ? 0 : tails.size();
        cudaError_t err = cudaSuccess;
        const char *stage = "";
        switch (o->kind) {
        case CQ_KERNEL: {
            void *params[CQ_MAX_ARGS];
            cudaKernelNodeParams p = kernel_node(o, params);
            err = cudaGraphAddKernelNode(node, g->graph, dep, nd, &p);
            if (err == cudaSuccess && pdl) {
                cudaGraphEdgeData e = {};
                e.from_port = cudaGraphKernelNodePortProgrammatic;
                e.type = cudaGraphDependencyTypeProgrammatic;
                err = cudaGraphAddDependencies(g->graph, &tails[0], node, &e, 1);
                stage = "programmatic edge";
            }
            break;
        }
        case CQ_COPY:
            err = cudaGraphAddMemcpyNode1D(node, g->graph, dep, nd, o->dst, o->src, o->bytes,
                                           o->dir);
            break;
        case CQ_MEMSET: {
            cudaMemsetParams p = memset_node(o);
            err = cudaGraphAddMemsetNode(node, g->graph, dep, nd, &p);
            break;
        }
        case CQ_CALL: {
            /* captured straight into this graph after the current tails (a child graph may
             * not hold what cuBLAS records on Hopper, such as programmatic launches) */
            stage = "capture";
            err = cudaStreamBeginCaptureToGraph(q->cap_stream, g->graph, dep, nullptr, nd,
                                                cudaStreamCaptureModeThreadLocal);
            if (err != cudaSuccess) break;
            o->call(c, q->cap_stream, o->args);
            cudaStreamCaptureStatus cs;
            const cudaGraphNode_t *last = nullptr;
            size_t nlast = 0;
            err = cudaStreamGetCaptureInfo(q->cap_stream, &cs, nullptr, nullptr, &last, nullptr,
                                           &nlast);
            std::vector<cudaGraphNode_t> after(last, last + (err == cudaSuccess ? nlast : 0));
            cudaGraph_t same = nullptr;
            cudaError_t end = cudaStreamEndCapture(q->cap_stream, &same);
            if (err == cudaSuccess) err = end;
            if (err == cudaSuccess && !after.empty()) tails = after;
            break;
        }
        }
        if (err != cudaSuccess) { /* not fatal: the caller runs the ops one by one */
            cudaGetLastError();
            if (!q->warned_build)
                fprintf(stderr, "tessera: cuda: no graph for a step (%s at op %zu, %s%s%s): "
                                "running its ops one by one\n",
                        cudaGetErrorString(err), i, o->what ? o->what : "?", *stage ? ", " : "",
                        stage);
            q->warned_build = true;
            graph_drop(g);
            return false;
        }
        if (o->kind != CQ_CALL) tails.assign(1, *node);
    }
    cudaError_t ierr = cudaGraphInstantiate(&g->exec, g->graph, 0);
    if (ierr != cudaSuccess) {
        cudaGetLastError();
        if (!q->warned_build)
            fprintf(stderr, "tessera: cuda: no graph for a step (instantiate: %s): running its "
                            "ops one by one\n",
                    cudaGetErrorString(ierr));
        q->warned_build = true;
        graph_drop(g);
        return false;
    }
    g->ops = ops;
    g->sig = sig;
    g->frees = c->frees;
    g->table_bytes = q->table_pending;
    g->n_copies = q->table_pending > 0;
    for (const cq_op &o : ops)
        g->n_copies += o.kind == CQ_COPY || o.kind == CQ_MEMSET;
    q->n_builds++;
    return true;
}

static cq_graph *graph_slot(cq_state *q) {
    cq_graph *best = &q->cache[0];
    for (auto &g : q->cache) {
        if (!g.exec) return &g;
        if (g.last_use < best->last_use) best = &g;
    }
    return best;
}

static void profile_collect(cuda_ctx *c, cq_state *q) {
    cuda_check(c, cudaStreamSynchronize(c->stream), "sync");
    /* the first submissions upload the weights inside their first ops: not counted */
    bool count = ++q->n_profiled > 8;
    for (size_t i = 0; count && i + 1 < q->events.size() && i < q->ops.size(); i++) {
        float ms = 0;
        cudaEventElapsedTime(&ms, q->events[i], q->events[i + 1]);
        cq_prof &p = q->prof[q->ops[i].what ? q->ops[i].what : "?"];
        p.ms += ms;
        p.n++;
    }
    for (cudaEvent_t e : q->events) cudaEventDestroy(e);
    q->events.clear();
    q->ops.clear();
}

/* The graph the queued ops run as: a cached one brought to their arguments, one built now (a
 * shape seen in one of the last CQ_RECENT submissions), or nullptr (op by op). */
static cq_graph *prepare(cuda_ctx *c, cq_state *q, uint64_t sig) {
    cq_graph *hit = nullptr;
    for (auto &g : q->cache)
        if (graph_matches(&g, sig, q->ops, q->table_pending, &q->changed)) {
            hit = &g;
            break;
        }
    if (hit && hit->n_copies > 0 && hit->frees != c->frees) { /* see cq_graph */
        graph_drop(hit);
        hit = nullptr;
    }
    /* a shape seen in one of the last few submissions is a step that repeats: worth a graph */
    bool graphable = true, recent = false;
    for (uint64_t s : q->no_graph)
        graphable = graphable && s != sig;
    for (uint64_t s : q->recent_sig)
        recent = recent || s == sig;
    if (!hit && recent && graphable) {
        cq_graph *g = graph_slot(q);
        if (graph_build(c, q, g, sig, q->ops)) {
            hit = g;
        } else {
            q->no_graph[q->no_graph_next++ % 8] = sig;
        }
    } else if (hit && !graph_update(c, q, hit, q->ops, q->changed)) {
        /* run plainly, then rebuild */
        graph_drop(hit);
        hit = nullptr;
        c->failed = false;
        cudaGetLastError();
    }
    return hit;
}

static void steps_add(cq_state *q, const char *what, cudaEvent_t from, cudaEvent_t to) {
    float ms = 0;
    if (cudaEventSynchronize(to) == cudaSuccess &&
        cudaEventElapsedTime(&ms, from, to) == cudaSuccess) {
        q->prof[what].ms += ms;
        q->prof[what].n++;
    }
    cudaGetLastError();
}

/* =steps: the replay launched last, where none follows it */
static void steps_last(cq_state *q) {
    if (q->step_prev >= 0)
        steps_add(q, "graph replay, launch call included", q->step_ev[q->step_prev][0],
                  q->step_ev[q->step_prev][1]);
    q->step_prev = -1;
}

/* =steps: launches a replay between its pair of events, then reads the one before it (ended by
 * now) and the device's idle time in between; false where no events could be had */
static bool steps_launch(cuda_ctx *c, cq_state *q, cq_graph *hit) {
    int k = q->step_prev == 0 ? 1 : 0, j = q->step_prev;
    for (cudaEvent_t &e : q->step_ev[k])
        if (!e && cudaEventCreate(&e) != cudaSuccess) {
            cudaGetLastError();
            e = nullptr;
            return false;
        }
    if (j >= 0) host_add(q, "from the wait's return to the launch", now_ms() - q->step_woke);
    cudaEventRecord(q->step_ev[k][0], c->stream);
    double t_launch = now_ms();
    cuda_check(c, cudaGraphLaunch(hit->exec, c->stream), "graph launch");
    host_add(q, "launch call", now_ms() - t_launch);
    cudaEventRecord(q->step_ev[k][1], c->stream);
    if (j >= 0) {
        steps_add(q, "graph replay, launch call included", q->step_ev[j][0], q->step_ev[j][1]);
        steps_add(q, "device idle before a replay", q->step_ev[j][1], q->step_ev[k][0]);
    }
    q->step_prev = k;
    return true;
}

/* Whether ops copy anything to the host (a result cq_wait_keys cannot see arrive) */
static bool downloads(const std::vector<cq_op> &ops) {
    for (const cq_op &o : ops)
        if (o.kind == CQ_COPY && o.dir != cudaMemcpyHostToDevice &&
            o.dir != cudaMemcpyDeviceToDevice)
            return true;
    return false;
}

/* cq_wait_keys' wait: true once every key the launched submission writes has come (none is 0,
 * cuda_argmax_key), false where the stream ended (or failed) first - a row of NaNs leaves its
 * key 0 - and the caller then synchronizes as usual. Polling the stream only every 64 rounds
 * keeps the driver's lock out of the loop. */
static bool keys_came(cuda_ctx *c, cq_state *q) {
    for (unsigned spin = 1;; spin++) {
        bool all = true;
        for (const cq_state::keys_at &k : q->keys_launched)
            for (int i = 0; all && i < k.n; i++)
                all = ((const volatile unsigned long long *)k.at)[i] != 0;
        if (all) {
            std::atomic_thread_fence(std::memory_order_acquire);
            return true;
        }
        if (spin % 64 == 0 && cudaStreamQuery(c->stream) != cudaErrorNotReady) return false;
    }
}

/* Launches the queued ops: graph hit, or one by one. t_start: when the host began on them
 * (=graph profiling). */
static void launch_ops(cuda_ctx *c, cq_state *q, cq_graph *hit, double t_start) {
    if (!hit) {
        if (q->profile_steps) steps_last(q); /* the idle time is counted between replays only */
        if (q->table_pending)
            cuda_check(c,
                       cudaMemcpyAsync(q->table, q->table_host, q->table_pending,
                                       cudaMemcpyHostToDevice, c->stream),
                       "tables");
        for (const cq_op &o : q->ops)
            run_op(c, &o, c->stream);
        return;
    }
    hit->last_use = ++q->clock;
    q->n_replays++;
    q->last_copies = hit->n_copies;
    cudaEvent_t e[2];
    bool timed = q->profile_graphs && cudaEventCreate(&e[0]) == cudaSuccess &&
                 cudaEventCreate(&e[1]) == cudaSuccess;
    if (!timed) {
        if (!q->profile_steps || !steps_launch(c, q, hit))
            cuda_check(c, cudaGraphLaunch(hit->exec, c->stream), "graph launch");
        return;
    }
    double t_launch = now_ms();
    if (q->last_flush_end > 0)
        host_add(q, "queue ops (since last flush)", t_start - q->last_flush_end);
    host_add(q, "match and update", t_launch - t_start);
    cudaEventRecord(e[0], c->stream);
    cuda_check(c, cudaGraphLaunch(hit->exec, c->stream), "graph launch");
    host_add(q, "launch call", now_ms() - t_launch);
    cudaEventRecord(e[1], c->stream);
    cudaEventSynchronize(e[1]);
    float ms = 0;
    cudaEventElapsedTime(&ms, e[0], e[1]);
    char name[48];
    snprintf(name, sizeof name, "graph of %zu ops", q->ops.size());
    cq_prof &p = q->prof[name];
    p.ms += ms;
    p.n++;
    cudaEventDestroy(e[0]);
    cudaEventDestroy(e[1]);
}

/* The shadow arenas that held ops write their host bytes to (false: none could be had). */
static bool shadows(cq_state *q) {
    if (!q->stage_shadow && q->stage &&
        cudaMallocHost((void **)&q->stage_shadow, CQ_STAGE_BYTES) != cudaSuccess) {
        cudaGetLastError();
        q->stage_shadow = nullptr;
    }
    if (!q->table_shadow && q->table_host &&
        cudaMallocHost((void **)&q->table_shadow, CQ_TABLE_BYTES) != cudaSuccess) {
        cudaGetLastError();
        q->table_shadow = nullptr;
    }
    return (!q->stage || q->stage_shadow) && (!q->table_host || q->table_shadow);
}

bool cq_broken(cuda_ctx *c) { return c->q && c->q->broken; }

bool cq_can_hold(cuda_ctx *c) {
    cq_state *q = state_of(c);
    return q && q->graphs && !q->profile && q->stage;
}

void cq_launch(cuda_ctx *c, bool hold) {
    cq_state *q = c->q;
    if (!q) return;
    if (q->in_flight) cq_wait(c); /* one submission in flight at a time */
    if (q->profile) profile_collect(c, q);
    if (q->broken) cq_drop(c); /* a broken held step never runs */
    if (!q->ops.empty()) {
        if (!c->failed) {
            if (q->hold) { /* the ops' host bytes, into the arenas their copies read */
                if (q->stage_used) memcpy(q->stage, q->stage_shadow, q->stage_used);
                if (q->table_pending) memcpy(q->table_host, q->table_shadow, q->table_pending);
            }
            double t_start = q->profile_graphs ? now_ms() : 0;
            uint64_t sig = q->sealed ? q->sealed_sig : shape_sig(q->ops);
            cq_graph *hit = q->sealed ? q->sealed_hit : prepare(c, q, sig);
            launch_ops(c, q, hit, t_start);
            q->recent_sig[q->recent_next++ % CQ_RECENT] = sig;
            q->in_flight = true;
            q->keys_launched.swap(q->keys_queued);
            if (downloads(q->ops)) q->keys_launched.clear();
        }
        q->ops.clear();
    }
    q->keys_queued.clear();
    q->defer_launched.swap(q->defer_queued);
    q->defer_queued.clear();
    q->sealed = false;
    q->hold = hold;
    if (hold && !shadows(q)) q->broken = true; /* nothing can be held: cq_seal says no */
    q->stage_used = 0, q->table_used = 0, q->table_pending = 0, q->epoch++;
}

bool cq_seal(cuda_ctx *c) {
    cq_state *q = c->q;
    if (!q || !q->hold || q->broken || !q->graphs || c->failed) return false;
    q->sealed_sig = shape_sig(q->ops);
    q->sealed_hit = prepare(c, q, q->sealed_sig);
    q->sealed = !c->failed;
    return q->sealed;
}

void cq_wait(cuda_ctx *c) {
    cq_state *q = c->q;
    bool early = q && q->in_flight && !q->keys_launched.empty() && !c->failed && keys_came(c, q);
    if (!early) cuda_check(c, cudaStreamSynchronize(c->stream), "sync");
    if (!q) return;
    q->n_early_waits += early;
    q->keys_launched.clear();
    if (q->profile_steps) q->step_woke = now_ms();
    for (const cq_defer &d : q->defer_launched)
        d.done(c, &d, !c->failed);
    q->defer_launched.clear();
    q->in_flight = false;
    if (q->profile_graphs) q->last_flush_end = now_ms();
}

void cq_drop(cuda_ctx *c) {
    cq_state *q = c->q;
    if (!q) return;
    q->ops.clear();
    q->defer_queued.clear();
    q->keys_queued.clear();
    q->sealed = false, q->broken = false, q->hold = false;
    /* what the dropped ops uploaded never arrived: callers that upload only on a change
     * (cuda_positions) must upload again */
    q->stage_used = 0, q->table_used = 0, q->table_pending = 0, q->epoch++;
}

void cq_defer_add(cuda_ctx *c, const cq_defer *d) {
    cq_state *q = state_of(c);
    if (q && !q->broken) q->defer_queued.push_back(*d);
}

void cq_flush(cuda_ctx *c) {
    cq_state *q = c->q;
    if (q && q->hold && !q->ops.empty()) { /* held ops cannot run before the caller says so */
        q->ops.clear();
        q->defer_queued.clear();
        q->keys_queued.clear();
        q->sealed = false;
        q->broken = true;
    }
    if (q && q->broken) { /* the held step is dropped whole: wait for what is in flight */
        cq_wait(c);
        return;
    }
    cq_launch(c, q && q->hold);
    cq_wait(c);
}

void cq_wait_keys(cuda_ctx *c, unsigned long long *staged, int n) {
    cq_state *q = c->q;
    if (!q || q->broken || n <= 0 || !q->early_wait) return;
    memset(cq_stage_fill(c, staged), 0, (size_t)n * sizeof *staged); /* "not yet" */
    q->keys_queued.push_back({staged, n});
}

void *cuda_table(cuda_ctx *c, const void *host, size_t bytes) {
    cq_state *q = state_of(c);
    if (!q) return nullptr;
    if (!q->table && !cuda_check(c, cudaMalloc((void **)&q->table, CQ_TABLE_BYTES), "tables"))
        return nullptr;
    if (!q->table_host_tried) {
        q->table_host_tried = true;
        if (cudaMallocHost((void **)&q->table_host, CQ_TABLE_BYTES) != cudaSuccess) {
            cudaGetLastError();
            q->table_host = nullptr; /* each table then goes up with a copy of its own */
        }
    }
    if (bytes > CQ_TABLE_BYTES) {
        cuda_check(c, cudaErrorInvalidValue, "table too large");
        return nullptr;
    }
    size_t at = (q->table_used + 15) & ~(size_t)15;
    if (at + bytes > CQ_TABLE_BYTES) {
        cq_flush(c);
        at = 0;
    }
    q->table_used = at + bytes;
    if (q->graphs && q->hoist && q->table_host) { /* copied at the flush, all tables at once */
        memcpy((q->hold ? q->table_shadow : q->table_host) + at, host, bytes);
        q->table_pending = q->table_used;
    } else { /* ops run as they come: a copy of its own */
        cuda_upload_fresh(c, q->table + at, host, bytes, "table"); /* space new in this submission */
    }
    return q->table + at;
}

void *cq_stage(cuda_ctx *c, size_t bytes) {
    cq_state *q = state_of(c);
    if (!q || !q->stage || q->broken) return nullptr;
    size_t at = (q->stage_used + 15) & ~(size_t)15;
    if (at + bytes > CQ_STAGE_BYTES) return nullptr;
    q->stage_used = at + bytes;
    return q->stage + at;
}

void *cq_held_table_fill(cuda_ctx *c, void *table) {
    cq_state *q = c->q;
    if (!q || !q->hold || q->broken || !q->graphs || !q->hoist || !q->table_host ||
        !q->table_shadow)
        return nullptr;
    return q->table_shadow + ((unsigned char *)table - q->table);
}

bool cq_holding(cuda_ctx *c) { return c->q && c->q->hold && !c->q->broken; }

void *cq_stage_fill(cuda_ctx *c, void *staged) {
    cq_state *q = c->q;
    if (!q || !q->hold) return staged;
    return q->stage_shadow + ((unsigned char *)staged - q->stage);
}

static void copy_async(cuda_ctx *c, void *dst, const void *src, size_t bytes, cudaMemcpyKind dir,
                       const char *what, bool hoist) {
    if (!bytes) return;
    cq_op op{}; /* zeroed, padding included: arguments are compared bytewise */
    op.kind = CQ_COPY;
    op.what = what;
    op.dst = dst;
    op.src = src;
    op.bytes = bytes;
    op.dir = dir;
    op.hoist = hoist;
    cq_submit(c, &op);
}

void cuda_copy_async(cuda_ctx *c, void *dst, const void *src, size_t bytes, cudaMemcpyKind dir,
                     const char *what) {
    copy_async(c, dst, src, bytes, dir, what, false);
}

void cuda_memset_async(cuda_ctx *c, void *dst, size_t bytes, const char *what) {
    if (!bytes) return;
    cq_op op{}; /* zeroed, padding included: arguments are compared bytewise */
    op.kind = CQ_MEMSET;
    op.what = what;
    op.dst = dst;
    op.bytes = bytes;
    cq_submit(c, &op);
}

bool cuda_upload_now(cuda_ctx *c, void *dst, const void *src, size_t bytes, const char *what) {
    if (!bytes) return true;
    c->ops_submitted++;
    return cuda_check(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream),
                      what) &&
           cuda_check(c, cudaStreamSynchronize(c->stream), what);
}

static void upload(cuda_ctx *c, void *dst, const void *src, size_t bytes, const char *what,
                   bool hoist) {
    if (!bytes) return;
    void *st = cq_stage(c, bytes);
    if (!st) {
        /* too big for the arena (a one-off, such as parameters at load): run what is queued,
         * then copy directly */
        cq_flush(c);
        st = cq_stage(c, bytes);
        if (!st) {
            if (!cq_broken(c)) cuda_upload_now(c, dst, src, bytes, what);
            return;
        }
    }
    memcpy(cq_stage_fill(c, st), src, bytes);
    copy_async(c, dst, st, bytes, cudaMemcpyHostToDevice, what, hoist);
}

void cuda_upload_async(cuda_ctx *c, void *dst, const void *src, size_t bytes, const char *what) {
    upload(c, dst, src, bytes, what, false);
}

void cuda_upload_fresh(cuda_ctx *c, void *dst, const void *src, size_t bytes, const char *what) {
    upload(c, dst, src, bytes, what, true);
}

unsigned long cq_epoch(cuda_ctx *c) { return c->q ? c->q->epoch : 0; }

long cq_early_waits(cuda_ctx *c) { return c->q ? c->q->n_early_waits : 0; }

long cq_queued_ops(cuda_ctx *c) { return c->q ? (long)c->q->ops.size() : 0; }

int cq_last_copies(cuda_ctx *c) { return c->q ? c->q->last_copies : -1; }

void cq_stats(cuda_ctx *c, long *replays, long *builds, long *updates) {
    *replays = c->q ? c->q->n_replays : 0;
    *builds = c->q ? c->q->n_builds : 0;
    *updates = c->q ? c->q->n_updates : 0;
}
