"""CPU emulation for dev/wip/dkdv_dropout_staged*.patch: the transposed keep mask of
dropout_kept_transposed (main) and of dropout_draw_group + dropout_kept_staged (the patch), per
thread of a warpgroup, on flash_attn_det.dropout's Philox; checks the masks are equal and the
shared-memory words are written once each.    python3 dev/wip/emulate_staged.py"""
import os
import random
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from flash_attn_det.dropout import _philox_int
U32 = 0xffffffff
def draw(k0, k1, h, i_pos, j, seq=0):
    c = [((j >> 6) << 2) | ((j >> 1) & 3), i_pos & U32, h, seq]
    return _philox_int(c, k0, k1, rounds=7)
def kb(word, byte, keep8): return int(((word >> (8 * byte)) & 0xff) < keep8)
def old(k0, k1, keep8, h, j, m0, i_off, lane, kMB):
    mine = (lane >> 2) & 1; wsel = (j >> 4) & 3; shift = 8 * (j & 1); kept = 0
    for nb in range(kMB):
        words = []
        for e2 in range(2):  # own/other resolved: the row with offset e2
            i = m0 + nb * 8 + (lane % 4) * 2 + e2
            words.append(draw(k0, k1, h, i + i_off, j)[wsel] >> shift)
        for e2 in range(2):
            for e1 in range(2):
                kept |= kb(words[e2], 2 * e1, keep8) << (nb * 4 + 2 * e1 + e2)
    return kept
def new(k0, k1, keep8, h, g0, jj, m0, i_off, lane, kRows):
    kPad = kRows + 8; s = {}
    for t in range(128):
        for k in range(kRows * 4 // 128):
            c = t + 128 * k; row, pr = c >> 2, c & 3
            bits = draw(k0, k1, h, m0 + row + i_off, g0 + 2 * pr)
            for w in range(4):
                idx = (4 * w + pr) * kPad + row
                assert idx not in s; s[idx] = bits[w]
    w = (jj >> 4) & 3; pr = (jj >> 1) & 3; shift = 8 * (jj & 1); base = (4 * w + pr) * kPad + 2 * (lane % 4)
    kept = 0
    for nb in range(kRows // 8):
        for e2 in range(2):
            word = s[base + 8 * nb + e2] >> shift
            for e1 in range(2):
                kept |= kb(word, 2 * e1, keep8) << (nb * 4 + 2 * e1 + e2)
    return kept
rng = random.Random(5)
n = 0
for trial in range(3):
    k0, k1, keep8, h = rng.getrandbits(32), rng.getrandbits(32), rng.choice([26, 128, 230]), rng.randrange(8)
    kRows = rng.choice([32, 64, 128]); g0 = 64 * rng.randrange(4); m0 = kRows * rng.randrange(3); i_off = rng.randrange(50)
    for warp in range(4):
        for lane in range(0, 32, 3):
            jj = warp * 16 + lane // 4
            a = old(k0, k1, keep8, h, g0 + jj, m0, i_off, lane, kRows // 8)
            b = new(k0, k1, keep8, h, g0, jj, m0, i_off, lane, kRows)
            assert a == b, (trial, warp, lane, hex(a), hex(b)); n += 1
print("equal masks:", n)
