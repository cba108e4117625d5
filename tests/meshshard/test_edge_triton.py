"""The fused edge MLP kernel (``meshshard/nn/_edge_triton.py``), run by Triton's interpreter on the CPU.

On a GPU the processor's edge MLP runs as one Triton kernel. CI has no GPU, so these tests run the
same kernel under ``TRITON_INTERPRET=1`` (NumPy executes it block by block, with the same masks and
gathers) in a fresh interpreter, and compare it with the unfused path: values and every gradient
of a processor step's edge half, and of a whole MeshGraphNet, in float32 against the float64
result, with the activations recomputed and saved; and which inputs it refuses (falling back).
``bench/edge_mlp.py --device cuda`` runs the same comparison on a GPU and times both.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                reason="triton is not installed (pip install triton; it is in the test extra)")


def _interpreted(check: str) -> None:
    """Run ``check`` (a function of this module) in a fresh interpreter with TRITON_INTERPRET=1."""
    env = os.environ | {"TRITON_INTERPRET": "1", "MESHSHARD_TRITON": "ieee"}
    code = f"from tests.meshshard.test_edge_triton import {check}; {check}()"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "checked" in done.stdout, done.stdout


def test_the_fused_edge_step_equals_the_unfused_one_values_and_every_gradient() -> None:
    _interpreted("_check_edge_step")


def test_a_meshgraphnet_with_the_fused_edge_mlps_equals_the_unfused_one() -> None:
    _interpreted("_check_model")


def test_inputs_the_kernel_does_not_cover_take_the_unfused_path() -> None:
    _interpreted("_check_refusals")


# ----------------------------------------------------------------------------- run in the subprocess


def _inputs(width: int, num_edges: int, num_nodes: int, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)

    e, src_proj, dst_proj = rand(num_edges, width), rand(num_nodes, width), rand(num_nodes, width)
    dst = torch.sort(torch.randint(0, num_nodes, (num_edges,), generator=g)).values
    src = torch.randint(0, num_nodes, (num_edges,), generator=g)
    scale = width ** -0.5
    params = [rand(width, width) * scale, None, rand(width, width) * scale, rand(width), rand(width, width) * scale,
              rand(width), 1 + 0.1 * rand(width), 0.1 * rand(width)]
    return e, src_proj, dst_proj, src, dst, params


def _edge_step_run(inputs, recompute: bool, fused: bool):
    from meshshard._graph import segment_lengths
    from meshshard.nn._edge_mlp import Scratch, edge_step

    os.environ["MESHSHARD_TRITON"] = "ieee" if fused else "0"
    e, src_proj, dst_proj, src, dst, params = (
        [None if p is None else p.clone().requires_grad_() for p in x] if isinstance(x, list)
        else (x.clone().requires_grad_() if x.is_floating_point() else x) for x in inputs)
    num_dst = dst_proj.shape[0]
    e_next, aggregate = edge_step(e, src_proj, dst_proj, src, dst, num_dst, e.dtype, params, 1e-5, recompute,
                                  segment_lengths(dst, num_dst), Scratch())
    g = torch.Generator().manual_seed(7)
    w_next = torch.randn(e_next.shape, generator=g, dtype=torch.float64).to(e.dtype)
    w_agg = torch.randn(aggregate.shape, generator=g, dtype=torch.float64).to(e.dtype)
    ((e_next * w_next).sum() + (aggregate * w_agg).sum()).backward()
    grads = {"e": e.grad, "src_proj": src_proj.grad, "dst_proj": dst_proj.grad}
    grads |= {f"param {i}": p.grad for i, p in enumerate(params) if p is not None}
    return {"e_next": e_next.detach(), "aggregate": aggregate.detach(), **grads}


def _count_kernel_runs():
    from meshshard.nn import _edge_triton

    calls = []
    real = _edge_triton.run

    def counted(*args, **kwargs):
        calls.append(args[7])  # norm: True in a forward, False in the backward's recomputation
        return real(*args, **kwargs)

    _edge_triton.run = counted
    return calls


def _check_edge_step() -> None:
    from tests._tolerance import assert_close

    calls = _count_kernel_runs()
    for width, num_edges in ((16, 77), (32, 200)):  # 77, 200: blocks of 32 with a ragged end
        inputs = _inputs(width, num_edges, 23, torch.float32)
        truth = _edge_step_run([x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else
                                ([None if p is None else p.double() for p in x] if isinstance(x, list) else x)
                                for x in inputs], True, fused=False)
        results = {}
        for recompute in (True, False):
            del calls[:]
            results[recompute] = fused = _edge_step_run(inputs, recompute, fused=True)
            assert calls == ([True, False] if recompute else [True]), calls  # the kernel ran, not the fallback
            for name, value in fused.items():
                assert value.dtype == torch.float32, name
                assert_close(value, truth[name], torch.float32, f"width {width}, recompute={recompute}: {name}",
                             cast=True)
        for name in results[True]:  # the recomputed activations are the forward's, bit for bit
            assert torch.equal(results[True][name], results[False][name]), name
        del calls[:]
        unfused = _edge_step_run(inputs, True, fused=False)
        assert calls == []
        assert any(not torch.equal(unfused[n], results[True][n]) for n in unfused)  # another order of sums
    print("checked")


def _check_model() -> None:
    from meshshard import edge_features
    from meshshard.nn import MeshGraphNet
    from tests._tolerance import assert_normwise_close

    calls = _count_kernel_runs()
    g = torch.Generator().manual_seed(1)
    pos = torch.rand(60, 2, generator=g, dtype=torch.float64)
    edge_index = torch.cat([torch.randint(0, 60, (1, 400), generator=g), torch.arange(60).repeat(7)[None, :400]])
    edge_index = edge_index[:, torch.argsort(edge_index[1], stable=True)]
    x = torch.randn(60, 3, generator=g, dtype=torch.float64)
    w = torch.randn(60, 2, generator=g, dtype=torch.float64)
    ea = edge_features(pos, edge_index)
    torch.manual_seed(0)
    model = MeshGraphNet(3, ea.shape[1], 2, latent_size=16, hidden_layers=2, message_passing_steps=3).double()

    def run(dtype: torch.dtype, fused: bool):
        os.environ["MESHSHARD_TRITON"] = "ieee" if fused else "0"
        m = MeshGraphNet(3, ea.shape[1], 2, latent_size=16, hidden_layers=2, message_passing_steps=3).to(dtype)
        m.load_state_dict(model.state_dict())
        xx, eaa = x.detach().to(dtype, copy=True).requires_grad_(), ea.detach().to(dtype, copy=True).requires_grad_()
        y = m(xx, edge_index, eaa)
        (y * w.to(dtype)).sum().backward()
        return {"output": y.detach(), "x": xx.grad, "edge features": eaa.grad,
                **{n: p.grad for n, p in m.named_parameters()}}

    truth = run(torch.float64, False)
    plain = run(torch.float32, False)
    del calls[:]
    fused = run(torch.float32, True)
    assert calls.count(True) == 3 and calls.count(False) == 3, calls  # each processor step, forward and backward
    for name in truth:
        assert_normwise_close(fused[name], plain[name], name, truth=truth[name])
    print("checked")


def _check_refusals() -> None:
    from meshshard.nn import _edge_triton

    e, src_proj, dst_proj, _, _, params = _inputs(16, 10, 5, torch.float32)
    assert _edge_triton.applies(e, src_proj, dst_proj, params, None)
    refused = {
        "float64": (e.double(), src_proj.double(), dst_proj.double(),
                    [None if p is None else p.double() for p in params], None),
        "under autocast": (e, src_proj, dst_proj, params, torch.bfloat16),
        "the edge encoder (no node products)": (e, None, None, params, None),
        "three layers after the first": (e, src_proj, dst_proj, params[:2] + params[2:4] * 2 + params[4:], None),
        "a width of 24": (*_inputs(24, 10, 5, torch.float32)[:3], _inputs(24, 10, 5, torch.float32)[5], None),
        "a transposed weight": (e, src_proj, dst_proj, [params[0].t().contiguous().t(), *params[1:]], None),
    }
    for what, args in refused.items():
        assert not _edge_triton.applies(*args), what
    os.environ["MESHSHARD_TRITON"] = "0"
    assert not _edge_triton.applies(e, src_proj, dst_proj, params, None), "MESHSHARD_TRITON=0"
    os.environ["MESHSHARD_TRITON"] = "auto"  # the default: only where float32 products may use TF32
    assert not _edge_triton.applies(e, src_proj, dst_proj, params, None), "exact float32"
    torch.set_float32_matmul_precision("high")
    assert _edge_triton.applies(e, src_proj, dst_proj, params, None) and _edge_triton.precision() == "tf32"
    torch.set_float32_matmul_precision("highest")
    os.environ["TRITON_INTERPRET"] = "0"
    os.environ["MESHSHARD_TRITON"] = "ieee"
    assert not _edge_triton.applies(e, src_proj, dst_proj, params, None), "a CPU tensor, not interpreting"
    print("checked")
