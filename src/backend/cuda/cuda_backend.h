/* The CUDA backend: the same op vtable as the CPU backend, with activations and state in device
 * memory and weights uploaded to the device on first use. Built with -DTESSERA_CUDA=ON; without
 * it (backend/cuda_stub.c) creation fails with TS_ERR_UNSUPPORTED. */
#ifndef TS_BACKEND_CUDA_CUDA_BACKEND_H
#define TS_BACKEND_CUDA_CUDA_BACKEND_H

#ifdef __cplusplus
extern "C" { /* the base/ and backend/ headers are C, without their own guards */
#endif

#include "backend/backend.h"

/* A backend on CUDA device `device`. Fails with one line ("tessera was built without CUDA",
 * "no CUDA device: ...") when there is none. */
ts_status ts_backend_cuda_create(int device, ts_backend **out);
/* The device's name ("NVIDIA H200"); NULL if be is not a CUDA backend. */
const char *ts_backend_cuda_device_name(const ts_backend *be);

#ifdef __cplusplus
}
#endif

#endif
