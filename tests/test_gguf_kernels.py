"""The kernels' quantized formats hold a GGUF file's weights exactly, and multiply them as documented.

For each GGUF type the kernels keep (models/gguf_blocks.py): random blocks of that type, read and packed, give back
exactly the values the gguf package dequantizes them to; the kernels' products equal a slow reference of the same
arithmetic (activations rounded to int8 per group of 32, integer sums per group, float32 scales); and every row's
outputs are the same whatever rows share the pass (batch invariance, which makes speculation lossless)."""
import numpy as np
import pytest
import torch

from specdec.models.gguf_blocks import K4, K5, K6, Q4, Q40, READERS, read_rows
from specdec.models.quantized_args import pack_rows

kernels = pytest.importorskip("specdec.kernels")
if kernels.unavailable_reason():
    pytest.skip(kernels.unavailable_reason(), allow_module_level=True)

# bytes of a block, the offsets of its float16 fields, weights per block
BLOCKS = {"Q4_0": (18, (0,), 32), "Q4_1": (20, (0, 2), 32), "Q8_0": (34, (0,), 32), "Q4_K": (144, (0, 2), 256),
          "Q5_K": (176, (0, 2), 256), "Q6_K": (210, (208,), 256)}


def random_blocks(kind: str, rows: int, k: int, seed: int = 0) -> np.ndarray:
    """Random valid blocks of `kind` for a (rows, k) weight: random bytes, with finite float16 scales of varied
    magnitudes (and signs, where the format allows any)."""
    size, halves, per_block = BLOCKS[kind]
    gen = np.random.default_rng(seed)
    raw = gen.integers(0, 256, size=(rows, k // per_block, size), dtype=np.uint8)
    for at in halves:
        scale = (gen.uniform(0.5, 2.0, size=raw.shape[:2]) * 2.0 ** gen.integers(-12, -4, size=raw.shape[:2]))
        raw[..., at:at + 2] = scale.astype(np.float16).view(np.uint8).reshape(*raw.shape[:2], 2)
    return raw.reshape(rows, -1)


def dequantized(kind: str, raw: np.ndarray) -> np.ndarray:
    from gguf import GGMLQuantizationType, dequantize

    return dequantize(raw, GGMLQuantizationType[kind])


@pytest.fixture(scope="module")
def module():
    return kernels.load()


@pytest.mark.parametrize("kind", list(READERS))
@pytest.mark.parametrize("rows", [1, 64, 70])
def test_packed_blocks_hold_exactly_the_values_the_gguf_package_reads(module, kind, rows):
    k = 512
    raw = random_blocks(kind, rows, k, seed=rows)
    quantized = read_rows(kind, raw)
    packed = pack_rows(module, quantized)
    got = module.packed_rows(packed, quantized.fmt, rows, k)
    torch.testing.assert_close(got, torch.from_numpy(dequantized(kind, raw)), rtol=0, atol=0)


def _int8_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The kernels' activations (quantize_rows): per group of 32, q = round(x * 127 / max|x|), the scale
    max|x| / 127 and the exact float32 sum of x. (M, K) -> q (M, G, 32), scale (M, G), sum (M, G)."""
    groups = x.reshape(x.shape[0], -1, 32).astype(np.float32)
    amax = np.abs(groups).max(-1)
    inv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    q = np.rint(groups * inv[..., None]).astype(np.int64)
    sums = np.zeros(amax.shape, np.float32)
    for i in range(32):  # float32, in k order, as the kernel sums
        sums = (sums + groups[..., i]).astype(np.float32)
    return q, (amax / np.float32(127)).astype(np.float32), sums


def reference_product(kind: str, raw: np.ndarray, x: np.ndarray) -> np.ndarray:
    """x (M, K) @ W^T in the kernels' arithmetic, for W the GGUF blocks `raw` (N, bytes): integer sums of the stored
    integers times int8 activations per group (per half for K6, scaled by each half's sc), times d and the
    activations' scale, plus m times the activations' sum where the format has a minimum; in float64 (the kernels'
    float32 steps differ from it by rounding only)."""
    w = read_rows(kind, raw)
    q, scale, sums = _int8_rows(x)
    codes = w.codes.astype(np.int64).reshape(w.shape[0], -1, 32)  # (N, G, 32)
    if w.fmt == K6:
        sc = w.first.astype(np.int64).reshape(w.shape[0], -1, 2)  # (N, G, halves)
        halves = np.einsum("mghk,nghk->mngh", q.reshape(*q.shape[:2], 2, 16), codes.reshape(*codes.shape[:2], 2, 16))
        isum = (halves * sc[None]).sum(-1)
        d = np.repeat(w.super_d.astype(np.float64), 8, axis=1)
        return (isum * d[None] * scale[:, None]).sum(-1)
    isum = np.einsum("mgk,ngk->mng", q, codes)
    if w.fmt in (K4, K5):
        d = np.repeat(w.super_d.astype(np.float64), 8, axis=1) * w.first
        m = np.repeat(w.super_m.astype(np.float64), 8, axis=1) * w.second
    else:
        d = w.first.astype(np.float64)
        if w.fmt == Q4:
            m = w.second.astype(np.float64)
        elif w.fmt == Q40:  # Q4_0: d * (u - 8)
            m = -8 * d
        else:
            m = np.zeros_like(d)
    return (isum * d[None] * scale[:, None]).sum(-1) + (m[None] * sums[:, None]).sum(-1)


@pytest.mark.parametrize("kind", list(READERS))
def test_products_are_the_documented_arithmetic(module, kind):
    n, k = 96, 512
    raw = random_blocks(kind, n, k, seed=7)
    x = np.random.default_rng(1).standard_normal((5, k)).astype(np.float32)
    quantized = read_rows(kind, raw)
    got = module.packed_matmul(torch.from_numpy(x), pack_rows(module, quantized), quantized.fmt, n, k).numpy()
    want = reference_product(kind, raw, x)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * np.abs(want).max())
    # and they approximate the float product of the file's weights (activations rounded to int8 cost ~1%)
    exact = x.astype(np.float64) @ dequantized(kind, raw).astype(np.float64).T
    assert np.abs(got - exact).max() < 0.05 * np.abs(exact).max()


@pytest.mark.parametrize("kind", list(READERS))
def test_outputs_do_not_depend_on_how_the_threads_share_the_blocks(module, kind):
    """A matrix of many blocks is shared among the threads by whole blocks of 64 rows, one of few blocks by halves
    (linear_quantized), which AVX-512 builds run as whole blocks where a thread holds both halves: the first three
    or four blocks' outputs are the same bits either way, for one row and for several (three blocks on two threads
    leave the middle one to both, half each)."""
    blocks, k = 41, 256
    quantized = read_rows(kind, random_blocks(kind, 64 * blocks, k, seed=5))
    packed = pack_rows(module, quantized)
    for rows in (1, 3, 6):
        x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows))
        many = module.packed_matmul(x, packed, quantized.fmt, 64 * blocks, k)
        for few_blocks in (3, 4):
            first = packed[: packed.numel() // blocks * few_blocks]
            few = module.packed_matmul(x, first, quantized.fmt, 64 * few_blocks, k)
            assert torch.equal(few, many[:, : 64 * few_blocks])


@pytest.mark.parametrize("kind", list(READERS))
def test_a_rows_outputs_do_not_depend_on_the_other_rows_of_the_pass(module, kind):
    n, k = 130, 256
    quantized = read_rows(kind, random_blocks(kind, n, k, seed=3))
    packed = pack_rows(module, quantized)
    x = torch.randn(9, k, generator=torch.Generator().manual_seed(2))
    whole = module.packed_matmul(x, packed, quantized.fmt, n, k)
    for m in range(9):
        alone = module.packed_matmul(x[m:m + 1], packed, quantized.fmt, n, k)
        assert torch.equal(alone[0], whole[m])
    for start, size in ((1, 2), (0, 3), (0, 4), (3, 5), (0, 6), (2, 7)):
        part = module.packed_matmul(x[start:start + size], packed, quantized.fmt, n, k)
        assert torch.equal(part, whole[start:start + size])


# the packed bytes over the file's, for whole blocks of 64 rows: the file's own size, but for K-quants' 6-bit scales
# and mins, which the kernels keep a byte each (8 + 8 bytes a super-block instead of 12)
PACKED_OVER_FILE = {"Q4_0": 1.0, "Q4_1": 1.0, "Q8_0": 1.0, "Q4_K": 148 / 144, "Q5_K": 180 / 176, "Q6_K": 1.0}


@pytest.mark.parametrize("kind", list(READERS))
def test_the_packed_weight_takes_the_files_bytes(module, kind):
    """A step reads the file's bytes: Q4_0's minimum is computed, not stored, and Q6_K's codes keep their 6 bits."""
    raw = random_blocks(kind, 128, 512)
    assert pack_rows(module, read_rows(kind, raw)).numel() == raw.nbytes * PACKED_OVER_FILE[kind]


def test_q8_0_keeps_minus_128():
    """llama.cpp's Q8_0 allows q = -128; the kernels' signed products must not overflow on it."""
    module = kernels.load()
    raw = random_blocks("Q8_0", 64, 64, seed=5).reshape(64, 2, 34)
    raw[:, :, 2:] = np.array(-128, dtype=np.int8).view(np.uint8)
    raw = raw.reshape(64, -1)
    x = np.random.default_rng(3).standard_normal((2, 64)).astype(np.float32)
    quantized = read_rows("Q8_0", raw)
    got = module.packed_matmul(torch.from_numpy(x), pack_rows(module, quantized), quantized.fmt, 64, 64).numpy()
    np.testing.assert_allclose(got, reference_product("Q8_0", raw, x), rtol=2e-5, atol=1e-6)


def test_a_scale_that_is_not_finite_is_refused():
    raw = random_blocks("Q4_1", 4, 64)
    raw[0, 0:2] = np.array([np.inf], dtype=np.float16).view(np.uint8)
    with pytest.raises(ValueError, match="not finite"):
        read_rows("Q4_1", raw)


def test_k4_scales_and_mins_unpack_as_llama_cpp_packs_them():
    """Every 6-bit scale and min of a Q4_K super-block, written as llama.cpp packs them, reads back."""
    from specdec.models.gguf_blocks import _k4_scales

    sc = np.arange(8, dtype=np.uint8) * 7 % 64
    mn = (np.arange(8, dtype=np.uint8) * 11 + 3) % 64
    packed = np.zeros(12, dtype=np.uint8)
    for j in range(8):  # llama.cpp's quantize_row_q4_K_ref
        if j < 4:
            packed[j], packed[j + 4] = sc[j], mn[j]
        else:
            packed[j + 4] = (sc[j] & 0xF) | ((mn[j] & 0xF) << 4)
            packed[j - 4] |= (sc[j] >> 4) << 6
            packed[j] |= (mn[j] >> 4) << 6
    got_sc, got_mn = _k4_scales(packed)
    assert got_sc.tolist() == sc.tolist() and got_mn.tolist() == mn.tolist()
    assert K4 != Q4


@pytest.mark.parametrize("code_byte", [0x00, 0xFF])  # every code q = -32, or every code q = 31
def test_q6_k_at_its_extremes_is_exact_in_every_tile(module, code_byte):
    """Q6_K's extreme codes times the largest activations: the several-row tile's 16-bit sums of the unsigned codes
    wrap (8 × 63 × 127 > 2^15) before the offset brings them back; the outputs still equal the reference's and the
    one-row tile's."""
    n, k = 64, 512
    raw = random_blocks("Q6_K", n, k).reshape(n, -1, 210)
    raw[..., :192] = code_byte  # ql and qh: all low and high bits set, or none
    raw = raw.reshape(n, -1)
    x = np.ones((4, k), dtype=np.float32)
    x[1] *= -1.0
    x[3, ::2] = -1.0
    quantized = read_rows("Q6_K", raw)
    packed = pack_rows(module, quantized)
    together = module.packed_matmul(torch.from_numpy(x), packed, quantized.fmt, n, k)
    for m in range(4):
        alone = module.packed_matmul(torch.from_numpy(x[m:m + 1]), packed, quantized.fmt, n, k)
        assert torch.equal(together[m:m + 1], alone)
    want = reference_product("Q6_K", raw, x)
    np.testing.assert_allclose(together.numpy(), want, rtol=2e-5, atol=2e-5 * np.abs(want).max())
