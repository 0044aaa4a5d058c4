#!/usr/bin/env bash
# Same-machine A/B/C... of builds of the extension on the forward harness: each
# dev/abi/_C_<name>.abi3.so of $BUILDS (default: base new new2; carry dev/abi) copied in turn to
# flash_attn_det/_C.abi3.so, two alternating turns of bench_fwd's full preset filtered by
# $FILTER (default "bf16 D256"), fad_det beside SDPA cuDNN in both layouts. Tables under
# $OUT/run; /tmp-style summaries: ratios per config (see the results files that cite it).
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
out=$OUT/run; mkdir -p $out
for turn in 1 2; do for b in ${BUILDS:-base new new2}; do
  cp dev/abi/_C_$b.abi3.so flash_attn_det/_C.abi3.so
  python3 benchmarks/bench_fwd.py --preset full --rounds 2 --no-plot --filter "${FILTER:-bf16 D256}" \
     --impls fad_det,sdpa_cudnn,sdpa_cudnn_bhld --out $out --tag ab_${b}_$turn 2>>$out/stderr.log >/dev/null
done; done
rm -f $out/*.jsonl
for f in $out/ab_*.md; do echo "== $f"; grep -E '^\| bf16' $f | cut -c1-100; done
