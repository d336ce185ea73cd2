#!/usr/bin/env python3
"""A Megatron indexed dataset (PREFIX.bin / PREFIX.idx, MMIDIDX version 1, uint16 tokens) of
random-token documents with chosen lengths, each ending in the end-of-document token: training
data for timing packed documents (--reset-attention-mask) at a document length the mock data
does not have (its documents are 1-4095 tokens).

Lengths cycle through 256, 200, 312, 256, 180, 332 times --scale (apps/megadlm_bench's packed
rows: --scale 1 gives documents of ~256 tokens, 4 of ~1024). Tokens are uniform in
[1, --mask-token) so that neither the mask nor the end-of-document id occurs inside a document.

  python3 scripts/make_synthetic_corpus.py PREFIX --tokens 4000000 --scale 1 --eod 50288
  pretrain_difflm ... --data-path PREFIX --tokenizer-type NullTokenizer --vocab-size 50289
"""
import argparse
import array
import random
import struct

LENGTHS = [256, 200, 312, 256, 180, 332]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("prefix")
    p.add_argument("--tokens", type=int, default=4_000_000, help="at least this many tokens")
    p.add_argument("--scale", type=int, default=1, help="document lengths times this")
    p.add_argument("--eod", type=int, default=50288, help="end-of-document id (NullTokenizer: vocab - 1)")
    p.add_argument("--mask-token", type=int, default=50277, help="tokens are drawn below this id")
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    assert max(a.eod, a.mask_token) < 65536, "uint16 tokens"
    lengths = []
    while sum(lengths) < a.tokens:
        lengths.append(a.scale * LENGTHS[len(lengths) % len(LENGTHS)])
    rng = random.Random(a.seed)
    with open(a.prefix + ".bin", "wb") as f:
        for n in lengths:
            doc = array.array("H", (rng.randrange(1, a.mask_token) for _ in range(n - 1)))
            doc.append(a.eod)
            f.write(doc.tobytes())
    n = len(lengths)
    pointers, at = array.array("q"), 0
    for length in lengths:
        pointers.append(at)
        at += 2 * length
    with open(a.prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(struct.pack("<QBQQ", 1, 8, n, n + 1))  # version 1, dtype 8 (uint16), counts
        f.write(array.array("i", lengths).tobytes())
        f.write(pointers.tobytes())
        f.write(array.array("q", range(n + 1)).tobytes())  # one sequence per document
    print(f"{a.prefix}: {n} documents, {sum(lengths)} tokens, mean length {sum(lengths) / n:.0f}")


if __name__ == "__main__":
    main()
