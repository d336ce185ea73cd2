#!/usr/bin/env bash
# Every cluster recipe in configs/recipes/ (docs/recipes.md), as CI can check it without a
# cluster: (1) its dry run at its own world size passes every rule and prints the layout; (2) its
# tiny twin — the tiny model of configs/tiny_dlm.args with the recipe's layout file and the
# recipe's `# twin:` overrides (the same layout shape at 8 ranks or fewer) — trains a few
# iterations on the CPU under mpirun, so the recipe's flag combination is proven to run, not only
# to parse. Every twin must train: one this build refuses ("not supported yet") fails the test.
# Without Open MPI's mpirun the twins cannot run: exit 77 (skipped) after the dry runs.
set -uo pipefail
bin=$(cd "$1" && pwd); src=$(cd "$2" && pwd)
p="$bin/pretrain_difflm"
fail() { echo "FAIL: $*"; exit 1; }
header() { grep -m1 "^# $1:" "$2" | sed "s/^# $1:[[:space:]]*//"; }

mpirun_flags=(--oversubscribe)
[ "$(id -u)" = 0 ] && mpirun_flags+=(--allow-run-as-root)
have_mpi=0
command -v mpirun >/dev/null && mpirun --version 2>/dev/null | grep -q "Open MPI\|OpenRTE" && have_mpi=1

n=0; total=0
for recipe in "$src"/configs/recipes/*.args; do
  name=$(basename "$recipe" .args)
  total=$((total + 1))
  ws=$(header world-size "$recipe")
  [ -n "$ws" ] || fail "$name: no '# world-size:' line"
  out=$("$p" @"$recipe" --mock-data --dry-run --world-size "$ws" 2>&1)
  rc=$?
  [ $rc -eq 0 ] || fail "$name: dry run at world size $ws exited $rc: $out"
  grep -q "^world size $ws = " <<< "$out" || fail "$name: no layout line for world size $ws"
  # The memory planner: the busiest rank fits one H200 (141 GB) with 10 % headroom, and the
  # cost model gives the step time docs/recipes.md quotes.
  peak=$(sed -nE 's/.*busiest rank: (.*, )?([0-9.]+) GB of 141\.00 GB.*: fits$/\2/p' <<< "$out")
  [ -n "$peak" ] || fail "$name: the planner does not say it fits a 141 GB GPU: $(grep 'busiest rank' <<< "$out")"
  awk -v p="$peak" 'BEGIN { exit !(p <= 0.9 * 141) }' ||
    fail "$name: predicted peak $peak GB leaves less than 10 % of an H200's 141 GB"
  grep -q "^estimated step on H200s" <<< "$out" || fail "$name: no step-time estimate in the dry run"
  echo "$name: $ws GPUs, predicted peak $peak GB; $(grep -o '^estimated step on H200s.*' <<< "$out" | sed -E 's/ \(the --plan.*\)://')"

  # The tiny twin.
  layout=$(grep -m1 '^@\.\./layouts/' "$recipe" | sed 's/^@//')
  [ -n "$layout" ] || fail "$name: no layout file (@../layouts/...)"
  twin_ws=$(header twin-world-size "$recipe")
  [ -n "$twin_ws" ] && [ "$twin_ws" -le 8 ] || fail "$name: '# twin-world-size:' must be 1..8"
  read -r -a twin <<< "$(header twin "$recipe")"
  args=(@"$src/configs/tiny_dlm.args" @"$src/configs/recipes/$layout" "${twin[@]}"
        --device cpu --train-iters 3 --log-interval 1 --micro-batch-size 1 --global-batch-size 8
        --lr-warmup-iters 1 --eval-iters 0)
  out=$("$p" "${args[@]}" --dry-run --world-size "$twin_ws" 2>&1)
  [ $? -eq 0 ] || fail "$name: the twin's dry run at $twin_ws ranks fails: $out"
  if grep -q "not supported yet" <<< "$out"; then
    fail "$name: the tiny twin is refused: $(grep -A1 'not supported yet by megadlm' <<< "$out" | sed -n '2s/^ *//p')"
  fi
  [ $have_mpi = 1 ] || continue
  out=$(OMPI_MCA_rmaps_base_oversubscribe=1 timeout 300 mpirun -np "$twin_ws" "${mpirun_flags[@]}" \
        "$p" "${args[@]}" 2>&1)
  rc=$?
  [ $rc -eq 0 ] || fail "$name: the tiny twin on $twin_ws ranks exited $rc: $(tail -20 <<< "$out")"
  grep -q "iteration        3/       3" <<< "$out" || fail "$name: the twin logged no iteration 3: $(tail -5 <<< "$out")"
  n=$((n + 1))
done
# The launch files: each starts its default recipe on as many GPUs as the recipe asks for.
for f in "$src"/configs/launch/slurm_*gpu.sbatch "$src"/configs/launch/mpirun_*gpu.sh; do
  bash -n "$f" || fail "$f: not valid bash"
  gpus=$(basename "$f" | sed 's/^[a-z]*_\([0-9]*\)gpu\..*/\1/')
  recipe=$(grep -o 'RECIPE:-[^}]*' "$f" | sed 's/RECIPE:-//')
  [ -f "$src/$recipe" ] || fail "$f: default recipe $recipe does not exist"
  [ "$(header world-size "$src/$recipe")" = "$gpus" ] || fail "$f: $recipe is not a $gpus-GPU recipe"
  if [[ "$f" == *.sbatch ]]; then
    nodes=$(grep -m1 '^#SBATCH --nodes=' "$f" | cut -d= -f2)
    [ $((nodes * 8)) = "$gpus" ] || fail "$f: $nodes nodes x 8 is not $gpus GPUs"
  fi
done
# The flags every launch adds to a recipe are valid with it.
out=$(cd "$(mktemp -d)" && RECIPE=x source "$src/configs/launch/cluster_env.sh" && \
      "$p" @"$src/configs/recipes/megadlms_1.7b_8gpu.args" --mock-data "${RUN_FLAGS[@]}" --dry-run --world-size 8 2>&1)
[ $? -eq 0 ] || fail "cluster_env.sh's RUN_FLAGS are not accepted: $out"

[ "$total" -gt 0 ] || fail "no recipes in $src/configs/recipes"
if [ $have_mpi = 0 ]; then
  echo "SKIP: every dry run of the $total recipes passes, but no tiny twin ran (no Open MPI mpirun here)"
  exit 77
fi
[ "$n" -eq "$total" ] || fail "$n of $total tiny twins trained"
echo "recipes: every dry run passes; all $n tiny twins trained on CPU"
echo "PASS"
