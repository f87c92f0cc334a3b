/* Linked when qlm is built without CUDA (make CUDA=1 compiles the .cu files of this folder instead). */
#include "../core/backend.h"
#include "../core/error.h"

const qlm_backend *qlm_backend_cuda(void) {
    qlm_errorf("this qlm was built without CUDA (rebuild with `make CUDA=1`)");
    return NULL;
}
