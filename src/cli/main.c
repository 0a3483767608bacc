/* tessera: the command-line entry point. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} commands[] = {
    {"run", cmd_run,
     "run -m MODEL (--ids 1,2,3 | -p TEXT [--special]) -n N [--temp T] "
     "[--top-k K] [--top-p P] [--min-p P] [--seed S] [--threads K] [--print-ids] "
     "[--ignore-eos] [--json | --json-schema FILE | --grammar FILE] [--image FILE ...] [--video "
     "FILE ...]"},
    {"chat", cmd_chat,
     "chat -m MODEL [--system TEXT] [--think] [--think-budget N] [-n MAX] [--image FILE ...] "
     "[--video FILE ...] "
     "[--temp T] [--top-k K] "
     "[--top-p P] [--min-p P] [--seed S] [--threads K]"},
    {"serve", cmd_serve,
     "serve -m MODEL [--host 127.0.0.1] [--port 8080] [--ctx N] "
     "[--max-pending 32] [--parallel N (4 cpu, 16 cuda)] [--max-tokens-cap N] [--threads K] "
     "[--api-key KEY] [--reasoning-budget N] [--reasoning-budget-message TEXT] "
     "[--reasoning-effort-budgets low=N,...] [--reasoning-format none|deepseek|auto] "
     "[--reasoning-field reasoning_content|reasoning|both] "
     "[--alias NAME ...] [--any-model] [--cache-mb 1024] [--responses-store-mb 64] [--max-body-kb "
     "4096] [--drain-ms "
     "10000] "
     "[--idle-timeout 30] [--send-timeout 600] [--request-timeout 60] [--max-connections 1024] "
     "[--max-connections-per-ip N] [--cors-origins '*'|LIST|''] "
     "[--device cpu|cuda] [--prefill-chunk N] [--image-max-pixels N] [--allow-media-urls] "
     "[--media-url-max-mb 32] [--media-url-timeout 10] [--allowed-media-domains HOST,...] "
     "[--allowed-media-dir DIR] [--draft-max 8] "
     "[--draft-lookup] [--draft-mtp N] [--pooling last|mean|cls] [--matryoshka any|LENGTHS] "
     "[--lora PATH ...] [--lora-scaled PATH SCALE ...] [--lora-modules NAME=PATH ...] "
     "[--lora-init-without-apply]"},
    {"ppl", cmd_ppl,
     "ppl -m MODEL -f FILE [--ctx 512] [--stride 256] [--max-tokens N] "
     "[--threads K]"},
    {"tokenize", cmd_tokenize, "tokenize -m MODEL [--special] TEXT"},
    {"detokenize", cmd_detokenize, "detokenize -m MODEL [--skip-special] ID..."},
    {"logits", cmd_logits, "logits -m MODEL --ids 1,2,3 [-o FILE] [--hidden] [--threads K]"},
    {"embed", cmd_embed,
     "embed -m MODEL (-p TEXT [--special] | --ids 1,2,3) [--pooling last|mean|cls] "
     "[--threads K]"},
    {"bench", cmd_bench,
     "bench -m MODEL [-p 512] [-n 128] [-r REPS] [-d DEPTH] "
     "[--parallel 1,8,32] [--temp T] [--top-k K] [--top-p P] [--min-p P] [--seed S] "
     "[--draft-mtp N] [--threads K] [--no-bandwidth] [--json]"},
    {"quantize", cmd_quantize,
     "quantize IN OUT.gguf --type q8_0|q4_0|q4_k_m|f16|bf16|f32 "
     "[--threads K]"},
    {"synth", cmd_synth,
     "synth --arch qwen35 --preset 0.8b|2b|tiny[-vl] -o DIR [--dtype bf16|f16|f32] "
     "[--seed S]"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: tessera COMMAND [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  tessera %s\n", commands[i].help);
    fprintf(f, "\nCommon options: --threads K (default: all cores), --device cpu|cuda "
               "(cuda: builds with -DTESSERA_CUDA=ON), --lora PATH and --lora-scaled PATH SCALE "
               "(a PEFT LoRA adapter directory, at scale 1 or SCALE; repeatable), "
               "TESSERA_ISA=scalar|avx2|avx512 limits the CPU kernels.\n");
}

int main(int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "help") == 0 || strcmp(argv[1], "--help") == 0 ||
        strcmp(argv[1], "-h") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? CLI_EXIT_USAGE : 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(argv[1], commands[i].name) == 0) return commands[i].fn(argc - 1, argv + 1);
    return cli_usage("unknown command '%s'", argv[1]);
}
