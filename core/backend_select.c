#include <string.h>

#include "backend.h"
#include "error.h"

const qlm_backend *qlm_backend_by_name(const char *name) {
    if (!name || strcmp(name, "auto") == 0) {
        const qlm_backend *b = qlm_backend_cuda();
        qlm_clear_error();
        return b ? b : qlm_backend_cpu();
    }
    if (strcmp(name, "cpu") == 0) return qlm_backend_cpu();
    if (strcmp(name, "cuda") == 0) return qlm_backend_cuda();
    qlm_errorf("unknown device '%s' (expected cpu, cuda or auto)", name);
    return NULL;
}
