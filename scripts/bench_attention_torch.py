#!/usr/bin/env python3
"""PyTorch's attention kernels at megadlm_bench's attention shapes, timed the same way.

What the alternatives reach where megadlm's packed-document rows are measured: PyTorch's SDPA
backends (FlashAttention-2, cuDNN, memory-efficient) on the dense rows B4 S2048 and B32 S256,
and its variable-length flash kernel (aten._flash_attention_forward / _backward with cumulative
sequence lengths, what flash_attn_varlen_func runs) on the packed documents of
apps/megadlm_bench/attention.cpp (the same lengths). Nested-tensor SDPA is left out: at these
shapes its host-side work (2.6-77 ms a call on the H200) hides the kernels. Timing as megadlm_bench: 5
warm-up calls, 25 timed, each after writing 256 MiB to evict L2, median; FLOPs 4 H D sum(L^2)
forward, 2.5x that backward, so a row's TFLOP/s is per useful FLOP like megadlm's.

  python3 scripts/bench_attention_torch.py OUT.json     (a table on stdout, rows in OUT.json)
"""
import json
import sys

import torch
import torch.nn.functional as F

H, D = 16, 128
WARMUP, REPS = 5, 25
flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")


def median_ms(fn):
    for _ in range(WARMUP):
        fn()
    times = []
    for i in range(REPS):
        flush.fill_(i + 1)
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    times.sort()
    return times[len(times) // 2]


def document_lengths(batch, seq, kind):
    """apps/megadlm_bench/attention.cpp's pack_documents: lengths of each row's documents."""
    base = [256, 200, 312, 256, 180, 332]
    scale = 4 if kind == "mean1024" else 1
    rows = []
    for b in range(batch):
        i, doc, lens = 0, 0, []
        while i < seq:
            n = min(scale * base[(b + doc) % len(base)], seq - i)
            if kind == "exact256":
                n = min(256, seq - i)
            lens.append(n)
            i += n
            doc += 1
        rows.append(lens)
    return [n for r in rows for n in r]


def dense_case(batch, seq, backend_name):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
               "efficient": SDPBackend.EFFICIENT_ATTENTION}[backend_name]
    q, k, v = (torch.randn(batch, H, seq, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    dout = torch.randn(batch, H, seq, D, device="cuda", dtype=torch.bfloat16)
    with sdpa_kernel(backend):
        fwd = median_ms(lambda: F.scaled_dot_product_attention(q, k, v))
        out = F.scaled_dot_product_attention(q, k, v)
        bwd = median_ms(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True))
    return fwd, bwd, float(batch) * seq * seq


def varlen_flash_case(lengths):
    """FlashAttention-2's varlen kernels as PyTorch ships them (q, k, v as [T, H, D] + cu_seqlens)."""
    total = sum(lengths)
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0).tolist()), dtype=torch.int32, device="cuda")
    max_len = max(lengths)
    q, k, v = (torch.randn(total, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    dout = torch.randn(total, H, D, device="cuda", dtype=torch.bfloat16)
    scale = D ** -0.5

    def forward():
        return torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, max_len, max_len, 0.0, False, False,
                                                       scale=scale)

    res = forward()
    out, lse, rng, unused = res[0], res[1], res[2], res[3]
    fwd = median_ms(forward)
    bwd = median_ms(lambda: torch.ops.aten._flash_attention_backward(
        dout, q, k, v, out, lse, cu, cu, max_len, max_len, 0.0, False, rng, unused, scale=scale))
    return fwd, bwd, float(sum(n * n for n in lengths))


def main():
    out_path = sys.argv[1] if len(sys.argv) > 1 else "attention_torch.json"
    rows = []

    def record(name, fn):
        try:
            fwd, bwd, pairs = fn()
            flops = 4.0 * H * D * pairs
            row = {"name": name, "fwd_ms": fwd, "bwd_ms": bwd, "fwd_tflops": flops / fwd / 1e9,
                   "bwd_tflops": 2.5 * flops / bwd / 1e9}
            print(f"{name:40s} {fwd:8.3f} / {bwd:8.3f} ms = {row['fwd_tflops']:6.0f} / "
                  f"{row['bwd_tflops']:6.0f} TFLOP/s", flush=True)
        except Exception as e:  # a backend that refuses the shape is a result too
            row = {"name": name, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
            print(f"{name:40s} {row['error']}", flush=True)
        rows.append(row)

    print(f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, {torch.cuda.get_device_name()}")
    for backend in ("cudnn", "flash", "efficient"):
        record(f"dense_b4_s2048_{backend}", lambda: dense_case(4, 2048, backend))
        record(f"dense_b32_s256_{backend}", lambda: dense_case(32, 256, backend))
    for kind in ("mean256", "exact256", "mean1024"):
        lengths = document_lengths(4, 2048, kind)
        record(f"documents_{kind}_flash_varlen", lambda: varlen_flash_case(lengths))
    with open(out_path, "w") as f:
        json.dump({"torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
