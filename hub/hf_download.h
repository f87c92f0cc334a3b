/* Downloading a model repository from the Hugging Face hub (or a mirror at HF_ENDPOINT) into the
 * shared cache (hf_cache.h) with libcurl's multi interface: several files at once, each resumed from
 * blobs/<etag>.incomplete with a Range request, retried with backoff on 5xx, 429 and broken or
 * too slow transfers, given up past a deadline per file, verified against the hub's etag before being renamed into blobs/. */
#ifndef QLM_HF_DOWNLOAD_H
#define QLM_HF_DOWNLOAD_H

#include <stddef.h>

typedef struct {
    const char *repo;                  /* ORG/NAME */
    const char *rev;                   /* branch, tag or commit; NULL = "main" */
    const char *const *include;        /* fnmatch globs over the repo paths; none = the default set */
    int n_include;
    const char *const *exclude;        /* removed from whatever include selected */
    int n_exclude;
    int progress;                      /* a progress line per file on stderr */
    int jobs;                          /* files downloaded at once; 0 = QLM_HF_DEFAULT_JOBS, 1 = in turn */
    /* A transfer averaging under min_rate bytes/s over rate_window_s seconds is broken off and
     * retried (0: QLM_HF_DEFAULT_MIN_RATE, QLM_HF_DEFAULT_RATE_WINDOW). */
    long min_rate, rate_window_s;
    /* Each file must be done within this many seconds, tries and pauses included (0: 10 minutes
     * plus its size at min_rate). What arrived stays in the partial for the next pull. */
    double deadline_s;
} qlm_hf_pull_opts;

enum { QLM_HF_DEFAULT_JOBS = 4, QLM_HF_MAX_JOBS = 64, QLM_HF_DEFAULT_MIN_RATE = 1024, QLM_HF_DEFAULT_RATE_WINDOW = 30 };

/* The default set: config, generation config, tokenizer files and safetensors weights (with the
 * shard index) at the top of the repo; no .bin/.pt/.h5/.msgpack/ONNX duplicates. */
int qlm_hf_default_file(const char *rfilename);

/* Downloads the selected files and points refs/<rev> at the commit; the snapshot folder is
 * written into snapshot. Returns 0, or -1 with an error naming the repository and file. */
int qlm_hf_pull(const qlm_hf_pull_opts *o, char *snapshot, size_t cap);

#endif
