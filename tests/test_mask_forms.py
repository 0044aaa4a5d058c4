"""The walk rules of csrc/fad_math.h, each held to one definition by a plain C program, so CI
(no GPU) checks what every path (CPU and kernels) compiles:
- the mask in its two forms: fad_row_keys, a row's key range, used by the forward, the CPU path
  and the mma.sync backward; fad_band_masked, the per-element test the wgmma backward's dK/dV
  kernel uses; compared on every (row, key) of many shapes and windows;
- where a split starts and ends: fad_split_of / fad_split_keys (the definition), the tile
  count-down fad_split_tiles_left that the prefill kernels walk with, and the split range
  fad_first_split / fad_end_split of a key range that the combine and the CPU path walk,
  against brute force over keys;
- the division by a launch's constant (fad_fastdiv, the warp-specialized forward's grid index)
  against '/'."""
import os
import shutil
import subprocess

import pytest

CSRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "csrc")


def run_check(tmp_path, name, program):
    """Compiles a C check against csrc/fad_math.h and runs it: it must count checks and no bad one."""
    src, exe = tmp_path / f"{name}.c", tmp_path / name
    src.write_text(program)
    subprocess.run(["gcc", "-O2", "-std=c11", "-Wall", "-I" + CSRC, str(src), "-o", str(exe), "-lm"],
                   check=True)
    proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout
    assert "bad 0" in proc.stdout and "checked 0 " not in proc.stdout, proc.stdout

PROGRAM = r"""
#include <stdio.h>
#include "fad_math.h"

int main(void)
{
    static const int lens[] = {1, 2, 7, 64, 65, 130};
    static const int windows[] = {-1, 0, 1, 5, 64, 200};
    long checked = 0, bad = 0;
    for (int a = 0; a < 6; a++)
        for (int b = 0; b < 6; b++)
            for (int wl = 0; wl < 6; wl++)
                for (int wr = 0; wr < 6; wr++) {
                    const int lq = lens[a], lk = lens[b];
                    const fad_band band = fad_make_band(lq, lk, windows[wl], windows[wr]);
                    for (int i = 0; i < lq; i++) {
                        const fad_key_range r = fad_row_keys(i, lq, lk, windows[wl], windows[wr]);
                        for (int j = 0; j < lk + 3; j++) {
                            const int in_range = j >= r.lo && j < r.hi;
                            checked++;
                            if (in_range == fad_band_masked(band, i, j)) {
                                if (bad++ < 5)
                                    printf("MISMATCH lq=%d lk=%d wl=%d wr=%d i=%d j=%d\n", lq, lk,
                                           windows[wl], windows[wr], i, j);
                            }
                        }
                    }
                }
    printf("checked %ld bad %ld\n", checked, bad);
    return bad != 0;
}
"""


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_band_mask_equals_row_key_ranges(tmp_path):
    run_check(tmp_path, "mask_forms", PROGRAM)


SPLIT_PROGRAM = r"""
#include <stdio.h>
#include "fad_math.h"

int main(void)
{
    static const int sizes[] = {64, 128, 192, 512, 1024};
    static const int blocks[] = {32, 64};
    long checked = 0, bad = 0;
    for (int a = 0; a < 5; a++) {
        const int S = sizes[a];
        for (int t = 0; t < 3 * 1024; t++) { /* every key lies in the split that claims it */
            const fad_key_range k = fad_split_keys(fad_split_of(t, S), S);
            checked++;
            bad += !(k.lo <= t && t < k.hi && k.hi - k.lo == S);
        }
        for (int c = 0; c < 2; c++) /* counting tiles down reaches the split's end exactly */
            for (int t0 = 0; t0 < 3 * 1024; t0 += blocks[c]) {
                const int n = fad_split_tiles_left(t0, S, blocks[c]);
                const int last = t0 + (n - 1) * blocks[c];
                checked++;
                bad += !(n >= 1 && fad_split_of(last, S) == fad_split_of(t0, S) &&
                         fad_split_of(last + blocks[c], S) == fad_split_of(t0, S) + 1);
            }
        for (int lo = 0; lo < 600; lo += 7) /* the splits a key range meets, by brute force */
            for (int hi = lo; hi < 1300; hi += 13) {
                const fad_key_range r = {lo, hi};
                int first = -1, end = -1;
                for (int t = lo; t < hi; t++) {
                    if (first < 0) first = fad_split_of(t, S);
                    end = fad_split_of(t, S) + 1;
                }
                const int f = fad_first_split(r, S), e = fad_end_split(r, S);
                checked++;
                if (first < 0 ? e != f : (f != first || e != end)) {
                    if (bad++ < 5)
                        printf("MISMATCH S=%d [%d, %d): %d..%d vs %d..%d\n", S, lo, hi, f, e, first, end);
                }
            }
    }
    printf("checked %ld bad %ld\n", checked, bad);
    return bad != 0;
}
"""


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_split_rules_agree(tmp_path):
    run_check(tmp_path, "split_rules", SPLIT_PROGRAM)


FASTDIV_PROGRAM = r"""
#include <stdio.h>
#include "fad_math.h"

static long checked, bad;

static void check(int n, uint32_t d, fad_fastdiv f)
{
    const int want = (int)((uint32_t)n / d), got = fad_fastdiv_div(n, f);
    checked++;
    if (got != want && bad++ < 5)
        printf("MISMATCH %d / %u: %d, want %d\n", n, d, got, want);
}

int main(void)
{
    /* every divisor below 70000 on edges and a spread of numerators; then divisors near
     * powers of two and up to 2^31 - 1 */
    static const int edges[] = {0, 1, 2, 3, 127, 128, 65535, 65536, 1 << 20, (1 << 30) - 1, 1 << 30,
                                0x7ffffffe, 0x7fffffff};
    for (uint32_t d = 1; d < 70000; d++) {
        const fad_fastdiv f = fad_make_fastdiv(d);
        for (unsigned e = 0; e < sizeof edges / sizeof edges[0]; e++)
            check(edges[e], d, f);
        for (long long q = 0; q * d < 0x7fffffffLL; q = q * 3 + 1) { /* multiples and their neighbours */
            const long long n = q * d;
            check((int)n, d, f);
            if (n > 0) check((int)(n - 1), d, f);
            if (n + 1 < 0x7fffffffLL) check((int)(n + 1), d, f);
        }
        for (int n = 0; n < 300; n++)
            check(n, d, f);
    }
    for (int k = 1; k < 31; k++)
        for (int delta = -2; delta <= 2; delta++) {
            const long long d = (1LL << k) + delta;
            if (d < 1 || d > 0x7fffffffLL) continue;
            const fad_fastdiv f = fad_make_fastdiv((uint32_t)d);
            for (unsigned e = 0; e < sizeof edges / sizeof edges[0]; e++)
                check(edges[e], (uint32_t)d, f);
            for (long long n = 0x7fffffffLL; n > 0; n = n * 7 / 8)
                check((int)n, (uint32_t)d, f), check((int)(n - n % d), (uint32_t)d, f);
        }
    const uint32_t big[] = {0x7fffffffu, 0x7ffffffeu, 0x40000001u, 1000000007u, 87382u, 33554432u};
    for (unsigned i = 0; i < sizeof big / sizeof big[0]; i++) {
        const fad_fastdiv f = fad_make_fastdiv(big[i]);
        for (long long n = 0x7fffffffLL; n > 0; n = n * 15 / 16)
            check((int)n, big[i], f), check((int)(n - n % big[i]), big[i], f),
                check((int)(n - n % big[i] - (n >= big[i])), big[i], f);
    }
    printf("checked %ld bad %ld\n", checked, bad);
    return bad != 0;
}
"""


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_fastdiv_equals_division(tmp_path):
    """fad_fastdiv_div (the warp-specialized forward's grid index) against '/'."""
    run_check(tmp_path, "fastdiv", FASTDIV_PROGRAM)
