/* tessera quantize: a Hugging Face checkpoint or a GGUF file to a GGUF file of another type. */
#include <stdio.h>
#include <sys/stat.h>

#include "cli/cli.h"

int cmd_quantize(int argc, char **argv) {
    const char *in = NULL, *out = NULL, *type = NULL, *v;
    long threads = 0;
    for (int i = 1; i < argc; i++) {
        if ((v = cli_opt_value(argc, argv, &i, "-t", "--type")))
            type = v;
        else if ((v = cli_opt_value(argc, argv, &i, NULL, "--threads"))) {
            if (!cli_parse_int(v, 1, 1024, &threads)) return cli_usage("bad --threads '%s'", v);
        } else if (argv[i][0] == '-' && argv[i][1])
            return cli_usage("quantize: unknown option '%s'", argv[i]);
        else if (!in)
            in = argv[i];
        else if (!out)
            out = argv[i];
        else
            return cli_usage("quantize: unexpected argument '%s'", argv[i]);
    }
    if (!in || !out || !type) return cli_usage("quantize needs IN OUT.gguf --type TYPE");
    double t0 = cli_now();
    if (ts_quantize_model(in, out, type, (int)threads) != TS_OK) return cli_fail("quantize");
    struct stat sb;
    double mib = stat(out, &sb) == 0 ? (double)sb.st_size / (1 << 20) : 0;
    printf("wrote %s (%s, %.1f MiB) in %.1f s\n", out, type, mib, cli_now() - t0);
    /* the GGUF carries a tokenizer only when the input had one we convert */
    ts_tokenizer *tok;
    if (ts_tokenizer_open(out, &tok) == TS_OK)
        ts_tokenizer_free(tok);
    else
        printf("note: no tokenizer in %s (the input has no tokenizer.json); pass one with the "
               "model when running\n",
               out);
    return 0;
}
