"""Checkpoints: tensors and plain values only, never unpickled code, a checksum over every value.

No ranks are started: these are the file-level guarantees that ``--resume``, a peer failure and
``meshshard predict`` rely on.
"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest
import torch

from meshshard.nn import MeshGraphNet
from meshshard.run import load_checkpoint


def _state() -> dict:
    torch.manual_seed(0)
    model = MeshGraphNet(3, 3, 1, latent_size=8, hidden_layers=1, message_passing_steps=1).double()
    # a weight with known bytes, so the test can find it in the file
    with torch.no_grad():
        model.decoder[0].weight.copy_(torch.linspace(0.125, 0.875, model.decoder[0].weight.numel()).view_as(
            model.decoder[0].weight))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(5, 3, dtype=torch.float64)
    ei = torch.tensor([[0, 1, 2, 3], [1, 2, 3, 4]])
    model(x, ei, torch.randn(4, 3, dtype=torch.float64)).sum().backward()
    opt.step()
    return {"step": 2, "model": model.state_dict(), "optimizer": opt.state_dict(), "losses": [0.5, 0.25],
            "rng": torch.get_rng_state(), "config": {"lr": 1e-3, "data": "DATA"}, "world_size": 2}


def _save(path: Path, state: dict | None = None) -> dict:
    from meshshard.run._checkpoint import save_checkpoint

    state = _state() if state is None else state
    save_checkpoint(path, state)
    return state


def test_a_checkpoint_round_trips_every_value(tmp_path: Path) -> None:
    state = _save(tmp_path / "checkpoint.pt")
    ckpt = load_checkpoint(tmp_path / "checkpoint.pt")
    assert ckpt["step"] == 2 and ckpt["losses"] == [0.5, 0.25] and ckpt["world_size"] == 2
    assert ckpt["config"] == state["config"] and torch.equal(ckpt["rng"], state["rng"])
    for name, value in state["model"].items():
        assert torch.equal(ckpt["model"][name], value), name
    model = MeshGraphNet(3, 3, 1, latent_size=8, hidden_layers=1, message_passing_steps=1).double()
    model.load_state_dict(ckpt["model"])
    torch.optim.Adam(model.parameters()).load_state_dict(ckpt["optimizer"])
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]  # no temporary file left


class _RunsCode:
    """Pickles as a call to exec: loading it with weights_only=False runs the code."""

    def __init__(self, code: str) -> None:
        self.code = code

    def __reduce__(self):  # noqa: D105
        return (exec, (self.code,))


def test_a_checkpoint_that_would_run_code_is_refused_and_the_code_never_runs(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    payload = {"format": "meshshard-checkpoint", "format_version": 1, "step": 1,
               "model": _RunsCode(f"open({str(marker)!r}, 'w').close()")}
    torch.save(payload, tmp_path / "proof.pt")
    torch.load(tmp_path / "proof.pt", weights_only=False)  # the payload is live: plain unpickling runs it
    assert marker.exists()
    marker.unlink()
    torch.save(payload, tmp_path / "checkpoint.pt")
    with pytest.raises(ValueError, match=r"checkpoint\.pt: not a readable meshshard checkpoint \(it holds "
                                         r"something other than tensors and plain values"):
        load_checkpoint(tmp_path / "checkpoint.pt")
    assert not marker.exists()
    torch.save({"model": _Shell(f"touch {marker}")}, tmp_path / "checkpoint.pt")  # os.system: another refusal text
    with pytest.raises(ValueError) as err:
        load_checkpoint(tmp_path / "checkpoint.pt")
    assert "something other than tensors and plain values" in str(err.value) and "system" in str(err.value)
    assert "weights_only" not in str(err.value)  # never the advice to turn the protection off
    assert not marker.exists()


class _Shell:
    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):  # noqa: D105
        import os

        return (os.system, (self.command,))


def test_a_flipped_byte_inside_a_weight_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.pt"
    state = _save(path)
    raw = bytearray(path.read_bytes())
    weight = state["model"]["decoder.0.weight"].numpy().tobytes()
    at = raw.find(weight)
    assert at > 0, "the weight's bytes are stored verbatim in the file"
    raw[at + len(weight) // 2] ^= 0x10
    path.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match=r"checkpoint\.pt: checksum mismatch \(the file was changed or damaged "
                                         r"after it was written\); refusing to resume from it"):
        load_checkpoint(path)


def test_incomplete_or_foreign_checkpoints_are_one_line_errors(tmp_path: Path) -> None:
    from meshshard.run._checkpoint import save_checkpoint

    state = _state()
    del state["optimizer"]
    with pytest.raises(ValueError, match=r"Expected a checkpoint state with 'optimizer'"):
        save_checkpoint(tmp_path / "a.pt", state)
    # an otherwise valid file (right checksum) that lacks an entry, as an older or hand-made file would
    from meshshard.run._checkpoint import _digest

    body = {"format": "meshshard-checkpoint", "format_version": 2, **state}
    torch.save(body | {"sha256": _digest(body)}, tmp_path / "b.pt")
    with pytest.raises(ValueError, match=r"b\.pt: incomplete meshshard checkpoint \(no 'optimizer' entry\)"):
        load_checkpoint(tmp_path / "b.pt")
    (tmp_path / "c.pt").write_bytes(b"not a checkpoint at all")
    with pytest.raises(ValueError, match=r"c\.pt: not a readable meshshard checkpoint \(") as err:
        load_checkpoint(tmp_path / "c.pt")
    assert "\n" not in str(err.value)
    good = tmp_path / "d.pt"
    _save(good)
    (tmp_path / "e.pt").write_bytes(good.read_bytes()[: good.stat().st_size // 2])  # truncated
    with pytest.raises(ValueError, match=r"e\.pt: not a readable meshshard checkpoint \(") as err:
        load_checkpoint(tmp_path / "e.pt")
    assert "\n" not in str(err.value)
    torch.save({"format": "meshshard-checkpoint", "format_version": 1, "step": 1}, tmp_path / "f.pt")
    with pytest.raises(ValueError, match=r"f\.pt: meshshard checkpoint format_version 1 has no checksum"):
        load_checkpoint(tmp_path / "f.pt")


def test_non_finite_weights_are_never_saved(tmp_path: Path) -> None:
    from meshshard.run._checkpoint import save_checkpoint

    state = _state()
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(path, state)
    before = path.read_bytes()
    state["model"]["decoder.0.bias"] = torch.full_like(state["model"]["decoder.0.bias"], float("nan"))
    with pytest.raises(ValueError, match=r"refusing to save non-finite weights \('decoder\.0\.bias' holds nan"):
        save_checkpoint(path, state)
    assert path.read_bytes() == before  # the last good checkpoint is kept


def test_only_plain_values_can_be_saved(tmp_path: Path) -> None:
    from meshshard.run._checkpoint import atomic_save

    with pytest.raises(TypeError, match=r"Expected only tensors, numbers, strings, lists and dicts .*got bytearray"):
        atomic_save({"x": bytearray(b"1")}, tmp_path / "x.pt")
    atomic_save({"loss": 1.5, "grads": torch.ones(3), "sample": 2}, tmp_path / "first_step.pt")
    assert torch.load(tmp_path / "first_step.pt", weights_only=True)["sample"] == 2
    with zipfile.ZipFile(io.BytesIO((tmp_path / "first_step.pt").read_bytes())) as z:
        assert z.namelist()  # an ordinary torch.save zip
