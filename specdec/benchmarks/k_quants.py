"""Quantizers for llama.cpp's K-quant formats Q4_K, Q5_K and Q6_K, which the gguf package cannot write: float32
(rows, K) weights -> raw blocks (uint8, rows x blocks x block bytes). The layouts are llama.cpp's, byte for byte,
but the scales come from each block's min/max, without llama.cpp's search for the scales of least error, so their
error is somewhat larger than llama-quantize's (speed is the same). gguf_file.py writes files with them.
"""

from __future__ import annotations

import numpy as np

QK_K = 256  # weights in a K-quant super-block
CHUNK = 1 << 22  # weights quantized at a time: bounds the float32 temporaries to tens of megabytes


def _f16_bytes(x: np.ndarray) -> np.ndarray:
    """(n,) float -> (n, 2) uint8: the little-endian float16 bytes a block header holds."""
    return x.astype(np.float16).reshape(-1, 1).view(np.uint8)


def _inverse(x: np.ndarray) -> np.ndarray:
    """1 / x, and 0 where x is 0 (a block of zeros quantizes to zeros, not NaN)."""
    return np.divide(1.0, x, out=np.zeros_like(x), where=x != 0)


def _q4_k_blocks(x: np.ndarray) -> np.ndarray:
    """(n, 256) float32 -> (n, 144) uint8 Q4_K blocks: fp16 d, fp16 dmin, 12 bytes of 6-bit scales and mins, 128
    bytes of nibbles. A weight is d * sc[j] * u - dmin * m[j], u in 0..15, j its sub-block of 32."""
    return _k_min_blocks(x, 15)


def _q5_k_blocks(x: np.ndarray) -> np.ndarray:
    """(n, 256) float32 -> (n, 176) uint8 Q5_K blocks: as Q4_K's with u in 0..31, whose fifth bits are the 32 bytes
    qh before the nibbles: qh byte l, bit j holds weight l of sub-block j."""
    return _k_min_blocks(x, 31)


def _k_min_blocks(x: np.ndarray, top: int) -> np.ndarray:
    """Q4_K (top 15) or Q5_K (top 31) blocks of (n, 256) float32 weights."""
    n = x.shape[0]
    x = x.reshape(n, 8, 32)
    lo = np.minimum(x.min(-1), 0)  # the offset dmin * m is subtracted, so a sub-block's floor is never above 0
    hi = x.max(-1)
    # the super-block scales: the largest sub-block scale (hi - lo) / 15 and the largest min -lo map to 63
    d = _f16_bytes((hi - lo).max(-1) / (top * 63)).view(np.float16)
    dmin = _f16_bytes(-lo.min(-1) / 63).view(np.float16)
    df, dminf = d.astype(np.float32), dmin.astype(np.float32)  # (n, 1): the values the file will hold
    m = np.rint(-lo * _inverse(dminf)).clip(0, 63)
    off = dminf * m
    # the scale is fitted to the rounded offset, so that the sub-block's max still maps to 15
    sc = np.rint((hi + off) * _inverse(top * df)).clip(0, 63)
    u = np.rint((x + off[..., None]) * _inverse(df * sc)[..., None]).clip(0, top).astype(np.uint8)
    sc, m = sc.astype(np.uint8), m.astype(np.uint8)
    # llama.cpp's get_scale_min_k4: bytes 0-3 hold sc[0..3] and the top 2 bits of sc[4..7], bytes 4-7 the same
    # for the mins, bytes 8-11 the low 4 bits of sc[4..7] (low nibble) and of m[4..7] (high nibble)
    scales = np.concatenate(
        [sc[:, :4] | (sc[:, 4:] >> 4) << 6, m[:, :4] | (m[:, 4:] >> 4) << 6, (sc[:, 4:] & 15) | (m[:, 4:] & 15) << 4],
        axis=1,
    )
    low = u & 15
    qs = (low[:, 0::2] | low[:, 1::2] << 4).reshape(n, 128)  # chunk c of 32 bytes: sub-block 2c low, 2c+1 high
    if top == 15:
        return np.concatenate([d.view(np.uint8), dmin.view(np.uint8), scales, qs], axis=1)
    qh = ((u >> 4) << np.arange(8, dtype=np.uint8)[:, None]).sum(1, dtype=np.uint8)  # (n, 32)
    return np.concatenate([d.view(np.uint8), dmin.view(np.uint8), scales, qh, qs], axis=1)


def _q6_k_blocks(x: np.ndarray) -> np.ndarray:
    """(n, 256) float32 -> (n, 210) uint8 Q6_K blocks: ql[128] (low 4 bits), qh[64] (high 2 bits), int8
    scales[16], fp16 d. A weight is d * sc[j] * (q - 32), q in 0..63, j its sub-block of 16."""
    n = x.shape[0]
    x = x.reshape(n, 16, 16)
    amax = np.take_along_axis(x, np.abs(x).argmax(-1)[..., None], -1)[..., 0]
    # as ggml does, the largest weight maps to -32, the end of -32..31 that has room, whatever its sign
    scale = amax / -32
    d = _f16_bytes(np.abs(scale).max(-1) / 127).view(np.float16)
    sc = np.rint(scale * _inverse(d.astype(np.float32))).clip(-128, 127)
    step = d.astype(np.float32) * sc
    q = (np.rint(x * _inverse(step)[..., None]).clip(-32, 31) + 32).astype(np.uint8).reshape(n, 2, 4, 32)
    # each half of 128 weights: ql byte l holds weights l (low nibble) and l + 64 (high); byte l + 32 holds
    # weights l + 32 and l + 96; qh byte l holds the top 2 bits of weights l, l + 32, l + 64, l + 96
    ql = ((q[:, :, :2] & 15) | (q[:, :, 2:] & 15) << 4).reshape(n, 128)
    top = q >> 4
    qh = (top[:, :, 0] | top[:, :, 1] << 2 | top[:, :, 2] << 4 | top[:, :, 3] << 6).reshape(n, 64)
    return np.concatenate([ql, qh, sc.astype(np.int8).view(np.uint8), d.view(np.uint8)], axis=1)


def _by_chunks(w: np.ndarray, blocks, block_bytes: int) -> np.ndarray:
    """Rows of `w` (rows, K) quantized by `blocks` a few thousand super-blocks at a time."""
    rows, k = w.shape
    if k % QK_K:
        raise ValueError(f"K-quants need rows of a multiple of {QK_K} weights, not {k}")
    out = np.empty((rows, k // QK_K * block_bytes), np.uint8)
    step = max(1, CHUNK // k)
    for r in range(0, rows, step):
        part = np.asarray(w[r : r + step], dtype=np.float32).reshape(-1, QK_K)
        out[r : r + step] = blocks(part).reshape(-1, out.shape[1])
    return out


def quantize_q4_k(w: np.ndarray) -> np.ndarray:
    """float (rows, K), K a multiple of 256 -> uint8 (rows, K / 256 * 144): llama.cpp's Q4_K blocks."""
    return _by_chunks(w, _q4_k_blocks, 144)


def quantize_q5_k(w: np.ndarray) -> np.ndarray:
    """float (rows, K), K a multiple of 256 -> uint8 (rows, K / 256 * 176): llama.cpp's Q5_K blocks."""
    return _by_chunks(w, _q5_k_blocks, 176)


def quantize_q6_k(w: np.ndarray) -> np.ndarray:
    """float (rows, K), K a multiple of 256 -> uint8 (rows, K / 256 * 210): llama.cpp's Q6_K blocks."""
    return _by_chunks(w, _q6_k_blocks, 210)
