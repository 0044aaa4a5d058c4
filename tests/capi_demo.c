/*
 * capi_demo.c — uses flash_attn_det through its public C header alone (no
 * Python, no torch) and checks it against a float64 reference computed here.
 *
 * Build (CPU):  gcc -O2 -std=c11 -ffp-contract=off -Icsrc tests/capi_demo.c \
 *                   csrc/fad_core.c csrc/fad_cpu.c csrc/fad_nocuda.c -lm -o demo
 * Build (CUDA): compile with -DFAD_DEMO_CUDA and link with the kernel files
 *               csrc/cuda/*.cu (nvcc) instead of fad_nocuda.c.
 *
 * Every check prints one line "CHECK <name> ok" or "CHECK <name> FAIL <why>";
 * the last line is "OK" (exit 0) when all passed, else "FAILED n" (exit 1).
 * With an argument DIR, config 0's inputs and outputs are written there as
 * raw little-endian files (q.bin k.bin v.bin out.bin lse.bin) so that a test
 * can compare them with the Python API bit for bit.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fad.h"

#ifdef FAD_DEMO_CUDA
#include <cuda_runtime_api.h>
#endif

static int g_failed = 0;

static void check(const char *name, int ok, const char *why)
{
    if (ok) {
        printf("CHECK %s ok\n", name);
    } else {
        printf("CHECK %s FAIL %s\n", name, why ? why : "");
        g_failed++;
    }
}

/* --- deterministic inputs: a 64-bit LCG, values in (-1, 1), never 0 ------- */

static uint64_t g_lcg = 0x853c49e6748fea9bULL;

static double lcg_uniform(void)
{
    g_lcg = g_lcg * 6364136223846793005ULL + 1442695040888963407ULL;
    uint32_t x = (uint32_t)(g_lcg >> 40); /* 24 bits */
    return ((double)x + 0.5) / 8388608.0 - 1.0; /* exact; never 0 */
}

static uint16_t f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static float bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* --- problem configurations ---------------------------------------------- */

typedef struct config {
    int B, Sq, Sk, H, Hk, D;
    int causal, wl, wr;
    float softcap;
    int alibi; /* 0 none, 1 (H,), 2 (B, H) */
    int split_size;
} config;

static const config CONFIGS[] = {
    /* causal, GQA, several splits (300 keys, split 128) */
    {2, 37, 300, 4, 2, 64, 1, -1, 0, 0.f, 0, 128},
    /* sliding window, softcap, alibi (H,), MQA, head dim 128 */
    {2, 64, 129, 2, 1, 128, 0, 20, 5, 8.f, 1, 512},
    /* causal with Sq > Sk (fully masked rows), alibi (B, H), head dim 40 */
    {1, 50, 20, 2, 2, 40, 1, -1, 0, 0.f, 2, 128},
};
#define NCONFIGS ((int)(sizeof CONFIGS / sizeof CONFIGS[0]))

typedef struct problem {
    config c;
    size_t nq, nk, nlse, nalibi;
    uint16_t *q, *k, *v, *out;
    float *lse, *alibi;
    double *ref, *ref_lse;
} problem;

static void problem_init(problem *pr, const config *c)
{
    memset(pr, 0, sizeof *pr);
    pr->c = *c;
    pr->nq = (size_t)c->B * c->Sq * c->H * c->D;
    pr->nk = (size_t)c->B * c->Sk * c->Hk * c->D;
    pr->nlse = (size_t)c->B * c->H * c->Sq;
    pr->nalibi = c->alibi == 0 ? 0 : c->alibi == 1 ? (size_t)c->H : (size_t)c->B * c->H;
    pr->q = malloc(pr->nq * 2);
    pr->k = malloc(pr->nk * 2);
    pr->v = malloc(pr->nk * 2);
    pr->out = malloc(pr->nq * 2);
    pr->lse = malloc(pr->nlse * 4);
    pr->alibi = pr->nalibi ? malloc(pr->nalibi * 4) : NULL;
    pr->ref = malloc(pr->nq * sizeof(double));
    pr->ref_lse = malloc(pr->nlse * sizeof(double));
    for (size_t i = 0; i < pr->nq; i++) pr->q[i] = f32_to_bf16((float)(2.0 * lcg_uniform()));
    for (size_t i = 0; i < pr->nk; i++) pr->k[i] = f32_to_bf16((float)(2.0 * lcg_uniform()));
    for (size_t i = 0; i < pr->nk; i++) pr->v[i] = f32_to_bf16((float)lcg_uniform());
    for (size_t i = 0; i < pr->nalibi; i++) pr->alibi[i] = (float)(0.3 + 0.25 * lcg_uniform());
}

static void problem_free(problem *pr)
{
    free(pr->q), free(pr->k), free(pr->v), free(pr->out), free(pr->lse), free(pr->alibi);
    free(pr->ref), free(pr->ref_lse);
}

/* Params for pr with the given tensor pointers (host or device). */
static void fill_params(fad_fwd_params *p, const problem *pr, const void *q, const void *k,
                        const void *v, void *out, float *lse, const float *alibi)
{
    const config *c = &pr->c;
    fad_fwd_params_init(p);
    p->q = q, p->k = k, p->v = v, p->out = out, p->softmax_lse = lse;
    p->alibi_slopes = c->alibi ? alibi : NULL;
    p->alibi_batch_stride = c->alibi == 2 ? c->H : 0;
    p->q_batch_stride = p->out_batch_stride = (int64_t)c->Sq * c->H * c->D;
    p->q_row_stride = p->out_row_stride = (int64_t)c->H * c->D;
    p->q_head_stride = p->out_head_stride = c->D;
    p->k_batch_stride = p->v_batch_stride = (int64_t)c->Sk * c->Hk * c->D;
    p->k_row_stride = p->v_row_stride = (int64_t)c->Hk * c->D;
    p->k_head_stride = p->v_head_stride = c->D;
    p->batch = c->B, p->seqlen_q = c->Sq, p->seqlen_k = c->Sk;
    p->num_heads = c->H, p->num_heads_k = c->Hk, p->head_dim = c->D;
    p->dtype = FAD_BFLOAT16;
    p->softmax_scale = (float)(1.0 / sqrt((double)c->D));
    p->softcap = c->softcap;
    p->causal = c->causal;
    p->window_left = c->wl;
    p->window_right = c->causal ? 0 : c->wr;
    p->split_size = c->split_size;
}

/* float64 reference: the documented semantics, written out directly. */
static void reference(problem *pr)
{
    const config *c = &pr->c;
    const int group = c->H / c->Hk;
    const double scale = 1.0 / sqrt((double)c->D);
    double *s = malloc(sizeof(double) * (c->Sk ? c->Sk : 1));
    for (int b = 0; b < c->B; b++)
        for (int h = 0; h < c->H; h++)
            for (int i = 0; i < c->Sq; i++) {
                const int hk = h / group;
                const long pos = (long)i + c->Sk - c->Sq;
                const int right = c->causal ? 0 : c->wr;
                double m = -INFINITY;
                for (int j = 0; j < c->Sk; j++) {
                    int visible = (c->wl < 0 || j >= pos - c->wl) && (right < 0 || j <= pos + right);
                    if (!visible) {
                        s[j] = -INFINITY;
                        continue;
                    }
                    double dot = 0;
                    for (int d = 0; d < c->D; d++)
                        dot += (double)bf16_to_f32(pr->q[(((size_t)b * c->Sq + i) * c->H + h) * c->D + d]) *
                               (double)bf16_to_f32(pr->k[(((size_t)b * c->Sk + j) * c->Hk + hk) * c->D + d]);
                    double x = dot * scale;
                    if (c->softcap > 0) x = c->softcap * tanh(x / c->softcap);
                    if (c->alibi) {
                        double slope = pr->alibi[(c->alibi == 2 ? b * c->H : 0) + h];
                        x -= slope * fabs((double)(pos - j));
                    }
                    s[j] = x;
                    if (x > m) m = x;
                }
                double *o = pr->ref + (((size_t)b * c->Sq + i) * c->H + h) * c->D;
                double l = 0;
                for (int d = 0; d < c->D; d++) o[d] = 0;
                if (m > -INFINITY) {
                    for (int j = 0; j < c->Sk; j++) {
                        if (s[j] == -INFINITY) continue;
                        double w = exp(s[j] - m);
                        l += w;
                        for (int d = 0; d < c->D; d++)
                            o[d] += w * bf16_to_f32(pr->v[(((size_t)b * c->Sk + j) * c->Hk + hk) * c->D + d]);
                    }
                    for (int d = 0; d < c->D; d++) o[d] /= l;
                }
                pr->ref_lse[((size_t)b * c->H + h) * c->Sq + i] = m > -INFINITY ? m + log(l) : -INFINITY;
            }
    free(s);
}

/* Compares pr->out/lse with the reference; returns 1 when within tolerance.
 * atol/rtol on out, lse_tol absolute; fully masked rows must be exactly 0 and -inf. */
static int compare(const problem *pr, double atol, double rtol, double lse_tol, char *why,
                   size_t why_len)
{
    double max_err = 0, max_lse = 0;
    int bad = 0, nan = 0, masked_bad = 0;
    for (size_t i = 0; i < pr->nq; i++) {
        double o = bf16_to_f32(pr->out[i]), r = pr->ref[i];
        if (o != o) { nan++; continue; }
        double e = fabs(o - r);
        if (e > max_err) max_err = e;
        if (e > atol + rtol * fabs(r)) bad++;
    }
    for (size_t i = 0; i < pr->nlse; i++) {
        double l = pr->lse[i], r = pr->ref_lse[i];
        if (r == -INFINITY) {
            if (l != -INFINITY) masked_bad++;
            continue;
        }
        double e = (l != l || isinf(l)) ? INFINITY : fabs(l - r);
        if (e > max_lse) max_lse = e;
    }
    /* fully masked rows: out exactly zero */
    const config *c = &pr->c;
    for (int b = 0; b < c->B; b++)
        for (int h = 0; h < c->H; h++)
            for (int i = 0; i < c->Sq; i++)
                if (pr->ref_lse[((size_t)b * c->H + h) * c->Sq + i] == -INFINITY)
                    for (int d = 0; d < c->D; d++)
                        if (pr->out[(((size_t)b * c->Sq + i) * c->H + h) * c->D + d] & 0x7fffu)
                            masked_bad++;
    printf("  max_abs_err=%.3g max_lse_err=%.3g bad=%d nan=%d masked_bad=%d\n", max_err, max_lse,
           bad, nan, masked_bad);
    snprintf(why, why_len, "max_abs_err=%.3g lse_err=%.3g bad=%d nan=%d masked_bad=%d", max_err,
             max_lse, bad, nan, masked_bad);
    return bad == 0 && nan == 0 && masked_bad == 0 && max_lse <= lse_tol;
}

static int msg_has(const char *msg, const char *word) { return strstr(msg, word) == msg; }

/* --- fad_fwd_check: every bad value is refused with a message naming the field */

static void check_validation(const problem *pr)
{
    char msg[256], why[512], name[64];
    fad_fwd_params p, good;
    fill_params(&good, pr, pr->q, pr->k, pr->v, pr->out, pr->lse, pr->alibi);
    check("check_good_params", fad_fwd_check(&good, msg, sizeof msg) == FAD_OK, msg);

    struct {
        const char *field;
        fad_status want;
        int which;
    } cases[] = {
        {"head_dim", FAD_ERR_VALUE, 0},  {"head_dim", FAD_ERR_VALUE, 1},
        {"split_size", FAD_ERR_VALUE, 2}, {"split_size", FAD_ERR_VALUE, 3},
        {"num_heads_k", FAD_ERR_VALUE, 4}, {"window_size", FAD_ERR_VALUE, 5},
        {"dtype", FAD_ERR_DTYPE, 6},     {"softmax_scale", FAD_ERR_VALUE, 7},
        {"softcap", FAD_ERR_VALUE, 8},   {"causal", FAD_ERR_VALUE, 9},
        {"schedule", FAD_ERR_VALUE, 10}, {"alibi_slopes", FAD_ERR_VALUE, 11},
        {"batch", FAD_ERR_VALUE, 12},    {"num_heads", FAD_ERR_VALUE, 13},
    };
    for (size_t t = 0; t < sizeof cases / sizeof cases[0]; t++) {
        p = good;
        switch (cases[t].which) {
        case 0: p.head_dim = 12; break;
        case 1: p.head_dim = 264; break;
        case 2: p.split_size = 100; break;
        case 3: p.split_size = 0; break;
        case 4: p.num_heads_k = 3; break;
        case 5: p.window_left = -2; break;
        case 6: p.dtype = (fad_dtype)7; break;
        case 7: p.softmax_scale = -1.f; break;
        case 8: p.softcap = -1.f; break;
        case 9: p.causal = 1, p.window_right = -1; break;
        case 10: p.schedule = (fad_schedule)9; break;
        case 11: p.alibi_batch_stride = 1; break;
        case 12: p.batch = -1; break;
        case 13: p.num_heads = 0; break;
        }
        msg[0] = 0;
        fad_status st = fad_fwd_check(&p, msg, sizeof msg);
        snprintf(name, sizeof name, "check_bad_%s_%d", cases[t].field, cases[t].which);
        snprintf(why, sizeof why, "status %d (%s), msg '%s'", (int)st, fad_status_string(st), msg);
        check(name, st == cases[t].want && msg_has(msg, cases[t].field), why);
    }

    /* NULL msg is allowed; a short buffer is truncated and terminated. */
    p = good;
    p.head_dim = 12;
    check("check_null_msg", fad_fwd_check(&p, NULL, 0) == FAD_ERR_VALUE, "");
    char small[8];
    memset(small, 'x', sizeof small);
    fad_fwd_check(&p, small, sizeof small);
    check("check_short_msg_terminated", memchr(small, 0, sizeof small) != NULL, "");

    /* fad_fwd_params_init's defaults, as documented in fad.h */
    fad_fwd_params_init(&p);
    check("init_defaults",
          p.window_left == -1 && p.window_right == -1 && p.deterministic == 1 &&
              p.split_size == 512 && p.schedule == FAD_SCHEDULE_AUTO && p.causal == 0 &&
              p.softcap == 0.f && p.alibi_slopes == NULL && p.dropout_p == 0.f &&
              p.dropout_seq_ids == NULL && p.dropout_seed_offset == NULL && p.num_threads == 0,
          "");
    /* fad.h: "scale 0 means 1/sqrt(head_dim)": a default-scale call must be accepted */
    p = good;
    p.softmax_scale = 0.f;
    msg[0] = 0;
    fad_status st = fad_fwd_check(&p, msg, sizeof msg);
    snprintf(why, sizeof why, "fad_fwd_check with softmax_scale 0 returned %d: %s", (int)st, msg);
    check("default_scale_accepted", st == FAD_OK, why);

    check("status_string", strlen(fad_status_string(FAD_ERR_VALUE)) > 0 &&
                               strcmp(fad_status_string(FAD_OK), "ok") == 0, "");
}

/* --- the CPU entry -------------------------------------------------------- */

static int run_cpu_threads(problem *pr, fad_schedule schedule, int threads)
{
    fad_fwd_params p;
    char msg[256] = "";
    fill_params(&p, pr, pr->q, pr->k, pr->v, pr->out, pr->lse, pr->alibi);
    p.schedule = schedule;
    p.num_threads = threads;
    fad_status st = fad_fwd_cpu(&p, msg, sizeof msg);
    if (st != FAD_OK) printf("  fad_fwd_cpu: %s\n", msg);
    return st == FAD_OK;
}

static int run_cpu(problem *pr, fad_schedule schedule) { return run_cpu_threads(pr, schedule, 1); }

static void check_cpu(problem *pr, int idx)
{
    char name[64], why[512];
    snprintf(name, sizeof name, "cpu_reference_%d", idx);
    int ok = run_cpu(pr, FAD_SCHEDULE_AUTO);
    ok = ok && compare(pr, 2e-5, 1.0 / 256, 1e-4, why, sizeof why);
    check(name, ok, why);

    /* run to run: identical bits, here on 3 threads (the count changes none) */
    uint16_t *out1 = malloc(pr->nq * 2);
    float *lse1 = malloc(pr->nlse * 4);
    memcpy(out1, pr->out, pr->nq * 2);
    memcpy(lse1, pr->lse, pr->nlse * 4);
    memset(pr->out, 0xff, pr->nq * 2);
    run_cpu_threads(pr, FAD_SCHEDULE_AUTO, 3);
    snprintf(name, sizeof name, "cpu_run_to_run_%d", idx);
    check(name, !memcmp(out1, pr->out, pr->nq * 2) && !memcmp(lse1, pr->lse, pr->nlse * 4), "");

    /* batch invariance: the last sequence alone gives the bits it had in the batch */
    if (pr->c.B > 1) {
        const config *c = &pr->c;
        size_t oq = (size_t)(c->B - 1) * c->Sq * c->H * c->D, ok_ = (size_t)(c->B - 1) * c->Sk * c->Hk * c->D;
        fad_fwd_params p;
        char msg[256] = "";
        uint16_t *o2 = malloc((size_t)c->Sq * c->H * c->D * 2);
        float *l2 = malloc((size_t)c->H * c->Sq * 4);
        const float *al = pr->alibi ? pr->alibi + (c->alibi == 2 ? (c->B - 1) * c->H : 0) : NULL;
        fill_params(&p, pr, pr->q + oq, pr->k + ok_, pr->v + ok_, o2, l2, al);
        p.batch = 1;
        fad_status st = fad_fwd_cpu(&p, msg, sizeof msg);
        snprintf(name, sizeof name, "cpu_batch_invariance_%d", idx);
        check(name, st == FAD_OK && !memcmp(o2, pr->out + oq, (size_t)c->Sq * c->H * c->D * 2) &&
                        !memcmp(l2, pr->lse + (size_t)(c->B - 1) * c->H * c->Sq, (size_t)c->H * c->Sq * 4),
              msg);
        free(o2), free(l2);
    }

    /* a refused call writes nothing */
    {
        fad_fwd_params p;
        char msg[256] = "";
        memset(pr->out, 0x77, pr->nq * 2);
        memset(pr->lse, 0x77, pr->nlse * 4);
        fill_params(&p, pr, pr->q, pr->k, pr->v, pr->out, pr->lse, pr->alibi);
        p.split_size = 100;
        fad_status st = fad_fwd_cpu(&p, msg, sizeof msg);
        int untouched = 1;
        for (size_t i = 0; i < pr->nq; i++) untouched &= pr->out[i] == 0x7777;
        for (size_t i = 0; i < pr->nlse; i++) {
            uint32_t u;
            memcpy(&u, &pr->lse[i], 4);
            untouched &= u == 0x77777777u;
        }
        snprintf(name, sizeof name, "cpu_refused_writes_nothing_%d", idx);
        check(name, st == FAD_ERR_VALUE && msg_has(msg, "split_size") && untouched, msg);
    }
    free(out1), free(lse1);
    run_cpu(pr, FAD_SCHEDULE_AUTO); /* leave the good result for the dump */
}

/* fad_fwd_params.dropout_seed_offset: (seed, offset) read from memory give the bits of the same
 * two given as values (the CUDA path reads device memory the same way, through the same
 * fad_dropout_of), and the pointer wins over the values; seed 2^64 - 5 is -5 as an int64. */
static void check_cpu_dropout_pair(const problem *pr)
{
    const int64_t pair[2] = {-5, 1234};
    uint16_t *outs[3];
    fad_status st[3];
    char msg[256] = "";
    for (int r = 0; r < 3; r++) {
        fad_fwd_params p;
        outs[r] = malloc(pr->nq * 2);
        fill_params(&p, pr, pr->q, pr->k, pr->v, outs[r], NULL, pr->alibi);
        p.dropout_p = 0.25f;
        if (r == 0) /* the values */
            p.dropout_seed = UINT64_MAX - 4, p.dropout_offset = 1234;
        else if (r == 1) /* the pointer, with values that would give other bits */
            p.dropout_seed_offset = pair, p.dropout_seed = 1, p.dropout_offset = 2;
        else /* another offset: other bits, so the two above are not equal by accident */
            p.dropout_seed = UINT64_MAX - 4, p.dropout_offset = 1235;
        st[r] = fad_fwd_cpu(&p, msg, sizeof msg);
    }
    check("cpu_dropout_seed_offset_pointer",
          st[0] == FAD_OK && st[1] == FAD_OK && st[2] == FAD_OK &&
              !memcmp(outs[0], outs[1], pr->nq * 2) && memcmp(outs[0], outs[2], pr->nq * 2),
          msg);
    for (int r = 0; r < 3; r++) free(outs[r]);
}

static void dump(const problem *pr, const char *dir)
{
    const char *names[5] = {"q.bin", "k.bin", "v.bin", "out.bin", "lse.bin"};
    const void *data[5] = {pr->q, pr->k, pr->v, pr->out, pr->lse};
    size_t bytes[5] = {pr->nq * 2, pr->nk * 2, pr->nk * 2, pr->nq * 2, pr->nlse * 4};
    char path[1024];
    for (int i = 0; i < 5; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        FILE *f = fopen(path, "wb");
        if (!f || fwrite(data[i], 1, bytes[i], f) != bytes[i]) {
            check("dump", 0, path);
            if (f) fclose(f);
            return;
        }
        fclose(f);
    }
}

/* For each head dim D = 8, 16, ..., 256: a one-row problem run with softmax_scale 0 (the
 * C API's default), dumped as scale_D<D>.bin = q | k | v | out | lse, for the comparison
 * with the Python API's default, head_dim ** -0.5 (tests/test_capi.py). */
static void dump_default_scale(const char *dir)
{
    for (int D = 8; D <= FAD_MAX_HEAD_DIM; D += 8) {
        const config c = {1, 1, 3, 1, 1, D, 0, -1, -1, 0.f, 0, 512};
        problem pr;
        fad_fwd_params p;
        char msg[256] = "", path[1024];
        problem_init(&pr, &c);
        fill_params(&p, &pr, pr.q, pr.k, pr.v, pr.out, pr.lse, pr.alibi);
        p.softmax_scale = 0.f;
        fad_status st = fad_fwd_cpu(&p, msg, sizeof msg);
        snprintf(path, sizeof path, "%s/scale_D%d.bin", dir, D);
        FILE *f = st == FAD_OK ? fopen(path, "wb") : NULL;
        const int ok = f && fwrite(pr.q, 2, pr.nq, f) == pr.nq && fwrite(pr.k, 2, pr.nk, f) == pr.nk &&
                       fwrite(pr.v, 2, pr.nk, f) == pr.nk && fwrite(pr.out, 2, pr.nq, f) == pr.nq &&
                       fwrite(pr.lse, 4, pr.nlse, f) == pr.nlse;
        if (f) fclose(f);
        if (!ok) check("dump", 0, st == FAD_OK ? path : msg);
        problem_free(&pr);
    }
}

/* --- the CUDA entry ------------------------------------------------------- */

#ifdef FAD_DEMO_CUDA
#define CU(call)                                                                    \
    do {                                                                            \
        cudaError_t e_ = (call);                                                    \
        if (e_ != cudaSuccess) {                                                    \
            printf("  %s: %s\n", #call, cudaGetErrorString(e_));                     \
            return 0;                                                               \
        }                                                                           \
    } while (0)

/* Runs pr on the GPU with the given schedule; out/lse land in pr->out/lse. */
static int run_cuda(problem *pr, fad_schedule schedule, size_t *ws_bytes_out)
{
    void *dq, *dk, *dv, *dout, *dws = NULL;
    float *dlse, *dal = NULL;
    fad_fwd_params p;
    char msg[256] = "";
    size_t ws = 0;
    CU(cudaMalloc(&dq, pr->nq * 2));
    CU(cudaMalloc(&dk, pr->nk * 2));
    CU(cudaMalloc(&dv, pr->nk * 2));
    CU(cudaMalloc(&dout, pr->nq * 2));
    CU(cudaMalloc((void **)&dlse, pr->nlse * 4));
    if (pr->nalibi) {
        CU(cudaMalloc((void **)&dal, pr->nalibi * 4));
        CU(cudaMemcpy(dal, pr->alibi, pr->nalibi * 4, cudaMemcpyHostToDevice));
    }
    CU(cudaMemcpy(dq, pr->q, pr->nq * 2, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dk, pr->k, pr->nk * 2, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dv, pr->v, pr->nk * 2, cudaMemcpyHostToDevice));
    /* poison: every output element must be written */
    CU(cudaMemset(dout, 0xff, pr->nq * 2));   /* bf16 NaN */
    CU(cudaMemset(dlse, 0xff, pr->nlse * 4)); /* fp32 NaN */
    fill_params(&p, pr, dq, dk, dv, dout, dlse, dal);
    p.schedule = schedule;
    fad_status st = fad_fwd_workspace_size(&p, &ws, msg, sizeof msg);
    if (st != FAD_OK) {
        printf("  fad_fwd_workspace_size: %s\n", msg);
        return 0;
    }
    if (ws) CU(cudaMalloc(&dws, ws));
    st = fad_fwd_cuda(&p, dws, ws, NULL, msg, sizeof msg);
    if (st != FAD_OK) {
        printf("  fad_fwd_cuda: %s\n", msg);
        return 0;
    }
    CU(cudaDeviceSynchronize());
    CU(cudaMemcpy(pr->out, dout, pr->nq * 2, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(pr->lse, dlse, pr->nlse * 4, cudaMemcpyDeviceToHost));
    cudaFree(dq), cudaFree(dk), cudaFree(dv), cudaFree(dout), cudaFree(dlse);
    if (dal) cudaFree(dal);
    if (dws) cudaFree(dws);
    if (ws_bytes_out) *ws_bytes_out = ws;
    return 1;
}

static void check_cuda(problem *pr, int idx)
{
    char name[64], why[512];
    size_t ws1 = 0, ws2 = 0;
    uint16_t *o_one = malloc(pr->nq * 2);
    float *l_one = malloc(pr->nlse * 4);

    snprintf(name, sizeof name, "cuda_reference_%d", idx);
    int ok = run_cuda(pr, FAD_SCHEDULE_ONE_CTA, &ws1);
    /* tensor-core path: P is rounded to bf16 before P.V, so allow a few bf16 ulps */
    ok = ok && compare(pr, 1.0 / 128, 2.0 / 256, 1e-3, why, sizeof why);
    check(name, ok, why);
    memcpy(o_one, pr->out, pr->nq * 2);
    memcpy(l_one, pr->lse, pr->nlse * 4);

    snprintf(name, sizeof name, "cuda_schedules_equal_%d", idx);
    ok = run_cuda(pr, FAD_SCHEDULE_CTA_PER_SPLIT, &ws2);
    snprintf(why, sizeof why, "workspace one_cta=%zu cta_per_split=%zu", ws1, ws2);
    check(name, ok && ws1 == 0 && !memcmp(o_one, pr->out, pr->nq * 2) &&
                    !memcmp(l_one, pr->lse, pr->nlse * 4), why);

    snprintf(name, sizeof name, "cuda_auto_equal_%d", idx);
    ok = run_cuda(pr, FAD_SCHEDULE_AUTO, NULL);
    check(name, ok && !memcmp(o_one, pr->out, pr->nq * 2) && !memcmp(l_one, pr->lse, pr->nlse * 4), "");
    free(o_one), free(l_one);
}
#endif

int main(int argc, char **argv)
{
    const char *dump_dir = argc > 1 ? argv[1] : NULL;
    printf("flash_attn_det C API demo, version %s, has_cuda=%d\n", FAD_VERSION, fad_has_cuda());
#ifdef FAD_DEMO_CUDA
    check("has_cuda", fad_has_cuda() == 1, "");
#else
    check("has_cuda", fad_has_cuda() == 0, "");
    {
        /* the CUDA entries of a CPU-only build say so instead of crashing */
        problem pr;
        fad_fwd_params p;
        char msg[256] = "";
        size_t ws = 0;
        problem_init(&pr, &CONFIGS[0]);
        fill_params(&p, &pr, pr.q, pr.k, pr.v, pr.out, pr.lse, pr.alibi);
        fad_status a = fad_fwd_workspace_size(&p, &ws, msg, sizeof msg);
        fad_status b = fad_fwd_cuda(&p, NULL, 0, NULL, msg, sizeof msg);
        check("nocuda_entries", a == FAD_ERR_NO_CUDA && b == FAD_ERR_NO_CUDA && strstr(msg, "CUDA"),
              msg);
        problem_free(&pr);
    }
#endif
    for (int idx = 0; idx < NCONFIGS; idx++) {
        problem pr;
        problem_init(&pr, &CONFIGS[idx]);
        reference(&pr);
        printf("config %d: B=%d Sq=%d Sk=%d H=%d Hk=%d D=%d causal=%d window=(%d,%d) softcap=%g "
               "alibi=%d split=%d\n", idx, pr.c.B, pr.c.Sq, pr.c.Sk, pr.c.H, pr.c.Hk, pr.c.D,
               pr.c.causal, pr.c.wl, pr.c.wr, (double)pr.c.softcap, pr.c.alibi, pr.c.split_size);
        if (idx == 0) check_validation(&pr);
#ifdef FAD_DEMO_CUDA
        check_cuda(&pr, idx);
#else
        check_cpu(&pr, idx);
        if (idx == 0) check_cpu_dropout_pair(&pr);
#endif
        if (idx == 0 && dump_dir) dump(&pr, dump_dir);
        problem_free(&pr);
    }
#ifndef FAD_DEMO_CUDA
    if (dump_dir) dump_default_scale(dump_dir); /* (last: it draws from the inputs' LCG) */
#endif
    if (g_failed) {
        printf("FAILED %d\n", g_failed);
        return 1;
    }
    printf("OK\n");
    return 0;
}
