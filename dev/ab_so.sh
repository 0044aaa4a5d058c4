#!/usr/bin/env bash
# ab_so.sh: Same-run A/B of two prebuilt modules, alternating turns. Verdict: the standard A/B; most *_ab_* result files come from it.
# Same-machine A/B of two builds of the extension: dev/abi/_C_base.abi3.so against
# dev/abi/_C_new.abi3.so (carried to the device; *.so is ignored by git), each copied in turn to
# flash_attn_det/_C.abi3.so, running bench_fwd (BENCH=fwd, default) or bench_bwd (BENCH=bwd) with
# fad_det and SDPA cuDNN in both layouts, or dev/bench_dropout.py (BENCH=dropout: p = 0 and 0.1,
# SDPA flash beside; DROPOUT_ARGS=--fwd-only for the forward alone), or bench_decode (BENCH=decode:
# fad_det and SDPA cuDNN, graph and eager us, ${LENS} x ${BATCHES}, default 8k/32k/131k x B 1/8/16),
# N turns (default 2), ${FILTER} as bench_fwd's --filter, ${PRESET} its preset (default quick).
# BUILDS="base new new2 ..." times dev/abi/_C_<name>.abi3.so for each name, in that order in odd
# turns and in reverse in even ones (default "base new"; one pair of backward builds once read
# 0.95-1.00x at D128 8k-16k taken in one order, 0.97-1.06x in the other). Each benchmark run has
# RUN_TIMEOUT s (default 240): a build that hangs loses its turn, not the device call.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-device_out}/run
mkdir -p "$out"
builds=(${BUILDS:-base new})
for turn in $(seq 1 "${1:-2}"); do
    # (even turns take the builds in reverse order, so that a drift within a turn -- clocks,
    # temperature -- does not always fall on the same build)
    order=("${builds[@]}")
    [ $((turn % 2)) -eq 0 ] && order=($(printf '%s\n' "${builds[@]}" | tac))
    for b in "${order[@]}"; do
        cp "dev/abi/_C_$b.abi3.so" flash_attn_det/_C.abi3.so
        if [ "${BENCH:-fwd}" = decode ]; then
            timeout ${RUN_TIMEOUT:-240} python3 benchmarks/bench_decode.py --lens "${LENS:-8192,32768,131072}" \
                --batches "${BATCHES:-1,8,16}" --impls fad_det,sdpa_cudnn --out "$out" \
                --tag "ab_${b}_$turn" 2>>"$out/stderr.log" > /dev/null
            mv "$out"/decode_ab_${b}_${turn}_*.md "$out/ab_${b}_$turn.md"
        elif [ "${BENCH:-fwd}" = dropout ]; then
            timeout ${RUN_TIMEOUT:-240} python3 dev/bench_dropout.py ${DROPOUT_ARGS:-} --out "$out/ab_${b}_$turn.md" 2>>"$out/stderr.log" > /dev/null
        elif [ "${BENCH:-fwd}" = fwd ]; then
            timeout ${RUN_TIMEOUT:-240} python3 benchmarks/bench_fwd.py --preset ${PRESET:-quick} --rounds 2 --no-plot \
                ${FILTER:+--filter "$FILTER"} --impls fad_det,sdpa_cudnn,sdpa_cudnn_bhld \
                --out "$out" --tag "ab_${b}_$turn" 2>>"$out/stderr.log" > /dev/null
        else
            timeout ${RUN_TIMEOUT:-240} python3 benchmarks/bench_bwd.py --preset ${PRESET:-quick} --rounds 2 \
                --impls fad_det,sdpa_cudnn,sdpa_cudnn_bhld --out "$out" --tag "ab_${b}_$turn" \
                2>>"$out/stderr.log" > /dev/null
        fi
    done
done
cp "dev/abi/_C_${builds[-1]}.abi3.so" flash_attn_det/_C.abi3.so
rm -f "$out"/ab_*.jsonl "$out"/decode_ab_*.jsonl
for f in "$out"/ab_*_*.md; do echo "== $f"; grep -E '^\| (bf16|fp16|[0-9]|B[0-9]|L[0-9])' "$f" | cut -c1-110; done
