#!/usr/bin/env bash
# Builds the libFuzzer targets (cmake preset `fuzz`: clang, ASan, UBSan) and runs each on its seed
# corpus: fuzz/corpus/<target> plus inputs taken from the project's own files (the default model's
# config, tokenizer and chat template, ladb_config.yaml, the shipped ONNX predictor). Prints a
# table: executions, exec/s, coverage (libFuzzer's cov: edges), corpus size, and crashes.
#   bash bench/fuzz.sh                 each target until FUZZ_RUNS (1000000) runs or FUZZ_SECONDS (1800)
#   FUZZ_SECONDS=10 bash bench/fuzz.sh --ci   each briefly; any crash, leak or timeout fails (exit 1)
# FUZZ_TARGETS limits the targets; found crashes land in bench/out/fuzz/<target>/crash-* (move one
# into fuzz/corpus/<target>/ with the fix, as a regression input).
set -uo pipefail
cd "$(dirname "$0")/.."
CI=0
[ "${1:-}" = --ci ] && CI=1
RUNS=${FUZZ_RUNS:-1000000}
SECONDS_EACH=${FUZZ_SECONDS:-$([ $CI = 1 ] && echo 10 || echo 1800)}
TARGETS=${FUZZ_TARGETS:-generate_request openai_request chat_template config tokenizer tokenizer_encode safetensors model_config onnx_model}
cmake --preset fuzz > /dev/null && cmake --build --preset fuzz -j "$(nproc)" > /tmp/tailserve-fuzz-build.log 2>&1 || {
  tail -30 /tmp/tailserve-fuzz-build.log; echo "fuzz build failed"; exit 1; }
OUT=bench/out/fuzz
mkdir -p "$OUT"
seed() {  # extra seeds from the project's files, per target
  local t=$1 dir=$2
  case $t in
    config) cp ladb_config.yaml "$dir/ladb_config.yaml" ;;
    model_config) cp models/tiny-en/config.json "$dir/tiny_en.json" ;;
    tokenizer) cp models/tiny-en/tokenizer.json "$dir/tiny_en.json" ;;
    onnx_model) cp models/length_predictor.onnx "$dir/length_predictor.onnx" ;;
    chat_template)
      python3 -c 'import json,sys; t=json.load(open("models/tiny-en/tokenizer_config.json"))["chat_template"]
sys.stdout.buffer.write(t.encode()+b"\0"+json.dumps({"messages":[{"role":"user","content":"hi"}],"add_generation_prompt":True}).encode())' \
        > "$dir/tiny_en_template" ;;
  esac
}
dict() {
  case $1 in
    openai_request|model_config|tokenizer|safetensors) echo "-dict=fuzz/json.dict" ;;
    chat_template) echo "-dict=fuzz/jinja.dict" ;;
  esac
}
printf '| target | runs | seconds | exec/s | coverage (edges) | corpus | result |\n|---|---:|---:|---:|---:|---:|---|\n'
failed=0
for t in $TARGETS; do
  bin=build-fuzz/bin/${t}_fuzz
  work=$OUT/$t
  rm -rf "$work/corpus"
  mkdir -p "$work/corpus"
  cp fuzz/corpus/"$t"/* "$work/corpus/" 2>/dev/null
  seed "$t" "$work/corpus"
  # -rss_limit_mb / -malloc_limit_mb: an allocation past 2 GB is a finding (unbounded allocation);
  # -timeout: an input that takes 10 s is a hang.
  start=$(date +%s.%N)
  "$bin" "$work/corpus" $(dict "$t") -runs="$RUNS" -max_total_time="$SECONDS_EACH" -timeout=10 \
    -rss_limit_mb=2048 -malloc_limit_mb=2048 -max_len=65536 -print_final_stats=1 -artifact_prefix="$work/" \
    > "$work/log" 2>&1
  rc=$?
  end=$(date +%s.%N)
  runs=$(grep -Eo 'stat::number_of_executed_units: *[0-9]+' "$work/log" | grep -Eo '[0-9]+$' | tail -1)
  eps=$(grep -Eo 'stat::average_exec_per_sec: *[0-9]+' "$work/log" | grep -Eo '[0-9]+$' | tail -1)
  cov=$(grep -Eo 'cov: [0-9]+' "$work/log" | tail -1 | grep -Eo '[0-9]+')
  corpus=$(ls "$work/corpus" | wc -l)
  result=clean
  if [ $rc -ne 0 ]; then
    result="FOUND: $(grep -Eo 'ERROR: libFuzzer: [a-z-]+|ERROR: AddressSanitizer: [a-z-]+|runtime error|Test unit written to [^ ]+' "$work/log" | head -2 | tr '\n' ' ')"
    failed=1
  fi
  printf '| %s | %s | %.0f | %s | %s | %s | %s |\n' "$t" "${runs:-?}" "$(awk "BEGIN{print $end - $start}")" "${eps:-?}" "${cov:-?}" "$corpus" "$result"
done
exit $failed
