"""Your own model in ``meshshard train / predict --model FILE.py:NAME``.

Sharded training of a PyG model (the example's GATv2 network, ``examples/own_model/model.py``)
equals one process training it on the whole mesh, in float64 to 1e-10, on 2 and 3 ranks with
uneven METIS shards; sharded prediction equals one process; the checkpoint never makes predict
import code; every wrong ``--model`` or model output is refused in one line.

Mesh: ../shared/data/sfepy/big.mesh (2-D triangles), or a generated triangle mesh when it is missing.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from dataclasses import asdict
from pathlib import Path

import meshio
import numpy as np
import pytest
import torch

from meshshard.data import open_dataset
from meshshard.run import TrainConfig, load_checkpoint, sample_index, train
from meshshard.run._folder import check_resume
from meshshard.run._recipe import build_user_model, load_factory, normalise_spec, parse_model_args
from meshshard.run._recipe import check_model_output as check_output
from meshshard.tasks import whole_sample
from tests._dist import run_ranks
from tests._ranks import train_rank
from tests._warm import warm_command
from tests.meshshard.run._cases import waves_on_big_mesh

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "examples" / "own_model" / "model.py"
SPEC = f"{EXAMPLE}:build"
ARGS = {"hidden": 8, "layers": 2, "heads": 2}
STEPS = 3


@pytest.fixture(scope="module")
def case(tmp_path_factory) -> dict:
    return waves_on_big_mesh(tmp_path_factory.mktemp("usermodel"), 5, 0, 4.0, 1.0, (1, 2, 3))


def _cfg(case: dict, parts: int, name: str, **changes) -> dict:
    cfg = TrainConfig(partition=str(case["root"] / f"parts{parts}"), data=case["data"], out=str(case["root"] / name),
                      steps=STEPS, lr=1e-2, quiet=True, dtype="float64", model=SPEC, model_args=dict(ARGS),
                      lr_schedule="constant")  # the reference's Adam at one rate; the schedules: test_controls
    return asdict(cfg) | changes


def _reference(case: dict) -> tuple[list[float], dict]:
    """The same model trained by one process on the whole mesh, written out here (not by train)."""
    data = open_dataset(case["data"])
    train_ids = data.train
    samples = {int(s): whole_sample(case["data"], int(s), dtype=torch.float64) for s in train_ids}
    torch.manual_seed(0)
    model = build_user_model(SPEC, ARGS, 2, 3, 1).double()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for step in range(STEPS):
        x, y, ei, ea = samples[int(train_ids[sample_index(0, step, 0, 1, len(train_ids))])]
        loss = ((model(x, ei, ea) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses, model.state_dict()


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [2, 3])
def test_your_own_pyg_model_trains_on_shards_exactly_as_one_process(case: dict, ranks: int) -> None:
    cfg = _cfg(case, ranks, f"run{ranks}")
    losses = run_ranks(train_rank, ranks, cfg, timeout=180)
    ref_losses, ref_state = _reference(case)
    np.testing.assert_allclose(losses[0], ref_losses, rtol=1e-10)
    assert all(other == losses[0] for other in losses)
    ckpt = load_checkpoint(Path(cfg["out"]) / "checkpoint.pt")
    assert ckpt["config"]["model"] == SPEC and ckpt["config"]["model_args"] == ARGS
    assert set(ckpt["model"]) == set(ref_state)  # DomainParallel adds no key: the user's own state_dict
    for name, value in ref_state.items():
        torch.testing.assert_close(ckpt["model"][name], value, rtol=1e-10, atol=1e-12, msg=name)


def _cli(*args: str, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([*warm_command(), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=os.environ | {"MPLBACKEND": "Agg"})


@pytest.mark.slow
def test_the_commands_train_and_predict_your_model_and_sharded_prediction_equals_one_process(case: dict) -> None:
    root = case["root"]
    model = ["--model", SPEC, "--model-args", json.dumps(ARGS)]
    done = _cli("train", "parts2", "--data", "data", "--out", "cli-run", "--nproc", "2", "--steps", "2",
                "--dtype", "float64", *model, cwd=root)
    assert done.returncode == 0, done.stderr
    assert f"model: AttentionGNN from {SPEC}, " in done.stdout, done.stdout
    # predict takes the run's --model-args by default; the model file itself must be named again
    one = _cli("predict", "cli-run", "--data", "data", "--out", "pred1", "--model", SPEC, "--samples", "all", cwd=root)
    two = _cli("predict", "cli-run", "--data", "data", "--out", "pred2", "--model", SPEC, "--samples", "all",
               "--nproc", "2", "--pieces", cwd=root)
    assert one.returncode == 0 and two.returncode == 0, one.stderr + two.stderr
    for s in range(5):
        whole = meshio.read(root / "pred1" / f"0000{s}.vtu")
        pieces = [meshio.read(root / "pred2" / f"0000{s}" / f"part-0000{r}.vtu") for r in range(2)]
        ids = np.concatenate([p.point_data["global_id"] for p in pieces]).astype(np.int64)
        sharded = np.concatenate([p.point_data["T_pred"] for p in pieces])
        np.testing.assert_allclose(sharded, whole.point_data["T_pred"][ids], rtol=1e-10, atol=1e-12)
        assert np.abs(whole.point_data["T_pred"]).max() > 0

    # the same run in a script of one's own: meshshard.load_run, on the whole mesh and on 2 ranks
    from meshshard import load_run

    data = open_dataset(case["data"])
    points, edge_index = np.asarray(data.mesh(0).points), data.mesh(0).graph().edge_index()
    expected = {s: meshio.read(root / "pred1" / f"0000{s}.vtu").point_data["T_pred"] for s in range(5)}
    for given in (SPEC, build_user_model(SPEC, ARGS, 2, 3, 1)):
        run = load_run(root / "cli-run", model=given)
        assert (run.step, run.input_channels, run.target_channels, run.dtype) == (2, ["a", "b"], ["T"], torch.float64)
        with torch.no_grad():
            got = run(data.rows(3, np.arange(data.num_nodes(3)))[0], edge_index, points)
        np.testing.assert_allclose(got.numpy()[:, 0], expected[3], rtol=1e-12, atol=1e-12)
    for rank_rows in run_ranks(_load_run_rank, 2, str(root / "cli-run"), str(root / "parts2"), case["data"], timeout=120):
        ids, pred = rank_rows
        np.testing.assert_allclose(pred[:, 0], expected[3][ids], rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match=rf"cli-run: trained your own model \({re.escape(SPEC)}\); pass model="):
        load_run(root / "cli-run")
    with pytest.raises(ValueError, match=r"Expected inputs \(N, 2\): the run's channels a, b \(got shape \(4, 3\)\)"):
        run(np.zeros((4, 3)), edge_index, points[:4])
    with pytest.raises(ValueError, match="Expected pos, the .N, D. node coordinates"):
        run(np.zeros((4, 2)), edge_index)


def _load_run_rank(rank: int, world: int, run_dir: str, parts: str, data_dir: str) -> tuple:
    from meshshard import ShardGraph, ShardTensor, load_run
    from meshshard.partition import load_partition

    part = load_partition(parts, rank)
    graph = ShardGraph.from_partition(part, dtype=torch.float64)
    x = open_dataset(data_dir).rows(3, part.owned_ids)[0]
    run = load_run(run_dir, model=SPEC)
    with torch.no_grad():
        out = run(ShardTensor.from_local(torch.as_tensor(x), graph.spec), graph)
    return np.asarray(part.owned_ids), out.to_local().numpy()


@pytest.mark.slow
def test_predict_never_imports_the_model_a_checkpoint_names(case: dict, tmp_path: Path) -> None:
    marker = tmp_path / "imported"
    model_file = tmp_path / "mine.py"
    model_file.write_text(f"from pathlib import Path\nPath({str(marker)!r}).write_text('yes')\n"
                          f"import importlib.util, sys\nspec = importlib.util.spec_from_file_location('ex', {str(EXAMPLE)!r})\n"
                          "ex = importlib.util.module_from_spec(spec); spec.loader.exec_module(ex)\nbuild = ex.build\n")
    done = _cli("train", str(case["root"] / "parts1"), "--data", case["data"], "--out", "run", "--steps", "1",
                "--model", f"{model_file}:build", "--model-args", json.dumps(ARGS), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert marker.exists()  # the user named it on the command line: imported
    marker.unlink()
    refused = _cli("predict", "run", "--data", case["data"], "--out", "pred", cwd=tmp_path)
    assert refused.returncode == 2
    assert refused.stderr.strip() == (f"meshshard predict: error: run: trained your own model ({model_file}:build); pass "
                                      "--model with it to rebuild it (predict imports code named on the command line "
                                      "only, never from a checkpoint)")
    assert not marker.exists()
    wrong = _cli("predict", "run", "--data", case["data"], "--out", "pred", "--model", f"{model_file}:build",
                 "--model-args", '{"hidden": 4, "layers": 2, "heads": 2}', cwd=tmp_path)
    assert wrong.returncode == 2 and "to rebuild the run's model" in wrong.stderr and "size mismatch" in wrong.stderr
    assert f"(it trained --model {model_file}:build with --model-args {json.dumps(ARGS)})" in wrong.stderr
    assert len(wrong.stderr.strip().splitlines()) == 1


def test_model_specs_and_arguments_are_checked_in_one_line(tmp_path: Path, monkeypatch) -> None:
    assert normalise_spec("") == ""
    assert normalise_spec("mypackage.models:build") == "mypackage.models:build"
    monkeypatch.chdir(tmp_path)
    assert normalise_spec("models/gnn.py:build") == f"{tmp_path / 'models' / 'gnn.py'}:build"
    for spec in ("model.py", "model.py:", ":build", "model.py:not-a-name"):
        with pytest.raises(ValueError, match="Expected --model FILE.py:NAME or MODULE:NAME"):
            load_factory(spec)
    with pytest.raises(ValueError, match=r"nosuch\.py: no such file"):
        load_factory("nosuch.py:build")
    with pytest.raises(ValueError, match="no module 'nosuchmodule'"):
        load_factory("nosuchmodule:build")
    (tmp_path / "broken.py").write_text("import torch\nraise RuntimeError('half-written model file')\n")
    with pytest.raises(ValueError, match="importing broken.py failed: RuntimeError: half-written model file"):
        load_factory("broken.py:build")
    (tmp_path / "odd.py").write_text("import torch\nSIZE = 3\ndef make(a, b, c):\n    return [a, b, c]\n"
                                     "def build(a, b, c):\n    return torch.nn.Linear(a, c)\n")
    with pytest.raises(ValueError, match=r"defines no 'buld' \(it defines: build, make\)"):
        load_factory("odd.py:buld")
    with pytest.raises(ValueError, match="SIZE is a int, not a function or class"):
        load_factory("odd.py:SIZE")
    with pytest.raises(ValueError, match=r"make\(2, 3, 1\) returned a list, not a torch.nn.Module"):
        build_user_model("odd.py:make", {}, 2, 3, 1)
    with pytest.raises(ValueError, match=r"build\(2, 3, 1, width=4\) failed: TypeError: .*unexpected keyword.*"
                                         r"called with the dataset's input, edge and target channel counts"):
        build_user_model("odd.py:build", {"width": 4}, 2, 3, 1)
    (tmp_path / "wrapped.py").write_text("import torch\nfrom meshshard.nn import DomainParallel\n"
                                         "def build(a, b, c):\n    return DomainParallel(torch.nn.Linear(a, c))\n")
    with pytest.raises(ValueError, match=r"returned a DomainParallel; return the bare model \(meshshard train wraps it"):
        build_user_model("wrapped.py:build", {}, 2, 3, 1)
    (tmp_path / "refused.py").write_text("def build(a, b, c):\n    raise TypeError('ShardConv cannot run this layer')\n")
    with pytest.raises(ValueError, match=r"failed: TypeError: ShardConv cannot run this layer$"):  # the call fit: no hint
        build_user_model("refused.py:build", {}, 2, 3, 1)
    (tmp_path / "pkgmodel.py").write_text("import torch\ndef build(a, b, c, width=4):\n    return torch.nn.Linear(a, c)\n")
    assert isinstance(build_user_model("pkgmodel:build", {"width": 5}, 2, 3, 1), torch.nn.Linear)  # a module of cwd
    assert parse_model_args(None) == {} and parse_model_args('{"hidden": 8, "names": ["a", "b"]}') == {"hidden": 8, "names": ["a", "b"]}
    for text in ("[1]", '{"not a name": 1}', "{hidden: 8}", '{"f": {"nested": 1}}'):
        with pytest.raises(ValueError, match="Expected --model-args"):
            parse_model_args(text)


def test_a_model_must_return_one_row_per_owned_node(case: dict) -> None:
    from meshshard import ShardGraph, ShardTensor
    from meshshard.partition import load_partition

    graph = ShardGraph.from_partition(load_partition(case["root"] / "parts1", 0))
    rows = graph.spec.num_owned
    good = ShardTensor.from_local(torch.zeros(rows, 1), graph.spec)
    check_output(good, rows, 1, "m.py:build", sharded=True)
    check_output(torch.zeros(rows, 1), rows, 1, "m.py:build", sharded=False)
    with pytest.raises(ValueError, match=r"return a ShardTensor \(\d+, 1\) of this rank's rows on shards \(got a Tensor"):
        check_output(torch.zeros(rows, 1), rows, 1, "m.py:build", sharded=True)
    with pytest.raises(ValueError, match=r"one column per target channel \(got \(\d+, 2\)\)"):
        check_output(ShardTensor.from_local(torch.zeros(rows, 2), graph.spec), rows, 1, "m.py:build", sharded=True)


def _output_wrong_on_some_ranks(rank: int, world: int, wrong: tuple[int, ...]) -> str | None:
    """Rank r expects 3 + r rows; where r is in ``wrong``, the model's ShardTensor is laid out over
    another graph with one row more (a pooled or coarse graph, say). Returns what the rank raised."""
    from meshshard import ShardSpec, ShardTensor

    spec = ShardSpec.from_counts([3 + r + (r in wrong) for r in range(world)])
    try:
        check_output(ShardTensor.from_local(torch.zeros(spec.num_owned, 1), spec), 3 + rank, 1, "m.py:build",
                     sharded=True)
    except ValueError as err:
        return str(err)
    return None


@pytest.mark.parametrize("world,wrong", [(2, (1,)), (3, (2,)), (3, (1, 2)), (3, ())])
def test_a_wrong_output_on_some_ranks_fails_every_rank_alike(world: int, wrong: tuple[int, ...]) -> None:
    """No rank goes on into a collective that waits for one that stopped: every rank raises the same
    error, naming the lowest rank whose output is wrong (a hang here fails run_ranks' timeout)."""
    said = run_ranks(_output_wrong_on_some_ranks, world, wrong, timeout=60)
    if not wrong:
        assert said == [None] * world
        return
    assert len(set(said)) == 1, said
    assert said[0].startswith(f"rank {wrong[0]}: Expected the model of --model m.py:build to return a ShardTensor "
                              f"({3 + wrong[0]}, 1) of this rank's rows, one row per node"), said[0]
    assert said[0].endswith(f"(got ({4 + wrong[0]}, 1))"), said[0]


def test_unwrapped_pyg_layers_are_named_in_the_hint() -> None:
    from torch_geometric.nn import GCNConv, SAGEConv

    from meshshard.nn import ShardConv
    from meshshard.run._recipe import shard_hint, unwrapped_pyg_layers

    model = torch.nn.ModuleDict({"a": ShardConv(SAGEConv(2, 2)),
                                 "blocks": torch.nn.ModuleList([GCNConv(2, 2), ShardConv(GCNConv(2, 2))])})
    assert unwrapped_pyg_layers(model) == ["blocks.0"]
    assert "PyG layer(s) blocks.0 are not wrapped in meshshard.nn.ShardConv" in shard_hint(model)
    assert unwrapped_pyg_layers(ShardConv(SAGEConv(2, 2))) == [] and shard_hint(torch.nn.Linear(2, 2)) == ""


def test_resuming_refuses_another_model_or_other_model_arguments() -> None:
    saved = {"model": SPEC, "model_args": ARGS, "seed": 0}
    check_resume(saved, None, dict(saved), {})
    for change in ({"model_args": ARGS | {"hidden": 16}}, {"model": ""}):
        with pytest.raises(ValueError, match="cannot resume with changed settings: model"):
            check_resume(saved, None, saved | change | {"out": "run"}, {})
    check_resume({"seed": 0}, None, {"seed": 0, "model": "", "model_args": {}}, {})  # a run saved before --model


@pytest.mark.slow
def test_meshgraphnet_flags_are_refused_with_your_own_model(case: dict) -> None:
    root = case["root"]
    done = _cli("train", "parts1", "--data", "data", "--out", "x", "--model", SPEC, "--latent", "8", "--mp-steps", "2", cwd=root)
    assert done.returncode == 2
    assert done.stderr.strip() == ("meshshard train: error: --latent, --mp-steps set(s) the built-in MeshGraphNet; with "
                                   "--model, give your model's settings as --model-args '{\"name\": value}'")
    done = _cli("train", "parts1", "--data", "data", "--out", "x", "--model-args", "{}", cwd=root)
    assert done.returncode == 2 and "Expected --model-args only with --model" in done.stderr
    assert not (root / "x").exists()


@pytest.mark.slow
def test_an_error_in_your_model_is_reported_as_such_not_as_a_dead_peer(case: dict, tmp_path: Path) -> None:
    (tmp_path / "bad.py").write_text(
        "import torch\nfrom meshshard.nn import ShardConv\nfrom torch_geometric.nn import SAGEConv\n"
        "class Net(torch.nn.Module):\n"
        "    def __init__(self, a, b, c, bug):\n"
        "        super().__init__()\n        self.conv = ShardConv(SAGEConv(a, 4))\n"
        "        self.conv = SAGEConv(a, 4) if bug == 'noshardconv' else self.conv\n"
        "        self.out = torch.nn.Linear(5 if bug == 'shape' else 4, c)\n        self.bug = bug\n"
        "    def forward(self, x, graph, edge_attr):\n"
        "        h = self.out(self.conv(x, graph))\n"
        "        return h.to_local() if self.bug == 'local' else h\n"
        "def build(a, b, c, bug):\n    return Net(a, b, c, bug)\n")
    for bug, expected, extra in (
        ("shape", "failed in the model's forward or backward (RuntimeError: mat1 and mat2 shapes cannot be multiplied", []),
        # the commonest porting slip: a PyG layer handed the ShardGraph itself (a ValueError inside PyG)
        ("noshardconv", "step 0 failed in the model's forward or backward (ValueError: `MessagePassing.propagate` "
                        "only supports integer tensors", []),
        ("local", "Expected the model of --model ", []),
        ("local", "Expected the model of --model ", ["--val-every", "1"]),  # the validation pass checks it too
    ):
        done = _cli("train", str(case["root"] / "parts2"), "--data", case["data"], "--out", f"run-{bug}-{len(extra)}", "--nproc", "2",
                    "--steps", "1", "--model", "bad.py:build", "--model-args", json.dumps({"bug": bug}), *extra,
                    cwd=tmp_path)
        assert done.returncode != 0
        # the one line of the failure, after train's first-start note suggesting meshshard selftest --model
        lines = [line for line in done.stderr.strip().splitlines() if not line.startswith("note: check that your model")]
        assert len(lines) == 1 and expected in lines[0], done.stderr
        assert "peer rank probably died" not in done.stderr
        assert (bug == "noshardconv") == ("PyG layer(s) conv are not wrapped in meshshard.nn.ShardConv" in done.stderr)
        if bug != "local":
            assert lines[0].endswith("Last checkpoint: none yet; rerun with --force to start over."), lines[0]


@pytest.mark.slow
def test_resuming_notes_a_changed_model_file(case: dict, tmp_path: Path) -> None:
    mine = tmp_path / "mine.py"
    mine.write_text(EXAMPLE.read_text())
    run = ["train", str(case["root"] / "parts1"), "--data", case["data"], "--out", "run", "--model", "mine.py:build",
           "--model-args", json.dumps(ARGS)]
    first = _cli(*run, "--steps", "1", cwd=tmp_path)
    assert first.returncode == 0
    hint = f"meshshard selftest --model mine.py:build --model-args '{json.dumps(ARGS)}'"  # as typed: it runs as shown
    assert first.stderr.count(hint) == 1 and f"(output and every gradient) with: {hint}\n" in first.stderr
    same = _cli(*run, "--steps", "2", "--resume", cwd=tmp_path)
    assert same.returncode == 0 and "resuming from step 1" in same.stdout and "changed since" not in same.stdout
    assert "selftest" not in same.stderr  # a resumed run does not suggest it again
    mine.write_text(EXAMPLE.read_text() + "\n# edited\n")
    edited = _cli(*run, "--steps", "3", "--resume", cwd=tmp_path)
    assert edited.returncode == 0
    assert f"note: {mine} changed since step 2 was saved (SHA-256 " in edited.stdout, edited.stdout
    events = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events if "event" in e] == ["model file changed"]
    now = hashlib.sha256(mine.read_bytes()).hexdigest()
    assert [e["to"] for e in events if "event" in e] == [now]
    assert load_checkpoint(tmp_path / "run" / "checkpoint.pt")["config"]["model_sha256"] == now


def test_a_model_with_an_unused_parameter_trains_on_one_process(case: dict, tmp_path: Path) -> None:
    """Its gradient stays None on one process (no reduction fills it in): first_step.pt has zeros."""
    (tmp_path / "unused.py").write_text(
        "import torch\n"
        "class M(torch.nn.Module):\n"
        "    def __init__(self, a, b, c):\n"
        "        super().__init__()\n"
        "        self.lin, self.spare = torch.nn.Linear(a, c), torch.nn.Linear(a, 7)\n"
        "    def forward(self, x, graph, edge_attr):\n"
        "        return self.lin(x)\n"
        "def build(a, b, c):\n"
        "    return M(a, b, c)\n")
    cfg = TrainConfig(partition=str(case["root"] / "parts1"), data=case["data"], out=str(tmp_path / "run"), steps=1,
                      quiet=True, dtype="float64", model=f"{tmp_path / 'unused.py'}:build")
    train(cfg)
    first = torch.load(tmp_path / "run" / "first_step.pt", weights_only=True)
    assert first["grads"].shape == (2 * 1 + 1 + 2 * 7 + 7,) and not first["grads"][3:].any() and first["grads"][:3].any()


@pytest.mark.parametrize("text", ["[" * 200000, '{"lr": NaN}'])
def test_model_args_nested_too_deep_or_holding_nan_are_one_line(text: str) -> None:
    with pytest.raises(ValueError, match=r"^Expected --model-args to be a JSON object such as .* \(got '.{0,210}: "
                                         r"not valid JSON \(.*\)\)$"):
        parse_model_args(text)
