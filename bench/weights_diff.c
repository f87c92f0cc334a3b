/* weights_diff A.safetensors B.safetensors: the largest difference between the two files' F32
 * tensors of the same name, relative to each tensor's largest magnitude, and whether every byte
 * agrees — for the distributed-training equivalence table of scripts/bench_dist.sh.
 * Prints "max_rel_diff TENSOR identical|different"; exit 1 when the files do not pair up. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../core/error.h"
#include "../loaders/safetensors.h"

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: weights_diff A.safetensors B.safetensors\n");
        return 2;
    }
    qlm_tensor_store *a = qlm_store_new(), *b = qlm_store_new();
    if (!a || !b || qlm_safetensors_load(argv[1], a) != 0 || qlm_safetensors_load(argv[2], b) != 0) {
        fprintf(stderr, "weights_diff: %s\n", qlm_last_error());
        return 1;
    }
    if (qlm_store_count(a) != qlm_store_count(b)) {
        fprintf(stderr, "weights_diff: %d tensors against %d\n", qlm_store_count(a), qlm_store_count(b));
        return 1;
    }
    double worst = 0;
    const char *where = "-";
    int identical = 1;
    for (int i = 0; i < qlm_store_count(a); i++) {
        const qlm_tensor_entry *x = qlm_store_at(a, i), *y = qlm_store_find(b, x->name);
        if (!y || y->nbytes != x->nbytes || x->dtype != QLM_F32 || y->dtype != QLM_F32) {
            fprintf(stderr, "weights_diff: %s does not pair up (F32 of the same size in both)\n", x->name);
            return 1;
        }
        identical &= memcmp(x->data, y->data, x->nbytes) == 0;
        const float *u = x->data, *v = y->data;
        double big = 0, diff = 0;
        for (size_t k = 0; k < x->nbytes / sizeof(float); k++) {
            big = fmax(big, fabs(u[k]));
            diff = fmax(diff, fabs((double)u[k] - v[k]));
        }
        if (big > 0 && diff / big > worst) worst = diff / big, where = x->name;
    }
    printf("%.3g %s %s\n", worst, where, identical ? "identical" : "different");
    qlm_store_free(a);
    qlm_store_free(b);
    return 0;
}
