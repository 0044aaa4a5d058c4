# probe_bwd_placement.py: Whether the backward's speed depends on where its buffers land in memory. Verdict: no; the moves read 470-511 TFLOP/s (D128 L8k causal) in the same sequence in three processes, the grid 459-536 with no pattern by buffer or offset and cuDNN 446-520: the speed drifts in time (the clock at the power limit, probe_bwd_power.py).
"""Times the deterministic backward (D128 L8k B4 H16 bf16, causal and full) in one process
while its buffers move, two ways:

    PYTHONPATH=$PWD python3 dev/probe_bwd_placement.py moves [n]   # the workspace n times, then the inputs
    PYTHONPATH=$PWD python3 dev/probe_bwd_placement.py grid        # input sets x workspaces, cuDNN beside

moves: the workspace (row sums, fp32 dQ accumulator and its semaphores) moves by holding the
block the caching allocator would hand back, then the inputs are made afresh (the old ones
kept). grid: 3 input sets x 7 workspaces (the uint8 workspace the backward asks torch for,
handed out of 3 preallocated buffers, and at 4 offsets inside the first), cuDNN's backward
timed on each input set. Prints TFLOP/s (15-20 calls a median)."""
import os
import statistics
import sys

import torch

import flash_attn_det as fad

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
import common  # noqa: E402

fad.set_deterministic_mode(True)
B, L, H, D = 4, 8192, 16, 128
real_empty = torch.empty
ws = {"sizes": [], "pick": None}  # the workspaces asked for; (buffer, offset) to hand out


def ws_empty(*args, **kw):
    if kw.get("dtype") is torch.uint8:
        n = args[0] if isinstance(args[0], int) else args[0][0]
        ws["sizes"].append(n)
        if ws["pick"] is not None:
            buf, off = ws["pick"]
            return buf[off:off + n]
    return real_empty(*args, **kw)


torch.empty = ws_empty


def make(seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(B, L, H, D, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
               for _ in range(3))
    return q, k, v, torch.randn(B, L, H, D, device="cuda", dtype=torch.bfloat16, generator=g)


def tflops(fn, causal, n=15):
    ms = statistics.median(common.time_ms(fn, [()], n, 3, torch.device("cuda")))
    return 2.5 * 4 * B * H * L * L * D / (2 if causal else 1) / (ms * 1e-3) / 1e12


def fad_bwd(x, causal):
    q, k, v, do = x
    out = fad.flash_attn_func(q, k, v, causal=causal)
    return lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True)


def cudnn_bwd(x, causal):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    qt, kt, vt = (t.detach().transpose(1, 2).requires_grad_() for t in x[:3])
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        out = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
    dot = x[3].transpose(1, 2)

    def run():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.autograd.grad(out, (qt, kt, vt), dot, retain_graph=True)
    return run


def moves(n):
    x, hold = make(0), []
    print("workspace moves (same inputs): causal / full TFLOP/s")
    for i in range(n):
        c, f = tflops(fad_bwd(x, True), True), tflops(fad_bwd(x, False), False)
        print(f"  ws {i}: {c:6.1f} / {f:6.1f}   (workspace {max(ws['sizes']) / 2**20:.0f} MiB)")
        hold.append(real_empty(max(ws["sizes"]), dtype=torch.uint8, device="cuda"))
    del hold
    print("input moves (fresh inputs, the old ones kept): causal / full TFLOP/s")
    keep = [x]
    for i in range(n):
        keep.append(make(i + 1))
        print(f"  in {i}: {tflops(fad_bwd(keep[-1], True), True):6.1f} / "
              f"{tflops(fad_bwd(keep[-1], False), False):6.1f}")


def grid():
    xs = [make(s) for s in range(3)]
    bufs = [real_empty((300 << 20) + (4 << 20), dtype=torch.uint8, device="cuda") for _ in range(3)]
    places = [(0, 0), (1, 0), (2, 0), (0, 4096), (0, 65536), (0, 1 << 20), (0, 3 << 20)]
    for causal in (True, False):
        print(f"{'causal' if causal else 'full'}: TFLOP/s, rows input sets, columns workspace (buffer, offset)")
        print("          " + " ".join(f"{b}+{o >> 10:>5}K" for b, o in places) + "    cuDNN")
        for i, x in enumerate(xs):
            row = []
            for b, o in places:
                ws["pick"] = (bufs[b], o)
                row.append(tflops(fad_bwd(x, causal), causal))
            ws["pick"] = None
            print(f"  in {i}:  " + " ".join(f"{t:9.1f}" for t in row)
                  + f"   {tflops(cudnn_bwd(x, causal), causal):6.1f}", flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["grid"]:
        grid()
    else:
        moves(int(sys.argv[2]) if len(sys.argv) > 2 else 6)
