/*
 * dq_turn_check.cu — the five-product backward's add order on the CPU
 * (tests/test_bwd_dq_reduce.py builds and runs it with nvcc, host code only):
 * for random lengths and masks (causal, windows, more rows than keys or fewer),
 * every row tile's walkers (dkdv_row_tiles, the dK/dV kernel's own walk) must
 * take the turns 0, 1, 2, ... in key-block order, from the last block down or
 * (GQA's walk) from the first up (dq_turn). A gap
 * would leave a CTA waiting forever; a repeat would add twice in one turn.
 * And the accumulator's layout (dq_tile, dq_accum_cfg::head_tiles): for
 * random batches, dense or varlen, no two (sequence, head, row tile) share a
 * tile and every tile lies below heads x head_tiles, the workspace's count.
 * Prints "ok <cases>" or the first failing case, and exits nonzero on failure.
 */
#include <cstdio>
#include <vector>

#include "cuda/bwd_dq_accum.cuh"

template <int kM, int kN> static bool check(int lq, int lk, int wl, int wr, bool from_first)
{
    const int n_blocks = (lk + kN - 1) / kN, m_tiles = (lq + kM - 1) / kM;
    std::vector<std::vector<int>> walkers(m_tiles);
    for (int i = 0; i < n_blocks; i++) { /* in turn order: each tile's list is too */
        const int j = from_first ? i : n_blocks - 1 - i;
        int first = 0, count = 0;
        dkdv_row_tiles<kM, kN>(lq, lk, wl, wr, j * kN, &first, &count);
        for (int m = first; m < first + count; m++)
            walkers[m].push_back(j);
    }
    for (int m = 0; m < m_tiles; m++)
        for (size_t t = 0; t < walkers[m].size(); t++) {
            const int turn = dq_turn(walkers[m][t], kN, m, kM, lq, lk, wl, wr, from_first);
            if (turn != (int)t) {
                std::printf("FAIL kM %d kN %d len_q %d len_k %d window (%d, %d) from_first %d: tile %d, key "
                            "block %d has turn %d, expected %d\n", kM, kN, lq, lk, wl, wr, (int)from_first, m,
                            walkers[m][t], turn, (int)t);
                return false;
            }
        }
    return true;
}

/* Every (sequence, head, row tile) of a call of `lens` rows, dense (every
 * sequence padded to the longest) or varlen: distinct tiles, all below the
 * workspace's count. */
template <int kHeadDim> static bool check_layout(const std::vector<int> &lens, int heads, bool varlen)
{
    using Acc = dq_accum_cfg<kHeadDim>;
    std::vector<int32_t> cu(1, 0);
    int longest = 0;
    for (int l : lens) {
        cu.push_back(cu.back() + l);
        longest = l > longest ? l : longest;
    }
    fad_fwd_params p = {};
    p.batch = (int)lens.size(), p.num_heads = heads, p.seqlen_q = longest;
    p.cu_seqlens_q = varlen ? cu.data() : nullptr, p.total_q = cu.back();
    bwd_args a = {};
    a.p = p, a.dq_head_tiles = Acc::head_tiles(p), a.dq_m_tiles = Acc::m_tiles(p);
    const int64_t tiles = heads * a.dq_head_tiles;
    std::vector<char> used((size_t)tiles, 0);
    for (int b = 0; b < p.batch; b++)
        for (int h = 0; h < heads; h++)
            for (int m = 0; m * Acc::kRows < (varlen ? lens[b] : longest); m++) {
                fad_seq seq = {};
                seq.row0 = varlen ? cu[b] : (int64_t)b * heads * longest; /* (fad_get_seq's) */
                const int64_t t = dq_tile(a, b, seq, h, m, Acc::kRows);
                if (t < 0 || t >= tiles || used[(size_t)t]) {
                    std::printf("FAIL layout D%d %s batch %d heads %d: sequence %d (%d rows) head %d tile %d -> %lld "
                                "of %lld%s\n", kHeadDim, varlen ? "varlen" : "dense", p.batch, heads, b, lens[b], h,
                                m, (long long)t, (long long)tiles, t >= 0 && t < tiles ? ", taken" : "");
                    return false;
                }
                used[(size_t)t] = 1;
            }
    return true;
}

int main()
{
    unsigned s = 20261129u;
    auto rnd = [&](int n) { s = s * 1664525u + 1013904223u; return (int)((s >> 8) % (unsigned)n); };
    int cases = 0;
    for (int it = 0; it < 20000; it++) {
        const int lq = 1 + rnd(1500), lk = 1 + rnd(1500);
        const int wl = rnd(3) == 0 ? -1 : rnd(600);
        const int wr = rnd(3) == 0 ? -1 : rnd(2) ? 0 : rnd(600); /* (0: causal) */
        /* the tile shapes of D128 (64-row steps) and D64 (128-row steps), 128-key blocks */
        for (bool from_first : {false, true}) {
            if (!check<dq_accum_cfg<128>::kRows, bwd_wg_cfg<128>::kKeys>(lq, lk, wl, wr, from_first) ||
                !check<dq_accum_cfg<64>::kRows, bwd_wg_cfg<64>::kKeys>(lq, lk, wl, wr, from_first))
                return 1;
            cases += 2;
        }
    }
    for (int it = 0; it < 3000; it++) { /* batches of 1-24 sequences of 0-700 rows, 1-3 heads */
        std::vector<int> lens(1 + rnd(24));
        for (int &l : lens)
            l = rnd(4) == 0 ? rnd(3) : rnd(701);
        const int heads = 1 + rnd(3);
        for (bool varlen : {false, true}) {
            if (!check_layout<128>(lens, heads, varlen) || !check_layout<64>(lens, heads, varlen))
                return 1;
            cases += 2;
        }
    }
    std::printf("ok %d\n", cases);
    return 0;
}
