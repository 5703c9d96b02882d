#!/usr/bin/env bash
# One device run (see ../shared/gpu/README.md): GPU tests, kernel tests under compute-sanitizer,
# then the decode/prefill benchmark on synthetic Llama-3.2-1B and Llama-3.1-8B checkpoints.
# Everything it prints also lands in $OUT. Usage on the device: bash bench/gpu_run.sh [check|tests|bench|bench8b|ab|soak|kernels|kvlayout|trace|serve|prefix]
# (tests: check's GPU tests and memcheck without its benchmarks; MEMCHECK_TIMEOUT (300) bounds memcheck)
# (kernels [args]: the projections and attention alone at the 8B shape, no checkpoint: seconds, for kernel work;
# args go to tailserve-bench-kernels, e.g. --gemm-search, --ksplit, --gemv-splits or --stream-gemm; ab: decode at 512 tokens, batch 1/16/64, of a baseline
# build packed as .gpu/bin/tailserve-bench-cuda-base against this one, in alternating processes, AB_ROUNDS (2)
# rounds on the 8B and the 1B shape; AB_BATCHES and AB_MODELS (l8b l1b) override the batches and shapes,
# AB_FLAGS (e.g. --attention-splits 8) makes the A/B this build without those flags against with them,
# and AB_ARMS lists arms of either binary with flags ("base;new;new:--attention-splits 8");
# trace: the 8B (TRACE_MODEL=l1b: the 1B) decode at TRACE_BATCHES (1,16,64), with TRACE_FLAGS (files named by TRACE_TAG), under
# bench/cupti_trace.cc, then bench/trace_table.py: what each kernel of the replayed step costs it;
# serve: the schedulers behind the router on one CUDA worker, bench/gpu_serve.sh (packed with SERVE=1);
# prefix: the prefix cache's GPU tests, then multi-turn chat on one CUDA worker with the cache off and on,
# bench/gpu_prefix.sh (packed with SERVE=1);
# BENCH_FLAGS: engine options for check, bench, bench8b and soak, e.g. to measure an option before it
# becomes the default)
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
R=.gpu/run
export TAILSERVE_SHARED_DIR=$PWD/.gpu/data
export TAILSERVE_DEFAULT_MODEL=$PWD/models/tiny-en  # the tests' path is this machine's checkout
MODE=${1:-check}
for z in .gpu/lib/*.xz .gpu/bin/*.xz; do  # see bench/gpu_pack.sh
  [ -f "$z" ] || continue
  xz -d -f "$z" 2>/dev/null || python3 -c 'import lzma,sys; open(sys.argv[1][:-3],"wb").write(lzma.open(sys.argv[1]).read())' "$z"
done
chmod +x .gpu/bin/* 2>/dev/null  # a base binary packed by hand may come without its mode
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv | tee "$OUT/gpu.txt"
if [ "$MODE" = check ] || [ "$MODE" = tests ]; then
  echo "== GPU tests"
  # Bounded: a persistent kernel that waits on other CTAs (StreamFfn's test) would hang rather than fail.
  timeout "${TESTS_TIMEOUT:-360}" $R tailserve_cuda_tests > "$OUT/cuda_tests.log" 2>&1
  echo "exit code $? (124: timed out), ${SECONDS} s into the run"
  grep -E "^\[ +(OK|FAILED|SKIPPED) +\]|worst rel|PASSED|FAILED TEST" "$OUT/cuda_tests.log" | head -60
  echo "== compute-sanitizer (memcheck) on the kernel tests"
  CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  if [ -x "$CS" ]; then
    timeout "${MEMCHECK_TIMEOUT:-300}" $R "$CS" --tool memcheck --leak-check full --error-exitcode 9 .gpu/bin/tailserve_cuda_tests \
      --gtest_filter='CudaKernelTest.*:Dtypes/*:Ffn/*' > "$OUT/sanitizer.log" 2>&1
    echo "memcheck exit code $? ($(grep -c 'ERROR SUMMARY: 0 errors' "$OUT/sanitizer.log") clean summaries), ${SECONDS} s into the run"
    tail -3 "$OUT/sanitizer.log"
  else
    echo "compute-sanitizer not found"
  fi
fi
[ "$MODE" = tests ] && exit 0
if [ "$MODE" = kvlayout ]; then
  echo "== the attention's KV reads alone, slot-major (the cache) against head-major blocks"
  $R tailserve-bench-kv-layout 2>&1 | tee "$OUT/kv_layout.md"
  exit 0
fi
if [ "$MODE" = kernels ]; then
  echo "== kernels alone, 8B shape"
  shift
  $R tailserve-bench-kernels "$@" 2>&1 | tee "$OUT/kernels_8b.md"
  exit 0
fi
echo "== checkpoints"
mkdir -p /tmp/ckpt
# A warm machine keeps /tmp: reuse checkpoints a previous call made.
[ "$MODE" = bench8b ] || [ "$MODE" = serve ] || [ "$MODE" = prefix ] || { [ "$MODE" = ab ] && [ "${AB_MODELS:-l8b l1b}" = l8b ]; } || [ -f /tmp/ckpt/l1b/config.json ] || ( time $R tailserve-make-checkpoint --preset llama-3.2-1b --vocab 128256 --out /tmp/ckpt/l1b ) 2>&1 | tail -4
# A 1B-only trace (TRACE_MODEL=l1b) skips the 8B checkpoint's ~37 s.
[ "$MODE" = trace ] && [ "${TRACE_MODEL:-l8b}" = l1b ] || [ -f /tmp/ckpt/l8b/config.json ] || ( time $R tailserve-make-checkpoint --preset llama-3.1-8b --vocab 128256 --out /tmp/ckpt/l8b ) 2>&1 | tail -4
if [ "$MODE" = ab ]; then
  # Arms, ';'-separated, each base or new with optional engine flags after a colon (AB_ARMS, e.g.
  # "base;new;new:--attention-splits 8"). Default: base against new, or with AB_FLAGS this build without
  # them against with them (an engine option against its default).
  if [ -n "${AB_ARMS:-}" ]; then arms=$AB_ARMS; elif [ -n "${AB_FLAGS:-}" ]; then arms="new;new:$AB_FLAGS"; else arms="base;new"; fi
  echo "== A/B arms: $arms (P50 ms, 512 tokens)"
  IFS=';' read -r -a arm_list <<< "$arms"
  for m in ${AB_MODELS:-l8b l1b}; do
    for round in $(seq "${AB_ROUNDS:-2}"); do
      for arm in "${arm_list[@]}"; do
        which=${arm%%:*}; flags=; [ "$arm" != "$which" ] && flags=${arm#*:}
        bin=tailserve-bench-cuda; [ "$which" = base ] && bin=tailserve-bench-cuda-base
        # shellcheck disable=SC2086  # flags: words
        $R $bin --model /tmp/ckpt/$m --batches "${AB_BATCHES:-1,16,64}" --contexts 512 --prefills 512 $flags > /tmp/ab_one.md 2>&1
        { echo "### $m round $round $arm"; cat /tmp/ab_one.md; } >> "$OUT/ab.md"
        printf '%s [%s] round %s:' "$m" "$arm" "$round"
        awk -F'|' '/^\| [0-9]+ \| 512 \|/{printf " b%s %s", $2+0, $4+0}' /tmp/ab_one.md
        echo
      done
    done
  done
elif [ "$MODE" = serve ]; then
  bash bench/gpu_serve.sh
elif [ "$MODE" = prefix ]; then
  echo "== prefix cache GPU tests"
  timeout 120 $R tailserve_cuda_tests --gtest_filter='*PrefixCache*' > "$OUT/prefix_tests.log" 2>&1
  echo "exit code $?"
  grep -E "^\[ +(OK|FAILED|SKIPPED) +\]|rel. L2|position|PASSED|FAILED TEST" "$OUT/prefix_tests.log" | head -60
  bash bench/gpu_prefix.sh
elif [ "$MODE" = trace ]; then
  # TRACE_FLAGS: engine options for the traced process; TRACE_TAG names its files.
  tag=${TRACE_TAG:+_$TRACE_TAG}
  echo "== kernel timeline of the replayed ${TRACE_MODEL:-l8b} step (CUPTI), batches ${TRACE_BATCHES:-1,16,64}, 512 tokens ${TRACE_FLAGS:-}"
  # shellcheck disable=SC2086  # flags: words
  CUDA_INJECTION64_PATH=$PWD/.gpu/lib/libtailserve_cupti_trace.so TAILSERVE_TRACE_OUT=/tmp/trace.tsv \
    $R tailserve-bench-cuda --model "/tmp/ckpt/${TRACE_MODEL:-l8b}" --batches "${TRACE_BATCHES:-1,16,64}" --contexts 512 \
    --prefills 512 ${TRACE_FLAGS:-} > "$OUT/bench_traced$tag.md" 2>&1
  python3 bench/trace_table.py /tmp/trace.tsv --layer --head 12 --ffn | tee "$OUT/trace_table$tag.md"
  xz -T0 -c /tmp/trace.tsv > "$OUT/trace$tag.tsv.xz"
elif [ "$MODE" = bench8b ]; then
  echo "== bench 8B (decode only)"
  # shellcheck disable=SC2086  # BENCH_FLAGS: words
  $R tailserve-bench-cuda --model /tmp/ckpt/l8b --batches 1,16,64 --contexts 512,2048 --prefills 512 ${BENCH_FLAGS:-} 2>&1 | tee "$OUT/bench_8b.md"
elif [ "$MODE" = check ] || [ "$MODE" = bench ]; then
  echo "== bench 1B"
  # shellcheck disable=SC2086  # BENCH_FLAGS: words
  $R tailserve-bench-cuda --model /tmp/ckpt/l1b --batches 1,16,64 --contexts 512,2048 --prefills 512,2048 ${BENCH_FLAGS:-} 2>&1 | tee "$OUT/bench_1b.md"
  echo "== bench 8B"
  # shellcheck disable=SC2086  # BENCH_FLAGS: words
  $R tailserve-bench-cuda --model /tmp/ckpt/l8b --batches 1,16,64 --contexts 512,2048 --prefills 512,2048 ${BENCH_FLAGS:-} 2>&1 | tee "$OUT/bench_8b.md"
else
  echo "== soak 8B batch 64, 180 s"
  # shellcheck disable=SC2086  # BENCH_FLAGS: words
  $R tailserve-bench-cuda --model /tmp/ckpt/l8b --batches 64 --prefills 512 --steps 20 --soak-seconds 180 ${BENCH_FLAGS:-} 2>&1 | tee "$OUT/soak_8b.md"
fi
