/* llama2.c "v0" checkpoints: a header of 7 little-endian int32 (dim, hidden_dim, n_layers,
 * n_heads, n_kv_heads, vocab_size, seq_len; a negative vocab_size means the classifier is not
 * shared with the embedding), then F32 arrays grouped by kind across layers:
 *   token_embedding[vocab][dim], rms_att[L][dim], wq[L][dim][dim], wk[L][kv_dim][dim],
 *   wv[L][kv_dim][dim], wo[L][dim][dim], rms_ffn[L][dim], w1[L][hidden][dim],
 *   w2[L][dim][hidden], w3[L][hidden][dim], rms_final[dim],
 *   freq_cis_real[seq_len][head_size/2], freq_cis_imag[seq_len][head_size/2], (wcls[vocab][dim])
 * with kv_dim = n_kv_heads * dim / n_heads. Matrices are [out][in] like Hugging Face's; w1 is the
 * gate, w3 the up and w2 the down projection. llama2.c applies RoPE to interleaved pairs, so Q/K
 * rows are reordered to the rotate-half layout. The file size must match the header exactly. */
#include "llama2c.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../core/error.h"

#define L2C_HEADER_BYTES 28

/* Config from the header and the exact file size it implies; -1 if the header is invalid. */
static int parse_header(const char *path, const uint8_t *p, uint64_t size, qlm_llama_config *c,
                        uint64_t *expected) {
    if (size < L2C_HEADER_BYTES)
        return qlm_errorf("%s: file too short (%llu bytes) for a llama2.c header", path, (unsigned long long)size);
    int32_t h[7];
    memcpy(h, p, sizeof h);
    memset(c, 0, sizeof *c);
    snprintf(c->arch, sizeof c->arch, "llama");
    c->dim = h[0];
    c->hidden_dim = h[1];
    c->n_layers = h[2];
    c->n_heads = h[3];
    c->n_kv_heads = h[4];
    c->tie_embeddings = h[5] > 0;
    c->vocab_size = h[5] == INT32_MIN ? 0 : h[5] < 0 ? -h[5] : h[5];
    c->max_seq_len = h[6];
    c->head_dim = c->n_heads > 0 && c->dim % c->n_heads == 0 ? c->dim / c->n_heads : 0;
    c->rope_theta = 10000.0f;
    c->norm_eps = 1e-5f;
    c->bos_id = 1;
    c->eos_id = 2;
    if (c->n_heads > 0 && c->dim % c->n_heads != 0)
        return qlm_errorf("%s: dim %d is not a multiple of n_heads %d", path, c->dim, c->n_heads);
    if (qlm_config_validate(c, path) != 0) return -1;
    /* The limits qlm_config_validate enforces keep every product below 2^62. */
    uint64_t dim = (uint64_t)c->dim, hid = (uint64_t)c->hidden_dim, L = (uint64_t)c->n_layers;
    uint64_t kv = (uint64_t)c->n_kv_heads * (uint64_t)c->head_dim, vocab = (uint64_t)c->vocab_size;
    uint64_t floats = vocab * dim + L * (2 * dim + 2 * dim * dim + 2 * kv * dim + 3 * hid * dim) + dim +
                      (uint64_t)c->max_seq_len * (uint64_t)c->head_dim + (c->tie_embeddings ? 0 : vocab * dim);
    *expected = L2C_HEADER_BYTES + 4 * floats;
    return 0;
}

/* Maps the file and checks its size against the header. */
static int map_checkpoint(const char *path, qlm_llama_config *c, const uint8_t **map, size_t *size) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return qlm_errorf("%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size < L2C_HEADER_BYTES) {
        close(fd);
        return qlm_errorf("%s: not a regular file of at least %d bytes", path, L2C_HEADER_BYTES);
    }
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED) return qlm_errorf("%s: mmap failed: %s", path, strerror(errno));
    uint64_t expected = 0;
    int rc = parse_header(path, m, (uint64_t)st.st_size, c, &expected);
    if (rc == 0 && expected != (uint64_t)st.st_size)
        rc = qlm_errorf("%s: file has %lld bytes but its header (dim %d, hidden_dim %d, n_layers %d, n_heads %d, "
                        "n_kv_heads %d, vocab_size %d, seq_len %d) implies %llu", path, (long long)st.st_size,
                        c->dim, c->hidden_dim, c->n_layers, c->n_heads, c->n_kv_heads, c->vocab_size,
                        c->max_seq_len, (unsigned long long)expected);
    if (rc != 0) {
        munmap(m, (size_t)st.st_size);
        return -1;
    }
    *map = m;
    *size = (size_t)st.st_size;
    return 0;
}

int qlm_llama2c_probe(const char *path) {
    qlm_llama_config c;
    const uint8_t *map;
    size_t size;
    if (map_checkpoint(path, &c, &map, &size) != 0) return 0;
    munmap((void *)map, size);
    return 1;
}

typedef struct {
    const char *path;
    qlm_tensor_store *store;
    const float *next; /* the next array in the file */
} reader;

/* Adds rows x cols floats (cols 0: a vector of rows) at the reader's position, as layer `layer`'s
 * `name` (layer < 0: a model-level name), and advances. heads > 0: Q/K, whose rows stay in the
 * file's interleaved order (rope_heads) for the model to read in place or reorder as it copies. */
static int add(reader *r, int layer, const char *name, int64_t rows, int64_t cols, int heads) {
    char full[128];
    if (layer >= 0) snprintf(full, sizeof full, "model.layers.%d.%s", layer, name);
    else snprintf(full, sizeof full, "%s", name);
    int64_t shape[2] = {rows, cols};
    int ndim = cols ? 2 : 1;
    int64_t n = rows * (cols ? cols : 1);
    const float *src = r->next;
    r->next += n;
    qlm_tensor_entry *e = qlm_store_add(r->store, full, QLM_F32, ndim, shape, src, (size_t)n * sizeof(float));
    if (!e) return qlm_error_context("%s", r->path);
    e->rope_heads = heads;
    return 0;
}

/* One weight kind for every layer, as the file groups them. */
static int add_layers(reader *r, const qlm_llama_config *c, const char *name, int64_t rows, int64_t cols,
                      int heads) {
    for (int l = 0; l < c->n_layers; l++)
        if (add(r, l, name, rows, cols, heads) != 0) return -1;
    return 0;
}

static int add_all(reader *r, const qlm_llama_config *c) {
    int64_t dim = c->dim, hid = c->hidden_dim, kv = (int64_t)c->n_kv_heads * c->head_dim;
    if (add(r, -1, "model.embed_tokens.weight", c->vocab_size, dim, 0) != 0 ||
        add_layers(r, c, "input_layernorm.weight", dim, 0, 0) != 0 ||
        add_layers(r, c, "self_attn.q_proj.weight", dim, dim, c->n_heads) != 0 ||
        add_layers(r, c, "self_attn.k_proj.weight", kv, dim, c->n_kv_heads) != 0 ||
        add_layers(r, c, "self_attn.v_proj.weight", kv, dim, 0) != 0 ||
        add_layers(r, c, "self_attn.o_proj.weight", dim, dim, 0) != 0 ||
        add_layers(r, c, "post_attention_layernorm.weight", dim, 0, 0) != 0 ||
        add_layers(r, c, "mlp.gate_proj.weight", hid, dim, 0) != 0 ||
        add_layers(r, c, "mlp.down_proj.weight", dim, hid, 0) != 0 ||
        add_layers(r, c, "mlp.up_proj.weight", hid, dim, 0) != 0 || add(r, -1, "model.norm.weight", dim, 0, 0) != 0)
        return -1;
    r->next += (int64_t)c->max_seq_len * c->head_dim; /* freq_cis_real and _imag: recomputed by the model */
    return c->tie_embeddings ? 0 : add(r, -1, "lm_head.weight", c->vocab_size, dim, 0);
}

int qlm_llama2c_load(const char *path, qlm_llama_config *cfg, qlm_tensor_store *store) {
    const uint8_t *map;
    size_t size;
    if (map_checkpoint(path, cfg, &map, &size) != 0) return -1;
    if (qlm_store_keep_mapping(store, (void *)map, size) != 0) {
        munmap((void *)map, size);
        return -1;
    }
    /* 28 is a multiple of 4, so the floats after the header are aligned in the mapping. */
    reader r = {path, store, (const float *)(map + L2C_HEADER_BYTES)};
    return add_all(&r, cfg);
}
