/*
 * fad_config.h — every compile-time knob of the kernels in one place. Each is a
 * default that a -D flag overrides (dev/ab_variants.sh and dev/ab_decode.sh
 * build several at once for same-run A/B timings). Unless its comment says
 * otherwise, a knob never changes a bit: it moves work between threads, CTAs
 * or pipeline stages, never the order of a row's operations. The one knob of
 * the numerics, FAD_RESCALE_SLACK, lives with the math it changes (fad_math.h).
 *
 * Run-time switches (environment, read once): FLASH_ATTN_DET_WGMMA=0 turns the
 * sm_90a (wgmma) variants off, =force runs the backward's on any grid
 * (cuda/device.cu). Build-time (setup.py): FLASH_ATTN_DET_CUDA_ARCHS, and
 * FAD_SM90A, which setup.py defines when it builds sm_90a code.
 *
 * Switches kept although the default build does not compile the code they
 * select, each the losing side of a same-run A/B, kept so that the A/B can
 * be re-run on another GPU or compiler: FAD_WIDE_MAX_D (32 rows per warp),
 * FAD_WG_LEAN_LOADS=0 and FAD_WG_LOADS_DURING_S=0 (the sm_90a prefill
 * variant's older copies), FAD_WS_Q_REGS=0 and FAD_WG_WS=0 (before the
 * warp-specialized kernel), FAD_BWD_WG_DKDV_DEFER_MAX_D (at D64 ptxas
 * serialized the wgmmas), FAD_PACKED_Q_IN_REGS (the packed kernel with Q in
 * registers; no A/B of it is recorded: measure it or remove it).
 */
#ifndef FAD_CONFIG_H
#define FAD_CONFIG_H

/* ---------------- forward: the prefill kernel (fwd_prefill*.cu) ---------------- */

/* Tile shape of the forward kernel per head-dim class: tuning knobs that never
 * change a bit (rows are independent), compared with dev/ab_variants.sh.
 * FAD_WIDE_MAX_D: head dims up to this give each warp 32 query rows (else 16).
 * FAD_D64_WARPS / FAD_D128_WARPS: warps per CTA for D <= 64 and 64 < D <= 128
 * (4 above). FAD_D64_MIN_BLOCKS: CTAs per SM the D <= 64 register budget allows. */
#ifndef FAD_WIDE_MAX_D
#define FAD_WIDE_MAX_D 0
#endif
#ifndef FAD_D64_WARPS
#define FAD_D64_WARPS 8
#endif
#ifndef FAD_D64_MIN_BLOCKS
#define FAD_D64_MIN_BLOCKS 2
#endif
#ifndef FAD_D128_WARPS
#define FAD_D128_WARPS 4
#endif
/* FAD_WG_Q_REGS_MIN_D / FAD_WG_R_REGS_MIN_D: in the sm_90a prefill variant,
 * head-dim classes from this one up keep Q (wgmma A from registers) / the
 * merged result's o in registers; smaller ones keep them in shared memory.
 * At D64 (two warpgroups per CTA) Q in registers gives wrong results on the
 * H100 (docs/design.md, "wgmma-limits"), so D64 keeps Q in shared
 * memory; R in registers, no faster at first, is 5-7% faster at D64 since
 * the variant's lean copies and early fold (0 B spilled). */
#ifndef FAD_WG_Q_REGS_MIN_D
#define FAD_WG_Q_REGS_MIN_D 128
#endif
#ifndef FAD_WG_R_REGS_MIN_D
#define FAD_WG_R_REGS_MIN_D 64
#endif
/* FAD_WG_LEAN_LOADS: 1 = the sm_90a variant copies K/V tiles with
 * load_tile_lean (per-chunk offsets from one per-thread base; A/B knob). */
#ifndef FAD_WG_LEAN_LOADS
#define FAD_WG_LEAN_LOADS 1
#endif
/* FAD_WG_LOADS_DURING_S: 1 = the sm_90a variant issues the next tile's K/V
 * copies while S = Q K^T runs (0: before it, as the mma.sync kernel does). */
#ifndef FAD_WG_LOADS_DURING_S
#define FAD_WG_LOADS_DURING_S 1
#endif
/* FAD_WG_WS: 1 = at D128 the sm_90a prefill runs the warp-specialized
 * kernel (fwd_prefill_ws.cu: a producer warpgroup, FAD_WS_D128_CONSUMERS
 * consumer warpgroups of 64 rows) instead of fwd_kernel's wgmma variant; the
 * same bits. With two consumers (FAD_WS_D128_CONSUMERS 2): FAD_WS_STAGES, its
 * K/V ring depth, and FAD_WS_PRODUCER_REGS / FAD_WS_CONSUMER_REGS, the
 * registers per thread setmaxnreg gives each side (P + 2 * C <= 3 * 168: what
 * __launch_bounds__ gives 384 threads). D64's main shape takes FAD_WS_STAGES
 * too. */
#ifndef FAD_WG_WS
#define FAD_WG_WS 1
#endif
#ifndef FAD_WS_Q_REGS /* 1 = its consumers hold Q's A fragments in registers */
#define FAD_WS_Q_REGS 1
#endif
/* FAD_WS_DROP_Q_SMEM: 1 = with dropout its consumers read Q from shared
 * memory (SS wgmma) all the same: the draws' registers then fit (D128 spill
 * 44 B -> 8 B, narrow 44 -> 0), and the D128 forward at p = 0.1 takes
 * 0.93-0.95x the time. Without dropout Q stays in registers: there shared
 * memory costs 1-12% at D128 (docs/design.md, "dropout-kernels"). */
#ifndef FAD_WS_DROP_Q_SMEM
#define FAD_WS_DROP_Q_SMEM 1
#endif
/* FAD_WS_TMA: 1 = the warp-specialized kernel's producer copies whole K/V
 * tiles with the bulk tensor copy engine (tma.cuh; D128), 0 = cp.async. */
#ifndef FAD_WS_TMA
#define FAD_WS_TMA 1
#endif
/* FAD_WS_TMA_STORE: 1 = the warp-specialized kernel's consumers hand their
 * staged output to the bulk tensor copy engine at D128 (one store per 16-row
 * warp slice inside its sequence, tma.cuh), 0 = 16-byte stores from every
 * thread. */
#ifndef FAD_WS_TMA_STORE
#define FAD_WS_TMA_STORE 1
#endif
#ifndef FAD_WS_STAGES
#define FAD_WS_STAGES 4
#endif
/* FAD_WS_D256: 1 = at D256 (head dims 193..256) the sm_90a prefill runs the
 * warp-specialized kernel too, with one consumer warpgroup (its o of 64 rows
 * x 256 columns takes 128 registers a thread, so R's o and Q live in shared
 * memory), instead of fwd_kernel on mma.sync; the same bits. */
#ifndef FAD_WS_D256
#define FAD_WS_D256 1
#endif
/* FAD_WS_PAGED: 1 = a paged KV cache's prefill (no softcap or ALiBi, no
 * dropout) runs D128's warp-specialized kernel, its producer looking each
 * K/V row up in the block table (cp.async; no tensor map spans the pages);
 * 0 = fwd_kernel on mma.sync, as before. The same bits. */
#ifndef FAD_WS_PAGED
#define FAD_WS_PAGED 1
#endif
#ifndef FAD_WS_PRODUCER_REGS
#define FAD_WS_PRODUCER_REGS 40
#endif
#ifndef FAD_WS_CONSUMER_REGS
#define FAD_WS_CONSUMER_REGS 232
#endif
/* FAD_WS_D64_CONSUMERS: at D64 the warp-specialized kernel runs this many
 * consumer warpgroups (0: D64 stays on fwd_kernel's wgmma variant), with
 * FAD_WS_D64_PRODUCER_REGS / FAD_WS_D64_CONSUMER_REGS (P + n * C <= (n + 1) *
 * the registers __launch_bounds__ gives each of (n + 1) * 128 threads), for
 * calls whose seqlen_k is at least FAD_WS_D64_MIN_SK. Three, with the TMA
 * producer, against fwd_kernel's variant (H100, bf16): 0.81-0.84x at L512,
 * 0.85-0.91x at L1k, 0.97-1.01x at L2k, 1.03-1.04x at L4k, 1.09x at L8k,
 * 1.12x at L16k (docs/design.md, "warp-specialized-prefill"): one CTA of
 * 12 math warps per SM against two of 8, which overlap one's prologue and
 * epilogue with the other's tiles, so short walks stay on fwd_kernel. (With
 * the cp.async producer three measured 0.80-1.03x and were off.)
 * FAD_WS_D64_MIN_SK_FULL: the same where no mask bounds a row on the right
 * (neither causal nor a right window), whose rows all walk the CTA's keys:
 * the lean variant from 1024 keys reads 1.04x fwd_kernel there at L1k, and
 * 0.97x causal (H200, dev/ab_so.sh); in one process (dev/ab_inproc.py --fwd)
 * 1.13x causal at L1k. Both at 512 read 1.03-1.10x at 512-768 keys
 * (benchmarks/results/2026-11-30_h200_fwd_inproc_36d9477.md, section 8;
 * again 1.03-1.105x, benchmarks/results/2026-11-30_h200_fwd_row_blocks_cc7a1dd.md),
 * so both are 512.
 * FAD_WS_D64_LEAN_MAX_SK: up to this many keys D64 runs the lean variant
 * instead (0: never): four consumers with R and Q in shared memory,
 * setmaxnreg FAD_WS_LEAN_PRODUCER_REGS / _CONSUMER_REGS. Against fwd_kernel
 * at L2k and three consumers from L4k (H100, bf16): 1.03-1.06x at L2k,
 * 1.03-1.09x at L4k, 0.96-1.00x at L16k (docs/design.md,
 * "warp-specialized-prefill"); with R's fold through float4s (H200),
 * 1.00-1.02x three consumers at 8k-16k. */
#ifndef FAD_WS_D64_CONSUMERS
#define FAD_WS_D64_CONSUMERS 3
#endif
#ifndef FAD_WS_D64_MIN_SK
#define FAD_WS_D64_MIN_SK 512
#endif
#ifndef FAD_WS_D64_MIN_SK_FULL
#define FAD_WS_D64_MIN_SK_FULL 512
#endif
#ifndef FAD_WS_D64_LEAN_MAX_SK
#define FAD_WS_D64_LEAN_MAX_SK 16384
#endif
/* FAD_WS_NARROW_MAX_SK: at D128 the warp-specialized kernel runs its narrow
 * variant (one consumer warpgroup, two CTAs an SM, FAD_WS_NARROW_STAGES K/V
 * stages, setmaxnreg FAD_WS_NARROW_PRODUCER_REGS / _CONSUMER_REGS: P + C <=
 * 2 * 128) for calls whose seqlen_k is at most this (0: never); the same
 * bits. Against the two-consumer kernel (H100, bf16), with cp.async
 * producers: 1.02-1.14x at L512, 0.90-1.00x at L1k-2k, 0.84-0.93x at
 * L4k-16k, where each K/V tile feeding half the rows costs more than the
 * overlap gains; with TMA producers 1.05-1.07x at L1k and 0.98-1.05x at
 * L2k, and at 2048-4096 keys (MHA, GQA) within the spread, 0.94-1.07x
 * (docs/design.md, "warp-specialized-prefill"). With R's fold through
 * float4s (H200) the three-consumer kernel at L1k read 0.99-1.02x the narrow
 * one without a mask and 0.97-0.99x causal, call to call (dev/ab_so.sh). In
 * one process (dev/ab_inproc.py --fwd, H200) it reads 1.02-1.055x at L1k
 * (MHA and GQA, causal and not, two calls), 1.04-1.09x at L512 and
 * 0.83-0.93x at L256: the narrow variant now stops at 256 keys (up to 448
 * it read 0.91-1.05x at 320-448 keys). */
#ifndef FAD_WS_NARROW_MAX_SK
#define FAD_WS_NARROW_MAX_SK 256
#endif
#ifndef FAD_WS_NARROW_STAGES
#define FAD_WS_NARROW_STAGES 3
#endif
#ifndef FAD_WS_NARROW_PRODUCER_REGS
#define FAD_WS_NARROW_PRODUCER_REGS 24
#endif
#ifndef FAD_WS_NARROW_CONSUMER_REGS
#define FAD_WS_NARROW_CONSUMER_REGS 232
#endif
#ifndef FAD_WS_D64_PRODUCER_REGS
#define FAD_WS_D64_PRODUCER_REGS 32
#endif
#ifndef FAD_WS_D64_CONSUMER_REGS
#define FAD_WS_D64_CONSUMER_REGS 160
#endif
/* FAD_WS_D256_CONSUMERS (1 or 2): consumer warpgroups at D256; two keep
 * R's o in global memory (kRGlobal: a slot of FAD_WS_R_SLOT_FLOATS floats a
 * consumer warp, 64 rows x 256 columns over 4 warps, from a pool of
 * 4 x FAD_WS_D256_CONSUMERS x SMs slots in the call's workspace: 16.5 MB on
 * 132 SMs), with setmaxnreg FAD_WS_D256_PRODUCER_REGS / _CONSUMER_REGS (one:
 * 255 registers a thread, no setmaxnreg, R in shared memory). Two against
 * one (H100, bf16, 512-16k keys): 1.09-1.26x non-causal, 1.03-1.19x causal
 * (docs/design.md, "warp-specialized-prefill"). */
#ifndef FAD_WS_D256_CONSUMERS
#define FAD_WS_D256_CONSUMERS 2
#endif
#define FAD_WS_R_SLOT_FLOATS (16 * 256)
/* FAD_WS_D128_CONSUMERS (2 or 3): consumer warpgroups of D128's main
 * warp-specialized kernel (above FAD_WS_NARROW_MAX_SK keys). Three, with
 * setmaxnreg FAD_WS_D128_PRODUCER_REGS / _CONSUMER_REGS (P + 3 C <= 4 x 128),
 * read Q from shared memory (S = Q K^T as SS products) and keep R's o there
 * too, beside two K/V stages whose K and V halves are released apart. The
 * third consumer warp on each SM sub-partition issues while the other two
 * wait on their softmax chains: against two (H200, bf16, 2k-16k keys)
 * 0.98-1.07x, and 1.10-1.17x with no R at all (a timing probe). The fold of
 * each split into R is most of what is left: about 7% after its float4 form
 * (fwd_tile.cuh, fold_split; docs/design.md, "warp-specialized-prefill"). */
#ifndef FAD_WS_D128_CONSUMERS
#define FAD_WS_D128_CONSUMERS 3
#endif
#ifndef FAD_WS_D128_PRODUCER_REGS
#define FAD_WS_D128_PRODUCER_REGS 32
#endif
#ifndef FAD_WS_D128_CONSUMER_REGS
#define FAD_WS_D128_CONSUMER_REGS 160
#endif
/* FAD_WS_D128_Q_REG_K, FAD_WS_LEAN_Q_REG_K, FAD_WS_D256_Q_REG_K: of Q's k-chunks
 * (D / 16), how many each consumer thread of D128's three-consumer shape, D64's
 * lean shape and D256's shapes holds as A fragments in registers (4 registers
 * each; RS products), the rest read by SS products from shared memory; 0 = none.
 * D128: the 8 registers a three-consumer thread has to spare, which held two n8
 * blocks of R's o (1/8 fewer bytes through shared memory a fold) until the two
 * k-chunks spared each tile's S products 4 KB there: 0.996-1.039x (H200, in one
 * process, two calls; three chunks 0.976-1.009x, two beside R's blocks spill).
 * D64 lean (1 chunk) 0.97-0.99x and D256 (2 or 4 of 16) 0.98-1.03x: 0
 * (benchmarks/results/2026-12-01_h200_fwd_q_chunks_regs.md). */
#ifndef FAD_WS_D128_Q_REG_K
#define FAD_WS_D128_Q_REG_K 2
#endif
#ifndef FAD_WS_LEAN_Q_REG_K
#define FAD_WS_LEAN_Q_REG_K 0
#endif
#ifndef FAD_WS_D256_Q_REG_K
#define FAD_WS_D256_Q_REG_K 0
#endif
/* X slots: where fwd_kernel's kGroups variant (a one-CTA walk across the end
 * of a split group, fad_math.h FAD_MERGE_GROUP) keeps the outer result of a
 * warp's rows (fwd_tile.cuh, fold_group_close): FAD_X_LANE_FLOATS a lane (o of
 * 2 x 16 or 1 x 32 n8 blocks, the most fwd_kernel holds, and (m, l) of 4
 * rows), a slot for each of FAD_X_WARPS_PER_SM warps of every SM (as many as
 * can be resident): 147 MB on 132 SMs, whatever the call's rows. */
#define FAD_X_LANE_FLOATS (32 * 4 + 8)
#define FAD_X_WARPS_PER_SM 64
/* Past FAD_MERGE_GROUP splits the automatic schedule gives a CTA per split
 * (the combine folds the groups) while its partials' workspace (splits x
 * query rows x (D + 2) fp32, plus ready flags) stays within this, else the
 * one-CTA walk with X slots (a fixed 147 MB on 132 SMs): a CTA per split
 * keeps every SM busy on a few long rows (decode, short chunks) at a
 * workspace of that size, while a long prefill fills the device with row
 * blocks anyway and its partials would grow with rows x keys (2^20 rows and
 * keys, 32 heads, D128: 140 GB). 1 GiB: well inside any device this runs on
 * and above FAD_MAX_WORKSPACE_BYTES (which ordinary calls keep to), since
 * past one group the alternative is a walk of 2^19+ keys in one CTA. */
#define FAD_GROUPS_CTA_MAX_WORKSPACE ((size_t)1 << 30)
/* FAD_WS_RG_BATCH: n8 blocks of R's o in global memory loaded ahead of their
 * merges in a fold (kRGlobal). */
#ifndef FAD_WS_RG_BATCH
#define FAD_WS_RG_BATCH 4
#endif
/* FAD_WS_D256_LONG_MIN_SK (two consumers): from this many keys (seqlen_k) the
 * D256 kernel's long variant, which keeps the first FAD_WS_RG_SMEM_NB n8
 * blocks of each consumer warp's R (of 32: 64 rows x 256 columns over 4
 * warps) in the shared memory its ring and Q leave free (4 KB a warp at 8,
 * 32 KB a CTA) and the rest in its slot: a quarter fewer bytes through L2 at
 * each fold, which both consumers run at a split's end while the tensor
 * cores idle. Its fold loads FAD_WS_RG_LONG_BATCH n8 blocks ahead. Against
 * R wholly in its slot (H100, bf16): 1.01-1.09x at 2k-8k keys and 1.10-1.17x
 * at 16k, but 0.92-0.98x at 512-1k, where a row folds at most once and the
 * larger shared memory only costs (docs/design.md,
 * "warp-specialized-prefill"). On the H200 in one process (dev/ab_inproc.py
 * --fwd) it reads 1.055-1.07x at 1k keys and 1.00x at 2k-16k, and
 * 1.01-1.065x at 512-768 keys (the results' section 8; again 1.01-1.07x,
 * benchmarks/results/2026-11-30_h200_fwd_row_blocks_cc7a1dd.md), so it runs
 * from 512. */
#ifndef FAD_WS_D256_LONG_MIN_SK
#define FAD_WS_D256_LONG_MIN_SK 512
#endif
#ifndef FAD_WS_RG_SMEM_NB
#define FAD_WS_RG_SMEM_NB 8
#endif
#ifndef FAD_WS_RG_LONG_BATCH
#define FAD_WS_RG_LONG_BATCH 8
#endif
#ifndef FAD_WS_D256_PRODUCER_REGS
#define FAD_WS_D256_PRODUCER_REGS 24
#endif
#ifndef FAD_WS_D256_CONSUMER_REGS
#define FAD_WS_D256_CONSUMER_REGS 240
#endif
#ifndef FAD_WS_LEAN_PRODUCER_REGS
#define FAD_WS_LEAN_PRODUCER_REGS 24
#endif
#ifndef FAD_WS_LEAN_CONSUMER_REGS
#define FAD_WS_LEAN_CONSUMER_REGS 112
#endif

/* ---------------- forward: the packed (decode) kernel (fwd_decode.cu) ---------------- */

/* The packed forward kernel (fwd_packed_kernel: GQA heads packed into M, for
 * decode and other short query blocks). Knobs that never change a bit:
 * FAD_PACKED_WARPS: warps (16 packed rows each) per CTA; FAD_PACKED_STAGES(_MOD):
 * depth of its K/V cp.async pipeline (without / with softcap or ALiBi; fewer
 * where shared memory is short); FAD_PACKED_MAX_SQ: the longest query
 * block (seqlen_q, max_seqlen_q for varlen) that runs on it. */
#ifndef FAD_PACKED_WARPS
#define FAD_PACKED_WARPS 1
#endif
#ifndef FAD_PACKED_STAGES
#define FAD_PACKED_STAGES 3
#endif
#ifndef FAD_PACKED_STAGES_MOD /* the softcap/ALiBi variant (3 stages spill 24 B at D128) */
#define FAD_PACKED_STAGES_MOD 4
#endif
#ifndef FAD_PACKED_MAX_SQ
#define FAD_PACKED_MAX_SQ 16
#endif
/* Knobs that never change a bit: a one-sequence CTA-per-split plan of the
 * packed kernel past one wave (fwd_launch.h's packed_runs_shape) walks runs of
 * splits, a row block's split CTAs numbering floor(wave / row blocks), where
 * that is at least FAD_PACKED_RUN_MIN_CTAS (fwd_decode.cu's packed_run_ctas;
 * below, a CTA per split); the combine of a call with runs polls from
 * FAD_COMBINE_POLL_MIN_SPLITS_RUNS splits. */
#ifndef FAD_PACKED_RUN_MIN_CTAS
#define FAD_PACKED_RUN_MIN_CTAS 4
#endif
#ifndef FAD_COMBINE_POLL_MIN_SPLITS_RUNS
#define FAD_COMBINE_POLL_MIN_SPLITS_RUNS 32
#endif
/* A run lets its combine launch once it enters one of its last
 * FAD_PACKED_RUN_LAUNCH_SEGMENTS splits (at its first only where that is its
 * last): the combine folds the splits done while the last ones run. */
#ifndef FAD_PACKED_RUN_LAUNCH_SEGMENTS
#define FAD_PACKED_RUN_LAUNCH_SEGMENTS 2
#endif
#ifndef FAD_PACKED_Q_IN_REGS
#define FAD_PACKED_Q_IN_REGS 0
#endif
/* Knobs that never change a bit (dev/ab_decode.sh compares them):
 * FAD_PACKED_COL_WARPS: warps per 16-row group, splitting the output columns
 * of O += P V and the key blocks of S = Q K^T (1, 2, 4; fewer where the head
 * dim has too few 16-column blocks). */
#ifndef FAD_PACKED_COL_WARPS
#define FAD_PACKED_COL_WARPS 4
#endif

/* ---------------- forward: launch and combine (fwd_launch.cu, fwd_combine.cu) ---------------- */

/* Knob that never changes a bit: 1 = launch the combine as a programmatic
 * dependent of the attention kernel where the GPU has it (sm_90 on). */
#ifndef FAD_COMBINE_PDL
#define FAD_COMBINE_PDL 1
#endif
/* Knob that never changes a bit: 1 = launch the packed (decode) kernel as a
 * programmatic dependent of whatever runs before it in the stream (sm_90 on):
 * its CTAs are scheduled, and its code and parameters fetched, while that
 * kernel ends; they wait before touching global memory. Decode B1 8k on the
 * H200, back to back in a graph: 15.6 -> 15.0 us per call (docs/design.md,
 * "decode-pdl"). */
#ifndef FAD_ATTN_PDL
#define FAD_ATTN_PDL 1
#endif
/* Knob that never changes a bit: 1 = for fewer than 4 query rows, the 4 warps
 * of a combine CTA split one row's columns (0: one row per warp). */
#ifndef FAD_COMBINE_BY_COLS
#define FAD_COMBINE_BY_COLS 1
#endif
/* Knob that never changes a bit: 1 = where the staged combine follows the
 * packed kernel over more than FAD_COMBINE_POLL_MIN_SPLITS splits, each split
 * CTA flags its partials done and the combine, launched early
 * (FAD_COMBINE_PDL), folds each chunk of splits as soon as it is flagged,
 * while later splits still run (0: it waits for the whole grid). At 64
 * splits (32k keys) polling measured 0.8-1.3% slower at B 4 and 8, at 256
 * 2-3% faster at B1 (H100; docs/design.md, "combine-poll"). */
#ifndef FAD_COMBINE_POLL
#define FAD_COMBINE_POLL 1
#endif
#ifndef FAD_COMBINE_POLL_MIN_SPLITS
#define FAD_COMBINE_POLL_MIN_SPLITS 64
#endif
/* The staged combine's chunks in flight a warp (2..4): 2 keeps its shared
 * memory at 37 KB (D <= 128), so that a polling combine's CTAs find room
 * beside the packed kernel's while its last splits run. */
#ifndef FAD_COMBINE_STAGES
#define FAD_COMBINE_STAGES 2
#endif
/* Knob that never changes a bit: 1 = that by-columns combine streams the
 * partials of rows longer than 32 splits through shared memory (a kernel of
 * its own: cp.async, FAD_COMBINE_STAGES chunks of 32 splits in flight a warp;
 * 0: two register batches of 16, 32 in flight, for every row). */
#ifndef FAD_COMBINE_STAGED
#define FAD_COMBINE_STAGED 1
#endif

/* 1 when this build has sm_90a code (setup.py defines it); the wgmma variants
 * are compiled and launched only then. */
#ifndef FAD_SM90A
#define FAD_SM90A 0
#endif

/* ---------------- backward: the wgmma kernels (bwd_*_wgmma.cu) ---------------- */

/* FAD_BWD_WG_DKDV_WGS / FAD_BWD_WG_DQ_WGS: warpgroups per CTA of each kernel
 * (64 keys per dkdv warpgroup, 64 rows per dq warpgroup). More share each
 * streamed tile's copy; fewer give more CTAs per SM that no barrier holds in
 * step. Changes no bit. */
#ifndef FAD_BWD_WG_DKDV_WGS
#define FAD_BWD_WG_DKDV_WGS 2
#endif
/* (D64: two since the dQ kernel got its producer there; before, without one,
 * two measured 3-5% slower: docs/design.md, "backward-order") */
#ifndef FAD_BWD_WG_DQ_WGS_D64
#define FAD_BWD_WG_DQ_WGS_D64 2
#endif
#ifndef FAD_BWD_WG_DQ_WGS_D128
#define FAD_BWD_WG_DQ_WGS_D128 2
#endif
/* Deferred waits (changes no bit): the matmuls that end a step (dV, dK; dQ)
 * are left in flight while the next step's S and dP are issued, and waited
 * for with S; the streamed tiles then take 3 shared-memory stages, so that a
 * stage is reloaded only after every warpgroup has passed such a wait.
 * FAD_BWD_WG_DKDV_DEFER_MAX_D: dkdv defers up to this head dim. At 128 the
 * D64 and D128 kernels fit their registers (no spill), but ptxas serializes
 * their wgmmas (C7515) and the backward measured 0.89-0.91x.
 * FAD_BWD_WG_DQ_DEFER: dq defers (1) or not (0). */
/* FAD_BWD_WG_DKDV_WS: 1 = the wgmma dK/dV kernel gets a producer warpgroup
 * (cp.async into a ring of FAD_BWD_WG_DKDV_WS_STAGES stages through mbarriers)
 * and its math warpgroups no CTA barrier per step; the same bits. */
#ifndef FAD_BWD_WG_DKDV_WS
#define FAD_BWD_WG_DKDV_WS 1
#endif
/* FAD_BWD_WG_DQ_WS_MIN_D: the same for the wgmma dQ kernel (its ring: its
 * kDqStages) at head dims from this one. At D128 (two math warpgroups) the
 * backward measured 1.04-1.12x with it, at D64 with one 0.88-0.95x; at D64
 * with two (FAD_BWD_WG_DQ_WGS_D64 = 2) the dQ kernel took 8-19% less time and
 * the backward measured 1.02-1.15x (docs/design.md, "backward-order"). */
#ifndef FAD_BWD_WG_DQ_WS_MIN_D
#define FAD_BWD_WG_DQ_WS_MIN_D 64
#endif
/* FAD_BWD_WG_D256_SPLIT_SDP: at head dims above 128 (bwd_wg_cfg::kSplitCols)
 * each math warpgroup issues S and dP for half of the step's rows (dK/dV) or
 * keys (dQ) and hands the other its P / dS fragments through shared memory,
 * rather than both issuing S and dP in full (0); with a score mod only, where
 * FAD_BWD_WG_D256_BY_PRODUCT (below) is set. The same chains: the same bits. */
#ifndef FAD_BWD_WG_D256_SPLIT_SDP
#define FAD_BWD_WG_D256_SPLIT_SDP 1
#endif
/* FAD_BWD_WG_D256_BY_PRODUCT: at D256, without a score mod, the math
 * warpgroups of both kernels split S and dP by product instead (1): warpgroup
 * 0 issues S^T (S) for the whole step (tile), m64n64 rather than two m64n32
 * halves, and makes P; warpgroup 1 issues dP^T (dP) and, with warpgroup 0's
 * P through shared memory, makes dS; both then issue their gradient columns.
 * m64n32 with both operands in shared memory reaches two thirds of the tensor
 * pipe (dev/wgmma_rate.cu), m64n64 all of it: the backward measured 1.04-1.10x
 * (H200). The same chains and element-wise math: the same bits. */
#ifndef FAD_BWD_WG_D256_BY_PRODUCT
#define FAD_BWD_WG_D256_BY_PRODUCT 1
#endif
#ifndef FAD_BWD_WG_DKDV_WS_STAGES
#define FAD_BWD_WG_DKDV_WS_STAGES 2
#endif
#ifndef FAD_BWD_WG_DKDV_DEFER_MAX_D
#define FAD_BWD_WG_DKDV_DEFER_MAX_D 0
#endif
#ifndef FAD_BWD_WG_DQ_DEFER
#define FAD_BWD_WG_DQ_DEFER 1
#endif
/* FAD_BWD_DQ_PDL: the wgmma dQ kernel is launched as a programmatic
 * dependent of the dK/dV kernel (bwd_launch.cu). Changes no bit. */
#ifndef FAD_BWD_DQ_PDL
#define FAD_BWD_DQ_PDL 1
#endif
/* FAD_BWD_WG_D64_STEP_M / FAD_BWD_WG_D64_TILE_N: at D64, query rows per
 * dkdv step / keys per dq tile (64 or 128: the wgmma N of S^T, dP^T / of S,
 * dP). Changes no bit. */
#ifndef FAD_BWD_WG_D64_STEP_M
#define FAD_BWD_WG_D64_STEP_M 128
#endif
#ifndef FAD_BWD_WG_D64_TILE_N
#define FAD_BWD_WG_D64_TILE_N 128
#endif
/* FAD_BWD_DQ_SPAN: the five-product dK/dV grid (bwd_block.cuh,
 * dkdv_work_of_cta) deals out the key blocks of G = ceil(FAD_BWD_DQ_SPAN /
 * key blocks) (sequence, kv head) pairs in turn, so that a block starts G
 * CTAs after the block whose dQ adds it follows; 1: one pair at a time.
 * Changes no bit (the order of the adds is fixed by the turns). */
#ifndef FAD_BWD_DQ_SPAN
#define FAD_BWD_DQ_SPAN 128
#endif
/* FAD_BWD_DQ_WARPS: warps of the five-product dK/dV kernel's producer
 * warpgroup that add the dQ tiles (bwd_dkdv_wgmma.cu, dq_warp): 1 (both
 * step-parity buffers) or 2 (one each, so two adds are in flight); the
 * group's other warps load. Changes no bit (the order of the adds is fixed
 * by the turns). */
#ifndef FAD_BWD_DQ_WARPS
#define FAD_BWD_DQ_WARPS 2
#endif
/* FAD_BWD_DQ_LAG_MAX_D: up to this head dim (score mods aside: ptxas
 * serialized their wgmma), the five-product dK/dV kernel issues each step's
 * dQ product a step late and its math warpgroups take turns at issuing their
 * products (bwd_dkdv_wgmma.cu, kLag). Changes no bit: the same products, the
 * same chains. */
#ifndef FAD_BWD_DQ_LAG_MAX_D
#define FAD_BWD_DQ_LAG_MAX_D 64
#endif

#endif /* FAD_CONFIG_H */
