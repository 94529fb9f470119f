"""Writes the dequantization fixtures of `tests/dequant_fixture.rs` (run once, offline).

For each type: random blocks (every quant bit random; the f16 scale fields replaced by random
finite values) dequantized by llama.cpp's gguf-py (`gguf.quants`), written to `<TYPE>.bin` as the
raw block bytes followed by the f32 values (little-endian). Usage:
    PYTHONPATH=/path/to/gguf-py python3 make_fixtures.py
"""
import os
import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

rng = np.random.default_rng(20250601)
here = os.path.dirname(os.path.abspath(__file__))

# (type, blocks, byte offsets of f16 fields inside a block, type size)
TYPES = [
    (T.Q4_0, 4, [0], 18),
    (T.Q4_1, 4, [0, 2], 20),
    (T.Q5_0, 4, [0], 22),
    (T.Q5_1, 4, [0, 2], 24),
    (T.Q8_0, 4, [0], 34),
    (T.IQ4_NL, 4, [0], 18),
    (T.Q2_K, 1, [80, 82], 84),
    (T.Q3_K, 1, [108], 110),
    (T.Q4_K, 1, [0, 2], 144),
    (T.Q5_K, 1, [0, 2], 176),
    (T.Q6_K, 1, [208], 210),
    (T.IQ4_XS, 1, [0], 136),
]


def f16_field():
    v = np.float16(rng.choice([-1, 1]) * 2.0 ** rng.uniform(-12, 4))
    return np.frombuffer(v.tobytes(), dtype=np.uint8)


for ty, nb, f16s, size in TYPES:
    raw = rng.integers(0, 256, size=(nb, size), dtype=np.uint8)
    for b in range(nb):
        for off in f16s:
            raw[b, off:off + 2] = f16_field()
    vals = dequantize(raw.reshape(-1), ty).astype(np.float32)
    with open(os.path.join(here, f"{ty.name}.bin"), "wb") as f:
        f.write(raw.tobytes())
        f.write(vals.astype("<f4").tobytes())

# BF16: 64 random finite values (random sign, exponent and mantissa bits; no inf/NaN).
bits = rng.integers(0, 1 << 16, size=64, dtype=np.uint32)
bits = np.where((bits & 0x7F80) == 0x7F80, bits & ~np.uint32(0x4000), bits).astype(np.uint16)
raw = bits.view(np.uint8)
vals = dequantize(raw, T.BF16).astype(np.float32)
with open(os.path.join(here, "BF16.bin"), "wb") as f:
    f.write(raw.tobytes())
    f.write(vals.astype("<f4").tobytes())
