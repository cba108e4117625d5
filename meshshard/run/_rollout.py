"""``meshshard predict RUN --data DATA --out PRED --rollout [--rollout-steps N]``: a transient run applied
step after step, from each chosen trajectory's first state.

Each chosen trajectory (``--samples``; default: the validation trajectories) starts from its state
at step 0 and the model is applied ``N`` times (default: as many strides as the trajectory holds,
``(T - 1) // S``); each application moves the state ``S`` steps (the dataset's stride). Nodes of
boundary classes are prescribed from the trajectory's state where it is known, else held at their
previous value. The task says how a state becomes the model's input and how the output updates
the state (:meth:`meshshard.tasks.TransientTask.rollout_input`, ``rollout_update``): both work on
each rank's owned rows, so the state never leaves its shard, and on R ranks every step equals the
one-process rollout on the whole mesh (1e-10 in float64). Writes::

    PRED/
      metrics.json            per trajectory and state field: rollout.rmse, a list (the RMSE after
                              1, 2, ... N applications, over the interior nodes, physical units;
                              null where the truth is unknown), rmse_1, rmse_10, rmse_50, rmse_all
                              (those that exist); their means over the trajectories in "mean";
                              "files": everything written (what --force may delete)
      <trajectory>.pvd        the ParaView collection of the steps, with their real times
      <trajectory>/step-00000.vtu   the state at each step: <field>_pred, <field> (truth), <field>_error
                              (step 0 is the initial state); or step-00000.pvtu and a folder of
                              pieces, one per rank, for a large mesh, as predict writes a sample
      <trajectory>_error.png  the RMSE of each field against time
      <trajectory>.gif        truth, prediction and error on the mesh over the rollout (the steps
                              whose truth is known, at most ANIMATION_MAX_FRAMES spread evenly; a
                              3-D mesh's middle slab); none when the steps are written in pieces

Each trajectory's record also says where its time and memory went (``"timing"``, per rank in rank
order): seconds reading the truth, computing the steps (the model, the update, the errors), writing
the series (the gather or the pieces, the files, the ``.pvd``) and in all, and every rank's peak and
current resident memory after steps 0, 1, 10, 100, ... and the last (:func:`memory_steps`).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from meshshard.comm import barrier, gather_rows, init_distributed, sum_across
from meshshard.data import open_dataset, open_trajectories
from meshshard.partition.files import open_own

from ..tasks import get_task
from ._background import BackgroundWriter, write_now
from ._folder import checkpoint_used, read_run
from ._pictures import PLOT_MAX_NODES, RolloutFrames, animation_steps, gather_plot_rows, plot_rows, rollout_animation
from ._pred_folder import METRICS_FORMAT, check_prediction_folder, delete_paths, file_stem, write_metrics
from ._recipe import build_model
from ._report import gather_peak_memory, peak_memory_mb, resident_memory_mb
from ._request import (
    PredictConfig,
    check_model_request,
    check_rollout_request,
    normalisation_of,
    partition_reader,
    select_samples,
)
from ._stepping import roll_states
from ._vtk import check_compression
from ._writer import GATHER_MAX_NODES, field_slices, shard_layout, whole_layout, write_gathered, write_pieces

__all__ = ["ROLLOUT_MARKS", "memory_steps", "rollout", "write_pvd"]

#: The steps whose RMSE the metrics single out (those a rollout reaches), besides ``rmse_all``.
ROLLOUT_MARKS = (1, 10, 50)


def memory_steps(count: int) -> list[int]:
    """The steps of a ``count``-step rollout after which each rank's memory is recorded: 0, 1, 10,
    100, ... (those reached) and ``count``."""
    marks, m = [0], 1
    while m <= count:
        marks.append(m)
        m *= 10
    return marks if marks[-1] == count else [*marks, count]


def write_pvd(path: Path, entries: Iterable[tuple[float, str]]) -> None:
    """A ParaView collection (``.pvd``) of ``(time, file)`` entries, files relative to ``path``'s
    folder, written as ``entries`` yields them (a long rollout's are never all held)."""
    with open_own(path) as file:
        file.write('<?xml version="1.0"?>\n<VTKFile type="Collection" version="0.1" byte_order="LittleEndian">\n'
                   "  <Collection>\n")
        for t, name in entries:
            file.write(f'    <DataSet timestep="{t!r}" group="" part="0" file="{name}"/>\n')
        file.write("  </Collection>\n</VTKFile>\n")


def _step_time(times: np.ndarray, stride: int, n: int) -> float:
    """The time of rollout step ``n`` (``stride`` trajectory steps each): the trajectory's own, then
    on past its end at its last time step. One step at a time: whatever ``--rollout-steps`` says,
    nothing is made for the steps not yet done."""
    last = len(times) - 1
    return float(times[n * stride]) if n * stride <= last else float(times[-1] + (n * stride - last)
                                                                      * float(times[-1] - times[-2]))


def _summary_of(rmse: list[float | None], sse: float, count: float) -> dict[str, Any]:
    """``rmse_1``, ``rmse_10``, ... of the steps reached, and ``rmse_all`` over every known step."""
    out: dict[str, Any] = {f"rmse_{m}": rmse[m - 1] for m in ROLLOUT_MARKS if m <= len(rmse)}
    out["rmse_all"] = math.sqrt(sse / count) if count > 0 and math.isfinite(sse) else None
    return out


def _plot_rmse(path: Path, title: str, times: list[float], fields: dict[str, list[float | None]]) -> bool:
    """RMSE against time, one line per field (False without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=110)
    try:
        for name, values in fields.items():
            ax.plot(times, [np.nan if v is None else v for v in values], marker=".", label=name)
        ax.set_xlabel("time")
        ax.set_ylabel("RMSE (interior nodes)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(path)
    finally:
        plt.close(fig)
    return True


def rollout(cfg: PredictConfig, doing: list[str] | None = None) -> dict[str, Any] | None:
    """Roll a transient run out on the chosen trajectories, write PRED and return the metrics (on
    rank 0; ``None`` on the other ranks). Refusals are one-line ``ValueError``, before any collective.
    ``doing[0]`` is kept saying which trajectory is rolled out (for the error of a collective)."""
    doing = doing if doing is not None else [""]
    import torch

    ctx = init_distributed()
    data = open_dataset(cfg.data)
    ckpt = read_run(cfg.run, cfg.checkpoint)
    run_cfg = ckpt.get("config", {})
    check_model_request(ckpt, cfg.run, cfg.model)
    check_rollout_request(cfg, run_cfg)
    check_compression(cfg.compression)
    task = get_task(str(run_cfg.get("task")), run_cfg)
    task.check_dataset(data)
    dtype_name = cfg.dtype or run_cfg.get("dtype", "float32")
    if dtype_name not in ("float32", "float64"):
        raise ValueError(f"Expected --dtype float32 or float64 (got {dtype_name!r})")
    dtype = getattr(torch, dtype_name)
    normalisation_of(ckpt, data)  # the run's channels and dimension, checked against DATA's
    normaliser = task.prediction_normaliser(run_cfg, ctx.device, dtype)
    sizes = task.model_sizes(data)
    model = build_model(ckpt, sizes, dtype, cfg.model, cfg.model_args, str(data.path)).to(ctx.device)
    trajectories = open_trajectories(data)
    names, stride = trajectories.names, trajectories.time_stride
    picks = select_samples(cfg.samples, names, [int(v) for v in data.val])
    parts, reader = partition_reader(cfg, data, run_cfg, ctx, dtype, normaliser)
    fields = field_slices(task.output_fields(data, run_cfg))
    out = Path(cfg.out)
    stale = check_prediction_folder(out, cfg.force)  # on every rank, so a refusal stops them all
    head = {"format": METRICS_FORMAT, "format_version": 1, "complete": False, "kind": "rollout",
            "run": str(cfg.run), "data": str(cfg.data), "step": ckpt.get("step"),
            "checkpoint": checkpoint_used(cfg.run, cfg.checkpoint),  # what was read: "last" for a run without best.pt
            "world_size": ctx.world_size, "units": "physical (de-normalised)", "targets_known": True,
            "time_stride": stride, "compression": cfg.compression, "background_writing": cfg.background, "files": []}
    barrier()
    if ctx.rank == 0:
        delete_paths(stale)
        out.mkdir(parents=True, exist_ok=True)
        write_metrics(out, head | {"samples": []})
    barrier()
    main = ctx.rank == 0 and not cfg.quiet
    if main:
        where = "one process, whole meshes" if parts is None else f"{ctx.world_size} ranks, partition {parts}"
        print(f"meshshard predict --rollout: {len(picks)} trajectory(ies) of {cfg.data} with {cfg.run} "
              f"(step {ckpt.get('step')}); {where}", flush=True)
    stems = [file_stem(name) for name in names]
    val = set(int(v) for v in data.val)
    records: list[dict[str, Any]] = []
    for k in picks:
        doing[0] = f"the rollout of {names[k]}"
        started = time.perf_counter()
        stem = stems[k] if stems.count(stems[k]) == 1 else f"{stems[k]}-{k}"
        n = data.num_nodes(k)
        gather = True if parts is None else (cfg.gather if cfg.gather is not None else n <= GATHER_MAX_NODES)
        count = int(cfg.steps) if cfg.steps is not None else (trajectories.num_steps(k) - 1) // stride
        animate = cfg.plots and gather  # the animation is drawn from the gathered steps
        if ctx.rank == 0:  # listed before any rank writes them
            head["files"] += ([f"{stem}.pvd", stem] + ([f"{stem}_error.png"] if cfg.plots else [])
                              + ([f"{stem}.gif"] if animate else []))
            if cfg.plots and not gather:  # a note, even with --quiet
                print(f"meshshard predict: note: no animation of {names[k]}: its steps are written in pieces "
                      "(--pieces, or a mesh over the gathering limit); --gather draws one", file=sys.stderr,
                      flush=True)
            write_metrics(out, head | {"samples": records})
            (out / stem).mkdir(exist_ok=True)
        barrier()
        mesh = data.sample_mesh(k)
        layout = (whole_layout(data, mesh, model, normaliser, dtype, ctx.device, cfg.model, sizes[2])
                  if reader is None else
                  shard_layout(data, reader, mesh, model, ctx, pieces=not gather, model_spec=cfg.model,
                                num_targets=sizes[2]))
        record = {"trajectory": k, "name": names[k], "split": "val" if k in val else "train", "num_nodes": n,
                  "file": f"{stem}.pvd", "folder": stem}
        record |= _roll(cfg, task, trajectories, k, count, layout, normaliser, fields, out, stem, gather, ctx, dtype,
                        animate)
        record["seconds"] = round(time.perf_counter() - started, 4)
        if ctx.rank == 0 and cfg.plots:
            shown = _plot_rmse(out / f"{stem}_error.png", f"{names[k]}: rollout error", record["times"][1:],
                               {name: record["fields"][name]["rollout"]["rmse"] for name, _ in fields})
            record["picture"] = f"{stem}_error.png" if shown else None
        if ctx.rank == 0 and animate:
            record["animation"] = _animate(out / f"{stem}.gif", names[k], record.pop("_frames"))
        records.append(record)
        if ctx.rank == 0:
            write_metrics(out, head | {"samples": records})
        if main:
            print(f"  [{len(records)}/{len(picks)}] {names[k]}: {n:,} nodes, {count} steps, "
                  f"{record['seconds']:.1f} s -> {stem}.pvd", flush=True)
    memory = gather_peak_memory(ctx.device)  # every rank's peak, in rank order (a collective)
    if ctx.rank != 0:
        return None
    keys = [*[f"rmse_{m}" for m in ROLLOUT_MARKS], "rmse_all"]
    mean = {name: {"rmse": _mean([r["fields"][name]["rmse"] for r in records]), "rel_l2": None,
                   "rollout": {key: _mean([r["fields"][name]["rollout"].get(key) for r in records]) for key in keys}}
            for name, _ in fields}
    summary = head | {"complete": True, **memory, "samples": records, "mean": mean}
    write_metrics(out, summary)
    if main:
        _print_table(records, [name for name, _ in fields])
        print(f"wrote {out}/: {len(records)} rollout(s) (.pvd and one file per step), metrics.json"
              + (", error pictures" if cfg.plots else ""), flush=True)
    return summary


def _animate(path: Path, name: str, kept: RolloutFrames) -> str | None:
    """Rank 0 draws ``PRED/<trajectory>.gif``; one that cannot be drawn is a note, never a failure."""
    try:
        ok = rollout_animation(path, name, kept)
    except Exception as err:  # noqa: BLE001 - anything matplotlib or Pillow raises
        print(f"meshshard predict: note: no animation of {name} ({type(err).__name__}: {err}); the files and "
              "metrics are written", file=sys.stderr, flush=True)
        return None
    if not ok:
        print("meshshard predict: note: matplotlib (with Pillow) is not installed, so no animation", flush=True)
    return path.name if ok else None


def _roll(cfg: PredictConfig, task: Any, trajectories: Any, k: int, count: int, layout: Any, normaliser: Any,
          fields: list[tuple[str, slice]], out: Path, stem: str, gather: bool, ctx: Any, dtype: Any,
          animate: bool = False) -> dict[str, Any]:
    """Trajectory ``k`` rolled out ``count`` steps on this rank's rows; each step's file written.
    Returns its record (``times``, ``fields``: per field the RMSE of every step; ``timing`` on rank 0;
    with ``animate``, ``_frames`` on rank 0: the steps of the animation, at most
    :data:`ANIMATION_MAX_FRAMES` spread evenly over those whose truth is known)."""
    import torch

    started = time.perf_counter()
    spent = {"read": 0.0, "compute": 0.0, "write": 0.0}
    marks = memory_steps(count)
    memory: list[tuple[float, float]] = []  # (peak, now) in MB after each of marks

    data = trajectories.dataset
    ids = layout.owned_ids
    known = trajectories.num_steps(k)
    stride = trajectories.time_stride
    rows = task.rollout_rows(trajectories, k, ids, normaliser, ctx.device, dtype)
    interior = (~rows.boundary).cpu().numpy()
    state = torch.from_numpy(trajectories.state(k, 0, ids)).to(ctx.device, dtype)
    known_times = trajectories.times(k)
    times: list[float] = []  # of the steps done: the record grows with the files written, never with count
    mse = {name: [] for name, _ in fields}  # per step done: the mean square over interior nodes
    counts = sum_across(np.array([float(interior.sum())]), None, ctx.device)[0]
    read: list[np.ndarray | None] = [None]  # the truth of the step being computed, as read
    frames = set(animation_steps(min(count, (known - 1) // stride))) if animate else set()
    kept = RolloutFrames(fields)
    dim = layout.pos_owned.shape[1]
    whole = dim == 2 and layout.num_nodes <= PLOT_MAX_NODES  # drawn from the gathered mesh, its triangles
    take = plot_rows(layout.pos_owned, layout.num_nodes, None, ctx.device) if frames and not whole else None

    def truth_of(n: int) -> Any:
        clock = time.perf_counter()
        read[0] = trajectories.state(k, n * stride, ids) if n * stride < known else None
        spent["read"] += time.perf_counter() - clock
        return None if read[0] is None else torch.from_numpy(read[0]).to(ctx.device, dtype)

    states = roll_states(task, normaliser, layout.forward, state, rows, count, truth_of)
    writer = BackgroundWriter() if cfg.background else None
    submit = writer.submit if writer is not None else write_now
    try:
        for n in range(count + 1):
            t = n * stride
            times.append(_step_time(known_times, stride, n))
            clock, reading = time.perf_counter(), spent["read"]
            _, state, _ = next(states)
            truth = read[0]
            pred = state.detach().to(torch.float64).cpu().numpy()
            if n > 0:
                local = [float(((pred[:, sl] - truth[:, sl])[interior] ** 2).sum()) if truth is not None else math.nan
                         for _, sl in fields]
                for (name, sl), v in zip(fields, sum_across(np.array(local), None, ctx.device), strict=True):
                    mse[name].append(float(v) / max(counts * (sl.stop - sl.start), 1.0))
            spent["compute"] += time.perf_counter() - clock - (spent["read"] - reading)
            clock = time.perf_counter()

            def rows_of(at: np.ndarray, t: int = t) -> tuple[np.ndarray, np.ndarray | None]:
                return trajectories.inputs(k, at), trajectories.state(k, t, at) if t < known else None

            name, how = f"step-{n:05d}", {"rows_of": rows_of, "compression": cfg.compression, "submit": submit}
            if gather:
                full = write_gathered(out / stem / f"{name}.vtu", data, fields, k, layout, pred, ctx, **how)
                if n in frames:
                    _keep_frame(kept, n, times[n], full, take, layout, truth, pred, ctx)
            else:
                write_pieces(out / stem / name, out / stem / f"{name}.pvtu", data, fields, k, layout, pred, ctx, **how)
            spent["write"] += time.perf_counter() - clock  # the gather, and any wait for room in the queue
            if n == marks[len(memory)]:
                now = resident_memory_mb()
                memory.append((peak_memory_mb()["rss"], math.nan if now is None else now))
    except BaseException as err:  # every queued file written and the thread joined; the step's error raised
        if writer is not None:
            writer.__exit__(type(err), err, err.__traceback__)
        raise
    clock = time.perf_counter()
    if writer is not None:
        writer.close()  # the last steps' files; a file that failed raises here
    spent["write"] += time.perf_counter() - clock
    clock = time.perf_counter()
    if ctx.rank == 0:
        suffix = "vtu" if gather else "pvtu"
        write_pvd(out / f"{stem}.pvd", ((when, f"{stem}/step-{n:05d}.{suffix}") for n, when in enumerate(times)))
    spent["write"] += time.perf_counter() - clock
    mine = [spent["read"], spent["compute"], spent["write"], time.perf_counter() - started, *np.ravel(memory)]
    ranks = gather_rows(np.array([mine]), None, ctx.device)  # (world, 4 + 2 marks) on rank 0 (a collective)
    record: dict[str, Any] = {"steps": count, "times": times, "fields": {}}
    if animate and ctx.rank == 0:
        record["_frames"] = kept
    if ranks is not None:
        record["timing"] = _timing_record(ranks, marks)
    for (name, _), errors in zip(fields, mse.values(), strict=True):
        finite = [e for e in errors if math.isfinite(e)]
        if any(not math.isfinite(e) for e in errors) and ctx.rank == 0:  # a note, even with --quiet
            print(f"note: {name}: no truth past step {len(finite)} (or a non-finite prediction); its errors there "
                  "are null in metrics.json", file=sys.stderr, flush=True)
        rmse = [math.sqrt(e) if math.isfinite(e) else None for e in errors]
        summary = _summary_of(rmse, sum(finite), float(len(finite)))
        record["fields"][name] = {"rmse": summary["rmse_all"], "rel_l2": None, "rollout": {"rmse": rmse, **summary}}
    return record


def _keep_frame(kept: RolloutFrames, n: int, time: float, full: Any, take: np.ndarray | None, layout: Any,
                truth: np.ndarray, pred: np.ndarray, ctx: Any) -> None:
    """Step ``n`` into the animation's frames (on rank 0): the gathered 2-D mesh as written, or
    (3-D, or a mesh over :data:`PLOT_MAX_NODES`) the rows :func:`plot_rows` picks, gathered (a
    collective every rank enters alike)."""
    if take is None:
        if full is not None:
            pos, y, values, tri = full
            kept.add(n, time, pos, y, values, tri, f"{layout.num_nodes:,} nodes")
        return
    taken = gather_plot_rows(layout, take, truth, pred, ctx)
    if taken is not None:
        kept.add(n, time, taken[0], taken[1], taken[2], None, taken[3])


def _timing_record(ranks: np.ndarray, marks: list[int]) -> dict[str, Any]:
    """The ``timing`` of a trajectory's record from every rank's row of :func:`_roll`'s figures:
    seconds (read, compute, write, total), then (peak, current) resident MB after each mark."""
    def mb(values: np.ndarray) -> list[float | None]:
        return [round(float(v), 1) if math.isfinite(v) else None for v in values]

    out: dict[str, Any] = {f"{key}_s": [round(float(v), 4) for v in ranks[:, i]]
                           for i, key in enumerate(("read", "compute", "write", "total"))}
    memory = ranks[:, 4:].reshape(len(ranks), len(marks), 2)
    out["memory"] = [{"step": m, "peak_rss_mb": mb(memory[:, i, 0]), "rss_mb": mb(memory[:, i, 1])}
                     for i, m in enumerate(marks)]
    return out


def _mean(values: list[Any]) -> float | None:
    known = [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    return float(np.mean(known)) if known else None


def _print_table(records: list[dict[str, Any]], fields: list[str]) -> None:
    """Per trajectory and field: the RMSE after 1, 10 and 50 steps and over every step."""
    marks = [f"rmse_{m}" for m in ROLLOUT_MARKS] + ["rmse_all"]
    print(f"{'trajectory':<24} {'field':<10}" + "".join(f" {m.replace('rmse_', 'RMSE-'):>12}" for m in marks))
    for r in records:
        for f in fields:
            values = r["fields"][f]["rollout"]
            print(f"{r['name'][:24]:<24} {f[:10]:<10}"
                  + "".join(f" {'-' if values.get(m) is None else format(values[m], '.4g'):>12}" for m in marks))
