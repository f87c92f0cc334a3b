/* qlm pull: download a model repository from the Hugging Face hub into the shared cache. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "../hub/hf_cache.h"
#include "../hub/hf_download.h"
#include "commands.h"
#include "common.h"

static const char *k_usage =
    "usage: qlm pull ORG/NAME[@REVISION] [--include GLOB ...] [--exclude GLOB ...] [--jobs N] [options]\n"
    "Downloads a model from the Hugging Face hub into the Hugging Face cache ($HF_HOME/hub, default\n"
    "~/.cache/huggingface/hub) and prints its snapshot folder. Afterwards -m ORG/NAME[@REVISION] uses it.\n"
    "  --include GLOB   download only the files matching GLOB (repeatable; default: config, tokenizer\n"
    "                   and *.safetensors files)\n"
    "  --exclude GLOB   skip the files matching GLOB (repeatable)\n"
    "  -j, --jobs N     download up to N files at once (default 4; 1 = one after another)\n"
    "  -q, --quiet      no progress lines\n"
    "  --min-rate R     break off and retry a transfer slower than R bytes/s (k, M: 1024s) over\n"
    "                   --rate-window (default 1k)\n"
    "  --rate-window S  seconds the rate is averaged over (default 30)\n"
    "  --deadline S     give up on a file not done within S seconds, retries included (default:\n"
    "                   10 minutes plus its size at --min-rate); what arrived is kept for the next pull\n"
    "Environment: HF_ENDPOINT (default https://huggingface.co), HF_TOKEN (gated or private models),\n"
    "HF_HOME, HF_HUB_CACHE, HF_HUB_OFFLINE.\n";

enum { MAX_GLOBS = 64 };

/* A byte rate such as 500, 64k or 2M (k and M are 1024 and 1024^2). */
static int parse_rate(const char *arg, long *out) {
    char *end;
    double v = strtod(arg, &end);
    double unit = *end == 'k' || *end == 'K' ? 1024 : *end == 'm' || *end == 'M' ? 1024 * 1024 : 1;
    if (unit > 1) end++;
    if (end == arg || *end || !(v * unit >= 1) || v * unit > 1e12) {
        fprintf(stderr, "qlm pull: --min-rate wants bytes per second from 1 to 1e12 (e.g. 500, 64k, 2M), not \"%s\"\n",
                arg);
        return -1;
    }
    *out = (long)(v * unit);
    return 0;
}

int cmd_pull(int argc, char **argv) {
    const char *inc[MAX_GLOBS], *exc[MAX_GLOBS];
    int n_inc = 0, n_exc = 0, quiet = 0, jobs = QLM_HF_DEFAULT_JOBS, window = QLM_HF_DEFAULT_RATE_WINDOW;
    long min_rate = QLM_HF_DEFAULT_MIN_RATE;
    float deadline = 0;
    enum { OPT_INCLUDE = 300, OPT_EXCLUDE, OPT_MIN_RATE, OPT_RATE_WINDOW, OPT_DEADLINE };
    static const struct option opts[] = {{"include", required_argument, 0, OPT_INCLUDE},
                                         {"exclude", required_argument, 0, OPT_EXCLUDE},
                                         {"jobs", required_argument, 0, 'j'},
                                         {"quiet", no_argument, 0, 'q'},
                                         {"min-rate", required_argument, 0, OPT_MIN_RATE},
                                         {"rate-window", required_argument, 0, OPT_RATE_WINDOW},
                                         {"deadline", required_argument, 0, OPT_DEADLINE},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "j:qh", opts, NULL)) != -1) {
        switch (c) {
        case OPT_INCLUDE:
        case OPT_EXCLUDE:
            if ((c == OPT_INCLUDE ? n_inc : n_exc) == MAX_GLOBS) {
                fprintf(stderr, "qlm pull: at most %d --include and %d --exclude globs\n", MAX_GLOBS, MAX_GLOBS);
                return 2;
            }
            if (c == OPT_INCLUDE) inc[n_inc++] = optarg;
            else exc[n_exc++] = optarg;
            break;
        case 'j': {
            char *end;
            long n = strtol(optarg, &end, 10);
            if (*optarg == 0 || *end != 0 || n < 1 || n > QLM_HF_MAX_JOBS) {
                fprintf(stderr, "qlm pull: --jobs wants a number from 1 to %d, not \"%s\"\n", QLM_HF_MAX_JOBS, optarg);
                return 2;
            }
            jobs = (int)n;
            break;
        }
        case 'q': quiet = 1; break;
        case OPT_MIN_RATE: if (parse_rate(optarg, &min_rate) != 0) return 2; break;
        case OPT_RATE_WINDOW: if (cli_int("--rate-window", optarg, 1, 86400, &window) != 0) return 2; break;
        case OPT_DEADLINE: if (cli_float("--deadline", optarg, 1, 1e8f, &deadline) != 0) return 2; break;
        case 'h': fputs(k_usage, stdout); return 0;
        default: return cli_usage_error("pull", k_usage);
        }
    }
    char repo[QLM_HF_REPO_MAX], rev[QLM_HF_REV_MAX], snapshot[4200];
    if (argc - optind != 1) {
        fprintf(stderr, "qlm pull: give exactly one ORG/NAME[@REVISION]\n");
        return cli_usage_error("pull", k_usage);
    }
    if (!qlm_hf_parse_repo(argv[optind], repo, rev)) {
        fprintf(stderr, "qlm pull: %s is not a repository id ORG/NAME[@REVISION]\n", argv[optind]);
        return 2;
    }
    qlm_hf_pull_opts o = {.repo = repo, .rev = rev, .include = inc, .n_include = n_inc,
                          .exclude = exc, .n_exclude = n_exc, .progress = !quiet, .jobs = jobs,
                          .min_rate = min_rate, .rate_window_s = window, .deadline_s = deadline};
    if (qlm_hf_pull(&o, snapshot, sizeof snapshot) != 0) return cli_fail("pull");
    printf("%s\n", snapshot);
    return 0;
}
