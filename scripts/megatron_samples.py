#!/usr/bin/env python3
"""The clean token rows pretrain_difflm trains on, rebuilt in plain Python (no numpy, no torch).

Reads a Megatron indexed dataset (PREFIX.idx / PREFIX.bin, MMIDIDX version 1) and the GPT
dataset indices pretrain_difflm wrote to its --data-cache-path (Megatron's .npy cache format:
document_index, sample_index, shuffle_index of the train split), and assembles training sample g
exactly as src/data/gpt_dataset.cpp does (GptDataset::sample): shuffle_index[g] -> (document
index entry, offset) in sample_index -> seq_length + 1 tokens read across documents. Iteration k
(1-based, one data-parallel rank, no blend) trains on samples (k-1)·GBS .. k·GBS-1; the diffusion
objectives' clean row x_0 is sample[1:] (w_1..w_L, src/diffusion/forward_process.cpp).

The indices are read, not recomputed: the shuffle is megadlm's, so a peer fed these rows sees the
tokens megadlm saw. tests/e2e/bd_curve_data_order.sh checks that against megadlm's own gradients.

  python3 scripts/megatron_samples.py CACHE_DIR PREFIX --iteration 3 --gbs 8   # prints the rows
"""
import argparse
import array
import ast
import glob
import json
import os
import struct
import sys

_IDX_DTYPES = {1: ("B", 1), 2: ("b", 1), 3: ("h", 2), 4: ("i", 4), 5: ("q", 8), 8: ("H", 2)}
_NPY_DTYPES = {"<i2": "h", "<i4": "i", "<i8": "q", "<u4": "I", "<u8": "Q"}


def _typed(code, raw):
    a = array.array(code)
    a.frombytes(raw)
    if sys.byteorder != "little":
        a.byteswap()
    return a


class IndexedDataset:
    """PREFIX.idx / PREFIX.bin (Megatron MMIDIDX version 1): token sequences."""

    def __init__(self, prefix):
        self.prefix = prefix
        with open(prefix + ".idx", "rb") as f:
            raw = f.read()
        if raw[:9] != b"MMIDIDX\x00\x00":
            raise ValueError(f"{prefix}.idx: not a Megatron MMIDIDX index")
        version, code, nseq, ndoc = struct.unpack_from("<QBQQ", raw, 9)
        if version != 1 or code not in _IDX_DTYPES:
            raise ValueError(f"{prefix}.idx: version {version}, dtype code {code} not supported")
        self.code, self.item = _IDX_DTYPES[code]
        off = 34
        self.lengths = _typed("i", raw[off:off + 4 * nseq])
        off += 4 * nseq
        self.pointers = _typed("q", raw[off:off + 8 * nseq])
        self.bin = open(prefix + ".bin", "rb")

    def read(self, seq, offset, count):
        self.bin.seek(self.pointers[seq] + offset * self.item)
        return list(_typed(self.code, self.bin.read(count * self.item)))


def read_npy(path):
    """A 1-D or 2-D integer .npy (as megadlm's cache writes it), flattened."""
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:6] != b"\x93NUMPY":
        raise ValueError(f"{path}: not an .npy file")
    major = raw[6]
    hlen, start = (struct.unpack_from("<H", raw, 8)[0], 10) if major == 1 else (struct.unpack_from("<I", raw, 8)[0], 12)
    header = ast.literal_eval(raw[start:start + hlen].decode("latin1"))
    if header.get("fortran_order") or header["descr"] not in _NPY_DTYPES:
        raise ValueError(f"{path}: unsupported .npy header {header}")
    return _typed(_NPY_DTYPES[header["descr"]], raw[start + hlen:])


class CachedGptSamples:
    """The train split's samples of a megadlm run, from its --data-cache-path."""

    def __init__(self, cache_dir, prefix, split="train"):
        found = []
        for d in glob.glob(os.path.join(cache_dir, f"*-GPTDataset-{split}-description.json")):
            desc = json.load(open(d))
            if os.path.abspath(desc["dataset_path"]) == os.path.abspath(prefix):
                found.append((d, desc))
        if len(found) != 1:
            raise SystemExit(f"megatron_samples.py: {len(found)} {split} index caches of {prefix} in {cache_dir} "
                             "(expected exactly one: give the run a fresh --data-cache-path)")
        path, self.desc = found[0]
        base = path[: -len("-description.json")]
        self.seq_length = int(self.desc["sequence_length"])
        self.document_index = read_npy(base + "-document_index.npy")
        self.sample_index = read_npy(base + "-sample_index.npy")
        self.shuffle_index = read_npy(base + "-shuffle_index.npy")
        self.data = IndexedDataset(prefix)

    def __len__(self):
        return len(self.shuffle_index)

    def sample(self, g):
        """Sample g of the training order: seq_length + 1 tokens."""
        k = self.shuffle_index[g]
        entry, offset = self.sample_index[2 * k], self.sample_index[2 * k + 1]
        need, out = self.seq_length + 1, []
        while len(out) < need:
            seq = self.document_index[entry]
            take = min(self.data.lengths[seq] - offset, need - len(out))
            out += self.data.read(seq, offset, take)
            entry, offset = entry + 1, 0
        return out

    def iteration_rows(self, iteration, gbs):
        """The clean rows x_0 = sample[1:] of 1-based iteration `iteration` (one DP rank, no blend)."""
        first = (iteration - 1) * gbs
        return [self.sample(first + j)[1:] for j in range(gbs)]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("cache_dir")
    p.add_argument("prefix")
    p.add_argument("--iteration", type=int, default=1)
    p.add_argument("--gbs", type=int, required=True)
    a = p.parse_args()
    s = CachedGptSamples(a.cache_dir, a.prefix)
    for row in s.iteration_rows(a.iteration, a.gbs):
        print(" ".join(map(str, row)))


if __name__ == "__main__":
    main()
