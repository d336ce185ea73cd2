#!/usr/bin/env python3
"""Reads the TensorBoard event files of a log directory and checks which scalars they hold.

Two readers: `tensorboard` (the tensorboard package's EventAccumulator, what TensorBoard itself
uses; on a machine where it is installed) and `builtin` (an independent parser of the record
framing written from the format: uint64 length, masked CRC-32C of the length, the Event bytes,
masked CRC-32C of the bytes; every CRC is checked; then the Event/Summary protobuf fields:
wall_time 1, step 2, file_version 3, summary 5, value 1, tag 1, simple_value 2). `auto` (default)
takes tensorboard when importable.

usage: check_tensorboard.py LOGDIR [--reader auto|tensorboard|builtin]
                            [--expect "TAG=STEPS" ...] [--json OUT]
  STEPS: "1:20" (every step from 1 to 20), "5,10,20" or "any" (at least one value)
Exit status 1 when a file is corrupt or an expected tag lacks a step; prints one line per tag.
"""
import argparse
import glob
import json
import os
import struct
import sys


def _crc_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc_table()


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c = _TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def masked(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def varint(buf, i):
    shift = value = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return value, i


def fields(buf):
    """(field number, wire type, value) of a protobuf message (bytes for wire type 2)."""
    i = 0
    while i < len(buf):
        key, i = varint(buf, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = varint(buf, i)
        elif wt == 1:
            v = buf[i:i + 8]
            i += 8
        elif wt == 2:
            n, i = varint(buf, i)
            v = buf[i:i + n]
            i += n
        elif wt == 5:
            v = buf[i:i + 4]
            i += 4
        else:
            raise ValueError(f"wire type {wt} of field {num} is not valid protobuf")
        yield num, wt, v


def read_builtin(path):
    """{tag: [(step, value)]} and the file_version, checking every CRC."""
    out, version = {}, None
    data = open(path, "rb").read()
    i = 0
    records = 0
    while i < len(data):
        if i + 12 > len(data):
            raise ValueError(f"{path}: truncated record header at byte {i}")
        header = data[i:i + 8]
        (length,) = struct.unpack("<Q", header)
        (hcrc,) = struct.unpack("<I", data[i + 8:i + 12])
        if hcrc != masked(header):
            raise ValueError(f"{path}: length CRC mismatch at byte {i}")
        body = data[i + 12:i + 12 + length]
        if len(body) != length or i + 16 + length > len(data):
            raise ValueError(f"{path}: truncated record at byte {i}")
        (dcrc,) = struct.unpack("<I", data[i + 12 + length:i + 16 + length])
        if dcrc != masked(body):
            raise ValueError(f"{path}: data CRC mismatch in record {records} at byte {i}")
        i += 16 + length
        records += 1
        step, summary = 0, None
        for num, wt, v in fields(body):
            if num == 2 and wt == 0:
                step = v
            elif num == 3 and wt == 2:
                version = v.decode()
            elif num == 5 and wt == 2:
                summary = v
        if summary is None:
            continue
        for num, wt, v in fields(summary):
            if num != 1 or wt != 2:
                continue
            tag, value = None, None
            for n2, w2, v2 in fields(v):
                if n2 == 1 and w2 == 2:
                    tag = v2.decode()
                elif n2 == 2 and w2 == 5:
                    (value,) = struct.unpack("<f", v2)
            if tag is not None and value is not None:
                out.setdefault(tag, []).append((step, value))
    if records == 0 or version != "brain.Event:2":
        raise ValueError(f"{path}: no file_version brain.Event:2 record (got {version!r})")
    return out


def read_tensorboard(logdir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(logdir, size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def parse_steps(text):
    if text == "any":
        return None
    if ":" in text:
        a, b = text.split(":")
        return list(range(int(a), int(b) + 1))
    return [int(s) for s in text.split(",")]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("logdir")
    ap.add_argument("--reader", choices=["auto", "tensorboard", "builtin"], default="auto")
    ap.add_argument("--expect", action="append", default=[])
    ap.add_argument("--json")
    a = ap.parse_args()
    files = sorted(glob.glob(os.path.join(a.logdir, "*tfevents*")))
    if not files:
        sys.exit(f"check_tensorboard.py: no *tfevents* file in {a.logdir}")
    reader = a.reader
    if reader == "auto":
        try:
            import tensorboard  # noqa: F401
            reader = "tensorboard"
        except ImportError:
            reader = "builtin"
    scalars = {}
    try:
        if reader == "tensorboard":
            scalars = read_tensorboard(a.logdir)
        else:
            for f in files:
                for tag, vals in read_builtin(f).items():
                    scalars.setdefault(tag, []).extend(vals)
    except ImportError as e:
        sys.exit(f"check_tensorboard.py: --reader tensorboard needs the tensorboard package ({e})")
    except ValueError as e:
        print(f"FAIL: {e}")
        sys.exit(1)
    print(f"reader: {reader}; {len(files)} file(s); {len(scalars)} scalar tags")
    ok = True
    for spec in a.expect:
        tag, _, steps_text = spec.rpartition("=")
        steps = parse_steps(steps_text)
        have = {s for s, _ in scalars.get(tag, [])}
        missing = [] if steps is None else [s for s in steps if s not in have]
        if tag not in scalars or missing:
            ok = False
            print(f"FAIL: {tag!r}: missing steps {missing[:10]}{'...' if len(missing) > 10 else ''}"
                  if tag in scalars else f"FAIL: no scalar {tag!r} (tags: {sorted(scalars)})")
        else:
            print(f"ok: {tag!r}: {len(scalars[tag])} values")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({t: sorted(v) for t, v in scalars.items()}, f)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
