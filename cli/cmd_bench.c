/* qlm bench: prefill (ppN) and decode (tgN) throughput, in rows like llama-bench, plus the
 * decode rate as a fraction of the memory-bandwidth bound measured in the same run. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "../core/clock.h"
#include "../core/error.h"
#include "../quant/matmul.h"
#include "commands.h"
#include "common.h"
#include "progress.h"

static const char *k_usage =
    "usage: qlm bench -m MODEL [--dtype D] [--pp N] [--tg N] [--reps R] [--json]\n"
    "Measures prompt processing of N tokens (default 512) and generation of N tokens (default 128), R times\n"
    "each (default 3), and prints mean +- sd tokens/s, peak RSS, the measured memory bandwidth and the\n"
    "decode speed as a fraction of the bandwidth bound (weight bytes per token / bandwidth).\n\n" CLI_MODEL_HELP
    "      --pp N             prompt tokens (0 to skip)\n"
    "      --tg N             generated tokens (0 to skip)\n"
    "      --reps R           repetitions\n"
    "      --json             one JSON object instead of the table\n";


static void mean_sd(const double *x, int n, double *mean, double *sd) {
    double s = 0, ss = 0;
    for (int i = 0; i < n; i++) s += x[i];
    *mean = s / n;
    for (int i = 0; i < n; i++) ss += (x[i] - *mean) * (x[i] - *mean);
    *sd = n > 1 ? sqrt(ss / (n - 1)) : 0;
}

/* Tokens/s of one prefill of n tokens or one decode of n tokens from an empty cache. */
static double peak_rss_mib(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss / 1024.0;
}

static int run_once(const qlm_model *m, qlm_kv_state *st, int n, int decode, unsigned *seed, double *tps) {
    int *ids = malloc((size_t)n * sizeof *ids), *pos = malloc((size_t)n * sizeof *pos);
    float *logits = malloc((size_t)m->cfg.vocab_size * sizeof *logits);
    if (!ids || !pos || !logits) {
        free(ids);
        free(pos);
        free(logits);
        return qlm_errorf("out of memory");
    }
    for (int i = 0; i < n; i++) {
        ids[i] = (int)(rand_r(seed) % (unsigned)m->cfg.vocab_size);
        pos[i] = i;
    }
    int rc = 0;
    double t0 = qlm_now_s();
    if (decode) {
        for (int i = 0; i < n && rc == 0; i++) {
            int row = 0;
            rc = qlm_forward(m, st, &ids[i], &pos[i], 1, &row, 1, logits);
        }
    } else {
        int last = n - 1;
        rc = qlm_forward(m, st, ids, pos, n, &last, 1, logits);
    }
    *tps = n / (qlm_now_s() - t0);
    free(ids);
    free(pos);
    free(logits);
    return rc;
}

int cmd_bench(int argc, char **argv) {
    cli_model_opts mo;
    cli_model_opts_init(&mo);
    int pp = 512, tg = 128, reps = 3, json = 0;
    static const struct option opts[] = {CLI_MODEL_OPTIONS, {"pp", required_argument, 0, OPT_PP},
                                         {"tg", required_argument, 0, OPT_TG}, {"reps", required_argument, 0, OPT_REPS},
                                         {"json", no_argument, 0, OPT_JSON}, {0, 0, 0, 0}};
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "m:t:c:h", opts, NULL)) != -1) {
        int r = cli_model_flag(&mo, c, optarg);
        if (r < 0) return 2;
        if (r > 0) continue;
        switch (c) {
        case OPT_HELP: fputs(k_usage, stdout); return 0;
        case OPT_PP: if (cli_int("--pp", optarg, 0, 1 << 20, &pp)) return 2; break;
        case OPT_TG: if (cli_int("--tg", optarg, 0, 1 << 20, &tg)) return 2; break;
        case OPT_REPS: if (cli_int("--reps", optarg, 1, 1000, &reps)) return 2; break;
        case OPT_JSON: json = 1; break;
        default: return cli_usage_error("bench", k_usage);
        }
    }
    if (!mo.model || optind < argc) {
        fprintf(stderr, "qlm bench: need -m MODEL\n");
        return cli_usage_error("bench", k_usage);
    }
    if (pp == 0 && tg == 0) {
        fprintf(stderr, "qlm bench: --pp 0 and --tg 0 leave nothing to measure\n");
        return cli_usage_error("bench", k_usage);
    }
    cli_model cm;
    if (cli_load_model(&mo, &cm, 0, json) != 0) return cli_fail("bench");
    if (cli_require_decoder_only(&cm, "bench") != 0) {
        cli_free_model(&cm);
        return cli_fail("bench");
    }
    const qlm_model *m = &cm.model;
    int ctx = pp > tg ? pp : tg;
    if (ctx > qlm_llama_positions(&m->cfg)) {
        qlm_errorf("--pp/--tg of %d exceed the model's context of %d", ctx, qlm_llama_positions(&m->cfg));
        cli_free_model(&cm);
        return cli_fail("bench");
    }
    qlm_kv_state st;
    if (qlm_state_init(&st, m, ctx, pp > 0 && pp < mo.batch ? pp : mo.batch) != 0) {
        cli_free_model(&cm);
        return cli_fail("bench");
    }
    double *pps = calloc((size_t)reps, sizeof *pps), *tgs = calloc((size_t)reps, sizeof *tgs);
    unsigned seed = 1234;
    int rc = pps && tgs ? 0 : qlm_errorf("out of memory");
    double warm;
    /* Touch weights and caches once, in the positions the runs use (--tg 1 has one). */
    if (rc == 0) rc = run_once(m, &st, ctx < 4 ? ctx : 4, 1, &seed, &warm);
    /* The bandwidth is measured beside every decode repetition and averaged, so the bound and the
     * decode rate see the same machine (on a shared VM it drifts by a third between minutes). */
    double bw = 0, rss_mib = 0;
    int bw_n = 0;
    cli_progress progress;
    cli_progress_init(&progress, json);
    for (int r = 0; r < reps && rc == 0; r++) {
        if (pp > 0) rc = run_once(m, &st, pp, 0, &seed, &pps[r]);
        if (tg > 0 && rc == 0) rc = run_once(m, &st, tg, 1, &seed, &tgs[r]);
        if (rc == 0) {
            char done[96] = "";
            if (pp > 0) snprintf(done, sizeof done, ", pp%d %.1f tok/s", pp, pps[r]);
            if (tg > 0) snprintf(done + strlen(done), sizeof done - strlen(done), ", tg%d %.1f tok/s", tg, tgs[r]);
            cli_progress_update(&progress, r == reps - 1, "bench: repetition %d/%d%s", r + 1, reps, done);
        }
        /* The engine's peak, taken before the bandwidth measurement's 256 MiB buffer joins it. */
        if (r == 0) rss_mib = peak_rss_mib();
        double b = rc == 0 && tg > 0 ? m->be->bandwidth_gbs() : -1;
        if (b > 0) {
            bw += b;
            bw_n++;
        }
    }
    if (rc == 0 && bw_n == 0) {
        bw = m->be->bandwidth_gbs();
        bw_n = bw > 0;
    }
    if (bw_n) bw /= bw_n;
    char device[256];
    m->be->describe(device, sizeof device);
    if (rc == 0) {
        double pp_mean = 0, pp_sd = 0, tg_mean = 0, tg_sd = 0;
        if (pp > 0) mean_sd(pps, reps, &pp_mean, &pp_sd);
        if (tg > 0) mean_sd(tgs, reps, &tg_mean, &tg_sd);
        double wbytes = (double)qlm_model_weight_bytes(m);
        double bound = bw > 0 ? bw * 1e9 / wbytes : 0;
        const char *dt = qlm_dtype_name(m->fmt.dtype);
        const char *pc = m->fmt.per_channel ? "-pc" : "";
        if (json) {
            printf("{\"model\": \"%s\", \"dtype\": \"%s%s\", \"threads\": %d, \"params\": %lld, \"weight_bytes\": %.0f, "
                   "\"model_bytes\": %zu, \"state_bytes\": %zu, \"pp\": %d, \"pp_tps\": %.3f, \"pp_sd\": %.3f, \"tg\": %d, \"tg_tps\": %.3f, \"tg_sd\": %.3f, "
                   "\"bandwidth_gbs\": %.3f, \"tg_bound_tps\": %.3f, \"tg_fraction_of_bound\": %.4f, \"peak_rss_mib\": %.1f, "
                   "\"isa\": \"%s\", \"device\": \"%s\"}\n",
                   mo.model, dt, pc, omp_get_max_threads(), (long long)qlm_model_param_count(m), wbytes,
                   qlm_model_held_bytes(m), st.bytes, pp, pp_mean, pp_sd,
                   tg, tg_mean, tg_sd, bw, bound, bound > 0 ? tg_mean / bound : 0, rss_mib, qlm_matmul_isa(), device);
        } else {
            printf("| %-10s | %8s | %10s | %7s | %8s | %18s |\n", "dtype", "size MiB", "params", "threads", "test", "t/s");
            printf("| ---------- | -------: | ---------: | ------: | -------: | -----------------: |\n");
            if (pp > 0)
                printf("| %-7s%-3s | %8.1f | %9.1fM | %7d | %8s%d | %9.2f +- %6.2f |\n", dt, pc, wbytes / 1048576.0,
                       qlm_model_param_count(m) / 1e6, omp_get_max_threads(), "pp", pp, pp_mean, pp_sd);
            if (tg > 0)
                printf("| %-7s%-3s | %8.1f | %9.1fM | %7d | %8s%d | %9.2f +- %6.2f |\n", dt, pc, wbytes / 1048576.0,
                       qlm_model_param_count(m) / 1e6, omp_get_max_threads(), "tg", tg, tg_mean, tg_sd);
            char reached[64] = "";
            if (tg > 0) snprintf(reached, sizeof reached, "; decode reaches %.0f%% of it", bound > 0 ? 100 * tg_mean / bound : 0);
            printf("\n%s\nmemory bandwidth %.2f GB/s -> decode bound %.1f tok/s%s; peak RSS %.1f MiB\n", device, bw, bound,
                   reached, rss_mib);
        }
    }
    free(pps);
    free(tgs);
    qlm_state_free(&st, m);
    cli_free_model(&cm);
    return rc ? cli_fail("bench") : 0;
}
