/* tessera synth: write a random checkpoint with the real shapes of a known model size. */
#include <stdio.h>

#include "cli/cli.h"

int cmd_synth(int argc, char **argv) {
    const char *arch = "qwen35", *preset = NULL, *out = NULL, *dtype = "bf16", *v;
    long seed = 1;
    for (int i = 1; i < argc; i++) {
        if ((v = cli_opt_value(argc, argv, &i, NULL, "--arch")))
            arch = v;
        else if ((v = cli_opt_value(argc, argv, &i, NULL, "--preset")))
            preset = v;
        else if ((v = cli_opt_value(argc, argv, &i, "-o", "--output")))
            out = v;
        else if ((v = cli_opt_value(argc, argv, &i, NULL, "--dtype")))
            dtype = v;
        else if ((v = cli_opt_value(argc, argv, &i, NULL, "--seed"))) {
            if (!cli_parse_int(v, 0, 0x7fffffffL, &seed)) return cli_usage("bad --seed '%s'", v);
        } else
            return cli_usage("synth: unknown option '%s'", argv[i]);
    }
    if (!preset || !*preset || !out || !*out)
        return cli_usage("synth needs --preset NAME and -o DIR");
    double t0 = cli_now();
    if (ts_synth_write(arch, preset, dtype, (uint64_t)seed, out) != TS_OK)
        return cli_fail("synth failed");
    printf("wrote %s %s (%s) to %s in %.1f s\n", arch, preset, dtype, out, cli_now() - t0);
    return 0;
}
