/* The panel cache (loaders/panel_cache.h) through the command line, on a copy of the default
 * model: the first load writes the W8A8 panels, the next maps them and computes the same numbers
 * bit for bit, a changed model file or a damaged cache file is packed and written again, files of
 * a model that is gone are removed, and --no-panel-cache leaves no file. Where the CPU has no byte
 * dot products W8A8 is off and no panels are written. A dtype asked for that is not a block type
 * (INT8 here) is kept the same way, on every CPU. */
#include "test_util.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <sys/stat.h>
#include <time.h>
#include <utime.h>

#include "../quant/matmul.h"

typedef struct {
    char dir[256], model[300], cache[300], text[300];
} fixture;

/* One perplexity run with QLM_CACHE=f->cache: its NLL, and its stderr into *err. */
static double run(const fixture *f, const char *flags, char **err) {
    const char *bin = getenv("QLM_BIN");
    char cmd[4096], err_path[600];
    snprintf(err_path, sizeof err_path, "%s/err", f->dir);
    snprintf(cmd, sizeof cmd, "QLM_CACHE=%s %s perplexity -m %s -f %s --json --threads 2 %s 2>%s", f->cache,
             bin && *bin ? bin : "build/qlm", f->model, f->text, flags, err_path);
    char *out = NULL;
    int rc = test_run_shell(&out, cmd);
    *err = test_read_file(err_path, NULL);
    if (rc != 0) fail_msg("%s: exit %d: %s", cmd, rc, *err ? *err : "");
    cJSON *j = cJSON_Parse(out);
    if (!j || !cJSON_IsNumber(cJSON_GetObjectItem(j, "nll"))) fail_msg("%s: %s", cmd, out);
    double nll = cJSON_GetObjectItem(j, "nll")->valuedouble;
    cJSON_Delete(j);
    free(out);
    return nll;
}

/* The one file in f->cache/panels (its path into out): 1, or 0 when there is none. */
static int panel_file(const fixture *f, char *out, size_t cap) {
    char dir[400];
    snprintf(dir, sizeof dir, "%s/panels", f->cache);
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *de; d && (de = readdir(d));) {
        if (de->d_name[0] == '.') continue;
        snprintf(out, cap, "%s/%s", dir, de->d_name);
        n++;
    }
    if (d) closedir(d);
    assert_true(n <= 1);
    return n;
}

static void expect_in(const char *text, const char *want) {
    if (!text || !strstr(text, want)) fail_msg("expected \"%s\" in: %s", want, text ? text : "(nothing)");
}

/* A temporary folder with a copy of the default model, a short text and an empty cache. */
static void fixture_open(fixture *f) {
    char src[512], text[512], cmd[2000];
    test_default_gguf(src, sizeof src);
    test_asset(text, sizeof text, "tinystories-text/tinystories_sample.txt");
    REQUIRE_ASSET(src);
    REQUIRE_ASSET(text);
    assert_non_null(test_tmpdir(f->dir, sizeof f->dir));
    snprintf(f->model, sizeof f->model, "%s/model.gguf", f->dir);
    snprintf(f->cache, sizeof f->cache, "%s/cache", f->dir);
    /* a hundred tokens: enough to compare, quick to run */
    snprintf(f->text, sizeof f->text, "%s/text.txt", f->dir);
    snprintf(cmd, sizeof cmd, "cp '%s' '%s' && head -c 400 '%s' > '%s'", src, f->model, text, f->text);
    assert_int_equal(system(cmd), 0);
}

static void test_panel_cache(void **state) {
    (void)state;
    fixture f;
    char cmd[2000], file[800];
    fixture_open(&f);
    char *err = NULL;
    const double packed = run(&f, "", &err);
    if (!qlm_matmul_w8a8()) {
        print_message("kernels %s have no W8A8: no panels to keep\n", qlm_matmul_isa());
        assert_int_equal(panel_file(&f, file, sizeof file), 0);
        free(err);
        assert_int_equal(test_remove_tree(f.dir), 0);
        return;
    }
    expect_in(err, "weights made at load (92.0 MiB) kept in");
    free(err);
    assert_int_equal(panel_file(&f, file, sizeof file), 1);
    /* read in place from the cache: the same NLL, bit for bit, and nothing written */
    struct stat before, after;
    assert_int_equal(stat(file, &before), 0);
    assert_true(run(&f, "", &err) == packed);
    assert_null(strstr(err, "kept in"));
    free(err);
    assert_int_equal(stat(file, &after), 0);
    assert_true(before.st_ino == after.st_ino && before.st_mtim.tv_nsec == after.st_mtim.tv_nsec);
    /* the model file changed (its time here): stale, packed and written again */
    struct utimbuf t = {.actime = time(NULL) - 100, .modtime = time(NULL) - 100};
    assert_int_equal(utime(f.model, &t), 0);
    assert_true(run(&f, "", &err) == packed);
    expect_in(err, "are stale (the model file changed): making them again");
    expect_in(err, "kept in");
    free(err);
    assert_true(run(&f, "", &err) == packed);
    assert_null(strstr(err, "stale"));
    free(err);
    /* another format of the same file has its own file */
    assert_true(run(&f, "--dtype q8_0", &err) != packed);
    expect_in(err, "kept in");
    free(err);
    snprintf(cmd, sizeof cmd, "ls '%s/panels' | grep -c safetensors | grep -qx 2", f.cache);
    assert_int_equal(system(cmd), 0);
    /* once their source is gone, its files go when another model's are written */
    char moved[300];
    snprintf(moved, sizeof moved, "%s/moved.gguf", f.dir);
    assert_int_equal(rename(f.model, moved), 0);
    snprintf(f.model, sizeof f.model, "%s", moved);
    assert_true(run(&f, "", &err) == packed);
    expect_in(err, "kept in");
    free(err);
    assert_int_equal(panel_file(&f, file, sizeof file), 1);
    expect_in(file, "/moved.gguf-");
    snprintf(cmd, sizeof cmd, "rm -f '%s'/panels/*", f.cache);
    assert_int_equal(system(cmd), 0);
    /* a cut-short cache file is refused by the safetensors reader, then replaced; a dead writer's
     * temporary file goes */
    assert_true(run(&f, "", &err) == packed);
    free(err);
    assert_int_equal(panel_file(&f, file, sizeof file), 1);
    assert_int_equal(truncate(file, 4096), 0);
    char orphan[900];
    snprintf(orphan, sizeof orphan, "%s.tmp.2147483646", file);
    assert_int_equal(test_write_file(orphan, "x", 1), 0);
    assert_true(run(&f, "", &err) == packed);
    expect_in(err, "are stale (");
    expect_in(err, "kept in");
    free(err);
    assert_int_equal(access(orphan, F_OK), -1);
    assert_int_equal(stat(file, &after), 0);
    assert_true(after.st_size > 90 << 20);
    /* --no-panel-cache neither reads nor writes */
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", f.cache);
    assert_int_equal(system(cmd), 0);
    assert_true(run(&f, "--no-panel-cache", &err) == packed);
    assert_null(strstr(err, "kept in"));
    free(err);
    assert_int_equal(panel_file(&f, file, sizeof file), 0);
    assert_int_equal(test_remove_tree(f.dir), 0);
}

/* --dtype int8 of the Q4_1 file: converted and kept on the first load, mapped from the file on the
 * next with the same NLL bit for bit; per channel is another format, another file. */
static void test_converted_cache(void **state) {
    (void)state;
    fixture f;
    char cmd[2000];
    fixture_open(&f);
    char *err = NULL;
    const double converted = run(&f, "--dtype int8", &err);
    expect_in(err, "weights made at load (128.2 MiB) kept in");
    expect_in(err, "0.0 MiB from the panel cache's mapping");
    free(err);
    assert_true(run(&f, "--dtype int8", &err) == converted);
    assert_null(strstr(err, "kept in"));
    expect_in(err, "128.2 MiB from the panel cache's mapping, 0.1 MiB in memory of qlm's own");
    free(err);
    assert_true(run(&f, "--dtype int8 --per-channel", &err) != converted);
    expect_in(err, "kept in");
    free(err);
    snprintf(cmd, sizeof cmd, "ls '%s/panels' | grep -c safetensors | grep -qx 2", f.cache);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(test_remove_tree(f.dir), 0);
}

/* The 8-byte length of the safetensors header at path plus 8: where its data start. */
static uint64_t data_start(const char *path) {
    unsigned char len[8];
    FILE *fp = fopen(path, "rb");
    assert_non_null(fp);
    assert_int_equal(fread(len, 1, 8, fp), 8);
    fclose(fp);
    return 8 + test_le64(len);
}

/* The default model as a BF16 safetensors folder (qlm quantize) at dir/name, its data starting
 * `at` bytes past a cache line. */
static void bf16_folder(const fixture *f, const char *name, int at, char *folder, size_t cap) {
    const char *bin = getenv("QLM_BIN");
    char cmd[2000], made[400], file[500], moved[500];
    snprintf(made, sizeof made, "%s/made", f->dir);
    if (access(made, F_OK) != 0) {
        snprintf(cmd, sizeof cmd, "%s quantize '%s' '%s' --dtype bf16 2>/dev/null", bin && *bin ? bin : "build/qlm",
                 f->model, made);
        assert_int_equal(system(cmd), 0);
    }
    snprintf(folder, cap, "%s/%s", f->dir, name);
    snprintf(cmd, sizeof cmd, "mkdir -p '%s' && cp '%s'/*.json '%s'", folder, made, folder);
    assert_int_equal(system(cmd), 0);
    snprintf(file, sizeof file, "%s/model.safetensors", made);
    snprintf(moved, sizeof moved, "%s/model.safetensors", folder);
    assert_int_equal(test_safetensors_repad(file, moved, at), 0);
    assert_int_equal(data_start(moved) % 64, (uint64_t)at);
}

/* A BF16 safetensors model whose data start off a cache line, as most files' do: its matrices are
 * copied onto lines at the first load and kept, and the next load maps them from the cache file,
 * whose data start on a line, writing nothing; the same model file laid out on lines is read in
 * place and leaves no file. The NLL is the same bits all along. */
static void test_copies_on_lines(void **state) {
    (void)state;
    fixture f;
    char file[800], off[sizeof f.model], on[sizeof f.model];
    fixture_open(&f);
    bf16_folder(&f, "off", 8, off, sizeof off);
    bf16_folder(&f, "on", 0, on, sizeof on);
    char *err = NULL;
    snprintf(f.model, sizeof f.model, "%s", off);
    const double nll = run(&f, "", &err);
    expect_in(err, "kept in");
    expect_in(err, "0.0 MiB read where the model file is mapped");
    free(err);
    assert_int_equal(panel_file(&f, file, sizeof file), 1);
    assert_int_equal(data_start(file) % 64, 0);
    assert_true(run(&f, "", &err) == nll);
    assert_null(strstr(err, "kept in"));
    expect_in(err, "0.0 MiB read where the model file is mapped, 256.5 MiB from the panel cache's mapping");
    free(err);
    assert_int_equal(test_remove_tree(f.cache), 0);
    snprintf(f.model, sizeof f.model, "%s", on);
    assert_true(run(&f, "", &err) == nll);
    expect_in(err, "256.5 MiB read where the model file is mapped, 0.0 MiB from the panel cache's mapping");
    assert_null(strstr(err, "kept in"));
    free(err);
    assert_int_equal(panel_file(&f, file, sizeof file), 0);
    assert_int_equal(test_remove_tree(f.dir), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_panel_cache), cmocka_unit_test(test_converted_cache),
                                       cmocka_unit_test(test_copies_on_lines)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
