"""``check_model_exact``: a user's model on R ranks against one process, output and every gradient.

It passes exact models (the example's GATv2 network, GCN + BatchNorm + MeshGraphNet, in float64
and float32, on 1 to 4 ranks with uneven METIS parts of a generated mesh or a mesh file), and
catches two that run on shards without an error but are wrong: a statistic of the rank's own
rows, and a layer declared ``ShardConv(layer, local=True)`` that reads its sources' degrees.
Argument errors are one line, before any rank starts.
"""

from __future__ import annotations

from pathlib import Path

import meshio
import pytest

from meshshard.comm import RankFailed
from meshshard.run import ExactnessReport, check_model_exact
from meshshard.run._exactness import TOLERANCES, small_mesh

pytest.importorskip("torch_geometric")

REPO = Path(__file__).resolve().parents[3]
MODELS = Path(__file__).with_name("_exactness_models.py")
EXAMPLE = f"{REPO / 'examples' / 'own_model' / 'model.py'}:build"


def _names(report: ExactnessReport) -> list[str]:
    return [e.name for e in report.errors]


@pytest.mark.slow  # each check starts its ranks (spawned, each imports torch): 10 s or more on two cores
def test_the_example_model_is_exact_on_three_ranks() -> None:
    report = check_model_exact(EXAMPLE, '{"hidden": 8, "layers": 2, "heads": 2}', ranks=3)
    assert report.passed, report.verdict
    assert len(set(report.owned_per_rank)) > 1 and sum(report.owned_per_rank) == report.num_nodes  # uneven parts
    assert _names(report)[:3] == ["output", "grad of x", "grad of edge_attr"]
    assert "grad of convs.0.layer.att" in _names(report)  # every parameter, by its name in the bare model
    assert report.verdict.startswith("exact on 3 ranks") and report.worst.error <= 1e-10


@pytest.mark.slow
@pytest.mark.parametrize(("ranks", "dtype"), [(1, "float64"), (4, "float32")])
def test_gcn_batchnorm_meshgraphnet_is_exact(ranks: int, dtype: str, tmp_path: Path) -> None:
    data = small_mesh((5, 5, 4))
    mesh = tmp_path / "mesh.vtu"
    meshio.write(mesh, meshio.Mesh(data.pos, data.cells))
    report = check_model_exact(f"{MODELS}:exact", {"hidden": 6}, ranks=ranks, mesh=mesh, dtype=dtype, node_in=2,
                               node_out=3)
    assert report.passed, report.verdict
    assert report.num_nodes == 100 and report.tolerance == TOLERANCES[dtype]
    assert any(e.name.startswith("grad of mgn.processor.1.") for e in report.errors)


@pytest.mark.slow
def test_a_statistic_of_the_local_rows_is_caught() -> None:
    report = check_model_exact(f"{MODELS}:LocallyCentred", ranks=3)
    assert not report.passed
    bad = {e.name for e in report.errors if e.error > 1e-3}
    assert {"output", "grad of x", "grad of lin.weight"} <= bad
    assert report.worst.name in bad and report.verdict.startswith("NOT exact on 3 ranks")
    assert f"{report.worst.name} differs from one process" in report.verdict


@pytest.mark.slow
def test_a_layer_declared_local_by_mistake_is_caught() -> None:
    report = check_model_exact(f"{MODELS}:DeclaredLocal", ranks=3)
    assert not report.passed, report.verdict
    assert {e.name for e in report.errors if e.error > 1e-3} >= {"output", "grad of x", "grad of conv.layer.lin.weight"}


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"model_spec": "no_colon"}, r"Expected --model FILE.py:NAME"),
    ({"model_spec": f"{MODELS}:missing"}, r"defines no 'missing' \(it defines: .*DeclaredLocal"),
    ({"model_spec": f"{MODELS}:not_a_module"}, r"returned a Tensor, not a torch.nn.Module"),
    ({"model_spec": f"{MODELS}:exact", "model_args": "{bad"}, r"Expected --model-args to be a JSON object"),
    ({"model_spec": f"{MODELS}:exact", "model_args": {"width": 3}}, r"exact\(3, 4, 2, width=3\) failed"),
    ({"model_spec": f"{MODELS}:exact", "ranks": 0}, r"Expected --nproc to be 1 or more \(got 0\)"),
    ({"model_spec": f"{MODELS}:exact", "dtype": "float16"}, r"Expected --dtype float64 or float32"),
    ({"model_spec": f"{MODELS}:exact", "ranks": 106}, r"210 nodes .* too small for 106 parts"),
    ({"model_spec": f"{MODELS}:exact", "mesh": "missing.vtu"}, r"--mesh missing.vtu: no such file"),
    ({"model_spec": f"{MODELS}:OneColumnTooMany"}, r"to return a tensor \(210, 2\), .*\(got \(210, 3\)\)"),
    ({"model_spec": f"{MODELS}:Broken"}, r"Broken: its forward on one process \(x \(210, 3\), edge_index \(2, 2154\), "
                                         r"edge_attr \(2154, 4\)\) failed: RuntimeError: mat1 and mat2"),
])
def test_bad_arguments_are_one_line_before_any_rank_starts(kwargs, message, monkeypatch) -> None:
    import meshshard.comm

    def no_ranks(*args, **kw):
        raise AssertionError("a rank was started")

    monkeypatch.setattr(meshshard.comm, "launch_local", no_ranks)
    with pytest.raises(ValueError, match=message) as err:
        check_model_exact(**kwargs)
    assert "\n" not in str(err.value)


@pytest.mark.slow
def test_a_model_that_fails_on_shards_names_the_rank(tmp_path: Path) -> None:
    model = tmp_path / "model.py"
    model.write_text(
        "from torch import nn\n"
        "from meshshard import ShardTensor\n"
        "class Net(nn.Module):\n"
        "    def __init__(self, node_in, edge_in, node_out):\n"
        "        super().__init__()\n"
        "        self.lin = nn.Linear(node_in, node_out)\n"
        "    def forward(self, x, graph, edge_attr):\n"
        "        out = self.lin(x)\n"
        "        return out.to_local() if isinstance(out, ShardTensor) else out\n"
    )
    with pytest.raises(RankFailed, match=r"rank \d+: Expected the model of --model .*Net to return a ShardTensor"):
        check_model_exact(f"{model}:Net", ranks=2)
