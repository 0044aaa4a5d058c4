"""The pinned-algorithm GEMM (flash_attn_det.blocks.linear) on the GPU: each row's bits for
row counts 1..16384 against the rows of the largest call, at the linear shapes of the
0.5B models, and its time beside torch's (cuBLAS's own choice) at 1, 64 and 8192 rows.
Verdict so far: see docs/performance.md, "Batch-invariant blocks".

    python3 dev/probe_gemm.py
"""
import torch
import torch.nn.functional as F

from flash_attn_det import blocks

SHAPES = [(1536, 1536), (512, 1536), (4096, 1536), (1536, 4096), (32000, 1536),  # llama-0.5b
          (896, 896), (128, 896), (4864, 896), (896, 4864), (151936, 896)]        # qwen2-0.5b
ROWS = [1, 2, 3, 5, 8, 13, 31, 64, 100, 127, 128, 129, 500, 1000, 2048, 4095, 8192, 16384]


def bench(fn, reps=20):
    fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(5):
        s.record()
        for _ in range(reps):
            fn()
        e.record()
        torch.cuda.synchronize()
        ts.append(s.elapsed_time(e) / reps * 1e3)
    return sorted(ts)[2]


def main():
    torch.manual_seed(0)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("| N | K | rows checked | rows differing (cuBLAS) | rows differing (pinned) | "
          "us at 1 / 64 / 8192 rows: torch | pinned | rel err vs fp64 |")
    print("|---|---|---|---|---|---|---|---|")
    for N, K in SHAPES:
        x = torch.randn(max(ROWS), K, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K ** 0.5
        full_t, full_p = F.linear(x, w), blocks.linear(x, w)
        bad_t = bad_p = 0
        for m in ROWS:
            for start in (0, 3):
                if start + m > len(x):
                    continue
                bad_t += not torch.equal(F.linear(x[start:start + m], w), full_t[start:start + m])
                bad_p += not torch.equal(blocks.linear(x[start:start + m], w), full_p[start:start + m])
        ref = x[:256].double() @ w.double().T
        err = float((full_p[:256].double() - ref).norm() / ref.norm())
        times = [(bench(lambda: F.linear(x[:m], w)), bench(lambda: blocks.linear(x[:m], w)))
                 for m in (1, 64, 8192)]
        print(f"| {N} | {K} | {2 * len(ROWS) - 1} | {bad_t} | {bad_p} | "
              f"{' / '.join(f'{t:.1f}' for t, _ in times)} | "
              f"{' / '.join(f'{p:.1f}' for _, p in times)} | {err:.1e} |", flush=True)


if __name__ == "__main__":
    main()
