#!/usr/bin/env bash
# The parallelism guide's launch lines, each added to the guide's base command for the MegaDLMs
# 1.7B model: every line (with the sizes that fit, or the world size it needs) passes --dry-run
# and prints rank 0's groups; the lines that cannot run as written exit 2 with a message saying
# why and what would be valid. Every layout a dry run accepts also runs: the CP lines run for real
# (e2e/context_parallel_cpu.sh), EP/MoE and FSDP layouts run (tests/layout/).
# Expected groups follow Megatron's rank order tp-cp-ep-dp-pp
# (TP fastest): for rank 0 the group of a dimension is 0, stride, 2·stride, ... where the stride
# is the product of the sizes of the dimensions before it.
set -uo pipefail
bin=$1; src=$2
p="$bin/pretrain_difflm"
fail() { echo "FAIL: $*"; exit 1; }

# The guide's base command. --train-iters 3000, not the guide's 10: the 1.7B config warms the LR
# up for 2000 iterations and decays over a WSD tail of 1000, which 10 iterations cannot hold
# (V-60), whatever the parallel layout.
base=(@"$src/configs/megadlms_1.7b.args" --mock-data --train-iters 3000 --global-batch-size 64
      --dry-run --world-size 8)

out=""
# run <expected exit code> <label> <flags...>: runs the base command plus the flags.
run() {
  local want=$1 label=$2; shift 2
  out=$("$p" "${base[@]}" "$@" 2>&1)
  local rc=$?
  [ "$rc" -eq "$want" ] || fail "$label: expected exit $want, got $rc: $out"
}
# has <label> <text>...: each text appears in the last output, verbatim.
has() {
  local label=$1; shift
  for text in "$@"; do
    grep -qF -- "$text" <<< "$out" || fail "$label: missing '$text' in:
$out"
  done
}
# group <label> <name> <members>: rank 0's group line, e.g. group x tp "[0, 1, 2, 3]".
group() {
  local dots=$(( 28 - ${#2} ))
  has "$1" "  $2 $(printf '%*s' "$dots" '' | tr ' ' .) $3"
}
# arg <label> <dest> <value>: a line of the arguments dump ("  name ..... value", 48 wide).
arg() {
  local dots=$(( 48 - ${#2} ))
  has "$1" "  $2 $(printf '%*s' "$dots" '' | tr ' ' .) $3"
}
runnable="dry run: the configuration is valid and runnable by this build"
not_runnable="dry run: the configuration is valid; the items above marked not supported yet keep this build from running it"

# ---- DP: --data-parallel-sharding-strategy no_shard (plain DDP over 8 ranks)
run 0 dp --data-parallel-sharding-strategy no_shard
has dp "world size 8 = tp 1 x cp 1 x dp 8 x pp 1" "$runnable" \
    "\`--data-parallel-sharding-strategy no_shard\` has effect only with \`--use-custom-fsdp\`"
group dp dp "[0, 1, 2, 3, 4, 5, 6, 7]"
group dp tp "[0]"
# With Megatron-FSDP: every strategy runs, the default optim_grads_params (FSDP) included.
run 0 fsdp-no-shard --use-custom-fsdp --data-parallel-sharding-strategy no_shard
has fsdp-no-shard "$runnable"
run 0 fsdp --use-custom-fsdp
has fsdp "$runnable" "world size 8 = tp 1 x cp 1 x dp 8 x pp 1"

# ---- TP + SP: --tensor-model-parallel-size 4 --sequence-parallel (dp = 8 / 4 = 2, stride 4)
run 0 tp --tensor-model-parallel-size 4 --sequence-parallel
has tp "world size 8 = tp 4 x cp 1 x dp 2 x pp 1" "$runnable"
arg tp sequence_parallel True
group tp tp "[0, 1, 2, 3]"
group tp dp "[0, 4]"

# ---- PP + VPP: --pipeline-model-parallel-size 8 --virtual-pipeline-model-parallel-size 4
# As written, 28 layers do not split over 8 stages; the message lists the pipeline sizes that
# split them, and those that also split each stage into 4 virtual stages.
run 2 pp-as-written --pipeline-model-parallel-size 8 --virtual-pipeline-model-parallel-size 4
has pp-as-written "\`--num-layers 28\` is not divisible by \`--pipeline-model-parallel-size 8\`; valid pipeline sizes: 1, 2, 4, 7, 14, 28; with \`--virtual-pipeline-model-parallel-size 4\`: 7 [V-18]"
run 2 pp-4-vpp-4 --pipeline-model-parallel-size 4 --virtual-pipeline-model-parallel-size 4
has pp-4-vpp-4 "\`--virtual-pipeline-model-parallel-size 4\` does not divide the 7 layers per pipeline stage (\`--num-layers 28\` / \`--pipeline-model-parallel-size 4\`) into whole virtual stages; valid: 1, 7 [V-19]"
# A 32-layer variant runs the line as written: 4 layers per stage, one per virtual stage. The
# three spellings of the virtual stages give the same layout.
for vflags in "--virtual-pipeline-model-parallel-size 4" "--num-virtual-stages-per-pipeline-rank 4" \
              "--num-layers-per-virtual-pipeline-stage 1" \
              "--virtual-pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 1"; do
  # shellcheck disable=SC2086  # split the flag list on purpose
  run 0 "pp ($vflags)" --num-layers 32 --pipeline-model-parallel-size 8 $vflags
  has "pp ($vflags)" "world size 8 = tp 1 x cp 1 x dp 1 x pp 8" "virtual pipeline stages 4;" \
      "$runnable"
  arg "pp ($vflags)" virtual_pipeline_model_parallel_size 4
  group "pp ($vflags)" pp "[0, 1, 2, 3, 4, 5, 6, 7]"
  group "pp ($vflags)" embedding "[0, 7]"
done
run 2 pp-disagree --num-layers 32 --pipeline-model-parallel-size 8 \
    --virtual-pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 2
has pp-disagree "\`--virtual-pipeline-model-parallel-size 4\` disagrees with \`--num-layers-per-virtual-pipeline-stage 2\`" \
    "values that agree: \`--virtual-pipeline-model-parallel-size 2\` with \`--num-layers-per-virtual-pipeline-stage 2\`, or \`--virtual-pipeline-model-parallel-size 4\` with \`--num-layers-per-virtual-pipeline-stage 1\`"

# ---- CP: --context-parallel-size 2 --cp-comm-type p2p --hierarchical-context-parallel-sizes 2 4
# As written the levels multiply to 8, not 2.
run 2 cp-as-written --context-parallel-size 2 --cp-comm-type p2p --hierarchical-context-parallel-sizes 2 4
has cp-as-written "\`--hierarchical-context-parallel-sizes 2 4\` multiply to 8, not to \`--context-parallel-size 2\`; valid: level sizes whose product is 2, e.g. \`--hierarchical-context-parallel-sizes 1 2\` or \`2 1\`; or \`--context-parallel-size 8\` to match these levels [V-9]"
# Levels 2 1: cp 2 (stride 1), dp 4 (stride 2); level 1 is the whole CP group, level 2 one rank.
run 0 cp-2 --context-parallel-size 2 --cp-comm-type p2p --hierarchical-context-parallel-sizes 2 1
has cp-2 "world size 8 = tp 1 x cp 2 x dp 4 x pp 1" "$runnable"
group cp-2 cp "[0, 1]"
group cp-2 dp "[0, 2, 4, 6]"
group cp-2 "hierarchical-cp level 1" "[0, 1]"
group cp-2 "hierarchical-cp level 2" "[0]"
# Levels 2 4 with cp 8: level 1 = 2 consecutive CP ranks, level 2 = every 2nd of the 8.
run 0 cp-8 --context-parallel-size 8 --cp-comm-type p2p --hierarchical-context-parallel-sizes 2 4
has cp-8 "world size 8 = tp 1 x cp 8 x dp 1 x pp 1" "$runnable"
group cp-8 cp "[0, 1, 2, 3, 4, 5, 6, 7]"
group cp-8 "hierarchical-cp level 1" "[0, 1]"
group cp-8 "hierarchical-cp level 2" "[0, 2, 4, 6]"
# The same levels drive a2a+p2p: all-to-all inside level 1, the ring across level 2; three
# levels are refused for it.
run 0 cp-8-a2a-p2p --context-parallel-size 8 --cp-comm-type a2a+p2p --hierarchical-context-parallel-sizes 2 4
has cp-8-a2a-p2p "world size 8 = tp 1 x cp 8 x dp 1 x pp 1" "$runnable"
run 2 cp-8-three-levels --context-parallel-size 8 --cp-comm-type a2a+p2p --hierarchical-context-parallel-sizes 2 2 2
has cp-8-three-levels "uses two hierarchical levels" "[M-24]"

# ---- EP: --expert-model-parallel-size 4 --num-experts 8 --moe-grouped-gemm --sequence-parallel
# Experts: etp 1 x ep 4 x edp 2 (ep stride 1, edp stride 4); SP is off with TP 1.
run 0 ep --expert-model-parallel-size 4 --num-experts 8 --moe-grouped-gemm --sequence-parallel
has ep "world size 8 = tp 1 x cp 1 x dp 8 x pp 1; experts: etp 1 x ep 4 x edp 2 x pp 1" \
    "$runnable" \
    "\`--sequence-parallel\` has no effect with \`--tensor-model-parallel-size 1\`; turned off"
group ep expert-ep "[0, 1, 2, 3]"
group ep expert-dp "[0, 4]"

# ---- all together: tp 4 x pp 4 x cp 2 needs 32 ranks, and EP needs experts.
mixed=(--tensor-model-parallel-size 4 --pipeline-model-parallel-size 4 --expert-model-parallel-size 2
       --context-parallel-size 2 --sequence-parallel)
run 2 mixed-as-written "${mixed[@]}"
has mixed-as-written \
    "world size 8 (\`--world-size 8\`) is not divisible by tp·pp·cp = 32 (\`--tensor-model-parallel-size 4\`, \`--pipeline-model-parallel-size 4\`, \`--context-parallel-size 2\`); valid world sizes: multiples of 32 (e.g. \`--world-size 32\`); valid for world size 8: sizes whose product tp·pp·cp divides it (1, 2, 4, 8) [V-5]" \
    "\`--expert-model-parallel-size 2\` needs \`--num-experts\` (a multiple of 2"
# On 32 ranks: tp stride 1, cp stride tp = 4, dp 1, pp stride tp·cp·dp = 8; experts: etp 4,
# ep stride etp = 4, edp 1.
# The 1.7B config truncates 1% of the micro-batches (--difflm-varilen-prob 0.01): CP pads those,
# and the MoE layer routes only the real rows, so the line runs as written.
run 0 mixed-32 "${mixed[@]}" --num-experts 8 --world-size 32
has mixed-32 "world size 32 = tp 4 x cp 2 x dp 1 x pp 4; experts: etp 4 x ep 2 x edp 1 x pp 4" "$runnable"
arg mixed-32 sequence_parallel True
group mixed-32 tp "[0, 1, 2, 3]"
group mixed-32 cp "[0, 4]"
group mixed-32 dp "[0]"
group mixed-32 pp "[0, 8, 16, 24]"
group mixed-32 expert-ep "[0, 4]"
group mixed-32 expert-tp "[0, 1, 2, 3]"

echo "PASS"
