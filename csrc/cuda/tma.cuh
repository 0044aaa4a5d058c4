/*
 * tma.cuh — the bulk tensor copy engine (TMA) of sm_90: a tensor map built
 * on the host for a 16-bit (rows, heads, head dim) tensor, and the device side
 * that copies a tile of it into shared memory and completes an mbarrier phase
 * by its byte count. Used by the producers of fwd_ws_kernel (Q and K/V tiles,
 * fwd_prefill_ws.cu) and of the backward's wgmma kernels (Q/dO, K/V); a tile
 * that a sequence's end cuts stays on cp.async, whose zero-fill stops at the
 * sequence, where a map's bounds are the tensor's.
 *
 * Map: 3-D, (D columns, H heads, R rows), strides (head, row) in bytes; a box
 * is 64 columns x 1 head x box_rows rows, written with the 128-byte swizzle,
 * which is swz128's layout (wgmma.cuh): rows x 128 bytes per 64-column block,
 * chunk c of row r at chunk c ^ (r % 8). Columns past D (a head dim below the
 * kernel's) are outside the map and land as zeros, as cp.async's zero-fill
 * gives them. Row r of the map is the element offset r * row_stride from the
 * tensor's base, so a sequence's rows start at its offset / row_stride: exact
 * for varlen batches (cu_seqlens rows) and for batched tensors whose batch
 * stride is a whole number of rows (fad_tma_rows_ok checks that, and the
 * int32 range of the coordinates, on the host).
 */
#ifndef FAD_TMA_CUH
#define FAD_TMA_CUH

#include <stdint.h>
#include <stdlib.h>

#include "wgmma.cuh"

/* ---- host: the map ---- */

/* cuda.h's CUtensorMap and cuTensorMapEncodeTiled's signature, spelled here
 * so that the build needs no driver header (the CUDA compiler wheels may lack
 * one); the enum values are the driver ABI's (cuda.h, CUDA 12.0 on). */
struct alignas(64) fad_tensor_map {
    uint64_t opaque[16];
};
enum {
    FAD_TMAP_UINT16 = 1,        /* CU_TENSOR_MAP_DATA_TYPE_UINT16 */
    FAD_TMAP_INTERLEAVE_NONE = 0,
    FAD_TMAP_SWIZZLE_128B = 3,  /* CU_TENSOR_MAP_SWIZZLE_128B */
    FAD_TMAP_L2_256B = 3,       /* CU_TENSOR_MAP_L2_PROMOTION_L2_256B */
    FAD_TMAP_OOB_ZERO = 0,      /* CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE: zeros */
};
typedef int (*fad_encode_tiled_fn)(fad_tensor_map *, int, uint32_t, void *, const uint64_t *, const uint64_t *,
                                   const uint32_t *, const uint32_t *, int, int, int, int);

/* cuTensorMapEncodeTiled through the runtime's driver entry point (looked up
 * once; nullptr where the driver has none, and then no map is made). */
static inline fad_encode_tiled_fn fad_encode_tiled()
{
    static fad_encode_tiled_fn fn = nullptr;
    static int looked = 0;
    if (!looked) {
        void *f = nullptr;
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) ==
                cudaSuccess &&
            q == cudaDriverEntryPointSuccess)
            fn = (fad_encode_tiled_fn)f;
        else
            (void)cudaGetLastError(); /* (a failed lookup leaves no sticky error behind) */
        looked = 1;
    }
    return fn;
}

/* Whether the copy engine may take the whole tiles of a tensor of `entries`
 * batch entries of `rows` rows: FAD_WS_TMA, and FLASH_ATTN_DET_WS_TMA=0 in the
 * environment (read once) turns it off -- an A/B knob; the bits are the
 * same --, no page table, each sequence's first row a whole map row (always
 * for varlen batches, whose cu_seqlens_q and _k come together; for batched
 * tensors where the batch stride is a non-negative multiple of the row
 * stride, or there is one entry), and every row a copy names inside the
 * engine's int32 coordinate (varlen rows are int32 offsets already). */
static inline bool fad_tma_enabled()
{
    static int env = -1;
    if (env < 0) {
        const char *e = getenv("FLASH_ATTN_DET_WS_TMA");
        env = FAD_WS_TMA && !(e && e[0] == '0');
    }
    return env;
}
static inline bool fad_tma_rows_ok(const fad_fwd_params &p, int entries, int rows, int64_t batch_stride,
                                   int64_t row_stride)
{
    if (!fad_tma_enabled() || p.block_table || row_stride <= 0)
        return false;
    if (p.cu_seqlens_k)
        return true;
    if (entries > 1 && (batch_stride < 0 || batch_stride % row_stride))
        return false;
    const int64_t entry_rows = entries > 1 ? batch_stride / row_stride : 0;
    return (int64_t)(entries - 1) * entry_rows + rows <= 0x7fffffff;
}
/* The entries of k/v: the cache's with a KV cache, else the batch's. */
static inline int fad_kv_entries(const fad_fwd_params &p) { return p.cache_seqlens ? p.kv_batch : p.batch; }

/* The (D, H, rows) map of a 16-bit tensor at base with the given element
 * strides, boxes of 64 columns x 1 head x box_rows rows; false where the copy
 * engine cannot take it (alignment: base and strides multiples of 16 bytes)
 * or no encoder exists. */
static inline bool fad_make_map(fad_tensor_map *map, const void *base, int d, int heads, int64_t row_stride,
                                int64_t head_stride, int box_rows)
{
    const fad_encode_tiled_fn enc = fad_encode_tiled();
    if (!enc || !base || ((uintptr_t)base & 15) || row_stride <= 0 || head_stride <= 0 || (row_stride * 2) % 16 ||
        (head_stride * 2) % 16 || d <= 0 || heads <= 0)
        return false;
    /* Rows: the map never bounds a copy (only whole tiles inside a sequence
     * are copied through it), so its row extent is the largest the engine
     * takes. */
    const uint64_t dims[3] = {(uint64_t)d, (uint64_t)heads, (uint64_t)0x7fffffff};
    const uint64_t strides[2] = {(uint64_t)head_stride * 2, (uint64_t)row_stride * 2};
    const uint32_t box[3] = {64, 1, (uint32_t)box_rows}, elem[3] = {1, 1, 1};
    return enc(map, FAD_TMAP_UINT16, 3, const_cast<void *>(base), dims, strides, box, elem, FAD_TMAP_INTERLEAVE_NONE,
               FAD_TMAP_SWIZZLE_128B, FAD_TMAP_L2_256B, FAD_TMAP_OOB_ZERO) == 0; /* CUDA_SUCCESS */
}

/* One tensor a kernel reads through a map: its base and element strides. */
struct fad_map_src {
    const void *base;
    int64_t batch_stride, row_stride, head_stride;
};

/* The maps of two tensors of one shape (entries x rows x heads x head_dim)
 * that a producer copies together -- K and V, or Q and dO --, boxes of
 * box_rows rows: false, and the kernel's copies stay on cp.async, unless
 * both take the copy engine (fad_tma_rows_ok, fad_make_map). */
static inline bool fad_make_maps(const fad_fwd_params &p, int entries, int rows, int heads, int box_rows,
                                 const fad_map_src &a, const fad_map_src &b, fad_tensor_map *map_a,
                                 fad_tensor_map *map_b)
{
    return fad_tma_rows_ok(p, entries, rows, a.batch_stride, a.row_stride) &&
           fad_tma_rows_ok(p, entries, rows, b.batch_stride, b.row_stride) &&
           fad_make_map(map_a, a.base, p.head_dim, heads, a.row_stride, a.head_stride, box_rows) &&
           fad_make_map(map_b, b.base, p.head_dim, heads, b.row_stride, b.head_stride, box_rows);
}
/* The output's map for bulk tensor stores (FAD_WS_TMA_STORE): boxes of
 * box_rows rows, each inside one sequence (the caller's rule, as for loads);
 * columns past D are outside the map and never written. */
static inline bool fad_make_o_map(const fad_fwd_params &p, int box_rows, fad_tensor_map *map)
{
    return FAD_WS_TMA_STORE && fad_tma_rows_ok(p, p.batch, p.seqlen_q, p.out_batch_stride, p.out_row_stride) &&
           fad_make_map(map, p.out, p.head_dim, p.num_heads, p.out_row_stride, p.out_head_stride, box_rows);
}
/* Q's map for the forward's producer (boxes of box_rows rows). */
static inline bool fad_make_q_map(const fad_fwd_params &p, int box_rows, fad_tensor_map *map)
{
    return fad_tma_rows_ok(p, p.batch, p.seqlen_q, p.q_batch_stride, p.q_row_stride) &&
           fad_make_map(map, p.q, p.head_dim, p.num_heads, p.q_row_stride, p.q_head_stride, box_rows);
}
/* A paged cache's K and V maps: its blocks as one tensor of kv_batch x
 * page_size rows (each block's rows contiguous in it), boxes of box_rows rows:
 * 16, so that a tile's 16-row groups (page sizes are multiples of 16) are one
 * box each, or a whole tile where pages hold whole tiles; each box at the row
 * its page gives (fwd_prefill_ws.cu's producer). */
static inline bool fad_make_paged_kv_maps(const fad_fwd_params &p, int box_rows, fad_tensor_map *k_map,
                                          fad_tensor_map *v_map)
{
    return fad_tma_enabled() && p.block_table && p.page_size % 16 == 0 && p.k_row_stride > 0 &&
           p.v_row_stride > 0 && p.k_batch_stride == (int64_t)p.page_size * p.k_row_stride &&
           p.v_batch_stride == (int64_t)p.page_size * p.v_row_stride &&
           (int64_t)p.kv_batch * p.page_size <= 0x7fffffff &&
           fad_make_map(k_map, p.k, p.head_dim, p.num_heads_k, p.k_row_stride, p.k_head_stride, box_rows) &&
           fad_make_map(v_map, p.v, p.head_dim, p.num_heads_k, p.v_row_stride, p.v_head_stride, box_rows);
}
/* K's and V's maps (the rows of a KV cache's entries, or of the batch's). */
static inline bool fad_make_kv_maps(const fad_fwd_params &p, int box_rows, fad_tensor_map *k_map,
                                    fad_tensor_map *v_map)
{
    return fad_make_maps(p, fad_kv_entries(p), p.seqlen_k, p.num_heads_k, box_rows,
                         {p.k, p.k_batch_stride, p.k_row_stride, p.k_head_stride},
                         {p.v, p.v_batch_stride, p.v_row_stride, p.v_head_stride}, k_map, v_map);
}

/* ---- device: one box, and the barrier that counts its bytes ---- */

#if FAD_HAS_WGMMA
/* An arrival that also expects `bytes` more to land (complete_tx) before the
 * phase can complete. */
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t *bar, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes)
                 : "memory");
}
/* Expects `bytes` more to land on bar's phase (complete_tx), no arrival. */
__device__ __forceinline__ void mbar_expect_tx(uint64_t *bar, uint32_t bytes)
{
    asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes)
                 : "memory");
}
/* Box (c0 .. c0 + 63, head, row .. row + box rows - 1) of map into dst
 * (1024-byte aligned), its bytes counted on bar. */
__device__ __forceinline__ void tma_load_box(void *dst, const fad_tensor_map *map, int c0, int head, int row,
                                             uint64_t *bar)
{
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(smem_addr(dst)),
                 "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(head), "r"(row), "r"(smem_addr(bar))
                 : "memory");
}
/* Box (c0 .., head, row ..) of map from src (1024-byte aligned, the box's
 * swizzled layout), a bulk-async group of its own; then, before the issuing
 * thread may let src be overwritten or exit, tma_store_wait_read. The
 * writers of src fence for the async proxy (fence_async_smem) and meet the
 * issuing thread first. */
__device__ __forceinline__ void tma_store_box(const fad_tensor_map *map, uint32_t src, int c0, int head, int row)
{
    asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%1, %2, %3}], [%4];\n"
                 "cp.async.bulk.commit_group;\n" ::"l"(reinterpret_cast<uint64_t>(map)),
                 "r"(c0), "r"(head), "r"(row), "r"(src)
                 : "memory");
}
/* Waits until every bulk store this thread issued has read its source. */
__device__ __forceinline__ void tma_store_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
#else
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t *, uint32_t) {}
__device__ __forceinline__ void mbar_expect_tx(uint64_t *, uint32_t) {}
__device__ __forceinline__ void tma_load_box(void *, const fad_tensor_map *, int, int, int, uint64_t *) {}
__device__ __forceinline__ void tma_store_box(const fad_tensor_map *, uint32_t, int, int, int) {}
__device__ __forceinline__ void tma_store_wait_read() {}
#endif

/* A kRows x kCols tile of map (head, rows row ..) into dst in swz128's layout
 * (kCols / 64 column blocks of kRows x 128 bytes): one box per block, its
 * bytes counted on bar; the map's boxes are kRows rows. (One thread.) */
template <int kRows, int kCols>
__device__ __forceinline__ void tma_load_tile(void *dst, const fad_tensor_map *map, int head, int row, uint64_t *bar)
{
#pragma unroll
    for (int cb = 0; cb < kCols / 64; cb++)
        tma_load_box(static_cast<unsigned char *>(dst) + cb * kRows * 128, map, cb * 64, head, row, bar);
}

#endif /* FAD_TMA_CUH */
