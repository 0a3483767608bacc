/* The part of the float (F32 / F16 / BF16) matmul kernels that is the same on every SIMD ISA:
 * the prefill driver (panels of packed weights against tiles of tokens), the choice between it
 * and the decode kernel, and the kernel table. Included at the end of matmul_avx2.c and
 * matmul_avx512.c, which define before it:
 *   PF_ROWS, PF_TOK, PF_KC, PF_PANELS   the prefill panel and tile sizes
 *   DEC_MAX_TOK, DEC_ROWS_MAX           decode up to this many tokens, its row block
 *   pack_panel, pf_tile, decode          the ISA's own pieces
 *   MMF_TABLE                            the name of the kernel table to define
 *   MMF_ALIGN                            the vector size, for the packed panels on the stack
 * Every function here is inlined into the ISA's file, so each compiles for that ISA alone. */

/* Every whole tile of PF_TOK tokens against every panel, then the leftover tokens. */
static void pf_tiles(const float (*wp)[PF_KC * PF_ROWS], int np, int nr_last, int kc,
                     const float *x, int64_t ldx, int n_tok, float *y, int64_t ldy, int add) {
    int t = 0;
    for (; t + PF_TOK <= n_tok; t += PF_TOK)
        for (int p = 0; p < np; p++)
            pf_tile(wp[p], kc, x + t * ldx, ldx, y + t * ldy + p * PF_ROWS, ldy,
                    p + 1 < np ? PF_ROWS : nr_last, add, PF_TOK);
    x += t * ldx;
    y += t * ldy;
    for (int p = 0; p < np; p++) {
        int nr = p + 1 < np ? PF_ROWS : nr_last;
        float *yp = y + p * PF_ROWS;
        switch (n_tok - t) {
        case 0: break;
        case 1: pf_tile(wp[p], kc, x, ldx, yp, ldy, nr, add, 1); break;
        case 2: pf_tile(wp[p], kc, x, ldx, yp, ldy, nr, add, 2); break;
        case 3: pf_tile(wp[p], kc, x, ldx, yp, ldy, nr, add, 3); break;
        case 4: pf_tile(wp[p], kc, x, ldx, yp, ldy, nr, add, 4); break;
        default: pf_tile(wp[p], kc, x, ldx, yp, ldy, nr, add, 5); break; /* PF_TOK - 1 */
        }
    }
}

INLINE void prefill(ts_dtype dt, const cpu_mm_job *j, int64_t r0, int64_t r1) {
    float wp[PF_PANELS][PF_KC * PF_ROWS] __attribute__((aligned(MMF_ALIGN)));
    const size_t rb = j->row_bytes, esz = dt == TS_DTYPE_F32 ? 4 : 2;
    const int64_t group = PF_PANELS * PF_ROWS;
    for (int64_t rg = r0; rg < r1; rg += group) {
        int64_t rows = r1 - rg < group ? r1 - rg : group;
        int np = (int)((rows + PF_ROWS - 1) / PF_ROWS);
        int nr_last = (int)(rows - (int64_t)(np - 1) * PF_ROWS);
        for (int64_t k0 = 0; k0 < j->cols; k0 += PF_KC) {
            int kc = j->cols - k0 < PF_KC ? (int)(j->cols - k0) : PF_KC;
            for (int p = 0; p < np; p++) {
                /* where the next pack reads: next panel, else next columns, else next group */
                int64_t nrow = rg + (int64_t)(p + 1) * PF_ROWS, ncol = k0;
                if (p + 1 == np) {
                    ncol = k0 + PF_KC < j->cols ? k0 + PF_KC : 0;
                    nrow = ncol ? rg : rg + group;
                }
                pack_panel(dt, j, rg + (int64_t)p * PF_ROWS, p + 1 < np ? PF_ROWS : nr_last, k0,
                           kc, j->w + (size_t)nrow * rb + (size_t)ncol * esz, wp[p]);
            }
            pf_tiles((const float(*)[PF_KC * PF_ROWS])wp, np, nr_last, kc, j->x + k0, j->ldx,
                     j->n_tok, j->y + rg, j->ldy, k0 > 0);
        }
    }
}

INLINE void mm_run(ts_dtype dt, const cpu_mm_job *j, int64_t r0, int64_t r1) {
    if (j->n_tok <= DEC_MAX_TOK)
        decode(dt, j, r0, r1);
    else
        prefill(dt, j, r0, r1);
}

static void mm_f32(const cpu_mm_job *j, int64_t r0, int64_t r1) {
    mm_run(TS_DTYPE_F32, j, r0, r1);
}
static void mm_f16(const cpu_mm_job *j, int64_t r0, int64_t r1) {
    mm_run(TS_DTYPE_F16, j, r0, r1);
}
static void mm_bf16(const cpu_mm_job *j, int64_t r0, int64_t r1) {
    mm_run(TS_DTYPE_BF16, j, r0, r1);
}

const cpu_mm_kernel MMF_TABLE[TS_DTYPE_COUNT] = {
    [TS_DTYPE_F32] = {mm_f32, PF_ROWS, DEC_MAX_TOK, DEC_ROWS_MAX},
    [TS_DTYPE_F16] = {mm_f16, PF_ROWS, DEC_MAX_TOK, DEC_ROWS_MAX},
    [TS_DTYPE_BF16] = {mm_bf16, PF_ROWS, DEC_MAX_TOK, DEC_ROWS_MAX},
};
