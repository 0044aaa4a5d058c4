"""Dropout's keep mask in torch ops, and where a call's seed and offset come from.

The kernels and the CPU path draw the mask in C (csrc/fad_math.h: fad_make_dropout,
fad_dropout_draw, fad_dropout_kept); this module is the same rule written again in
integer torch ops, on any device: for S_dmask (return_attn_probs=True) and as the tests'
independent reference. The rule, in short: element (query row i, key j) of head h is kept
with probability 1 - p (in steps of 1/256), by a byte of Philox4x32-7 keyed by the call's
(seed, offset) and counted by (j's 64-key group and pair, the row's key-space position
i + len_k - len_q, h, seq_id).
No batch index enters, so a sequence is dropped the same way alone and in any batch.
seq_id is 0 (sequences are not told apart).

Seed and offset: on CUDA, torch's CUDA generator of q's device gives its seed and its
offset, which each call then advances by OFFSET_STEP (a constant: a call's successor gets
the same offset whatever the batch); torch.manual_seed therefore reproduces a run. On the
CPU, two 63-bit integers are drawn from torch's default CPU generator.
Under CUDA graph capture host values would be frozen into the graph, every replay dropping
the same elements: there the pair is drawn on the device instead, by a captured torch RNG op
(draw_captured) whose int64 (2,) result the kernels read when they run
(fad_fwd_params.dropout_seed_offset), so each replay draws a new mask. torch's CUDA RNG ops
are graph-safe: torch.manual_seed before capture or replay governs the replays' draws.
Outside capture nothing changes: torch.manual_seed reproduces a run as before. Under
torch.compile, where host values would become constants of the compiled graph, the forward
custom op draws when it runs, as an eager call does (ops.py), so compiled and eager code
share masks.
"""
import struct

import torch

_M0, _M1 = 0xD2511F53, 0xCD9E8D57
_W0, _W1 = 0x9E3779B9, 0xBB67AE85
_U32 = 0xFFFFFFFF
_DROP = 0x64726F70  # "drop": the key-derivation counter's tag (fad_make_dropout)
OFFSET_STEP = 4  # what one call with dropout advances the CUDA generator's offset by


def _f32(x):
    return struct.unpack("f", struct.pack("f", x))[0]


DRAW_ROUNDS = 7  # FAD_DROPOUT_ROUNDS: the mask's draws (the call key uses 10)


def _philox_int(c, k0, k1, rounds=10):
    """Philox4x32 (10 rounds: Random123's default) on Python ints: c a list of 4 uint32."""
    c = list(c)
    for _ in range(rounds):
        p0, p1 = _M0 * c[0], _M1 * c[2]
        c = [(p1 >> 32) ^ c[1] ^ k0, p1 & _U32, (p0 >> 32) ^ c[3] ^ k1, p0 & _U32]
        k0, k1 = (k0 + _W0) & _U32, (k1 + _W1) & _U32
    return c


def _mulhilo(a, m):
    """(hi, lo) 32-bit halves of a * m for int64 tensors a holding uint32 values and a
    32-bit constant m, without overflowing int64 (16-bit limbs)."""
    a_lo, a_hi = a & 0xFFFF, a >> 16
    m_lo, m_hi = m & 0xFFFF, m >> 16
    mid = a_hi * m_lo + a_lo * m_hi  # < 2^33
    lo_full = a_lo * m_lo + ((mid & 0xFFFF) << 16)  # < 2^33
    hi = (a_hi * m_hi + (mid >> 16) + (lo_full >> 32)) & _U32
    return hi, lo_full & _U32


def _philox(c0, c1, c2, c3, k0, k1, rounds=10):
    """Philox4x32 elementwise over int64 tensors holding uint32 counters."""
    for _ in range(rounds):
        hi0, lo0 = _mulhilo(c0, _M0)
        hi1, lo1 = _mulhilo(c2, _M1)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0, k1 = (k0 + _W0) & _U32, (k1 + _W1) & _U32
    return c0, c1, c2, c3


def call_key(seed, offset):
    """The call's Philox key (fad_make_dropout)."""
    k = _philox_int([offset & _U32, offset >> 32 & _U32, _DROP, 0], seed & _U32, seed >> 32 & _U32)
    return k[0], k[1]


def keep_threshold(dropout_p):
    """keep8 of fad_make_dropout, in the same fp32 steps: round((1 - p) * 256)."""
    keep = _f32(1.0 - _f32(dropout_p))
    return int(_f32(keep * 256.0 + 0.5))


def keep_mask(dropout_p, seed, offset, heads, rows, keys, seq_id=0):
    """Bool (len(heads), len(rows), len(keys)): True where the element is kept. heads, rows
    (key-space positions i + len_k - len_q) and keys: 1-D integer tensors on one device.
    One Philox call per distinct counter, as the kernels draw (a draw holds 16 keys of a row),
    then each key's word and byte picked from it: a sixteenth of the work of one call per
    element, which made S_dmask the slow part of flash_attn's race test."""
    k0, k1 = call_key(seed, offset)
    keep8 = keep_threshold(dropout_p)
    j = keys.to(torch.int64)
    counters, which = torch.unique(((j >> 6) << 2) | ((j >> 1) & 3), return_inverse=True)
    shape = (heads.numel(), rows.numel(), counters.numel())
    c0 = counters.view(1, 1, -1).expand(shape)
    c1 = (rows.to(torch.int64).view(1, -1, 1) & _U32).expand(shape)
    c2 = (heads.to(torch.int64).view(-1, 1, 1) & _U32).expand(shape)
    c3 = torch.full(shape, seq_id & _U32, dtype=torch.int64, device=keys.device)
    words = torch.stack(_philox(c0, c1, c2, c3, k0, k1, DRAW_ROUNDS), dim=-1)  # (H, R, U, 4)
    w = words.flatten(-2)[..., 4 * which + ((j >> 4) & 3)]  # key j's word: (H, R, len(keys))
    byte = 2 * ((j >> 3) & 1) + (j & 1)
    return ((w >> (8 * byte)) & 0xFF) < keep8


def capturing(q):
    """True when a call on q runs under CUDA graph capture (its seed and offset must then
    come from draw_captured)."""
    return isinstance(q, torch.Tensor) and q.is_cuda and torch.cuda.is_current_stream_capturing()


def draw(q, dropout_p):
    """(seed, offset, commit) for a call with dropout on q's device: commit() advances the
    generator, to be called once the call has passed its checks (a call that raises leaves
    the generator as it was). Not under CUDA graph capture (draw_captured)."""
    if isinstance(q, torch.Tensor) and q.is_cuda:
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("dropout_p: under CUDA graph capture a call's seed and offset "
                               "are drawn on the device (dropout.draw_captured), not read on "
                               "the host")
        gen = torch.cuda.default_generators[q.get_device()]
        seed, offset = gen.initial_seed(), gen.get_offset()
        return seed, offset, lambda: gen.set_offset(offset + OFFSET_STEP)
    gen = torch.default_generator
    state = gen.get_state()
    seed, offset = torch.randint(0, 2 ** 63 - 1, (2,), dtype=torch.int64).tolist()
    after = gen.get_state()
    gen.set_state(state)
    return seed, offset, lambda: gen.set_state(after)


def draw_captured(q):
    """(seed, offset) of a call under CUDA graph capture: an int64 (2,) tensor on q's device,
    drawn by a torch RNG op that is captured with the call and read by the kernels when they
    run. Each replay of the graph draws a new pair (torch's graph-safe generator state), so a
    new mask; the host generator is left to torch (there is nothing to commit). (Compiled
    code that torch captures, mode="reduce-overhead", gets here through the ops' own draw.)"""
    return torch.randint(0, 2 ** 62, (2,), dtype=torch.int64, device=q.device)


def seed_offset(dropout):
    """(seed, offset) ints of a dropout tuple as _C takes it, (dropout_p, seed, offset[,
    seq_ids[, seed_offset]]): the pair tensor's values when one is given (read back from the
    device: not under capture), else the host ints."""
    if len(dropout) > 4 and dropout[4] is not None:
        seed, offset = dropout[4].tolist()
        return seed, offset
    return dropout[1], dropout[2]
