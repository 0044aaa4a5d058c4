"""Batch-invariance checks for users' own code, and a divergence finder.

    from flash_attn_det import invariance as inv
    inv.assert_batch_invariant(lambda ids, mask, pos: model(ids, attention_mask=mask,
                                                            position_ids=pos).logits, prompts)
    report = inv.find_divergence(lambda ids, mask, pos: model(ids, attention_mask=mask,
                                                              position_ids=pos).logits.sum(),
                                 prompts, index=1, backward=True)
    print(report)   # the first op whose inputs were bit-equal and whose outputs were not

The pytest plugin (`flash_attn_det.pytest_plugin`, on when the package is installed) hands these
to tests as the `invariance` fixture.

A batched call is `fn(ids, mask, position_ids)`: `ids` (B, L, ...) are the sequences padded to
one length L along dim 1 (`side` "right" or "left", `pad_value` in the padding), `mask` (B, L)
int64 marks real tokens, `position_ids` (B, L) count each sequence's tokens from 0. "packed"
puts every sequence into one row (B = 1, mask None, position_ids restarting at each sequence).
A sequence alone is the same call with B = 1 and no padding. fn returns a tensor whose dims 0
and 1 are batch and sequence (logits, hidden states) for assert_batch_invariant; anything for
find_divergence, which compares the ops it runs.

`sequences`: tensors (L, ...), or token ids as a tokenizer gives them: lists of ints, or the
tokenizer's output itself (its "input_ids", unpadded by its "attention_mask" when it padded
them into one tensor). Token lists become int64 tensors on `device` (default the CPU; pass
the model's device).
"""
import difflib
import itertools

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

SIDES = ("right", "left", "packed")


def as_sequences(sequences, device=None):
    """sequences as a list of tensors, each at least 1-D: a tensor passes as it is (a 0-D one,
    a lone token, becomes 1-D), a list of ints becomes an int64 tensor on `device`; a mapping
    with "input_ids" (a tokenizer's output) gives its input_ids, a padded (B, L) tensor of them
    cut to the tokens its "attention_mask" keeps. A flat list of ints (one prompt's tokens) is
    refused: one sequence makes no batch."""
    mask = None
    if hasattr(sequences, "keys") and "input_ids" in sequences:  # (a tokenizer's BatchEncoding)
        sequences, mask = sequences["input_ids"], sequences.get("attention_mask")
    if isinstance(sequences, torch.Tensor) and mask is not None:
        mask = torch.as_tensor(mask, device=sequences.device).bool()
        if mask.shape != sequences.shape[:2]:
            raise ValueError(f"sequences: attention_mask shape {tuple(mask.shape)} does not match "
                             f"input_ids {tuple(sequences.shape)}")
        sequences = [row[keep] for row, keep in zip(sequences, mask)]
    if isinstance(sequences, (str, bytes)) or not hasattr(sequences, "__len__") or not len(sequences):
        raise TypeError("sequences: expected a non-empty list of token-id tensors or int lists "
                        f"(or a tokenizer's output), got {type(sequences).__name__}")
    if all(isinstance(s, int) for s in sequences):
        raise TypeError("sequences: got one list of ints (one prompt's tokens); pass a list of "
                        "sequences, e.g. tokenizer(prompts)['input_ids'] or [ids_a, ids_b]")
    out = []
    for i, s in enumerate(sequences):
        if not isinstance(s, torch.Tensor):
            try:
                s = torch.tensor(s, dtype=torch.long, device=device)
            except (TypeError, ValueError, RuntimeError):
                raise TypeError(f"sequences[{i}]: expected a tensor or a list of ints, got "
                                f"{type(s).__name__}") from None
        out.append(s if s.dim() >= 1 else s.reshape(1))
    return out


def pad_batch(sequences, side="right", pad_value=0):
    """(ids, mask, position_ids, rows) for the batched call; rows[b] = (batch row, slice of
    dim 1) where sequence b's tokens sit."""
    if side not in SIDES:
        raise ValueError(f"side: expected one of {SIDES}, got {side!r}")
    seqs = as_sequences(sequences)
    dev = seqs[0].device
    if side == "packed":
        ids = torch.cat(seqs, 0)[None]
        pos = torch.cat([torch.arange(s.shape[0], device=dev) for s in seqs])[None]
        starts = list(itertools.accumulate([0] + [s.shape[0] for s in seqs]))
        return ids, None, pos, [(0, slice(a, b)) for a, b in zip(starts, starts[1:])]
    L = max(s.shape[0] for s in seqs)
    ids = torch.full((len(seqs), L, *seqs[0].shape[1:]), pad_value, dtype=seqs[0].dtype, device=dev)
    mask = torch.zeros(len(seqs), L, dtype=torch.long, device=dev)
    rows = []
    for b, s in enumerate(seqs):
        n = s.shape[0]
        sl = slice(L - n, L) if side == "left" else slice(0, n)
        ids[b, sl], mask[b, sl] = s, 1
        rows.append((b, sl))
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids, mask, pos, rows


def _alone(fn, seq):
    n = seq.shape[0]
    dev = seq.device
    return fn(seq[None], torch.ones(1, n, dtype=torch.long, device=dev),
              torch.arange(n, device=dev)[None])


def assert_batch_invariant(fn, sequences, side="right", pad_value=0, device=None):
    """Asserts that fn gives every sequence the same bits alone and inside the batch (padded on
    `side`, or packed). Raises AssertionError naming the first sequence that differs, its largest
    difference, and what find_divergence would be asked next."""
    sequences = as_sequences(sequences, device)
    ids, mask, pos, rows = pad_batch(sequences, side, pad_value)
    with torch.no_grad():
        batched = fn(ids, mask, pos)
        for i, (seq, (b, sl)) in enumerate(zip(sequences, rows)):
            alone = _alone(fn, seq)[0]
            got = batched[b, sl]
            if not torch.equal(alone, got):
                diff = (alone.double() - got.double()).abs().max().item()
                raise AssertionError(
                    f"sequence {i}: alone and in the batch ({side}) differ (max |diff| {diff:.3g}); "
                    f"find_divergence(fn, sequences, index={i}, side={side!r}) names the first op "
                    f"whose inputs were equal and whose outputs were not")


def assert_run_to_run(fn, runs=3):
    """Asserts that fn() returns the same bits (every tensor of its output) `runs` times."""
    first = [t for t in tree_flatten(fn())[0] if isinstance(t, torch.Tensor)]
    for r in range(1, runs):
        again = [t for t in tree_flatten(fn())[0] if isinstance(t, torch.Tensor)]
        for i, (a, b) in enumerate(zip(first, again)):
            if not torch.equal(a, b):
                raise AssertionError(f"run {r}: output tensor {i} differs from run 0")


# --------------------------------------------------------------------------
# the divergence finder
# --------------------------------------------------------------------------

class _Op:
    __slots__ = ("name", "where", "phase", "inputs", "outputs")

    def __init__(self, name, where, phase, inputs, outputs):
        self.name, self.where, self.phase = name, where, phase
        self.inputs, self.outputs = inputs, outputs

    def key(self):
        return (self.name, self.where, self.phase)


class _Recorder(TorchDispatchMode):
    """Records every aten op (forward and, under backward(), the autograd engine's) with copies
    of its tensor inputs and outputs, and the module whose forward was running."""

    def __init__(self, stack):
        super().__init__()
        self.ops, self.stack, self.phase = [], stack, "forward"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        tensors = lambda x: [t.detach().clone() for t in tree_flatten(x)[0]  # noqa: E731
                             if isinstance(t, torch.Tensor)]
        where = self.stack[-1] if self.stack else "(top level)"
        self.ops.append(_Op(str(func.overloadpacket.__name__), where, self.phase,
                            tensors((args, kwargs)), tensors(out)))
        return out


def _module_hooks(roots, stack):
    """Forward pre/post hooks on every submodule of the nn.Modules in roots that keep `stack`
    the path of the module running; returns the handles."""
    def leave(module, args, output):  # (a forward hook that returns a value replaces the output)
        if stack:
            stack.pop()

    handles = []
    for root in roots:
        for name, m in root.named_modules():
            path = name or type(root).__name__
            handles.append(m.register_forward_pre_hook(lambda mod, a, p=path: stack.append(p)))
            handles.append(m.register_forward_hook(leave))
    return handles


def _record(fn, ids, mask, pos, modules, backward):
    stack = []
    handles = _module_hooks(modules, stack)
    rec = _Recorder(stack)
    try:
        with torch.enable_grad(), rec:
            out = fn(ids, mask, pos)
            if backward:
                rec.phase = "backward"
                stack.clear()
                out.backward()
    finally:
        for h in handles:
            h.remove()
    return rec.ops


def _map(tb, ta, b, sl, B, L):
    """(tb cut to what sequence b's own run should hold (ta's shape), whether that took a cut)
    for a tensor tb of the batched run; (None, False) when its layout cannot be mapped."""
    if tb.shape == ta.shape:
        return tb, False
    if tb.dim() != ta.dim() or tb.dim() == 0:
        return None, False
    if tb.shape[0] == B and ta.shape[0] == 1:  # (B, ...): the row, then the sequence's tokens
        t = tb[b:b + 1]
    elif tb.shape[0] == B * L and ta.shape[0] == sl.stop - sl.start:  # (B * L, ...) flattened
        t = tb.reshape(B, L, *tb.shape[1:])[b, sl]
        return (t, True) if t.shape == ta.shape else (None, False)
    else:
        return None, False
    for d in range(1, t.dim()):
        if t.shape[d] == L and ta.shape[d] == sl.stop - sl.start and L != ta.shape[d]:
            t = t.narrow(d, sl.start, sl.stop - sl.start)
    return (t, True) if t.shape == ta.shape else (None, False)


class Divergence:
    """What find_divergence found: `op` (the aten op), `module` (the module path running it, or
    the phase), `phase` ("forward" or "backward"), `index` (its position among the ops of the
    sequence's own run), `compared` (how many op pairs were compared); op None when none
    diverged."""

    def __init__(self, op=None, module=None, phase=None, index=None, compared=0, max_diff=None,
                 unmapped_inputs=0):
        self.op, self.module, self.phase, self.index = op, module, phase, index
        self.compared, self.max_diff, self.unmapped_inputs = compared, max_diff, unmapped_inputs

    def __bool__(self):
        return self.op is not None

    def __repr__(self):
        if self.op is None:
            return f"Divergence(none among {self.compared} compared ops)"
        extra = (f"; {self.unmapped_inputs} input(s) not comparable, e.g. a value computed over "
                 "the whole batch" if self.unmapped_inputs else "")
        return (f"Divergence({self.phase} op aten.{self.op} in {self.module}, op #{self.index}: "
                f"inputs bit-equal, outputs differ by up to {self.max_diff:.3g}{extra})")


def find_divergence(fn, sequences, index=0, side="right", pad_value=0, backward=False,
                    modules=(), device=None):
    """Runs fn on sequence `index` alone and on the batch (as assert_batch_invariant does),
    records every op of both runs (and of out.backward() when `backward`: fn must then return a
    scalar), aligns the two op sequences, and returns the first op whose inputs it could map
    were bit-equal while an output differed (a Divergence; falsy when none did). `modules`:
    nn.Modules whose submodule paths name where each op ran."""
    sequences = as_sequences(sequences, device)
    ids, mask, pos, rows = pad_batch(sequences, side, pad_value)
    b, sl = rows[index]
    seq = sequences[index]
    n = seq.shape[0]
    dev = seq.device
    alone = _record(fn, seq[None], torch.ones(1, n, dtype=torch.long, device=dev),
                    torch.arange(n, device=dev)[None], modules, backward)
    batched = _record(fn, ids, mask, pos, modules, backward)
    B, L = ids.shape[0], ids.shape[1]
    matcher = difflib.SequenceMatcher(None, [o.key() for o in alone], [o.key() for o in batched],
                                      autojunk=False)
    compared = 0
    for block in matcher.get_matching_blocks():
        for k in range(block.size):
            oa, ob = alone[block.a + k], batched[block.b + k]
            ins = [(*_map(tb, ta, b, sl, B, L), ta) for tb, ta in zip(ob.inputs, oa.inputs)]
            unmapped = sum(tb is None for tb, _, _ in ins) + abs(len(ob.inputs) - len(oa.inputs))
            batch_in = any(cut for _, cut, _ in ins)
            ins = [(tb, ta) for tb, cut, ta in ins if tb is not None]
            # An output is the sequence's own when it was cut from a batch-shaped one, or when
            # no input was batch-shaped (a parameter's op); an uncut output of batch-shaped
            # inputs is a value over the whole batch (a reduction), not comparable.
            outs = [(*_map(tb, ta, b, sl, B, L), ta) for tb, ta in zip(ob.outputs, oa.outputs)]
            outs = [(tb, ta) for tb, cut, ta in outs if tb is not None and (cut or not batch_in)]
            if not ins or not outs:
                continue
            compared += 1
            if all(torch.equal(tb, ta) for tb, ta in ins):
                bad = [(tb, ta) for tb, ta in outs if not torch.equal(tb, ta)]
                if bad:
                    diff = max((tb.double() - ta.double()).abs().max().item()
                               if tb.is_floating_point() else float("nan") for tb, ta in bad)
                    return Divergence(oa.name, oa.where, oa.phase, block.a + k, compared, diff,
                                      unmapped)
    return Divergence(compared=compared)
