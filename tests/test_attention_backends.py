import itertools
import math
import re

import pytest
import torch

from h3_core.config import get_config
from h3_core.model import H3DiT, attention
from h3_core.model.attention import BACKENDS, Documents, get_attention_backend, installed_version, unavailable_reason

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")

CPU = torch.device("cpu")
# A one-row document, one filling the 64-row block [64, 128) exactly, and ordinary ones.
BOUNDS = [0, 1, 64, 128, 192, 250]
CPU_BACKENDS = ["sdpa", "auto", "flex"]


def documents(bounds: list[int]) -> Documents:
    return Documents(torch.tensor(bounds, dtype=torch.int32), bounds[-1], CPU)


def strided_qkv(rows=250, seed=0):
    """q, k, v as strided views of one fused projection [rows, 3, heads, head_dim] (docs/failure_classes.md §C13)."""
    fused = torch.randn(rows, 3, 4, 16, generator=torch.Generator().manual_seed(seed))
    return fused.unbind(1)


def reference_attention(q, k, v, bounds):
    """float64 softmax(q k^T / sqrt(d)) v per document (docs/model.md §2.6)."""
    out = torch.empty(q.shape, dtype=torch.float64)
    for s, e in itertools.pairwise(bounds):
        qd, kd, vd = (t[s:e].double().transpose(0, 1) for t in (q, k, v))
        w = torch.softmax(qd @ kd.transpose(1, 2) / math.sqrt(q.shape[-1]), dim=-1)
        out[s:e] = (w @ vd).transpose(0, 1)
    return out


def test_backends_that_run_on_the_cpu():
    assert [n for n in BACKENDS if unavailable_reason(n, CPU, torch.float32) is None] == CPU_BACKENDS
    assert [n for n in BACKENDS if unavailable_reason(n, CPU, torch.bfloat16) is None] == CPU_BACKENDS


@pytest.mark.parametrize("name", CPU_BACKENDS)
def test_cpu_backend_matches_float64_reference_per_document(name):
    q, k, v = strided_qkv()
    assert not q.is_contiguous()
    docs = documents(BOUNDS)
    out = get_attention_backend(name, CPU, torch.float32)(q, k, v, docs)
    assert out.shape == (250, 4, 16) and out.dtype == torch.float32
    assert (out.double() - reference_attention(q, k, v, BOUNDS)).abs().max().item() < 1e-5
    assert torch.equal(out[0], v[0])  # a one-row document attends only to itself
    contiguous = BACKENDS[name](q.contiguous(), k.contiguous(), v.contiguous(), docs)
    assert torch.equal(contiguous, out)


def solo_vs_packed_max_diff(fn):
    """Largest |solo - packed| over the documents of BOUNDS."""
    q, k, v = strided_qkv()
    packed = fn(q, k, v, documents(BOUNDS))
    diffs = []
    for s, e in itertools.pairwise(BOUNDS):
        solo = fn(q[s:e].clone(), k[s:e].clone(), v[s:e].clone(), documents([0, e - s]))
        diffs.append((solo - packed[s:e]).abs().max().item())
    return max(diffs)


@pytest.mark.parametrize("name", ["sdpa", "auto"])
def test_cpu_backend_solo_equals_packed_bitwise(name):
    assert solo_vs_packed_max_diff(BACKENDS[name]) == 0.0


# Eager flex on the CPU: solo vs packed differ by up to about 6e-8 in float32, as its softmax runs
# over whole pack rows (flex_documents' docstring, docs/gpu_backends.md); on some CPUs it is bitwise.
EAGER_FLEX_SOLO_VS_PACKED_BOUND = 1e-6


def test_eager_flex_solo_vs_packed_within_rounding():
    assert solo_vs_packed_max_diff(BACKENDS["flex"]) <= EAGER_FLEX_SOLO_VS_PACKED_BOUND


def test_a_cross_document_leak_exceeds_the_eager_flex_bound():
    """The bound above catches a backend that attends across documents: one SDPA over the whole pack."""

    def whole_pack(q, k, v, docs):
        return torch.nn.functional.scaled_dot_product_attention(*(t.transpose(0, 1) for t in (q, k, v))).transpose(0, 1)

    assert solo_vs_packed_max_diff(whole_pack) > EAGER_FLEX_SOLO_VS_PACKED_BOUND


def test_auto_gathers_short_and_long_documents_into_one_call_each(monkeypatch):
    # On the CPU varlen and flash_attn4 cannot run, so stand them in by per-document SDPA to
    # check the routes and gathers (long documents from 256 rows here instead of 8,192).
    calls = []

    def recording(name):
        def fake(q, k, v, docs):
            calls.append((name, docs.bounds, docs.max_seqlen, q.is_contiguous()))
            return attention.sdpa_per_document(q, k, v, docs)

        return fake

    monkeypatch.setitem(attention.BACKENDS, "varlen", recording("varlen"))
    monkeypatch.setitem(attention.BACKENDS, "flash_attn4", recording("flash_attn4"))
    monkeypatch.setattr(attention, "unavailable_reason", lambda name, device, dtype: None)
    monkeypatch.setattr(attention, "AUTO_FLASH_ATTN4_MIN_ROWS", 256)
    bounds = [0, 1, 64, 320, 448, 512, 812]  # lengths 1, 63, 256, 128, 64, 300
    q, k, v = strided_qkv(rows=812)
    docs = documents(bounds)
    out = attention.auto(q, k, v, docs)
    assert calls == [
        ("varlen", (0, 1, 64, 192, 256), 128, True),  # every document of <= 128 rows
        ("flash_attn4", (0, 256, 556), 300, True),  # every document of >= 256 rows
    ]
    short_rows, _ = docs.gathered(((0, 1), (1, 64), (320, 448), (448, 512)))
    assert torch.equal(short_rows, torch.cat([torch.arange(0, 64), torch.arange(320, 512)]))
    assert torch.equal(out, attention.sdpa_per_document(q, k, v, docs))
    out_again = attention.auto(q, k, v, docs)  # the gathers are built once per Documents
    assert calls[2:] == calls[:2] and torch.equal(out_again, out)
    assert attention.auto_route(300, CPU, torch.float32) == "flash_attn4"


def test_auto_runs_sdpa_where_varlen_cannot():
    q, k, v = strided_qkv()
    docs = documents(BOUNDS)
    assert torch.equal(BACKENDS["auto"](q, k, v, docs), BACKENDS["sdpa"](q, k, v, docs))


@pytest.mark.parametrize(
    "name, device, dtype, reason",
    [
        ("varlen", "cpu", torch.bfloat16, "it needs a CUDA device, not cpu"),
        ("varlen", "cuda", torch.float32, "it needs bfloat16 or float16, not torch.float32"),
    ],
)
def test_unavailable_backend_raises_why(name, device, dtype, reason):
    with pytest.raises(RuntimeError, match=f"^{re.escape(f'attention backend {name!r} is unavailable: {reason}')}$"):
        get_attention_backend(name, device, dtype)


@pytest.mark.skipif(installed_version("flash_attn") is not None, reason="flash_attn is installed here")
def test_flash_attn_without_its_package_raises():
    with pytest.raises(
        RuntimeError,
        match="^attention backend 'flash_attn' is unavailable: the flash_attn 2.x package is not installed$",
    ):
        get_attention_backend("flash_attn", "cuda", torch.bfloat16)


@pytest.mark.skipif(installed_version("flash-attn-4") is not None, reason="flash-attn-4 is installed here")
def test_flash_attn4_without_its_package_raises():
    with pytest.raises(
        RuntimeError,
        match="^attention backend 'flash_attn4' is unavailable: the flash-attn-4 package is not installed$",
    ):
        get_attention_backend("flash_attn4", "cuda", torch.bfloat16)


def test_unknown_backend_and_dit_construction_errors():
    with pytest.raises(
        ValueError,
        match=re.escape(
            "attention backend 'flash' is unknown; available: "
            "['auto', 'flash_attn', 'flash_attn4', 'flex', 'sdpa', 'varlen']"
        ),
    ):
        get_attention_backend("flash", CPU, torch.float32)
    with pytest.raises(
        RuntimeError, match="^attention backend 'varlen' is unavailable: it needs a CUDA device, not cpu$"
    ):
        H3DiT(get_config("tiny"), attention_backend="varlen")
