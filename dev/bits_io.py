# bits_io.py: The save-or-compare step of dev/fwd_bits.py and dev/decode_bits.py. Verdict: tool (shared helper).
"""save_or_compare(out): with argv [path] saves out (a dict of tuples of tensors) to path; with
[path, "cmp"] loads path and prints the keys whose tensors differ from out's in any bit, exiting 1
if any does."""
import sys

import torch


def bits(t):
    """t's bit patterns (so that -0 and +0, or two NaNs, compare as what they are)."""
    return t.view(torch.int16 if t.element_size() == 2 else torch.int32)


def save_or_compare(out, argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[1:] == ["cmp"]:
        ref = torch.load(argv[0])
        bad = [key for key in ref
               if not all(torch.equal(bits(a), bits(b)) for a, b in zip(ref[key], out[key]))]
        print(f"{len(bad)} of {len(ref)} cases differ in some bit: {bad}")
        sys.exit(1 if bad else 0)
    torch.save(out, argv[0])
    print(f"saved {len(out)} cases")
