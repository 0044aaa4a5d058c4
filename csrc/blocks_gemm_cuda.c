/*
 * blocks_gemm_cuda.c — the batch-invariant matrix product on the GPU (fad_blocks.h)
 * through cuBLASLt with a pinned algorithm.
 *
 * Why a pinned algorithm is row-invariant: cuBLAS chooses its kernel (tile shape,
 * split-K, stream-K) from the whole problem, the row count included, so a row's
 * bits change with the number of rows in the call. Here the algorithm is chosen
 * once per plan key -- (device, element type, transposes, the two dimensions that
 * do not vary, bias) -- from a reference size of the varying dimension, with
 * split-K off, and then used for every call: each output row is then reduced by one
 * tile over the whole K in that kernel's own order, wherever the row sits.
 *
 * Weight gradients (trans_a: reduced over the varying dimension, so no row
 * invariance to keep, only the same bits run to run) may also get a second,
 * split-K algorithm: a narrow projection's dW (a 128 x 896 output: 7 tiles) run
 * as one pass over a batch's tokens would leave most SMs idle. Its partial sums
 * stay fp32 in the workspace and a separate step adds them in a fixed order
 * (the COMPUTE_TYPE reduction scheme, never atomics), so the bits are a function
 * of the shape alone; it is used where the call's row count is at least
 * SPLIT_MIN_ROWS and the algorithm runs at it.
 *
 * Column-major view: row-major C (m x n) = A' B' is column-major C^T (n x m) =
 * B'^T A'^T, so cuBLASLt's "A" is our B and its "B" is our A; the varying row
 * count m is cuBLASLt's n. docs/design.md, "batch-invariant-models".
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blas_lt.h"
#include "fad_blocks.h"
#include "fad_internal.h"

/* The varying dimension's size the algorithm is chosen for: a training or prefill
 * batch's token count, where the product's speed matters most. */
#define REF_ROWS 8192
#define MAX_PLANS 512
/* Scratch a plan's algorithm may use (one buffer a device, allocated at the first plan
 * that needs it, so a CUDA graph captures calls only after their shapes were planned;
 * calls on several streams of one device at once must not share it). */
#define GEMM_WORKSPACE ((size_t)32 << 20)
/* Row counts the pinned algorithm is checked against when the plan is made. */
static const int64_t CHECK_ROWS[] = {1, 2, 7, 64, 1000, REF_ROWS};
/* A weight gradient's split-K algorithm: checked at these, used from the first. */
#define SPLIT_MIN_ROWS 1024
static const int64_t SPLIT_CHECK_ROWS[] = {SPLIT_MIN_ROWS, REF_ROWS};

static lt_api lt;
static int lt_loaded;  /* 1 loaded, -1 failed */
static char lt_error[256];
#define LT_MAX_DEVICES 64
static lt_handle handles[LT_MAX_DEVICES];
static pthread_mutex_t lt_lock = PTHREAD_MUTEX_INITIALIZER;

typedef struct gemm_plan {
    int dev, ta, tb, bias;
    fad_etype et;
    int64_t f1, f2;        /* the fixed dims: (n, k) without trans_a, (m, n) with it */
    lt_matmul_desc desc;
    lt_algo algo;
    size_t workspace;      /* bytes its algorithm needs at most (<= GEMM_WORKSPACE) */
    /* trans_a only: a split-K algorithm (has_split) and its workspace */
    int has_split;
    lt_algo split_algo;
    size_t split_workspace;
    /* the layouts of the last call, kept while the varying size and the row strides stay:
     * a decode loop makes them once; last_split: split_algo runs at last_rows */
    struct { lt_layout a, b, c; } last;
    int64_t last_rows, last_lda, last_ldb, last_ldc;
    int last_split;
} gemm_plan;

static void *workspaces[LT_MAX_DEVICES];

static gemm_plan plans[MAX_PLANS];
static int num_plans;

static int load_lt(void)
{
    static const char *names[] = {NULL, "libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"};
    void *lib = NULL;
    names[0] = getenv("FLASH_ATTN_DET_CUBLASLT");
    for (size_t i = 0; i < sizeof names / sizeof *names && !lib; i++)
        if (names[i] && names[i][0])
            lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(lt_error, sizeof lt_error, "cannot load cuBLASLt (libcublasLt.so.13 or .12: "
                 "import torch with CUDA first, or set FLASH_ATTN_DET_CUBLASLT to its path)");
        return -1;
    }
#define SYM(field, name)                                                                  \
    if (!(*(void **)&lt.field = dlsym(lib, name))) {                                      \
        snprintf(lt_error, sizeof lt_error, "cuBLASLt has no %s", name);                  \
        return -1;                                                                        \
    }
    SYM(create, "cublasLtCreate")
    SYM(desc_create, "cublasLtMatmulDescCreate")
    SYM(desc_destroy, "cublasLtMatmulDescDestroy")
    SYM(desc_set, "cublasLtMatmulDescSetAttribute")
    SYM(layout_create, "cublasLtMatrixLayoutCreate")
    SYM(layout_destroy, "cublasLtMatrixLayoutDestroy")
    SYM(pref_create, "cublasLtMatmulPreferenceCreate")
    SYM(pref_destroy, "cublasLtMatmulPreferenceDestroy")
    SYM(pref_set, "cublasLtMatmulPreferenceSetAttribute")
    SYM(heuristic, "cublasLtMatmulAlgoGetHeuristic")
    SYM(algo_check, "cublasLtMatmulAlgoCheck")
    SYM(config_get, "cublasLtMatmulAlgoConfigGetAttribute")
    SYM(matmul, "cublasLtMatmul")
#undef SYM
    return 1;
}

static int lt_type(fad_etype t) { return t == FAD_E_FLOAT32 ? LT_R_32F : t == FAD_E_BFLOAT16 ? LT_R_16BF : LT_R_16F; }

/* cuBLASLt's three layouts for p with the varying dimension set to rows. */
typedef struct lt_shapes { lt_layout a, b, c; } lt_shapes;

static lt_status make_layouts(const fad_gemm_params *p, int64_t rows, lt_shapes *s)
{
    const int t = lt_type(p->etype);
    const int64_t m = p->trans_a ? p->m : rows, k = p->trans_a ? rows : p->k;
    lt_status e;
    s->a = s->b = s->c = NULL;
    /* cuBLASLt's A = our B: column-major (n x k) if trans_b else (k x n), ld = ldb */
    if ((e = lt.layout_create(&s->a, t, p->trans_b ? k : p->n, p->trans_b ? p->n : k, p->ldb)))
        return e;
    /* cuBLASLt's B = our A: column-major (m x k) if trans_a else (k x m), ld = lda */
    if ((e = lt.layout_create(&s->b, t, p->trans_a ? m : k, p->trans_a ? k : m, p->lda)))
        return e;
    return lt.layout_create(&s->c, t, p->n, m, p->ldc);
}

static void free_layouts(lt_shapes *s)
{
    if (s->a) lt.layout_destroy(s->a);
    if (s->b) lt.layout_destroy(s->b);
    if (s->c) lt.layout_destroy(s->c);
}

/* The heuristic's algorithms for p at the reference size under reduction scheme mask
 * `schemes` (16-byte operands, workspace <= GEMM_WORKSPACE), in its order: the first that
 * runs at every size of rows[] and whose K split count is 1 (want_split 0) or above 1
 * (want_split 1). *found = 0 when none; why gets each candidate and its verdict. */
static lt_status pick_algo(const fad_gemm_params *p, int dev, lt_matmul_desc desc,
                           uint32_t schemes, int want_split, const int64_t *rows, size_t nrows,
                           lt_algo *algo, size_t *workspace, int *found, char *why,
                           size_t why_len)
{
    lt_pref pref = NULL;
    lt_heuristic cand[16];
    int ncand = 0;
    const uint64_t ws_max = GEMM_WORKSPACE;
    const uint32_t align = 16;
    size_t used = 0;
    lt_status e;
    *found = 0;
    why[0] = 0;
    if ((e = lt.pref_create(&pref)) ||
        (e = lt.pref_set(pref, LT_PREF_MAX_WORKSPACE_BYTES, &ws_max, sizeof ws_max)) ||
        (e = lt.pref_set(pref, LT_PREF_REDUCTION_SCHEME_MASK, &schemes, sizeof schemes)) ||
        (e = lt.pref_set(pref, LT_PREF_MIN_ALIGNMENT_A, &align, sizeof align)) ||
        (e = lt.pref_set(pref, LT_PREF_MIN_ALIGNMENT_B, &align, sizeof align)) ||
        (e = lt.pref_set(pref, LT_PREF_MIN_ALIGNMENT_C, &align, sizeof align)) ||
        (e = lt.pref_set(pref, LT_PREF_MIN_ALIGNMENT_D, &align, sizeof align)))
        goto done;
    {
        lt_shapes s;
        if (!(e = make_layouts(p, REF_ROWS, &s)))
            e = lt.heuristic(handles[dev], desc, s.a, s.b, s.c, s.c, pref,
                             (int)(sizeof cand / sizeof *cand), cand, &ncand);
        free_layouts(&s);
        if (e)
            goto done;
    }
    for (int i = 0; i < ncand && !*found; i++) {
        int32_t splits = 0, algo_id = -1, tile = -1, stages = -1;
        size_t written = 0, ws = 0;
        const char *bad = NULL;
        int64_t bad_rows = 0;
        if (cand[i].state)
            bad = "state";
        else if (lt.config_get(&cand[i].algo, LT_ALGO_CONFIG_SPLITK_NUM, &splits, sizeof splits,
                               &written) || (splits > 1) != want_split)
            bad = want_split ? "no split-K" : "split-K";
        lt.config_get(&cand[i].algo, LT_ALGO_CONFIG_ID, &algo_id, sizeof algo_id, &written);
        lt.config_get(&cand[i].algo, LT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &written);
        lt.config_get(&cand[i].algo, LT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages, &written);
        for (size_t r = 0; !bad && r < nrows; r++) {
            lt_shapes sh;
            lt_heuristic res;
            lt_status ce = make_layouts(p, rows[r], &sh);
            if (!ce)
                ce = lt.algo_check(handles[dev], desc, sh.a, sh.b, sh.c, sh.c, &cand[i].algo, &res);
            free_layouts(&sh);
            if (ce)
                bad = "check", bad_rows = rows[r];
            else if (res.workspace_size > GEMM_WORKSPACE)
                bad = "workspace", bad_rows = rows[r];
            else if (res.workspace_size > ws)
                ws = res.workspace_size;
        }
        if (used < why_len)
            used += (size_t)snprintf(why + used, why_len - used, "%s[algo %d tile %d stages %d "
                                     "splits %d: %s%s%lld]", i ? " " : "", algo_id, tile, stages,
                                     splits, bad ? bad : "ok", bad ? " at rows " : " ws ",
                                     bad ? (long long)bad_rows : (long long)ws);
        if (!bad)
            *algo = cand[i].algo, *workspace = ws, *found = 1;
    }
done:
    if (pref)
        lt.pref_destroy(pref);
    return e;
}

/* A new plan for p's key: the first single-pass algorithm the heuristic offers with no
 * reduction scheme that runs at every CHECK_ROWS size; for a weight gradient (trans_a)
 * also the first split-K one with its partial sums reduced out of place in fp32
 * (COMPUTE_TYPE), where the heuristic offers one that runs at SPLIT_CHECK_ROWS. */
static fad_status new_plan(const fad_gemm_params *p, int dev, gemm_plan *plan, char *msg,
                           size_t msg_len)
{
    lt_status e = 0;
    int found = 0;
    char why[400], why_split[400] = "";
    const int opa = p->trans_b ? LT_OP_T : LT_OP_N, opb = p->trans_a ? LT_OP_T : LT_OP_N;
    memset(plan, 0, sizeof *plan);
    plan->dev = dev, plan->et = p->etype, plan->ta = p->trans_a, plan->tb = p->trans_b;
    plan->bias = p->bias != NULL;
    plan->f1 = p->trans_a ? p->m : p->n, plan->f2 = p->trans_a ? p->n : p->k;
    if ((e = lt.desc_create(&plan->desc, LT_COMPUTE_32F, LT_R_32F)) ||
        (e = lt.desc_set(plan->desc, LT_DESC_TRANSA, &opa, sizeof opa)) ||
        (e = lt.desc_set(plan->desc, LT_DESC_TRANSB, &opb, sizeof opb)))
        goto fail;
    if (plan->bias) {
        const uint32_t epi = LT_EPILOGUE_BIAS;
        const int bt = lt_type(p->etype);
        if ((e = lt.desc_set(plan->desc, LT_DESC_EPILOGUE, &epi, sizeof epi)) ||
            (e = lt.desc_set(plan->desc, LT_DESC_BIAS_DATA_TYPE, &bt, sizeof bt)))
            goto fail;
    }
    if ((e = pick_algo(p, dev, plan->desc, LT_REDUCTION_SCHEME_NONE, 0, CHECK_ROWS,
                       sizeof CHECK_ROWS / sizeof *CHECK_ROWS, &plan->algo, &plan->workspace,
                       &found, why, sizeof why)))
        goto fail;
    if (!found) {
        lt.desc_destroy(plan->desc);
        return fad_fail(FAD_ERR_UNSUPPORTED, msg, msg_len, "gemm: cuBLASLt offers no single-pass "
                        "algorithm for this shape (n=%lld, k=%lld): %s", (long long)p->n,
                        (long long)p->k, why);
    }
    if (p->trans_a &&
        (e = pick_algo(p, dev, plan->desc, LT_REDUCTION_SCHEME_COMPUTE_TYPE, 1, SPLIT_CHECK_ROWS,
                       sizeof SPLIT_CHECK_ROWS / sizeof *SPLIT_CHECK_ROWS, &plan->split_algo,
                       &plan->split_workspace, &plan->has_split, why_split, sizeof why_split)))
        goto fail;
    if (getenv("FLASH_ATTN_DET_GEMM_DEBUG"))
        fprintf(stderr, "flash_attn_det gemm plan (n=%lld k=%lld m=%lld ta=%d tb=%d): %s%s%s\n",
                (long long)p->n, (long long)p->k, (long long)p->m, p->trans_a, p->trans_b, why,
                p->trans_a ? "; split-K: " : "", why_split);
    return FAD_OK;
fail:
    if (plan->desc)
        lt.desc_destroy(plan->desc);
    return fad_fail(FAD_ERR_CUDA, msg, msg_len, "gemm: cuBLASLt setup failed (status %d)", e);
}

/* The plan for p's key on dev, made at the first use (under lt_lock). */
static fad_status get_plan(const fad_gemm_params *p, int dev, gemm_plan **out, char *msg,
                           size_t msg_len)
{
    const int64_t f1 = p->trans_a ? p->m : p->n, f2 = p->trans_a ? p->n : p->k;
    fad_status st = FAD_OK;
    pthread_mutex_lock(&lt_lock);
    if (!lt_loaded)
        lt_loaded = load_lt();
    if (lt_loaded < 0) {
        st = fad_fail(FAD_ERR_CUDA, msg, msg_len, "gemm: %s", lt_error);
        goto done;
    }
    if (!handles[dev]) {
        lt_status e = lt.create(&handles[dev]);
        if (e) {
            handles[dev] = NULL;
            st = fad_fail(FAD_ERR_CUDA, msg, msg_len, "gemm: cublasLtCreate failed (%d)", e);
            goto done;
        }
    }
    for (int i = 0; i < num_plans; i++) {
        gemm_plan *q = &plans[i];
        if (q->dev == dev && q->et == p->etype && q->ta == p->trans_a && q->tb == p->trans_b &&
            q->bias == (p->bias != NULL) && q->f1 == f1 && q->f2 == f2) {
            *out = q;
            goto done;
        }
    }
    if (num_plans == MAX_PLANS) {
        st = fad_fail(FAD_ERR_UNSUPPORTED, msg, msg_len, "gemm: more than %d distinct shapes",
                      MAX_PLANS);
        goto done;
    }
    st = new_plan(p, dev, &plans[num_plans], msg, msg_len);
    if (st == FAD_OK && (plans[num_plans].workspace || plans[num_plans].split_workspace) &&
        !workspaces[dev])
        st = fad_cuda_alloc(&workspaces[dev], GEMM_WORKSPACE, msg, msg_len);
    if (st == FAD_OK)
        *out = &plans[num_plans++];
done:
    pthread_mutex_unlock(&lt_lock);
    return st;
}

fad_status fad_gemm_cuda(const fad_gemm_params *p, struct CUstream_st *stream, char *msg,
                         size_t msg_len)
{
    fad_status st = fad_gemm_check(p, msg, msg_len);
    gemm_plan *plan = NULL;
    int dev = 0;
    if (st != FAD_OK || p->m == 0)
        return st;
    const size_t es = p->etype == FAD_E_FLOAT32 ? 4 : 2;
    if (((uintptr_t)p->a | (uintptr_t)p->b | (uintptr_t)p->c | (uintptr_t)p->bias) % 16 ||
        (p->lda * es) % 16 || (p->ldb * es) % 16 || (p->ldc * es) % 16)
        return fad_fail(FAD_ERR_ALIGNMENT, msg, msg_len, "gemm: operands and row strides must be "
                        "16-byte aligned on the GPU");
    if ((st = fad_cuda_current_device(&dev, msg, msg_len)) != FAD_OK)
        return st;
    if (dev >= LT_MAX_DEVICES)
        return fad_fail(FAD_ERR_CUDA, msg, msg_len, "gemm: device %d: too many devices", dev);
    if ((st = get_plan(p, dev, &plan, msg, msg_len)) != FAD_OK)
        return st;
    const float one = 1.f, zero = 0.f;
    const int64_t rows = p->trans_a ? p->k : p->m;
    lt_status e = 0;
    /* one descriptor and one set of layouts a plan; the bias pointer is the only per-call
     * attribute, so both are set under the lock and used at once */
    pthread_mutex_lock(&lt_lock);
    if (!plan->last.a || plan->last_rows != rows || plan->last_lda != p->lda ||
        plan->last_ldb != p->ldb || plan->last_ldc != p->ldc) {
        lt_shapes s;
        if (plan->last.a) {
            s.a = plan->last.a, s.b = plan->last.b, s.c = plan->last.c;
            free_layouts(&s);
            plan->last.a = plan->last.b = plan->last.c = NULL;
        }
        e = make_layouts(p, rows, &s);
        if (e)
            free_layouts(&s);
        else
            plan->last.a = s.a, plan->last.b = s.b, plan->last.c = s.c, plan->last_rows = rows,
            plan->last_lda = p->lda, plan->last_ldb = p->ldb, plan->last_ldc = p->ldc;
        /* the split-K algorithm where it runs at this row count (a function of the shape
         * alone, so the choice is the same run to run) */
        plan->last_split = 0;
        if (!e && plan->has_split && rows >= SPLIT_MIN_ROWS) {
            lt_heuristic res;
            plan->last_split = !lt.algo_check(handles[dev], plan->desc, s.a, s.b, s.c, s.c,
                                              &plan->split_algo, &res) &&
                               res.workspace_size <= GEMM_WORKSPACE;
        }
    }
    if (!e && plan->bias)
        e = lt.desc_set(plan->desc, LT_DESC_BIAS_POINTER, &p->bias, sizeof p->bias);
    if (!e) {
        const int split = plan->last_split;
        const size_t ws = split ? plan->split_workspace : plan->workspace;
        e = lt.matmul(handles[dev], plan->desc, &one, p->b, plan->last.a, p->a, plan->last.b,
                      &zero, p->c, plan->last.c, p->c, plan->last.c,
                      split ? &plan->split_algo : &plan->algo, ws ? workspaces[dev] : NULL,
                      ws ? GEMM_WORKSPACE : 0, stream);
    }
    pthread_mutex_unlock(&lt_lock);
    if (e)
        return fad_fail(FAD_ERR_CUDA, msg, msg_len, "gemm: cublasLtMatmul failed (status %d)", e);
    return FAD_OK;
}
