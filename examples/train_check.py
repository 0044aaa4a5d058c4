"""Training check on the GPU: a tiny causal transformer whose attention is
flash_attn_det's, trained on random tokens.

  1. Two runs of --steps steps from the same seed give bit-identical losses and weights.
  2. For one step on a batch of 8, every layer's attention-input gradients (dq, dk, dv for
     the captured q, k, v and dout) equal, bit for bit, those of the same sequences run as
     two batches of 4 and one sequence alone.

  3. Speed beside the peers a user would otherwise train with (--peers, default
     sdpa_cudnn,sdpa_flash): the same model and steps with attention through torch SDPA
     (enable_gqa, the model's (B, H, L, D) transposed views), the impls taking turns
     (--rounds), torch.use_deterministic_algorithms off for every impl in this part (SDPA's
     backward refuses to run under it); tokens/s of each, the median of its rounds.

    python3 examples/train_check.py [--steps 300] [--json out.json] [--peers ...] [--rounds 2]

The rest of the model uses torch ops under torch.use_deterministic_algorithms(True)
(CUBLAS_WORKSPACE_CONFIG set below), so any run-to-run difference would come from
attention. Exit status 0 only when checks 1 and 2 hold.
"""
import argparse
import json
import os
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

import flash_attn_det as fad  # noqa: E402

VOCAB, DIM, LAYERS, HEADS, KV_HEADS, SEQ, BATCH = 512, 256, 4, 4, 2, 256, 8
HEAD_DIM = DIM // HEADS
ATTN = "fad"  # which attention the model runs: "fad" or an SDPA backend of SDPA_BACKENDS
SDPA_BACKENDS = {"sdpa_cudnn": SDPBackend.CUDNN_ATTENTION, "sdpa_flash": SDPBackend.FLASH_ATTENTION}


def attention(q, k, v):
    """Causal attention of (B, L, H, D) q and (B, L, Hkv, D) k, v with the model's impl."""
    if ATTN == "fad":
        return fad.flash_attn_func(q, k, v, causal=True)  # GQA 4/2, no expansion
    with sdpa_kernel(SDPA_BACKENDS[ATTN]):
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                             is_causal=True, enable_gqa=True)
    return out.transpose(1, 2)


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q = nn.Linear(DIM, HEADS * HEAD_DIM, bias=False)
        self.kv = nn.Linear(DIM, 2 * KV_HEADS * HEAD_DIM, bias=False)
        self.o = nn.Linear(HEADS * HEAD_DIM, DIM, bias=False)
        self.capture = None  # a list: append (q, k, v, out) and later dout

    def forward(self, x):
        B, L, _ = x.shape
        q = self.q(x).view(B, L, HEADS, HEAD_DIM)
        k, v = self.kv(x).view(B, L, 2, KV_HEADS, HEAD_DIM).unbind(2)
        out = attention(q, k, v)
        if self.capture is not None and out.requires_grad:
            rec = [q.detach(), k.detach(), v.detach()]
            out.register_hook(lambda g: rec.append(g.detach()))
            self.capture.append(rec)
        return self.o(out.reshape(B, L, -1))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.n1, self.n2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.attn = Attention()
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

    def forward(self, x):
        x = x + self.attn(self.n1(x))
        return x + self.mlp(self.n2(x))


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, tokens):
        x = self.emb(tokens)
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def batches(steps, seed):
    gen = torch.Generator(device="cpu")
    gen.manual_seed(seed)
    for _ in range(steps):
        yield torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=gen).cuda()


def train(steps, seed=0):
    torch.manual_seed(seed)
    model = TinyLM().cuda().to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for tokens in batches(steps, seed + 1):
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return model, losses


def attn_grads(q, k, v, dout):
    q, k, v = (t.clone().requires_grad_(True) for t in (q, k, v))
    out = fad.flash_attn_func(q, k, v, causal=True)
    return (out.detach(),) + torch.autograd.grad(out, (q, k, v), dout)


def batch_split_check(model, seed=7):
    """One training step on 8 sequences; each layer's attention gradients vs 4 + 4 and 1."""
    for b in model.blocks:
        b.attn.capture = []
    tokens = next(batches(1, seed))
    logits = model(tokens[:, :-1])
    F.cross_entropy(logits.float().reshape(-1, VOCAB), tokens[:, 1:].reshape(-1)).backward()
    results = []
    for layer, b in enumerate(model.blocks):
        (q, k, v, dout), = b.attn.capture
        b.attn.capture = None
        full = attn_grads(q, k, v, dout)
        halves = [attn_grads(q[s], k[s], v[s], dout[s]) for s in (slice(0, 4), slice(4, 8))]
        alone = attn_grads(q[3:4], k[3:4], v[3:4], dout[3:4])
        split_ok = all(torch.equal(f, torch.cat((a, c))) for f, a, c in zip(full, *halves))
        alone_ok = all(torch.equal(f[3:4], a) for f, a in zip(full, alone))
        results.append(dict(layer=layer, b8_equals_4_plus_4=split_ok, seq3_equals_alone=alone_ok,
                            dq_abs_max=float(full[1].abs().max())))
    return results


def speed(impls, steps, rounds):
    """tokens/s of each attention impl on the same training run, the impls taking turns."""
    global ATTN
    torch.use_deterministic_algorithms(False)
    times = {i: [] for i in impls}
    try:
        for _ in range(rounds):
            for impl in impls:
                ATTN = impl
                torch.cuda.synchronize()
                t0 = time.time()
                train(steps)
                torch.cuda.synchronize()
                times[impl].append(time.time() - t0)
    finally:
        ATTN = "fad"
        torch.use_deterministic_algorithms(True)
    out = {}
    for impl, ts in times.items():
        t = sorted(ts)[len(ts) // 2]
        out[impl] = dict(seconds=[round(x, 2) for x in ts], tokens_per_s=round(steps * BATCH * SEQ / t))
    for impl in impls[1:]:
        out[impl]["fad_speedup"] = round(out["fad"]["tokens_per_s"] / out[impl]["tokens_per_s"], 3)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--json", default=None)
    ap.add_argument("--peers", default="sdpa_cudnn,sdpa_flash",
                    help="SDPA backends timed beside flash_attn_det ('' for none)")
    ap.add_argument("--rounds", type=int, default=2, help="turns of each impl in the speed part")
    args = ap.parse_args()
    peers = [p for p in args.peers.split(",") if p]
    for p in peers:
        if p not in SDPA_BACKENDS:
            ap.error(f"--peers: unknown {p!r} (known: {', '.join(SDPA_BACKENDS)})")
    torch.use_deterministic_algorithms(True)
    fad.set_deterministic_mode(True, split_size=512)
    t0 = time.time()
    m1, l1 = train(args.steps)
    t1 = time.time()
    m2, l2 = train(args.steps)
    weights_equal = all(torch.equal(a, b) for a, b in zip(m1.state_dict().values(),
                                                          m2.state_dict().values()))
    split = batch_split_check(m1)
    peer_speed = speed(["fad"] + peers, args.steps, args.rounds) if peers else None
    report = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, steps=args.steps,
                  batch=BATCH, seqlen=SEQ, layers=LAYERS, heads=f"{HEADS}/{KV_HEADS}",
                  head_dim=HEAD_DIM, seconds_per_run=round(t1 - t0, 2),
                  tokens_per_s=round(args.steps * BATCH * SEQ / (t1 - t0)),
                  loss_first=l1[0], loss_last=l1[-1], losses_equal=l1 == l2,
                  weights_equal=weights_equal, batch_split=split, speed=peer_speed)
    ok = report["losses_equal"] and weights_equal and all(
        r["b8_equals_4_plus_4"] and r["seq3_equals_alone"] for r in split)
    report["result"] = "PASS" if ok else "FAIL"
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
