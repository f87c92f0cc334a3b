// CUDA backend entry point. The device is probed here; the GPU op table arrives with the
// CUDA backend issue, so until then a present GPU is reported and the CPU backend is used.
#include <cuda_runtime.h>

extern "C" {
#include "../core/backend.h"
#include "../core/error.h"
}

extern "C" const qlm_backend *qlm_backend_cuda(void) {
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess || n == 0) {
        qlm_errorf("no GPU: %s", err != cudaSuccess ? cudaGetErrorString(err) : "no CUDA device found");
        return nullptr;
    }
    cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, 0);
    qlm_errorf("GPU %s found, but the CUDA op table is not implemented yet; use --device cpu", prop.name);
    return nullptr;
}
