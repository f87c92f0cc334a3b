/* qlm train as 1, 2 and 4 ranks under mpirun on tinystories-656K (a real pretrained Llama):
 * DDP, ZeRO-1, ZeRO-2, FSDP and hybrid sharding give, step by step, the loss of one process
 * running the same global batch, and its final weights, within bounds argued below; a rerun of a
 * setting is bit-identical; a rank killed by SIGKILL ends the job within seconds, and --resume
 * from the last committed sharded checkpoint then ends bit-identical to an uninterrupted run;
 * a checkpoint resumes under another number of ranks with --reshard, and a mismatched model or
 * launch is refused with a message saying what differs.
 *
 * The bound: the ranks' gradients are each summed over their own rows and then over the ranks,
 * one process sums all rows at once; in F32 the two orders differ by a few units in the last
 * place of the sum of |terms| (Higham: n u for n terms, here observed ~1e-7 relative to the
 * gradient). AdamW divides the gradient by its own running magnitude, so a relative change e in a
 * gradient moves the update by about lr e, and ten steps move a weight by about 10 lr e: with
 * lr 1e-3, 1e-9 of a weight of size 1. The observed worst is 3e-6 of the tensor's largest value
 * (the embedding, where a near-zero gradient's sign can flip); the test allows 1e-4. Losses are
 * means over ~2300 targets computed in double and agree to 1e-7; the test allows 1e-5. With LoRA
 * dropout and with BF16 compute copies (one BF16 rounding of a weight that moved by 1e-9 flips by
 * 2^-8 relative) the bounds are 1e-3 of the weights and 1e-3 nats (observed: LoRA 4e-5 and 1.4e-7,
 * BF16 5e-6 and 2e-4). QAT is the least smooth: a weight that crosses an edge of its INT8 grid
 * moves the forward by a whole step of 1/127 of its row's range, and the ten steps compound
 * such flips: 1e-3 of the weights and 5e-3 nats (observed 3e-4 and 2e-3). */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <math.h>
#include <signal.h>
#include <unistd.h>

#include "../loaders/safetensors.h"
#include "dist_test_util.h"
#include "train_cli_test_util.h"

enum { STEPS = 10, GLOBAL_BATCH = 8 };

static char g_model[512], g_dir[256], g_data[512], g_t5[512];

static int setup(void **state) {
    (void)state;
    if (!test_tmpdir(g_dir, sizeof g_dir)) return -1;
    test_asset(g_model, sizeof g_model, "tinystories-656K-hf");
    snprintf(g_data, sizeof g_data, "%s/data.jsonl", g_dir);
    snprintf(g_t5, sizeof g_t5, "%s/t5", g_dir);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    return test_remove_tree(g_dir);
}

static void prepare(void) {
    REQUIRE_ASSET(g_model);
    if (!test_path_exists(g_data)) test_write_story_pairs(g_data, 64);
}

/* What trains: full F32, LoRA, BF16 mixed precision, QAT per channel, LoRA on an INT8 base. */
static const char *const k_modes[] = {"--full --lr 1e-3", "--lora --rank 4 --lr 3e-3",
                                      "--full --dtype bf16 --lr 1e-3", "--qat --per-channel --lr 1e-3",
                                      "--lora --rank 4 --lr 3e-3 --base-dtype int8"};
enum { FULL, LORA, BF16, QAT, LORA_INT8 };

/* Trains into g_dir/name with np ranks (0: one process without mpirun) and the given split;
 * returns the exit status. extra: more flags (the model's, --resume). */
static int train(const char *name, int mode, int np, const char *split, const char *extra) {
    char out[400];
    snprintf(out, sizeof out, "%s/%s", g_dir, name);
    int batch = GLOBAL_BATCH / (np ? np : 1);
    const char *fmt = "%s train %s --data %s --out %s %s --steps %d --batch %d --seq-len 64 --save-every 2 %s %s";
    char *log = NULL, model[600];
    snprintf(model, sizeof model, "-m %s", g_model);
    if (extra && strstr(extra, "--random-weights")) model[0] = 0; /* the model is in extra */
    int rc;
    if (np == 0)
        rc = test_run_qlm(&log, "train %s --data %s --out %s %s --steps %d --batch %d --seq-len 64 --save-every 2 "
                                "--threads 1 %s 2>&1",
                          model, g_data, out, k_modes[mode], STEPS, batch, extra ? extra : "");
    else
        rc = test_mpirun(&log, NULL, np, fmt, test_qlm_bin(), model, g_data, out, k_modes[mode], STEPS, batch,
                         split ? split : "", extra ? extra : "");
    if (rc != 0) print_message("%s: exit %d\n%s\n", name, rc, log);
    free(log);
    return rc;
}

/* Every step's loss from out/metrics.jsonl. */
static int read_losses(const char *name, double *loss) {
    char path[500];
    snprintf(path, sizeof path, "%s/%s/metrics.jsonl", g_dir, name);
    char *text = test_read_file(path, NULL);
    assert_non_null(text);
    int n = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *j = cJSON_Parse(line);
        const cJSON *l = cJSON_GetObjectItem(j, "loss");
        if (cJSON_IsNumber(l) && n < STEPS) loss[n++] = l->valuedouble;
        cJSON_Delete(j);
    }
    free(text);
    return n;
}

static const char *weights_file(int mode) {
    return mode == LORA || mode == LORA_INT8 ? "adapter/adapter_model.safetensors" : "model/model.safetensors";
}

/* The largest difference between the two runs' trained tensors, relative to each tensor's
 * largest magnitude; *identical when every byte agrees. */
static double weight_diff(const char *a, const char *b, int mode, int *identical) {
    char pa[500], pb[500];
    snprintf(pa, sizeof pa, "%s/%s/%s", g_dir, a, weights_file(mode));
    snprintf(pb, sizeof pb, "%s/%s/%s", g_dir, b, weights_file(mode));
    qlm_tensor_store *sa = qlm_store_new(), *sb = qlm_store_new();
    if (qlm_safetensors_load(pa, sa) != 0 || qlm_safetensors_load(pb, sb) != 0) fail_msg("%s", qlm_last_error());
    assert_int_equal(qlm_store_count(sa), qlm_store_count(sb));
    double worst = 0;
    *identical = 1;
    for (int i = 0; i < qlm_store_count(sa); i++) {
        const qlm_tensor_entry *x = qlm_store_at(sa, i), *y = qlm_store_find(sb, x->name);
        assert_non_null(y);
        assert_int_equal(x->nbytes, y->nbytes);
        assert_int_equal(x->dtype, QLM_F32);
        *identical &= memcmp(x->data, y->data, x->nbytes) == 0;
        const float *u = x->data, *v = y->data;
        long n = (long)(x->nbytes / sizeof(float));
        double big = 0, diff = 0;
        for (long k = 0; k < n; k++) {
            big = fmax(big, fabs(u[k]));
            diff = fmax(diff, fabs((double)u[k] - v[k]));
        }
        if (big > 0 && diff / big > worst) worst = diff / big;
    }
    qlm_store_free(sa);
    qlm_store_free(sb);
    return worst;
}

/* Every rank's gathers of the run in summary.json: *unused, those no pass used (a prefetch of a unit
 * the passes then did not take). Returns the gathers. */
static long read_gathers(const char *name, long *unused) {
    char path[500];
    snprintf(path, sizeof path, "%s/%s/summary.json", g_dir, name);
    char *text = test_read_file(path, NULL);
    assert_non_null(text);
    cJSON *j = cJSON_Parse(text);
    const cJSON *ranks = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "dist"), "per_rank"), *r;
    long gathers = 0;
    *unused = 0;
    cJSON_ArrayForEach(r, ranks) {
        gathers += (long)cJSON_GetNumberValue(cJSON_GetObjectItem(r, "gathers"));
        *unused += (long)cJSON_GetNumberValue(cJSON_GetObjectItem(r, "gathers_unused"));
    }
    cJSON_Delete(j);
    free(text);
    return gathers;
}

/* Runs `name` (extra: more flags, or NULL) and holds it to the reference run `ref`: every step's
 * loss and the final weights; under FSDP over several ranks, every gather is used. */
static void check_against(const char *ref, const char *name, int mode, int np, const char *split, double loss_tol,
                          double weight_tol, const char *extra) {
    assert_int_equal(train(name, mode, np, split, extra), 0);
    double want[STEPS], got[STEPS], worst = 0;
    assert_int_equal(read_losses(ref, want), STEPS);
    assert_int_equal(read_losses(name, got), STEPS);
    for (int s = 0; s < STEPS; s++) worst = fmax(worst, fabs(got[s] - want[s]));
    int identical;
    double w = weight_diff(ref, name, mode, &identical);
    print_message("%-22s %d ranks %-34s loss within %.2g, weights within %.2g%s\n", k_modes[mode], np,
                  split ? split : "", worst, w, identical ? " (identical)" : "");
    assert_true(worst <= loss_tol);
    assert_true(w <= weight_tol);
    if (np > 1 && split && strstr(split, "fsdp")) {
        long unused, gathers = read_gathers(name, &unused);
        print_message("%-22s %d ranks %-34s %ld gathers, %ld unused\n", k_modes[mode], np, split, gathers, unused);
        assert_true(gathers > 0);
        assert_int_equal(unused, 0);
    }
}

/* Every strategy at 1 (bit-identical to one process), 2 and 4 ranks, and hybrid at 4 ranks. */
static void equivalence(int mode, const char *tag, double loss_tol, double weight_tol) {
    prepare();
    char ref[64], name[64];
    snprintf(ref, sizeof ref, "%s-ref", tag);
    assert_int_equal(train(ref, mode, 0, NULL, NULL), 0);
    static const char *const shards[] = {"ddp", "zero1", "zero2", "fsdp"};
    for (int k = 0; k < 4; k++)
        for (int np = 1; np <= 4; np *= 2) {
            char split[64];
            snprintf(split, sizeof split, "--shard %s", shards[k]);
            snprintf(name, sizeof name, "%s-%s-%d", tag, shards[k], np);
            check_against(ref, name, mode, np, split, np == 1 ? 0 : loss_tol, np == 1 ? 0 : weight_tol, NULL);
        }
    snprintf(name, sizeof name, "%s-hybrid", tag);
    check_against(ref, name, mode, 4, "--shard fsdp --sharding-factor 2", loss_tol, weight_tol, NULL);
}

static void test_full_f32(void **state) {
    (void)state;
    equivalence(FULL, "full", 1e-5, 1e-4);
}

static void test_lora(void **state) {
    (void)state;
    equivalence(LORA, "lora", 1e-3, 1e-3);
}

/* Mixed precision and QAT under the strategies that split their compute copies and scales, and
 * LoRA on an INT8 base that FSDP splits in its storage dtype. */
static void test_bf16_qat_int8(void **state) {
    (void)state;
    prepare();
    /* BF16 compute: a rank's share of the rows takes other kernel forms than the whole batch (the
     * AVX512_BF16 products round x per pair): losses 1.1e-3 apart on an AMD EPYC, 7e-4 with VNNI. */
    assert_int_equal(train("bf16-ref", BF16, 0, NULL, NULL), 0);
    check_against("bf16-ref", "bf16-fsdp", BF16, 4, "--shard fsdp", 2e-3, 1e-3, NULL);
    check_against("bf16-ref", "bf16-zero1", BF16, 2, "--shard zero1", 2e-3, 1e-3, NULL);
    assert_int_equal(train("qat-ref", QAT, 0, NULL, NULL), 0);
    check_against("qat-ref", "qat-zero2", QAT, 4, "--shard zero2", 5e-3, 1e-3, NULL);
    check_against("qat-ref", "qat-hybrid", QAT, 4, "--shard fsdp --sharding-factor 2", 5e-3, 1e-3, NULL);
    /* On an INT8 base, x's 16-bit rounding turns a last-bit difference in a sum into a whole step,
     * so the adapter's small tensors carry the noise of the kernels themselves: one process with
     * OpenBLAS's Prescott kernels and one with its SkylakeX ones ended 1.1e-2 apart on a lora_B
     * (relative to its largest value) while their losses agreed to 1e-5. The losses are the sharp
     * check here; the weights' bound only catches a step that went wrong. */
    assert_int_equal(train("int8-ref", LORA_INT8, 0, NULL, NULL), 0);
    check_against("int8-ref", "int8-fsdp", LORA_INT8, 4, "--shard fsdp", 1e-3, 3e-2, NULL);
}

/* A model folder dir holding only config.json, and the flags that train it from random weights with
 * the tokenizer tok. */
static void random_model(const char *dir, const char *config, const char *tok, char *flags, size_t cap) {
    char path[600];
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/config.json", dir);
    assert_int_equal(test_write_file(path, config, strlen(config)), 0);
    snprintf(flags, cap, "-m %s --random-weights -t %s", dir, tok);
}

/* A small T5 v1.1 (gated GELU, untied head; FLAN-T5's tokenizer, random weights): its passes gather
 * and reduce-scatter the encoder's and decoder's blocks and the shared unit (embedding, both final
 * norms, both bias tables, the head, and the head norm derived from the decoder's) as Llama's do. */
static void test_t5(void **state) {
    (void)state;
    prepare();
    char tok[512], extra[1200];
    test_asset(tok, sizeof tok, "flan-t5-small/tokenizer.json");
    REQUIRE_ASSET(tok);
    random_model(g_t5, "{\"architectures\": [\"T5ForConditionalGeneration\"], \"model_type\": \"t5\", \"d_ff\": 128, "
                       "\"d_kv\": 16, \"d_model\": 64, \"decoder_start_token_id\": 0, \"dense_act_fn\": \"gelu_new\", "
                       "\"eos_token_id\": 1, \"feed_forward_proj\": \"gated-gelu\", \"layer_norm_epsilon\": 1e-06, "
                       "\"num_decoder_layers\": 2, \"num_heads\": 4, \"num_layers\": 2, \"pad_token_id\": 0, "
                       "\"relative_attention_max_distance\": 128, \"relative_attention_num_buckets\": 32, "
                       "\"tie_word_embeddings\": false, \"vocab_size\": 32128}",
                 tok, extra, sizeof extra);
    /* The losses are the sharp check; AdamW turns last-bit differences of near-zero gradients (other
     * OpenBLAS blockings for a rank's rows) into whole steps: weights 7.7e-4 apart on an AMD EPYC
     * (its Zen kernels) with losses within 1.3e-7, under 1e-4 on an Intel Xeon. */
    assert_int_equal(train("t5-ref", FULL, 0, NULL, extra), 0);
    check_against("t5-ref", "t5-fsdp", FULL, 4, "--shard fsdp", 1e-5, 2e-3, extra);
    check_against("t5-ref", "t5-zero2", FULL, 2, "--shard zero2", 1e-5, 2e-3, extra);
    check_against("t5-ref", "t5-ddp", FULL, 2, "--shard ddp", 1e-5, 2e-3, extra);
}

/* LoRA on a Phi-3 (random weights, the stories' tokenizer): the adapter's stored qkv_proj and
 * gate_up_proj pairs are the parameters the ranks reduce and split the optimizer over, while the
 * passes apply their q/k/v and gate/up parts; sharded runs train what one process does and save the
 * pairs under peft's names. */
static void test_phi3_fused_lora(void **state) {
    (void)state;
    prepare();
    char dir[300], tok[700], extra[1200];
    snprintf(dir, sizeof dir, "%s/phi3", g_dir);
    snprintf(tok, sizeof tok, "%s/tokenizer.json", g_model);
    random_model(dir, "{\"architectures\": [\"Phi3ForCausalLM\"], \"model_type\": \"phi3\", \"hidden_size\": 64, "
                      "\"intermediate_size\": 128, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
                      "\"num_key_value_heads\": 2, \"vocab_size\": 2048, \"max_position_embeddings\": 256, "
                      "\"rms_norm_eps\": 1e-05, \"tie_word_embeddings\": false, \"bos_token_id\": 1, "
                      "\"eos_token_id\": 2, \"sliding_window\": null}",
                 tok, extra, sizeof extra);
    assert_int_equal(train("phi3-ref", LORA, 0, NULL, extra), 0);
    check_against("phi3-ref", "phi3-fsdp", LORA, 4, "--shard fsdp", 1e-3, 1e-3, extra);
    check_against("phi3-ref", "phi3-zero2", LORA, 2, "--shard zero2", 1e-3, 1e-3, extra);
    char saved[600];
    snprintf(saved, sizeof saved, "%s/phi3-fsdp/%s", g_dir, weights_file(LORA));
    qlm_tensor_store *st = qlm_store_new();
    if (qlm_safetensors_load(saved, st) != 0) fail_msg("%s", qlm_last_error());
    assert_non_null(qlm_store_find(st, "base_model.model.model.layers.1.self_attn.qkv_proj.lora_B.weight"));
    assert_non_null(qlm_store_find(st, "base_model.model.model.layers.1.mlp.gate_up_proj.lora_A.weight"));
    assert_null(qlm_store_find(st, "base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight"));
    qlm_store_free(st);
}

/* Two runs of one setting agree bit for bit (the reductions' order is fixed). */
static void test_reruns_are_bit_identical(void **state) {
    (void)state;
    prepare();
    const char *splits[] = {"--shard fsdp", "--shard fsdp --sharding-factor 2", "--shard ddp"};
    for (int k = 0; k < 3; k++) {
        char a[64], b[64];
        snprintf(a, sizeof a, "again-%d-a", k);
        snprintf(b, sizeof b, "again-%d-b", k);
        assert_int_equal(train(a, FULL, 4, splits[k], NULL), 0);
        assert_int_equal(train(b, FULL, 4, splits[k], NULL), 0);
        int identical;
        weight_diff(a, b, FULL, &identical);
        double la[STEPS], lb[STEPS];
        assert_int_equal(read_losses(a, la), STEPS);
        assert_int_equal(read_losses(b, lb), STEPS);
        assert_true(identical);
        assert_memory_equal(la, lb, sizeof la);
    }
}

/* The pid of world rank `rank` of a job training into out: a qlm process whose command line
 * names out and whose environment says OMPI_COMM_WORLD_RANK=rank; 0 when none (yet). */
static pid_t rank_pid(const char *out, int rank) {
    DIR *d = opendir("/proc");
    assert_non_null(d);
    struct dirent *e;
    pid_t found = 0;
    char want[64];
    snprintf(want, sizeof want, "OMPI_COMM_WORLD_RANK=%d", rank);
    while (!found && (e = readdir(d)) != NULL) {
        char path[300], buf[65536];
        pid_t pid = (pid_t)atoi(e->d_name);
        if (pid <= 0) continue;
        snprintf(path, sizeof path, "/proc/%d/environ", pid);
        FILE *f = fopen(path, "rb");
        if (!f) continue;
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        int is_rank = 0;
        for (size_t i = 0; i < n; i += strlen(buf + i) + 1) is_rank |= strcmp(buf + i, want) == 0;
        if (!is_rank) continue;
        snprintf(path, sizeof path, "/proc/%d/cmdline", pid);
        f = fopen(path, "rb");
        if (!f) continue;
        n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[n] = 0;
        for (size_t i = 0; i < n; i++)
            if (!buf[i]) buf[i] = ' ';
        if (strstr(buf, out) && strstr(buf, " train ")) found = pid;
    }
    closedir(d);
    return found;
}

/* SIGKILL of rank 2 of 4 mid-run: the job ends non-zero within 30 s, saying which rank; the
 * committed checkpoint is whole; --resume reaches the uninterrupted run's weights bit for bit. */
static void test_killed_rank_and_resume(void **state) {
    (void)state;
    prepare();
    const char *split = "--shard fsdp";
    assert_int_equal(train("whole", FULL, 4, split, NULL), 0);
    char out[400], cmd[4096];
    snprintf(out, sizeof out, "%s/killed", g_dir);
    snprintf(cmd, sizeof cmd,
             TEST_MPIRUN " -np 4 %s train -m %s --data %s --out %s %s --steps %d --batch 2 --seq-len 64 --save-every 2 %s > "
             "%s.log 2>&1; echo $? > %s.rc",
             test_qlm_bin(), g_model, g_data, out, k_modes[FULL], STEPS, split, out, out);
    pid_t job = fork();
    assert_true(job >= 0);
    if (job == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    /* Wait for the second committed checkpoint, then kill rank 2. */
    char manifest[500];
    snprintf(manifest, sizeof manifest, "%s/metrics.jsonl", out);
    pid_t victim = 0;
    for (int i = 0; i < 6000 && !victim; i++) {
        usleep(5000);
        size_t len = 0;
        char *m = test_read_file(manifest, &len);
        int lines = 0;
        for (size_t k = 0; m && k < len; k++) lines += m[k] == '\n';
        free(m);
        if (lines >= 4) victim = rank_pid(out, 2);
    }
    assert_true(victim > 0);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    kill(victim, SIGKILL);
    int status;
    waitpid(job, &status, 0);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    char path[500];
    snprintf(path, sizeof path, "%s.rc", out);
    char *rc = test_read_file(path, NULL), *log;
    snprintf(path, sizeof path, "%s.log", out);
    log = test_read_file(path, NULL);
    assert_non_null(rc);
    assert_non_null(log);
    print_message("killed rank 2: the job ended after %.1f s with exit %d\n", secs, atoi(rc));
    assert_int_not_equal(atoi(rc), 0);
    assert_true(secs < 30);
    assert_true(strstr(log, "rank 2") != NULL);
    free(rc);
    free(log);
    test_check_checkpoint_intact(out);
    assert_int_equal(train("killed", FULL, 4, split, "--resume"), 0);
    int identical;
    weight_diff("whole", "killed", FULL, &identical);
    assert_true(identical);
}

/* The checkpoint of a 4-rank FSDP run: another launch is refused with what differs, then resumed
 * with --reshard by 2 ranks under ZeRO-1 and by one process; a checkpoint of another model is
 * refused naming both models. */
static void test_reshard_and_mismatch(void **state) {
    (void)state;
    prepare();
    char out[400], cmd[4096];
    snprintf(out, sizeof out, "%s/reshard", g_dir);
    char *log = NULL;
    int rc = test_mpirun(&log, NULL, 4, "%s train -m %s --data %s --out %s %s --steps 4 --batch 2 --seq-len 64 "
                                        "--save-every 2 --shard fsdp",
                         test_qlm_bin(), g_model, g_data, out, k_modes[FULL]);
    assert_int_equal(rc, 0);
    free(log);
    /* Continue to STEPS under another split: refused, then accepted with --reshard. */
    const char *fmt = "%s train -m %s --data %s --out %s %s --steps 4 --batch %d --seq-len 64 --shard zero1 --resume %s";
    rc = test_mpirun(&log, NULL, 2, fmt, test_qlm_bin(), g_model, g_data, out, k_modes[FULL], 4, "");
    print_message("%s", strstr(log, "made by") ? strstr(log, "made by") : log);
    assert_int_not_equal(rc, 0);
    assert_non_null(strstr(log, "made by 4 ranks with --shard fsdp"));
    assert_non_null(strstr(log, "--reshard"));
    free(log);
    rc = test_mpirun(&log, NULL, 2, fmt, test_qlm_bin(), g_model, g_data, out, k_modes[FULL], 4, "--reshard");
    if (rc != 0) print_message("%s\n", log);
    assert_int_equal(rc, 0);
    free(log);
    /* A different model: refused, both named. */
    char other[512];
    test_asset(other, sizeof other, "stories260K/stories260K.bin");
    snprintf(cmd, sizeof cmd, "train -m %s -t %s --data %s --out %s --full --steps 4 --batch 8 --seq-len 64 --resume "
                              "--reshard 2>&1",
             other, "../shared/assets/stories260K/tok512.bin", g_data, out);
    rc = test_run_qlm(&log, "%s", cmd);
    assert_int_not_equal(rc, 0);
    assert_non_null(strstr(log, "made for the model"));
    assert_non_null(strstr(log, "tinystories-656K-hf"));
    free(log);
}

/* Flags that cannot work are refused before anything trains. */
static void test_bad_flags(void **state) {
    (void)state;
    prepare();
    char *log = NULL;
    int rc = test_mpirun(&log, NULL, 4, "%s train -m %s --data %s --out %s/bad --full --steps 2 --batch 2 --shard fsdp "
                                        "--sharding-factor 3",
                         test_qlm_bin(), g_model, g_data, g_dir);
    assert_int_not_equal(rc, 0);
    assert_non_null(strstr(log, "sharding factor 3 must divide the 4 ranks"));
    free(log);
    rc = test_run_qlm(&log, "train -m %s --data %s --out %s/bad --shard raid 2>&1", g_model, g_data, g_dir);
    assert_int_equal(rc, 2);
    assert_non_null(strstr(log, "--shard must be"));
    free(log);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_full_f32),
        cmocka_unit_test(test_lora),
        cmocka_unit_test(test_bf16_qat_int8),
        cmocka_unit_test(test_t5),
        cmocka_unit_test(test_phi3_fused_lora),
        cmocka_unit_test(test_reruns_are_bit_identical),
        cmocka_unit_test(test_killed_rank_and_resume),
        cmocka_unit_test(test_reshard_and_mismatch),
        cmocka_unit_test(test_bad_flags),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
