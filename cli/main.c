#include <stdio.h>
#include <string.h>

#include "blas_core.h"
#include "commands.h"

#define QLM_VERSION "0.1.0"

static const struct {
    const char *name;
    int (*run)(int, char **);
    const char *summary;
} k_commands[] = {
    {"generate", cmd_generate, "continue a prompt"},
    {"chat", cmd_chat, "interactive multi-turn chat with the model's template"},
    {"info", cmd_info, "show a model's architecture, tensors and tokenizer"},
    {"tokenize", cmd_tokenize, "show the token ids (and pieces) of a text"},
    {"perplexity", cmd_perplexity, "mean negative log-likelihood of a text file"},
    {"quantize", cmd_quantize, "write a model in f32, bf16, f16 or int8 as safetensors"},
    {"convert", cmd_convert, "turn a GGUF or llama2.c model into a safetensors folder"},
    {"bench", cmd_bench, "prefill and decode speed"},
    {"summarize", cmd_summarize, "summarize a dialogue, or a JSONL file of them in batches"},
    {"rouge", cmd_rouge, "ROUGE-1/2/L/Lsum of predictions against references (JSONL)"},
    {"lora", cmd_lora, "inspect a PEFT LoRA adapter, or merge one into a model"},
    {"train", cmd_train, "fine-tune: LoRA, full or quantization-aware, with exact resume"},
    {"serve", cmd_serve, "OpenAI-compatible HTTP server with continuous batching"},
    {"pull", cmd_pull, "download ORG/NAME from the Hugging Face hub into its cache"},
};

static void usage(FILE *f) {
    fprintf(f, "qlm: run and fine-tune transformer language models in low precision\n\n"
               "usage: qlm COMMAND [options]   (qlm COMMAND --help or qlm help COMMAND for its options)\n"
               "       qlm --version\n\ncommands:\n");
    for (size_t i = 0; i < sizeof k_commands / sizeof k_commands[0]; i++)
        fprintf(f, "  %-11s %s\n", k_commands[i].name, k_commands[i].summary);
}

int main(int argc, char **argv) {
    cli_blas_core_check(argv);
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "-V")) {
        printf("qlm %s\n", QLM_VERSION);
        return 0;
    }
    if (!strcmp(argv[1], "help") && argc > 2) { /* qlm help CMD: CMD --help */
        char *help_argv[] = {argv[2], "--help", NULL};
        for (size_t i = 0; i < sizeof k_commands / sizeof k_commands[0]; i++)
            if (!strcmp(argv[2], k_commands[i].name)) return k_commands[i].run(2, help_argv);
        fprintf(stderr, "qlm: unknown command '%s'\n\n", argv[2]);
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof k_commands / sizeof k_commands[0]; i++)
        if (strcmp(argv[1], k_commands[i].name) == 0) return k_commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "qlm: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
