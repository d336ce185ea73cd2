#!/usr/bin/env bash
# The profiling scripts of docs/profiling.md on inputs whose answers are known by construction
# (they run on the GPU machine; here they read synthetic files):
#   1. scripts/trace_gaps.py on a CUPTI-style trace: 3 kernels of 10 us with gaps of 5 and 25 us,
#      the second gap while the host waited in cudaStreamSynchronize: busy 30 us, idle 30 us,
#      both gaps found and the 25 us one attributed to the synchronisation;
#   2. scripts/kernel_summary.py on an ncu --csv --page raw file: the families and the idle time
#      against a given wall time;
#   3. --profile on a CPU run: accepted, the run trains (cudaProfilerStart/Stop are no-ops on the
#      CPU), and a range without a step is refused naming the flags (M-26).
set -uo pipefail
bin=$1; src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# 1. Times in ns. Kernel k1 [0, 10000], k2 [15000, 25000] (5 us gap, launched in time), k3
#    [50000, 60000] (25 us gap: its launch call starts at 48000, after the host sat in a sync
#    from 20000 to 47000).
cat > "$tmp/trace.jsonl" <<'EOF'
{"k":"api","s":0,"e":1000,"corr":1,"tid":1,"name":"cudaLaunchKernel_v7000"}
{"k":"kernel","s":2000,"e":12000,"stream":7,"corr":1,"name":"k1(int)"}
{"k":"api","s":1500,"e":2500,"corr":2,"tid":1,"name":"cudaLaunchKernel_v7000"}
{"k":"kernel","s":17000,"e":27000,"stream":7,"corr":2,"name":"k2(int)"}
{"k":"api","s":20000,"e":47000,"corr":3,"tid":1,"name":"cudaStreamSynchronize_v3020"}
{"k":"api","s":48000,"e":49000,"corr":4,"tid":1,"name":"cudaLaunchKernel_v7000"}
{"k":"kernel","s":52000,"e":62000,"stream":7,"corr":4,"name":"k3(float)"}
EOF
python3 "$src/scripts/trace_gaps.py" "$tmp/trace.jsonl" --kernels 3 > "$tmp/gaps.md" || fail "trace_gaps.py failed"
grep -q "3 GPU operations over 0.06 ms: busy 0.03 ms, idle 0.03 ms in 2 gaps" "$tmp/gaps.md" ||
  { cat "$tmp/gaps.md"; fail "trace_gaps.py: busy/idle totals"; }
grep -q "| 25 | \`k2\` | \`k3\` | host returning from cudaStreamSynchronize_v3020 |" "$tmp/gaps.md" ||
  { cat "$tmp/gaps.md"; fail "trace_gaps.py: the 25 us gap is the synchronisation's"; }
grep -q "| 5 | \`k1\` | \`k2\` | launched in time" "$tmp/gaps.md" ||
  { cat "$tmp/gaps.md"; fail "trace_gaps.py: the 5 us gap"; }
echo "1. trace_gaps.py: totals and attribution as constructed"

# 2. ncu's raw page: a header, a units row, then one row per kernel (ns).
cat > "$tmp/ncu.csv" <<'EOF'
==PROF== Connected to process
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","gpu__time_duration.sum"
"","","","","","","","","","","","nsecond"
"0","1","p","h","nvjet_sm90_tst_256x128(int)","1","7","(384,1,1)","(132,1,1)","0","9.0","300000"
"1","1","p","h","void megadlm::adamw_multi_kernel<float>(float*)","1","7","(256,1,1)","(1024,1,1)","0","9.0","100000"
"2","1","p","h","nvjet_sm90_tst_256x128(int)","1","7","(384,1,1)","(132,1,1)","0","9.0","100000"
EOF
python3 "$src/scripts/kernel_summary.py" "$tmp/ncu.csv" --wall-ms 1.0 > "$tmp/kernels.md" || fail "kernel_summary.py failed"
grep -q "3 kernels, 0.50 ms of GPU time summed; wall time 1.00 ms without the profiler: 0.50 ms (50.0 %)" "$tmp/kernels.md" ||
  { cat "$tmp/kernels.md"; fail "kernel_summary.py: totals"; }
grep -q "| GEMM | 2 | 0.40 | 80.0 % |" "$tmp/kernels.md" || { cat "$tmp/kernels.md"; fail "kernel_summary.py: GEMM family"; }
grep -q "| optimizer | 1 | 0.10 | 20.0 % |" "$tmp/kernels.md" || { cat "$tmp/kernels.md"; fail "kernel_summary.py: optimizer family"; }
echo "2. kernel_summary.py: totals and families as constructed"

# 3. --profile on the CPU.
"$bin/pretrain_difflm" @"$src/configs/tiny_dlm.args" --device cpu --train-iters 3 --log-interval 1 \
  --lr-warmup-iters 1 --lr-decay-iters 3 --profile --profile-step-start 1 --profile-step-end 2 \
  > "$tmp/profile.log" 2>&1 || { tail -5 "$tmp/profile.log"; fail "--profile run"; }
[ "$(grep -c ' iteration ' "$tmp/profile.log")" -ge 3 ] || { tail -5 "$tmp/profile.log"; fail "--profile run: 3 iterations"; }
"$bin/pretrain_difflm" @"$src/configs/tiny_dlm.args" --device cpu --train-iters 3 --profile \
  --profile-step-start 2 --profile-step-end 2 > "$tmp/refused.log" 2>&1 && fail "an empty --profile range was accepted"
grep -q "M-26" "$tmp/refused.log" || { cat "$tmp/refused.log"; fail "the refusal names M-26"; }
echo "3. --profile: a CPU run trains; an empty range is refused (M-26)"
echo "PASS"
