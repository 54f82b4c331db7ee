#!/usr/bin/env python3
"""Writes torch's FP8 E4M3 ("fn") decoding and encoding, and torchao's dynamic-scale recipe on a
few matrices, as the fixture crates/quant's FP8 reference is compared with bit for bit
(crates/quant/tests/fixtures/fp8_e4m3.json; the test is crates/quant/tests/fp8.rs).

Every float is stored as the integer of its float32 bits (JSON has no NaN, and bits are exact).

- "decode": torch's float32 of each of the 256 codes (`torch.float8_e4m3fn` -> float32).
- "encode": [x, clamped, cast] for a few hundred float32 x: torch's code of x.clamp(-448, 448)
  (what torchao's to_fp8_saturated casts), and its code of x cast as it is. The inputs: every
  e4m3 value, every midpoint between two neighbours (the ties) and the floats next to it, both
  signs, the subnormal range, around 448 / 464 / 480, 0, -0, NaN of both signs, inf, f32::MAX,
  and 300 random values. torch 2.15 casts saturating (clamped == cast); older torch gave NaN
  codes from 480 up (and for values that round to 480), hence the clamp.
- "rows": matrices [R, C] quantised with torchao's dynamic recipe, one scale a row (rowwise, or
  tensorwise where R = 1): multiplier = float32(448 / max(amax, 1e-12)) computed in float64
  (torchao.float8.float8_utils.amax_to_scale), codes = the saturated cast of x * multiplier.
  Each row: x, torchao's multiplier, the codes. Where torchao is importable the script checks
  that torchao's own functions give the same multipliers and codes.

Regenerate from the repository root with a python that has torch (2.1 or later):
  python scripts/fp8-fixture.py crates/quant/tests/fixtures/fp8_e4m3.json
To check the recipe against torchao as well (no other dependency is needed):
  python -m pip install --no-deps --target /tmp/ao torchao
  PYTHONPATH=/tmp/ao python scripts/fp8-fixture.py crates/quant/tests/fixtures/fp8_e4m3.json
"""

import json
import random
import struct
import sys

import torch

E4M3 = torch.float8_e4m3fn
MAX = 448.0
EPS = 1e-12  # torchao's lower bound on amax


def f32(bits):
    return struct.unpack("<f", struct.pack("<I", bits & 0xFFFFFFFF))[0]


def bits_of(t):
    """float32 tensor -> list of its bits as non-negative integers."""
    return [b & 0xFFFFFFFF for b in t.contiguous().view(torch.int32).flatten().tolist()]


def tensor_of(bits):
    """list of float32 bits -> float32 tensor holding exactly those bits."""
    signed = [b - (1 << 32) if b >= (1 << 31) else b for b in bits]
    return torch.tensor(signed, dtype=torch.int32).view(torch.float32)


def codes_of(t):
    return t.to(E4M3).view(torch.uint8).flatten().tolist()


def next_bits(b, d):
    """The float32 d steps away from bits b in magnitude (same sign)."""
    return b + d


# -- decode: all 256 codes --
all_codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
decoded = all_codes.view(E4M3).to(torch.float32)
decode = bits_of(decoded)

# -- encode inputs --
values = sorted(v for v in decoded.tolist()[:0x7F])  # the 127 finite values >= 0
assert len(values) == 127 and values[-1] == MAX
inputs = []
for v in values:
    inputs.append(bits_of(torch.tensor([v]))[0])
for a, b in zip(values, values[1:]):
    m = bits_of(torch.tensor([(a + b) / 2]))[0]  # exact: 5 significant bits
    assert f32(m) == (a + b) / 2
    inputs += [m, next_bits(m, -1), next_bits(m, 1)]
specials = [
    0.0,
    MAX,
    464.0,  # tie between 448 and 480 (which is NaN's bit pattern)
    479.99,
    480.0,
    480.01,
    500.0,
    1e6,
    432.0,  # tie between 416 and 448: rounds up to 448
    440.0,
    447.9,
    2.0**-10,  # tie between 0 and the smallest subnormal: to 0
    2.0**-11,
    3 * 2.0**-10,
    15 * 2.0**-10,  # tie between 7 * 2^-9 and 2^-6
    2.0**-6,
    1e-30,
    1e30,
    3.4028234663852886e38,  # f32::MAX
    float("inf"),
]
for s in specials:
    b = bits_of(torch.tensor([s], dtype=torch.float32))[0]
    inputs += [b, next_bits(b, -1) if s != 0 else 0, next_bits(b, 1) if s != float("inf") else b]
inputs += [1, 0x7FFFFF, 0x800000]  # float32 subnormals and the smallest normal
inputs += [0x7FC00000, 0x7F800001, 0x7FFFFFFF]  # NaNs (quiet, signalling, full payload)
rng = random.Random(40)
for _ in range(300):
    mag = 2.0 ** rng.uniform(-12.0, 9.5)
    inputs.append(bits_of(torch.tensor([mag], dtype=torch.float32))[0])
inputs = sorted(set(inputs))
inputs = inputs + [b | 0x80000000 for b in inputs]  # both signs (-0 and negative NaNs too)

x = tensor_of(inputs)
clamped = codes_of(x.clamp(-MAX, MAX))
cast = codes_of(x)
encode = [[b, c, r] for b, c, r in zip(inputs, clamped, cast)]


# -- torchao's recipe, row by row --
def multiplier(amax):
    """torchao's amax_to_scale for e4m3: 448 / max(amax, 1e-12) in float64, then float32."""
    return (MAX / torch.clamp(amax.to(torch.float64), min=EPS)).to(torch.float32)


def recipe(m):
    amax = m.abs().amax(dim=-1, keepdim=True)
    mult = multiplier(amax)
    codes = (m * mult).clamp(-MAX, MAX).to(E4M3)
    return mult, codes


gen = torch.Generator().manual_seed(40)
mats = []
# Rows of different magnitudes, from tiny to near f32::MAX.
row_scales = torch.tensor([[1e-3], [1.0], [100.0], [3e-9], [1e30], [2.0**-100]])
mats.append(torch.randn(6, 48, generator=gen) * row_scales)
# A wide dynamic range (e4m3 subnormal codes), and ties of the scaled values.
wide = torch.randn(3, 40, generator=gen) * torch.exp2(torch.randint(-20, 1, (3, 40), generator=gen))
mats.append(wide)
# amax below 1e-12; all zero with some -0; float32 subnormals; amax f32::MAX; exactly 448.
special = torch.zeros(6, 16)
special[0] = torch.randn(16, generator=gen) * 1e-13
special[1, ::3] = -0.0
special[2] = tensor_of([(0x1 << i) | (0x80000000 if i % 2 else 0) for i in range(16)])
special[3] = torch.randn(16, generator=gen) * 1e38
special[3, 5] = 3.4028234663852886e38
special[4] = torch.arange(16) * 30.0 - 2.0  # amax 448: scaling by exactly 1
special[5] = torch.randn(16, generator=gen)
special[5, 7] = 1e-12  # amax at the clamp: the others are far below it
special[5, :7] = 0.0
special[5, 8:] = 0.0
mats.append(special)
# Tensorwise: one row.
mats.append(torch.randn(1, 64, generator=gen) * 7.0)

rows = []
for m in mats:
    mult, codes = recipe(m)
    for r in range(m.shape[0]):
        rows.append(
            {
                "x": bits_of(m[r]),
                "multiplier": bits_of(mult[r])[0],
                "codes": codes[r].view(torch.uint8).tolist(),
            }
        )

try:
    from torchao.float8.config import ScalingGranularity
    from torchao.float8.float8_utils import tensor_to_scale, to_fp8_saturated
    import torchao

    for m in mats:
        mult, codes = recipe(m)
        s = tensor_to_scale(
            m, E4M3, scaling_granularity=ScalingGranularity.AXISWISE, axiswise_dim=-1
        )
        c = to_fp8_saturated(m * s, E4M3)
        assert bits_of(s) == bits_of(mult), "torchao's multipliers"
        assert c.view(torch.uint8).tolist() == codes.view(torch.uint8).tolist(), "torchao's codes"
    torchao_version = torchao.__version__
except ImportError:
    torchao_version = None

out = {
    "torch": torch.__version__,
    "torchao_checked": torchao_version,
    "decode": decode,
    "encode": encode,
    "rows": rows,
}
with open(sys.argv[1], "w") as f:
    json.dump(out, f, separators=(",", ":"))
    f.write("\n")
print(f"{len(encode)} encodings, {len(rows)} rows; torchao checked: {torchao_version}")
