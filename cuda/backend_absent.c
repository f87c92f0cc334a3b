/* Linked when qlm is built without CUDA (make CUDA=1 compiles the .cu files of this folder instead). */
#include "../core/backend.h"
#include "../core/error.h"
#include "../dist/launch.h"

const qlm_backend *qlm_backend_cuda(void) {
    qlm_errorf("this qlm was built without CUDA (rebuild with `make CUDA=1`)");
    return NULL;
}

qlm_transport *qlm_transport_nccl_world(const qlm_launch *l, qlm_transport *bootstrap, double timeout_s) {
    (void)l, (void)bootstrap, (void)timeout_s;
    qlm_errorf("NCCL needs a qlm built with CUDA (rebuild with `make CUDA=1`)");
    return NULL;
}
