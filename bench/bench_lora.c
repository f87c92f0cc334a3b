/* The cost of unmerged LoRA adapters on decode, for `make bench`: the time to switch a sequence's
 * adapter, and decode tokens/s of one sequence with no adapter and with one, and of a batch of
 * four sequences with no adapter, one shared adapter and four distinct ones (best of three
 * interleaved rounds).
 * usage: bench_lora MODEL ADAPTER1 ADAPTER2 ADAPTER3 ADAPTER4 (PEFT folders for MODEL). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../core/clock.h"
#include "../core/error.h"
#include "../models/model.h"
#include "../loaders/model_source.h"
#include "../lora/lora.h"

enum { PROMPT = 32, STEPS = 96, MAX_SEQ = PROMPT + STEPS };


/* Decode tokens/s of n_seq sequences (slot i uses use[i]) over STEPS steps after a prefill. */
static double decode_rate(const qlm_model *m, const qlm_lora_adapter *const *use, int n_seq) {
    qlm_kv_state s;
    if (qlm_state_init_slots(&s, m, MAX_SEQ, n_seq, 64) != 0) return -1;
    int vocab = m->cfg.vocab_size, ids[PROMPT], pos[PROMPT], slots[PROMPT], rows[4] = {0, 1, 2, 3}, last = PROMPT - 1;
    float *logits = malloc((size_t)n_seq * vocab * sizeof *logits);
    for (int q = 0; q < n_seq; q++) {
        qlm_lora_slots_set(&s.lora, q, use[q]);
        for (int i = 0; i < PROMPT; i++) {
            ids[i] = 100 + (q * 31 + i * 7) % 1000;
            pos[i] = i;
            slots[i] = q;
        }
        qlm_forward_slots(m, &s, ids, pos, slots, PROMPT, &last, 1, logits);
    }
    double t0 = qlm_now_s();
    for (int step = 0; step < STEPS; step++) {
        int tok[4], p[4], sl[4];
        for (int q = 0; q < n_seq; q++) {
            tok[q] = 200 + (step * 13 + q) % 1000;
            p[q] = PROMPT + step;
            sl[q] = q;
        }
        qlm_forward_slots(m, &s, tok, p, sl, n_seq, rows, n_seq, logits);
    }
    double rate = (double)STEPS * n_seq / (qlm_now_s() - t0);
    free(logits);
    qlm_state_free(&s, m);
    return rate;
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: bench_lora MODEL ADAPTER1 ADAPTER2 ADAPTER3 ADAPTER4\n");
        return 2;
    }
    qlm_source src;
    qlm_model m;
    qlm_lora_registry reg;
    qlm_model_options o = {.dtype = QLM_BF16, .backend = qlm_backend_cpu()};
    if (qlm_source_open(&src, argv[1], NULL) != 0 || qlm_model_build(&m, &src.cfg, src.store, &o) != 0 ||
        qlm_lora_registry_init(&reg, &src.cfg, NULL, o.backend) != 0) {
        fprintf(stderr, "bench_lora: %s\n", qlm_last_error());
        return 1;
    }
    const char *names[4] = {"a", "b", "c", "d"};
    for (int i = 0; i < 4; i++)
        if (qlm_lora_registry_load(&reg, names[i], argv[2 + i], QLM_F32) != 0) {
            fprintf(stderr, "bench_lora: %s\n", qlm_last_error());
            return 1;
        }
    const qlm_lora_adapter *A[4];
    for (int i = 0; i < 4; i++) A[i] = qlm_lora_registry_find(&reg, names[i]);

    /* Switching: what a request or /adapter does, the registry lookup and the slot's pointer. */
    qlm_kv_state s;
    qlm_state_init_slots(&s, &m, 8, 1, 8);
    enum { SWITCHES = 1000000 };
    double t0 = qlm_now_s();
    for (int i = 0; i < SWITCHES; i++) {
        qlm_lora_registry_set_default(&reg, names[i & 3]);
        qlm_lora_slots_set(&s.lora, 0, qlm_lora_registry_default(&reg));
    }
    double switch_ns = (qlm_now_s() - t0) / SWITCHES * 1e9;
    qlm_state_free(&s, &m);

    const qlm_lora_adapter *none[4] = {NULL, NULL, NULL, NULL}, *one[4] = {A[0], A[0], A[0], A[0]};
    /* The five cases interleaved, best of REPS rounds: machine noise hits them alike. */
    enum { REPS = 3 };
    const qlm_lora_adapter *const *use[5] = {none, one, none, one, A};
    int seqs[5] = {1, 1, 4, 4, 4};
    double best[5] = {0};
    for (int r = 0; r < REPS; r++)
        for (int k = 0; k < 5; k++) {
            double rate = decode_rate(&m, use[k], seqs[k]);
            if (rate > best[k]) best[k] = rate;
        }
    double single0 = best[0], single1 = best[1], batch0 = best[2], batch1 = best[3], batch4 = best[4];
    printf("| adapters | sequences | decode tok/s | vs no adapter |\n| --- | ---: | ---: | ---: |\n");
    printf("| none | 1 | %.1f | 1.00x |\n| one | 1 | %.1f | %.2fx |\n", single0, single1, single1 / single0);
    printf("| none | 4 | %.1f | 1.00x |\n| one, shared | 4 | %.1f | %.2fx |\n| four distinct | 4 | %.1f | %.2fx |\n",
           batch0, batch1, batch1 / batch0, batch4, batch4 / batch0);
    printf("\nSwitching an adapter (registry lookup + the sequence's pointer): %.0f ns, no allocation.\n", switch_ns);
    qlm_lora_registry_free(&reg);
    qlm_model_free(&m);
    qlm_source_close(&src);
    return 0;
}
