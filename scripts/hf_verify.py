#!/usr/bin/env python3
"""The Hugging Face side of `convert_checkpoint --verify`.

Loads a Hugging Face folder with transformers, runs the token ids of --input through it with
bidirectional attention (masked-diffusion models attend both ways; transformers' Qwen classes
are causal, so the causal mask is replaced by an all-zero additive 4-D mask and every
attention module's `is_causal` is cleared), and writes the logits to --output as safetensors
("logits", float32 [batch, seq, vocab]). With --causal the model runs as transformers defines it.

It checks its own patch: with bidirectional attention, changing the last token must change the
logits at position 0; if it does not, the installed transformers ignored the patch and the
script fails rather than report a meaningless comparison.

With --fp32-reference PATH (for --dtype bf16) the same weights, widened exactly to fp32, run once
more in fp32 without TF32 and those logits go to PATH: the reference against which both bf16
implementations are measured, and transformers' own bf16 error against it is the noise floor.

Usage: hf_verify.py --model DIR --input ids.safetensors --output logits.safetensors
                    [--dtype fp32|bf16] [--device cpu|cuda] [--causal] [--fp32-reference PATH]
       hf_verify.py --probe    (exit 0 when torch, safetensors and transformers import; else say why)
"""
import argparse
import sys

if "--probe" in sys.argv:
    try:
        import safetensors  # noqa: F401
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        print(f"{e} (the Hugging Face side needs torch, safetensors and transformers)")
        sys.exit(3)
    sys.exit(0)

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM


def bidirectional(model):
    for module in model.modules():
        if hasattr(module, "is_causal"):
            module.is_causal = False


def logits_of(model, ids, causal):
    kwargs = {}
    if not causal:
        b, s = ids.shape
        dtype = next(model.parameters()).dtype
        # An additive mask of zeros: every query attends to every key. transformers passes a 4-D
        # mask through unchanged (it is taken as already prepared).
        kwargs["attention_mask"] = torch.zeros((b, 1, s, s), dtype=dtype, device=ids.device)
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=False, **kwargs)
    return out.logits.float()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--input", required=True)
    p.add_argument("--output", required=True)
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--causal", action="store_true")
    p.add_argument("--fp32-reference")
    a = p.parse_args()
    if a.fp32_reference and a.dtype != "bf16":
        p.error("--fp32-reference goes with --dtype bf16")

    dtype = torch.float32 if a.dtype == "fp32" else torch.bfloat16
    # Plain fp32 matmuls (no TF32) so that fp32 differences are reassociation only.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = AutoModelForCausalLM.from_pretrained(a.model, torch_dtype=dtype, attn_implementation="eager")
    model.to(a.device).eval()
    if not a.causal:
        bidirectional(model)
    ids = load_file(a.input)["input_ids"].to(torch.long).to(a.device)

    logits = logits_of(model, ids, a.causal)
    if not torch.isfinite(logits).all():
        sys.exit("hf_verify.py: transformers produced non-finite logits (a mask this transformers "
                 "version reads differently?); refusing to compare")
    if not a.causal and ids.shape[1] > 1:
        changed = ids.clone()
        changed[:, -1] = (changed[:, -1] + 1) % model.config.vocab_size
        first = logits_of(model, changed, a.causal)[:, 0]
        if torch.equal(first, logits[:, 0]):
            sys.exit("hf_verify.py: the causal mask is still on (position 0 ignores the last token); "
                     f"this transformers {__import__('transformers').__version__} did not take the "
                     "bidirectional patch")
    save_file({"logits": logits.cpu().contiguous()}, a.output)
    if a.fp32_reference:
        model.float()  # bf16 -> fp32 is exact: the same weights, computed in fp32
        save_file({"logits": logits_of(model, ids, a.causal).cpu().contiguous()}, a.fp32_reference)
        print(f"hf_verify.py: fp32 reference logits written to {a.fp32_reference}")
    print(f"hf_verify.py: {model.config.model_type} ({'causal' if a.causal else 'bidirectional'}, "
          f"{a.dtype} on {a.device}): logits {tuple(logits.shape)} written to {a.output}")


if __name__ == "__main__":
    main()
