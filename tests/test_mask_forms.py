"""The mask in its two forms (csrc/fad_math.h): fad_row_keys, a row's key range, used by the
forward, the CPU path and the mma.sync backward; fad_band_masked, the per-element test the
wgmma backward's dK/dV kernel uses. A plain C program compares them on every (row, key) of
many shapes and windows, so CI (no GPU) holds the two to one rule."""
import os
import shutil
import subprocess

import pytest

CSRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "csrc")

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
    src, exe = tmp_path / "mask_forms.c", tmp_path / "mask_forms"
    src.write_text(PROGRAM)
    subprocess.run(["gcc", "-O2", "-std=c11", "-Wall", "-I" + CSRC, str(src), "-o", str(exe), "-lm"],
                   check=True)
    proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout
    assert "bad 0" in proc.stdout and "checked 0 " not in proc.stdout, proc.stdout
