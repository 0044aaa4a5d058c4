"""Sampler vs trainer parity: do the log-probabilities a trainer recomputes for sampled
tokens equal, bit for bit, those the sampler saw while generating them?

    from flash_attn_det.parity import parity_check
    report = parity_check(model, prompts, max_new_tokens=32)   # report["mismatches"] == 0

The sampler is transformers' generate: one left-padded batch, greedy, the KV cache, and
optionally chunked prefill (prefill_chunk_size). Each step's log-probability of the chosen
token comes from the logits generate returns. The trainer recomputes them from the finished
sequences four ways: each sequence alone, all in one right-padded batch (with and without
autograd recording), and all packed into one row (position ids restarting, the varlen path). A token counts as a mismatch when
any recomputation differs from the sampler in any bit.

Command line, on a model built from a config with random weights (no download):

    python -m flash_attn_det.parity --shape llama-0.5b --sequences 64 --new-tokens 32
"""
import argparse
import json
import time

import torch

from .blocks import token_logprobs


def _generate(model, prompts, max_new_tokens, pad_id, prefill_chunk_size):
    """Left-padded greedy generate; returns the new tokens (B, T) and their logprobs (B, T)."""
    dev = model.device
    L = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), L), pad_id, dtype=torch.long, device=dev)
    mask = torch.zeros((len(prompts), L), dtype=torch.long, device=dev)
    for i, p in enumerate(prompts):
        ids[i, L - len(p):] = torch.as_tensor(p, device=dev)
        mask[i, L - len(p):] = 1
    gc = model.generation_config
    saved = gc.eos_token_id, gc.prefill_chunk_size
    gc.eos_token_id, gc.prefill_chunk_size = None, prefill_chunk_size  # fixed lengths
    try:
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                             max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens,
                             output_logits=True, return_dict_in_generate=True, pad_token_id=pad_id)
    finally:
        gc.eos_token_id, gc.prefill_chunk_size = saved
    new = out.sequences[:, L:]
    logits = torch.stack(out.logits, 1)  # (B, T, V), fp32 copies of the model's logits
    return new, token_logprobs(logits, new)


def _recompute_alone(model, seqs, plen):
    out = []
    for s, p in zip(seqs, plen):
        logits = model(s[None]).logits[0, p - 1:-1]
        out.append(token_logprobs(logits, s[p:]))
    return out


def _recompute_padded(model, seqs, plen, pad_id):
    L = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), L), pad_id, dtype=torch.long, device=seqs[0].device)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        ids[i, :len(s)], mask[i, :len(s)] = s, 1
    logits = model(ids, attention_mask=mask).logits
    return [token_logprobs(logits[i, p - 1:len(s) - 1], s[p:])
            for i, (s, p) in enumerate(zip(seqs, plen))]


def _recompute_with_grad(model, seqs, plen, pad_id):
    """The right-padded batch again with autograd recording, as a trainer's forward runs
    (the backward's kernels do not touch the forward's bits; this checks the forward's)."""
    with torch.enable_grad():
        flags = [p.requires_grad for p in model.parameters()]
        for p in model.parameters():
            p.requires_grad_(True)
        try:
            out = _recompute_padded(model, seqs, plen, pad_id)
        finally:
            for p, f in zip(model.parameters(), flags):
                p.requires_grad_(f)
    return [o.detach() for o in out]


def _recompute_packed(model, seqs, plen):
    ids = torch.cat(seqs)[None]
    pos = torch.cat([torch.arange(len(s), device=s.device) for s in seqs])[None]
    logits = model(ids, position_ids=pos).logits[0]
    out, at = [], 0
    for s, p in zip(seqs, plen):
        out.append(token_logprobs(logits[at + p - 1:at + len(s) - 1], s[p:]))
        at += len(s)
    return out


@torch.no_grad()
def parity_check(model, prompts, max_new_tokens=16, pad_id=0, prefill_chunk_size=None,
                 batch_size=None):
    """Samples max_new_tokens greedy tokens for every prompt (lists of token ids), in batches
    of batch_size (all at once by default), and counts the tokens whose log-probability
    differs between the sampler and each recomputation. Returns a dict report."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("prompts: expected non-empty token lists")
    prompts = [[int(t) for t in p] for p in prompts]
    batch_size = batch_size or len(prompts)
    seqs, plen, sampled = [], [], []
    for b0 in range(0, len(prompts), batch_size):
        chunk = prompts[b0:b0 + batch_size]
        new, lp = _generate(model, chunk, max_new_tokens, pad_id, prefill_chunk_size)
        for i, p in enumerate(chunk):
            seqs.append(torch.cat((torch.as_tensor(p, device=new.device), new[i])))
            plen.append(len(p))
            sampled.append(lp[i])
    report = dict(sequences=len(seqs), tokens=len(seqs) * max_new_tokens,
                  prompt_lengths=[min(plen), max(plen)], batch_size=batch_size,
                  prefill_chunk_size=prefill_chunk_size, mismatches={}, max_abs_diff={})
    for name, got in (("alone", _recompute_alone(model, seqs, plen)),
                      ("padded_batch", _recompute_padded(model, seqs, plen, pad_id)),
                      ("padded_with_grad", _recompute_with_grad(model, seqs, plen, pad_id)),
                      ("packed", _recompute_packed(model, seqs, plen))):
        diff = torch.cat([(g - s).abs() for g, s in zip(got, sampled)])
        neq = torch.cat([g.view(torch.int32) != s.view(torch.int32) for g, s in zip(got, sampled)])
        report["mismatches"][name] = int(neq.sum())
        report["max_abs_diff"][name] = float(diff.nan_to_num(float("inf")).max())
    report["mismatching_tokens"] = sum(report["mismatches"].values())
    return report


def gradient_check(model, seqs, split=2):
    """Per-sequence input gradients in one batch vs the batch cut into `split` parts vs each
    sequence alone: the gradient of the summed token cross-entropy with respect to each
    sequence's input embeddings (equal-length sequences, (B, L) token ids). Returns a dict
    with the count of sequences whose gradient differs in any bit, per comparison."""
    from .blocks import cross_entropy
    emb = model.get_input_embeddings()

    def grads(ids):
        x = emb(ids).detach().requires_grad_(True)
        logits = model(inputs_embeds=x).logits
        cross_entropy(logits[:, :-1], ids[:, 1:], reduction="sum").backward()
        return x.grad

    was_training = model.training
    model.train()
    try:
        full = grads(seqs)
        parts = torch.cat([grads(c) for c in seqs.chunk(split)])
        alone = torch.cat([grads(seqs[i:i + 1]) for i in range(len(seqs))])
    finally:
        model.train(was_training)
        model.zero_grad(set_to_none=True)
    differ = lambda a, b: int((a != b).flatten(1).any(1).sum())  # noqa: E731
    return dict(sequences=len(seqs), differ_split=differ(full, parts),
                differ_alone=differ(full, alone), grad_abs_max=float(full.abs().max()))


SHAPES = {  # random-weight models by shape; ~0.5B parameters each
    "llama-0.5b": ("LlamaConfig", dict(vocab_size=32000, hidden_size=1536, intermediate_size=4096,
                                       num_hidden_layers=16, num_attention_heads=12,
                                       num_key_value_heads=4, max_position_embeddings=4096)),
    "qwen2-0.5b": ("Qwen2Config", dict(vocab_size=151936, hidden_size=896, intermediate_size=4864,
                                       num_hidden_layers=24, num_attention_heads=14,
                                       num_key_value_heads=2, max_position_embeddings=4096,
                                       tie_word_embeddings=True)),
    "llama-tiny": ("LlamaConfig", dict(vocab_size=512, hidden_size=128, intermediate_size=256,
                                       num_hidden_layers=2, num_attention_heads=4,
                                       num_key_value_heads=2, max_position_embeddings=1024)),
}


def build_model(shape, device, dtype=torch.bfloat16, seed=0):
    """A transformers causal LM of the named shape with random weights."""
    import transformers
    cls_name, kw = SHAPES[shape]
    cfg = getattr(transformers, cls_name)(**kw)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    return model.to(device).eval()


def random_prompts(n, lo, hi, vocab, seed=1):
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(lo, hi + 1, (n,), generator=g)
    return [torch.randint(1, vocab, (int(L),), generator=g).tolist() for L in lens]


def main(argv=None):
    ap = argparse.ArgumentParser(description="sampler vs trainer logprob parity of a random-"
                                 "weight model on batch-invariant blocks")
    ap.add_argument("--shape", default="llama-tiny", choices=sorted(SHAPES))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--sequences", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=8)
    ap.add_argument("--prompt-lengths", default="20,300", help="min,max prompt length")
    ap.add_argument("--batch-size", type=int, default=None, help="sampler batch (default: all)")
    ap.add_argument("--prefill-chunk-size", type=int, default=None)
    ap.add_argument("--stock", action="store_true",
                    help="leave the model on torch's kernels (SDPA, cuBLAS): the baseline")
    ap.add_argument("--grads", type=int, default=0, metavar="B",
                    help="also compare per-sequence input gradients of B equal-length "
                         "sequences in one batch, in two, and alone")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    lo, hi = (int(v) for v in args.prompt_lengths.split(","))
    model = build_model(args.shape, args.device)
    if not args.stock:
        from .integrations.transformers import make_invariant
        make_invariant(model)
    prompts = random_prompts(args.sequences, lo, hi, model.config.vocab_size)
    t0 = time.time()
    report = parity_check(model, prompts, args.new_tokens, batch_size=args.batch_size,
                          prefill_chunk_size=args.prefill_chunk_size)
    if args.grads:
        g = torch.Generator().manual_seed(2)
        ids = torch.randint(1, model.config.vocab_size, (args.grads, lo), generator=g)
        report["gradients"] = gradient_check(model, ids.to(args.device))
    report.update(shape=args.shape, device=str(args.device), stock=args.stock,
                  parameters=sum(p.numel() for p in model.parameters()),
                  seconds=round(time.time() - t0, 1))
    text = json.dumps(report)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    grads_ok = not args.grads or (report["gradients"]["differ_split"] == 0 and
                                  report["gradients"]["differ_alone"] == 0)
    return 0 if report["mismatching_tokens"] == 0 and grads_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
