# Shared by scripts/bench_{dp,tp,pp}.sh: runs pretrain_difflm on 1 GPU or under mpirun with a
# time limit, writing OUT/NAME.jsonl and OUT/NAME.log. Expects $out and the array $common (flags
# every run shares); sets the defaults below.
bin=${MEGADLM_BIN:-build/bin}
limit=${MEGADLM_RUN_LIMIT_S:-150}  # per run: a hang ends as a failed run, not a stuck script
mpirun_flags=(-x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE)
[ "$(id -u)" = 0 ] && mpirun_flags+=(--allow-run-as-root)
bench_run() {  # name, ranks, extra flags...
  local name=$1 np=$2; shift 2
  rm -f "$out/$name.jsonl"
  if [ "$np" = 1 ]; then
    timeout "$limit" "$bin/pretrain_difflm" "${common[@]}" --metrics-jsonl "$out/$name.jsonl" "$@" \
      > "$out/$name.log" 2>&1
  else
    timeout "$limit" mpirun -np "$np" "${mpirun_flags[@]}" "$bin/pretrain_difflm" "${common[@]}" \
      --metrics-jsonl "$out/$name.jsonl" "$@" > "$out/$name.log" 2>&1
  fi
  echo "$name exit $?"
}
