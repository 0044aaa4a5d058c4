"""End to end: a ~0.5B-parameter transformers model with random weights on batch-invariant
blocks (flash_attn_det.integrations.transformers.make_invariant) beside the same model on
stock torch (cuBLAS, and SDPA as transformers picks its backend), in alternating turns.

  generate: greedy, --new-tokens tokens after --prompt-len-token prompts, batch sizes --batches
  train:    one step (forward, summed cross-entropy, backward, AdamW) on --train-batch x
            --train-len tokens

Prints a markdown table (tokens/s of each, invariant / stock) and writes it to --out.

    python3 benchmarks/bench_model.py --shapes llama-0.5b,qwen2-0.5b --out results.md
"""
import argparse
import time

import torch
import torch.nn.functional as F

from flash_attn_det import blocks
from flash_attn_det.integrations.transformers import make_invariant
from flash_attn_det.parity import build_model


def timed(fn, reps):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps


def gen_fn(model, batch, prompt_len, new_tokens):
    g = torch.Generator().manual_seed(batch)
    ids = torch.randint(1, model.config.vocab_size, (batch, prompt_len), generator=g).cuda()
    model.generation_config.eos_token_id = None

    def run():
        model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                       max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=0)
    return run


def train_fn(model, batch, seqlen, invariant):
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(1, model.config.vocab_size, (batch, seqlen + 1), generator=g).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    V = model.config.vocab_size

    def run():
        logits = model(ids[:, :-1]).logits
        if invariant:
            loss = blocks.cross_entropy(logits, ids[:, 1:], reduction="sum")
        else:
            loss = F.cross_entropy(logits.float().reshape(-1, V), ids[:, 1:].reshape(-1),
                                   reduction="sum")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return run


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="llama-0.5b,qwen2-0.5b")
    ap.add_argument("--batches", default="1,8,64", help="generate batch sizes ('': none)")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--train-batch", type=int, default=8)
    ap.add_argument("--train-len", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows = []
    for shape in args.shapes.split(","):
        stock = build_model(shape, "cuda")
        stock.set_attn_implementation("sdpa")
        inv = make_invariant(build_model(shape, "cuda"))
        params = sum(p.numel() for p in stock.parameters()) / 1e9
        work = [(f"generate B{b}", b * args.new_tokens,
                 gen_fn(stock, b, args.prompt_len, args.new_tokens),
                 gen_fn(inv, b, args.prompt_len, args.new_tokens), 1)
                for b in (int(x) for x in args.batches.split(",") if x)]
        stock.train(), inv.train()
        work.append((f"train step {args.train_batch}x{args.train_len}",
                     args.train_batch * args.train_len,
                     train_fn(stock, args.train_batch, args.train_len, False),
                     train_fn(inv, args.train_batch, args.train_len, True), 3))
        for name, tokens, f_stock, f_inv, reps in work:
            f_stock(), f_inv()  # warm-up: plans, allocator, autotuning
            ts, ti = [], []
            for _ in range(args.rounds):
                ts.append(timed(f_stock, reps))
                ti.append(timed(f_inv, reps))
            s, i = sorted(ts)[len(ts) // 2], sorted(ti)[len(ti) // 2]
            rows.append((shape, f"{params:.2f}", name, tokens / s, tokens / i, s / i))
            print(f"{shape} {name}: stock {tokens / s:.0f} tok/s, invariant {tokens / i:.0f} "
                  f"tok/s, ratio {s / i:.3f}", flush=True)
        stock.eval(), inv.eval()
        del stock, inv
        torch.cuda.empty_cache()
    lines = [f"# End to end: invariant vs stock ({torch.cuda.get_device_name()}, torch "
             f"{torch.__version__}, bf16, median of {args.rounds} alternating rounds)", "",
             "| model | params (B) | work | stock tok/s | invariant tok/s | invariant / stock |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {a} | {b} | {c} | {d:.0f} | {e:.0f} | {f:.3f} |" for a, b, c, d, e, f in rows]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
