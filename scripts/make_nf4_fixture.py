#!/usr/bin/env python3
"""Writes tests/fixtures/nf4/*.txt: NF4 + double quantisation of small seeded matrices, computed here without
memtrain's code, for tests/test_nf4.cpp (which checks codes bit for bit and dequantised values exactly).

The algorithm (QLoRA, Dettmers et al. 2023; bitsandbytes functional.quantize_4bit, nf4, compress_statistics):
  - blocks of 64 over the flattened row-major matrix; absmax = max |w|; w / absmax rounded to f32; code = the
    nearest of the 16 NF4 levels (ties to the lower level); an all-zero block codes everything as 0 (code 7);
    two codes per byte, the even element in the high nibble (bitsandbytes' layout);
  - double quantisation: mean = mean of the absmaxes (f64 sum, rounded to f32); c = absmax - mean (f32);
    blocks of 256 of c, scale = the block's largest-magnitude value with its sign; code = nearest value of the
    signed dynamic map to c * f32(1 / scale) (ties to the lower code);
  - dequantised: absmax' = f32(f32(map[code] * scale) + mean); w' = f32(nf4[code] * absmax').
Pure Python (no numpy here): arithmetic in float64, rounded to f32 wherever the stored format is f32. One f32
operation computed in f64 and rounded once is the correctly rounded f32 result (53 >= 2 * 24 + 2 bits).
Run: python3 scripts/make_nf4_fixture.py   (deterministic; rewrites the fixtures)
"""
import os
import random
import struct

NF4 = [-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
       -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
       0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
       0.7229568362236023, 1.0]


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def f32_hex(x):
    return "%08x" % struct.unpack("<I", struct.pack("<f", x))[0]


NF4 = [f32(v) for v in NF4]


def signed_dynamic_map():
    # memtrain's signed dynamic tree map (memtrain/core/quant_map.h): decade 10^-k (k = 0..6) has 6 - k fraction
    # bits; fraction code j is the midpoint of the j-th of 2^bits equal steps of [0.1, 1]; both signs, 0 and 1.
    v = []
    for k in range(7):
        items = 1 << (6 - k)
        for j in range(items):
            x = 10.0 ** -k * (0.1 + 0.9 * (j + 0.5) / items)
            v += [x, -x]
    v += [0.0, 1.0]
    assert len(v) == 256
    return sorted(f32(x) for x in v)


DYN = signed_dynamic_map()


def nearest(x, table):
    """Index of the nearest table value (ascending table), ties to the lower index; exact in float64."""
    best = 0
    for i in range(1, len(table)):
        if abs(table[i] - x) < abs(table[best] - x):
            best = i
    return best


def quantize(w):
    n = len(w)
    assert n % 64 == 0
    codes4, absmax = [], []
    for b in range(n // 64):
        blk = w[64 * b:64 * b + 64]
        a = max(abs(x) for x in blk)
        absmax.append(a)
        codes4 += [7 if a == 0.0 else nearest(f32(x / a), NF4) for x in blk]
    packed = [(codes4[2 * i] << 4) | codes4[2 * i + 1] for i in range(n // 2)]
    mean = f32(sum(absmax) / len(absmax))
    centred = [f32(a - mean) for a in absmax]
    acodes, scales = [], []
    for s in range(0, len(centred), 256):
        blk = centred[s:s + 256]
        hi, lo = max(0.0, max(blk)), min(0.0, min(blk))
        scale = lo if -lo > hi else hi
        scales.append(scale)
        if scale == 0.0:
            acodes += [nearest(0.0, DYN)] * len(blk)
        else:
            inv = f32(1.0 / scale)
            acodes += [nearest(f32(x * inv), DYN) for x in blk]
    deq = []
    for b in range(n // 64):
        a = f32(f32(DYN[acodes[b]] * scales[b // 256]) + mean)
        deq += [f32(NF4[c] * a) for c in codes4[64 * b:64 * b + 64]]
    return packed, acodes, scales, mean, deq


def make(rows, cols, seed, zero_block=None, outlier=None):
    rng = random.Random(seed)
    w = [f32(rng.gauss(0.0, 0.02)) for _ in range(rows * cols)]
    if zero_block is not None:
        w[64 * zero_block:64 * zero_block + 64] = [0.0] * 64
    if outlier is not None:
        w[outlier[0]] = f32(outlier[1])
    return w


def write(path, rows, cols, w):
    packed, acodes, scales, mean, deq = quantize(w)
    with open(path, "w") as f:
        f.write("shape %d %d\n" % (rows, cols))
        f.write("mean %s\n" % f32_hex(mean))
        f.write("weight " + " ".join(f32_hex(x) for x in w) + "\n")
        f.write("codes " + " ".join("%02x" % c for c in packed) + "\n")
        f.write("absmax_codes " + " ".join("%02x" % c for c in acodes) + "\n")
        f.write("absmax_scales " + " ".join(f32_hex(x) for x in scales) + "\n")
        f.write("dequantized " + " ".join(f32_hex(x) for x in deq) + "\n")


def main():
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "nf4")
    os.makedirs(out, exist_ok=True)
    # 16 x 64: 16 blocks, one all zero (block 3), one with a 100x outlier.
    write(os.path.join(out, "small_zero_outlier.txt"), 16, 64, make(16, 64, 1, zero_block=3, outlier=(5 * 64 + 9, -2.5)))
    # 48 x 96: rows are not whole blocks (blocks span rows); 72 blocks, one partial 256-block of absmaxes.
    write(os.path.join(out, "rows_span_blocks.txt"), 48, 96, make(48, 96, 2))
    # 4 x 4224: 264 blocks = 256 + 8, two absmax scales, an outlier in the second.
    write(os.path.join(out, "two_absmax_blocks.txt"), 4, 4224, make(4, 4224, 3, outlier=(260 * 64 + 1, 0.9)))


if __name__ == "__main__":
    main()
