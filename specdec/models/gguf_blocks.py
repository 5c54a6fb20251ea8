"""A GGUF tensor's quantized blocks read as the numbers the CPU kernels pack (kernels/quantized_layout.h's QCodes).

llama.cpp's block formats store, for every run of 32 or 256 weights of a row, small integers and the float16
scales that turn them into weights. The kernels keep the same integers and scales, laid out for their products,
so that a weight is exactly the value the file defines (the one `gguf.quants.dequantize` computes) and a pass reads
about the file's bytes. Each reader takes a tensor's raw bytes (rows, bytes a row), as the gguf package's reader
maps them, and returns `QuantizedRows`: the kernels' format and its numbers, one row of weights per row.

| GGUF type | kernels' format | weight |
|---|---|---|
| Q4_0 | Q40 | d * u + m, m = -8 d (so d * (u - 8)), m computed, not stored |
| Q4_1 | Q4 | d * u + m |
| Q8_0 | Q8 | d * q |
| Q4_K | K4 | (d * sc) * u - dmin * mn; sc, mn 6-bit per 32 weights, d, dmin per 256 |
| Q5_K | K5 | as Q4_K, with u in 0..31 |
| Q6_K | K6 | (d * sc) * q, q in -32..31 (stored as 6 bits); sc int8 per 16 weights, d per 256 |
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# the kernels' formats (kernels/quantized_layout.h's QFormat)
Q4, Q40, Q8, K4, K5, K6 = 4, 41, 8, 40, 50, 60
SUPER = 256  # weights of a K-quant super-block


@dataclass
class QuantizedRows:
    """A weight (rows, K) as the kernels' numbers: codes (rows, K) uint8 (u) or int8 (q); first, second (rows, G or
    2G): per group of 32 numbers (float16 d and m for Q4, d for Q40 and Q8; uint8 sc and mn for K4 and K5; int8 sc
    of each half for K6, interleaved); super_d, super_m (rows, K / 256) float16 (K-quants: d, and -dmin for K4 and
    K5)."""

    fmt: int
    codes: np.ndarray
    first: np.ndarray
    second: np.ndarray | None = None
    super_d: np.ndarray | None = None
    super_m: np.ndarray | None = None
    kind: str = ""  # the GGUF type it was read from

    @property
    def shape(self) -> tuple[int, int]:
        return self.codes.shape

    def take(self, order: np.ndarray) -> QuantizedRows:
        """The same weight with its rows in `order` (a permutation of its rows)."""

        def rows(a: np.ndarray) -> np.ndarray:
            return np.ascontiguousarray(a[order])

        def pick(a: np.ndarray | None) -> np.ndarray | None:
            return None if a is None else rows(a)

        return QuantizedRows(
            self.fmt,
            rows(self.codes),
            rows(self.first),
            pick(self.second),
            pick(self.super_d),
            pick(self.super_m),
            self.kind,
        )


def _blocks(raw: np.ndarray, block_bytes: int) -> tuple[np.ndarray, int]:
    """(rows, bytes a row) uint8 -> (rows, blocks a row, block_bytes), and the row count."""
    rows = raw.shape[0]
    return np.asarray(raw, dtype=np.uint8).reshape(rows, -1, block_bytes), rows


def _half(blocks: np.ndarray, start: int) -> np.ndarray:
    """The float16 at byte `start` of every block: (rows, blocks)."""
    return np.ascontiguousarray(blocks[..., start : start + 2]).view(np.float16)[..., 0]


def _nibbles_32(qs: np.ndarray) -> np.ndarray:
    """16 bytes a block -> 32 codes: byte j holds code j in its low nibble and code 16 + j in its high one."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def read_q4_0(raw: np.ndarray) -> QuantizedRows:
    blocks, rows = _blocks(raw, 18)
    return QuantizedRows(Q40, _nibbles_32(blocks[..., 2:]).reshape(rows, -1), _half(blocks, 0))


def read_q4_1(raw: np.ndarray) -> QuantizedRows:
    blocks, rows = _blocks(raw, 20)
    return QuantizedRows(Q4, _nibbles_32(blocks[..., 4:]).reshape(rows, -1), _half(blocks, 0), _half(blocks, 2))


def read_q8_0(raw: np.ndarray) -> QuantizedRows:
    blocks, rows = _blocks(raw, 34)
    return QuantizedRows(Q8, np.ascontiguousarray(blocks[..., 2:]).view(np.int8).reshape(rows, -1), _half(blocks, 0))


def _k4_scales(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K's 12 bytes of 6-bit scales and mins a super-block -> sc, mn (..., 8) uint8 (llama.cpp's
    get_scale_min_k4)."""
    grouped = packed.reshape(*packed.shape[:-1], 3, 4)
    d, m, m_d = grouped[..., 0, :], grouped[..., 1, :], grouped[..., 2, :]
    sc = np.concatenate([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc, mn


def read_q4_k(raw: np.ndarray) -> QuantizedRows:
    blocks, rows = _blocks(raw, 144)
    sc, mn = _k4_scales(blocks[..., 4:16])
    # 4 chunks of 32 bytes: chunk c holds group 2c in its low nibbles and group 2c + 1 in its high ones
    qs = blocks[..., 16:].reshape(rows, -1, 4, 1, 32)
    u = np.concatenate([qs & 0x0F, qs >> 4], axis=-2).reshape(rows, -1)
    return QuantizedRows(K4, u, sc.reshape(rows, -1), mn.reshape(rows, -1), _half(blocks, 0), -_half(blocks, 2))


def read_q5_k(raw: np.ndarray) -> QuantizedRows:
    blocks, rows = _blocks(raw, 176)
    sc, mn = _k4_scales(blocks[..., 4:16])
    # as Q4_K's nibbles (qs: 4 chunks of 32 bytes, groups 2c and 2c + 1), and qh byte l holds the fifth bit of
    # weight l of group g in its bit g
    qs = blocks[..., 48:].reshape(rows, -1, 4, 1, 32)
    low = np.concatenate([qs & 0x0F, qs >> 4], axis=-2).reshape(rows, -1, 8, 32)
    qh = blocks[..., 16:48].reshape(rows, -1, 1, 32)
    fifth = (qh >> np.arange(8, dtype=np.uint8).reshape(1, 1, 8, 1)) & 1
    u = (low | (fifth << 4)).reshape(rows, -1)
    return QuantizedRows(K5, u, sc.reshape(rows, -1), mn.reshape(rows, -1), _half(blocks, 0), -_half(blocks, 2))


def read_q6_k(raw: np.ndarray) -> QuantizedRows:
    blocks, rows = _blocks(raw, 210)
    n = blocks.shape[1]
    ql, qh = blocks[..., :128], blocks[..., 128:192]
    scales = np.ascontiguousarray(blocks[..., 192:208]).view(np.int8)  # (rows, n, 16): one per 16 weights
    # as gguf.quants.Q6_K: low 4 bits from ql (2 halves of 64 bytes, low then high nibbles), high 2 bits from qh
    low = (ql.reshape(rows, n, 2, 1, 64) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 1, 2, 1)) & 0x0F
    high = (qh.reshape(rows, n, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 1, 4, 1)) & 0x03
    q = (low.reshape(rows, n, 2, 4, 32) | (high.reshape(rows, n, 2, 4, 32) << 4)).astype(np.int8) - np.int8(32)
    return QuantizedRows(K6, q.reshape(rows, -1), scales.reshape(rows, -1), None, _half(blocks, 208))


@dataclass
class GGUFMatrix:
    """A file's quantized matrix not yet read: its type, its raw blocks (rows, bytes a row; a view of the mapped
    file), and the order its rows take (None: as stored). Read one at a time when packed, so that a load never
    holds more than one matrix's numbers beside the packed bytes."""

    kind: str
    raw: np.ndarray
    order: np.ndarray | None = None
    name: str = ""

    @property
    def fmt(self) -> int:
        return FORMATS[self.kind]

    @property
    def shape(self) -> tuple[int, int]:
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        per_block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType[self.kind]]
        return self.raw.shape[0], self.raw.shape[1] // block_bytes * per_block

    def rows(self) -> QuantizedRows:
        """The kernels' numbers; ValueError (naming the tensor) where a scale is not finite."""
        try:
            rows = read_rows(self.kind, self.raw)
        except ValueError as exc:
            raise ValueError(f"{self.name}: {exc}") from None
        return rows if self.order is None else rows.take(self.order)


# the kernels' format of each GGUF type the readers take
FORMATS = {"Q4_0": Q40, "Q4_1": Q4, "Q8_0": Q8, "Q4_K": K4, "Q5_K": K5, "Q6_K": K6}

READERS = {
    "Q4_0": read_q4_0,
    "Q4_1": read_q4_1,
    "Q8_0": read_q8_0,
    "Q4_K": read_q4_k,
    "Q5_K": read_q5_k,
    "Q6_K": read_q6_k,
}


def read_rows(type_name: str, raw: np.ndarray) -> QuantizedRows:
    """A tensor's raw blocks (rows, bytes a row) of GGUF type `type_name` (a READERS key) as kernel numbers;
    ValueError where a scale is not finite (the kernels' bounds and products assume finite weights)."""
    rows = READERS[type_name](raw)
    rows.kind = type_name
    for name in ("first", "second", "super_d", "super_m"):
        value = getattr(rows, name)
        if value is not None and value.dtype == np.float16 and not np.isfinite(value).all():
            raise ValueError(f"a {type_name} tensor holds scales that are not finite")
    return rows
