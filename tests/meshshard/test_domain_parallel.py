"""DomainParallel, DDP and FSDP2 over a data x domain mesh: training equal to one process.

Mesh: ../shared/data/sfepy/big.mesh (2-D triangles, 2,885 nodes, SfePy, BSD-3-Clause), split by
METIS into uneven shards (and the "special" layout of tests/_meshes.py: a rank with no ghosts and
an empty rank). A MeshGraphNet trains for a few Adam steps in float64 on a batch of one random
sample per data group; its losses and final parameters equal single-process training on the
whole mesh with the same batches to 1e-10. Spawns: 4 ranks (2 data x 2 domain: DomainParallel,
DDP, FSDP2), 3 ranks (pure domain with an empty rank; unused parameters, bucket order, no_sync,
different models, reentrant checkpointing refused, the debug check), 2 ranks (2 data x 1 domain:
DomainParallel, DDP, FSDP2; 1 x 2 DomainParallel with activation checkpointing).
"""

from __future__ import annotations

import contextlib
import copy
import functools
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
from torch import nn

from meshshard import ShardGraph, ShardTensor, edge_features
from meshshard.comm import count_collectives, init_device_mesh_2d, set_debug
from meshshard.nn import DomainParallel, MeshGraphNet, fully_shard_data_parallel
from tests._dist import run_ranks
from tests._meshes import mesh_case

MESH = "sfepy/big.mesh"
STEPS = 3
LR = 1e-2


def _model() -> MeshGraphNet:
    torch.manual_seed(3)
    return MeshGraphNet(3, 3, 1, latent_size=8, hidden_layers=1, message_passing_steps=2).to(torch.float64)


def _sample(step: int, data_rank: int, num_nodes: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + data_rank)
    return torch.randn(num_nodes, 3, generator=g, dtype=torch.float64), torch.randn(num_nodes, 1, generator=g, dtype=torch.float64)


@functools.lru_cache(maxsize=2)
def _reference(data_parallel: int) -> tuple[list[float], dict[str, torch.Tensor]]:
    """One process, the whole mesh, the mean loss over the batch of ``data_parallel`` samples."""
    with _one_thread():
        return _train_whole(data_parallel)


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    """A small model: more threads only contend with the ranks and other processes (2 cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _train_whole(data_parallel: int) -> tuple[list[float], dict[str, torch.Tensor]]:
    case = mesh_case(MESH, 1)
    ei = torch.as_tensor(case.edge_index)
    ea = edge_features(torch.as_tensor(case.pos, dtype=torch.float64), ei)
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    losses = []
    for step in range(STEPS):
        batch = [_sample(step, d, case.num_nodes) for d in range(data_parallel)]
        loss = sum(((model(x, ei, ea) - y) ** 2).mean() for x, y in batch) / data_parallel
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses, {k: v.clone() for k, v in model.state_dict().items()}


def _singleton_group(world: int, rank: int):
    """A one-rank group for this rank (every rank creates every group, in order)."""
    groups = [dist.new_group([r]) for r in range(world)]
    return groups[rank]


def _train_sharded(rank: int, world: int, domain: int, how: str, layout: str = "metis", checkpoint: bool = False) -> dict:
    """Train on a (world // domain) x domain mesh with ``how`` in {"wrapper", "ddp", "fsdp"}."""
    mesh = init_device_mesh_2d(domain)
    domain_group = mesh.domain_group if domain > 1 else _singleton_group(world, rank)
    case = mesh_case(MESH, domain, layout)
    graph = ShardGraph.from_partition(case.parts[mesh.domain_rank], domain_group, dtype=torch.float64)
    own = graph.spec.global_ids
    if layout == "special":  # the mesh plus a copy owned by rank 0: train on the copy's rows too
        own = own % (case.num_nodes // 2)
    ea = edge_features(graph.pos, graph.edge_index)
    model = _model()
    model.checkpoint_steps = checkpoint  # activation checkpointing (non-reentrant): recomputed in backward
    started_before_end: list[int] = []
    if how == "wrapper":
        model = DomainParallel(model, mesh, bucket_cap_mb=0.002)
        # the first layer's gradient comes (almost) last: how many buckets were already sent by then
        model.node_encoder[0].weight.register_post_accumulate_grad_hook(
            lambda p: started_before_end.append(model._next_bucket))
    elif how == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        from meshshard.nn import ddp_comm_hook

        model = DistributedDataParallel(model, process_group=mesh.data_group if mesh.data_parallel_size > 1 else None)
        model.register_comm_hook(mesh, ddp_comm_hook)
    elif how == "fsdp":
        inner = model
        model = fully_shard_data_parallel(inner, mesh, modules=list(inner.processor))
    elif how == "fsdp-whole":  # one unit, whose output is a ShardTensor
        model = fully_shard_data_parallel(model, mesh, modules=())
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    losses, reductions = [], []
    n = case.num_nodes // 2 if layout == "special" else case.num_nodes
    for step in range(STEPS):
        x_full, y_full = _sample(step, mesh.data_rank, n)
        x = ShardTensor.from_local(x_full[own], graph.spec)
        y = ShardTensor.from_local(y_full[own], graph.spec)
        loss = ((model(x, graph, ea) - y) ** 2).mean()
        opt.zero_grad()
        with count_collectives() as log:
            loss.backward()
        if how == "wrapper":
            reductions.append(log.count("DomainParallel", "backward"))
        opt.step()
        if how == "wrapper":
            model.check_parameters()  # every rank applied bit-identical updates
        batch = loss.detach().reshape(1).clone()
        dist.all_reduce(batch)
        losses.append(float(batch) / world)
    if how.startswith("fsdp"):
        state = {k: v.full_tensor() for k, v in model.state_dict().items()}
    else:
        state = (model.module if how == "ddp" else model).state_dict()
    state = {k: v.detach().numpy().copy() for k, v in state.items()}  # tensors would travel as shared memory
    return {"losses": losses, "state": state if rank == 0 else None, "reductions": reductions,
            "buckets": len(model._buckets) if how == "wrapper" else None, "started_before_end": started_before_end}


def _data_x_domain(rank: int, world: int, configs: list[tuple]) -> list[dict]:
    return [_train_sharded(rank, world, *config) for config in configs]


def _assert_equal_training(result: dict, reference: tuple[list[float], dict], what: str) -> None:
    ref_losses, ref_state = reference
    torch.testing.assert_close(torch.tensor(result["losses"]), torch.tensor(ref_losses), rtol=1e-10, atol=0, msg=what)
    for name, value in ref_state.items():
        torch.testing.assert_close(torch.from_numpy(result["state"][name]), value, rtol=1e-10, atol=1e-12, msg=lambda m: f"{what}, {name}: {m}")


def test_two_by_two_wrapper_ddp_and_fsdp2_equal_single_process_training() -> None:
    configs = [(2, "wrapper", "metis"), (2, "ddp", "metis"), (2, "fsdp", "metis"), (2, "fsdp-whole", "metis")]
    results = run_ranks(_data_x_domain, 4, configs, timeout=240)[0]
    reference = _reference(2)
    for (_, how, *_), result in zip(configs, results):
        _assert_equal_training(result, reference, f"2 data x 2 domain, {how}")
    wrapper = results[0]
    assert wrapper["buckets"] > 1 and wrapper["reductions"] == [wrapper["buckets"]] * STEPS
    # overlap: buckets went out while the backward was still running
    assert len(wrapper["started_before_end"]) == STEPS and min(wrapper["started_before_end"]) >= 1


def test_two_by_one_and_one_by_two_equal_single_process_training() -> None:
    configs = [(1, "wrapper", "metis"), (1, "ddp", "metis"), (1, "fsdp", "metis"), (2, "wrapper", "metis", True)]
    results = run_ranks(_data_x_domain, 2, configs, timeout=240)[0]
    two_samples = _reference(2)
    for (_, how, *_), result in zip(configs[:3], results):
        _assert_equal_training(result, two_samples, f"2 data x 1 domain, {how}")
    _assert_equal_training(results[3], _reference(1), "1 data x 2 domain, wrapper, activation checkpointing")


class _Convs(nn.Module):
    """Two PyG layers in ShardConv: units whose inputs and outputs are ShardTensors."""

    def __init__(self) -> None:
        from torch_geometric.nn import SAGEConv

        from meshshard.nn import ShardConv

        super().__init__()
        torch.manual_seed(4)
        self.c1, self.c2 = ShardConv(SAGEConv(3, 8)).double(), ShardConv(SAGEConv(8, 1)).double()

    def forward(self, x, graph):
        return self.c2(torch.tanh(self.c1(x, graph)), graph)


class _Decoder(nn.Module):
    """A unit whose parameters are used through ``decode``, a method that returns a ShardTensor."""

    def __init__(self, conv: nn.Module) -> None:
        super().__init__()
        self.conv = conv

    def decode(self, h, graph):
        return self.conv(h, graph)


class _ConvsByMethod(nn.Module):
    """_Convs (the same weights), its second layer called through ``_Decoder.decode``: a unit
    whose backward needs its parameters again (its input's gradient)."""

    def __init__(self) -> None:
        super().__init__()
        convs = _Convs()
        self.c1, self.dec = convs.c1, _Decoder(convs.c2)

    def forward(self, x, graph):
        return self.dec.decode(torch.tanh(self.c1(x, graph)), graph)


def _train_convs(rank: int, world: int, units: str | None) -> list:
    """2 data x 2 domain, FSDP2 with the two layers as units (``"layers"``), one unit (``"model"``),
    or the layers as units with the second called through a registered forward method
    (``"method"``); ``None``: one process on the whole mesh with both data ranks' samples in each
    batch."""
    case = mesh_case(MESH, 2)
    model = _ConvsByMethod() if units == "method" else _Convs()
    if units is None:
        graph, own, data_rank, dp = torch.as_tensor(case.edge_index), slice(None), None, 2
    else:
        mesh = init_device_mesh_2d(2)
        graph = ShardGraph.from_partition(case.parts[mesh.domain_rank], mesh.domain_group, dtype=torch.float64)
        own, data_rank, dp = graph.spec.global_ids, mesh.data_rank, 1
        if units == "method":
            model = fully_shard_data_parallel(model, mesh, modules=[model.c1, model.dec], forward_methods=("decode",))
        else:
            model = fully_shard_data_parallel(model, mesh, modules=[model.c1, model.c2] if units == "layers" else ())
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    for step in range(STEPS):
        loss = 0
        for d in ([data_rank] if units else range(dp)):
            x, y = (t[own] for t in _sample(step, d, case.num_nodes))
            if units:
                x, y = ShardTensor.from_local(x, graph.spec), ShardTensor.from_local(y, graph.spec)
            loss = loss + ((model(x, graph) - y) ** 2).mean() / dp
        opt.zero_grad()
        loss.backward()
        opt.step()
    state = {k: v.full_tensor() if units else v for k, v in model.state_dict().items()}
    return [v.detach().numpy().copy() for v in state.values()]


def test_fsdp2_units_that_take_and_return_shard_tensors_train_as_one_process() -> None:
    """FSDP2 finds a unit's tensors in tuples, dicts and dataclasses only: without meshshard's help
    it missed ShardTensor outputs and left the gradients unreduced (one unit) or ran the backward
    on freed parameters (ShardConv units); so did a registered forward method that returns one."""
    reference = _train_convs(0, 1, None)
    for units in ("model", "layers", "method"):
        got = run_ranks(_train_convs, 4, units, timeout=120)
        for rank_state in got:
            for a, b in zip(rank_state, reference, strict=True):
                torch.testing.assert_close(torch.from_numpy(a), torch.from_numpy(b), rtol=1e-10, atol=1e-12,
                                           msg=lambda m: f"FSDP2 units: {units}: {m}")


# --- 3 ranks, pure domain parallelism: empty rank, unused parameters, no_sync, debug check ---------


class _Branches(nn.Module):
    """Each rank uses its own subset of the layers; ``never`` is used by no rank."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(5)
        self.a, self.b, self.c, self.never = (nn.Linear(4, 4).double() for _ in range(4))

    def forward(self, x: torch.Tensor, rank: int) -> torch.Tensor:
        layers = [[self.a], [self.b, self.a], [self.c]][rank]
        for layer in layers:
            x = torch.tanh(layer(x))
        return x


class _Reentrant(nn.Module):
    """``b(a(x))`` with ``a`` (or everything) under reentrant activation checkpointing."""

    def __init__(self, whole: bool) -> None:
        super().__init__()
        self.a, self.b, self.whole = nn.Linear(4, 4).double(), nn.Linear(4, 4).double(), whole

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint

        if self.whole:
            return checkpoint(lambda v: self.b(self.a(v)), x, use_reentrant=True)
        return self.b(checkpoint(self.a, x, use_reentrant=True))


def _local_grads(model: nn.Module, rank: int, seed: int) -> dict[str, torch.Tensor]:
    """This rank's own gradient contribution, computed without any reduction."""
    bare = copy.deepcopy(model)
    bare.zero_grad(set_to_none=True)
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(seed + rank), dtype=torch.float64)
    bare(x, rank).pow(2).sum().backward()
    return {n: (p.grad if p.grad is not None else torch.zeros_like(p)) for n, p in bare.named_parameters()}


def _pure_domain(rank: int, world: int) -> dict:
    out: dict = {}
    # 1. unused parameters, per-parameter buckets filled in different orders on different ranks
    bare = _Branches()
    expected = {n: sum(_local_grads(bare, r, 10)[n] for r in range(world)) for n, _ in bare.named_parameters()}
    model = DomainParallel(bare, bucket_cap_mb=1e-5)
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(10 + rank), dtype=torch.float64)
    with count_collectives() as log:
        y = model(x, rank)
        y.mul_(1.0)  # the output may be modified in place
        y.pow(2).sum().backward()
    out["buckets"], out["reductions"] = len(model._buckets), log.count("DomainParallel", "backward")
    for name, p in model.module.named_parameters():
        torch.testing.assert_close(p.grad, expected[name], rtol=1e-12, atol=1e-14, msg=name)
    assert torch.equal(model.module.never.weight.grad, torch.zeros(4, 4, dtype=torch.float64))

    # 2. no_sync: two accumulated micro-batches reduce to the sum of both ranks' both gradients
    micro = [_local_grads(bare, r, s) for s in (20, 30) for r in range(world)]
    model.zero_grad(set_to_none=True)
    with model.no_sync(), count_collectives() as log:
        x = torch.randn(5, 4, generator=torch.Generator().manual_seed(20 + rank), dtype=torch.float64)
        model(x, rank).pow(2).sum().backward()
    out["no_sync_reductions"] = log.count("DomainParallel")
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(30 + rank), dtype=torch.float64)
    model(x, rank).pow(2).sum().backward()
    for name, p in model.module.named_parameters():
        torch.testing.assert_close(p.grad, sum(g[name] for g in micro), rtol=1e-12, atol=1e-14, msg=name)

    # 3. the sharded MeshGraphNet with an empty rank (1) and a rank without ghosts (0): one step
    out["training"] = _train_sharded(rank, world, world, "wrapper", "special")

    # 4. different models on different ranks: the same error on every rank, before any bucket exists
    try:
        DomainParallel(nn.Sequential(nn.Linear(4, 5 if rank == 2 else 4), nn.Linear(4, 1)))
    except ValueError as err:
        out["layout_error"] = str(err)

    # 5. reentrant activation checkpointing would reduce twice: refused on every rank, and the wrapper recovers
    for whole in (False, True):
        torch.manual_seed(0)
        model = DomainParallel(_Reentrant(whole))
        try:
            model(torch.ones(2, 4, dtype=torch.float64, requires_grad=True)).sum().backward()
        except RuntimeError as err:
            out.setdefault("reentrant_errors", []).append(str(err))
    model.module.whole = False
    model.module.a = nn.Identity()  # nothing checkpointed holds parameters now: works again
    model.zero_grad(set_to_none=True)
    model(torch.full((2, 4), float(rank), dtype=torch.float64, requires_grad=True)).sum().backward()
    out["after_reentrant"] = model.module.b.weight.grad.clone().numpy()

    # 6. MESHSHARD_DEBUG: parameters that drifted apart are named by every rank, with the same error
    set_debug(True)
    try:
        model = DomainParallel(_Branches())
        opt = torch.optim.Adam(model.parameters())
        for _ in range(2):  # real steps: the checks at the next forwards pass
            with count_collectives() as log:
                model(torch.ones(1, 4, dtype=torch.float64), rank).sum().backward()
            opt.step()
            out.setdefault("debug_checks", []).append(log.count("DomainParallel.check_parameters"))
        with torch.no_grad():
            if rank == 2:
                model.module.b.bias[1] += 1e-12
                model.module.c.weight[0, 0] += 1.0
        try:
            model(torch.ones(1, 4, dtype=torch.float64), rank).sum().backward()  # a reduction ...
            model(torch.ones(1, 4, dtype=torch.float64), rank)  # ... so the next forward checks
        except RuntimeError as err:
            out["debug_error"] = str(err)
    finally:
        set_debug(False)
    return out


def test_pure_domain_unused_parameters_no_sync_empty_rank_and_debug_check() -> None:
    results = run_ranks(_pure_domain, 3, timeout=180)
    for r in results:
        assert r["buckets"] == 8 and r["reductions"] == 8  # one bucket per parameter, all sent
        assert r["no_sync_reductions"] == 0
        assert r["debug_checks"] == [1, 1]
    _assert_equal_training(results[0]["training"], _reference(1), "1 data x 3 domain, empty rank, wrapper")
    for r in results:
        assert len(r["reentrant_errors"]) == 2, r["reentrant_errors"]
        for message in r["reentrant_errors"]:
            assert "got its gradient in a nested backward (reentrant activation checkpointing?)" in message, message
        # d(sum b(x))/d b.weight = sum over rows of x = 2 rows of `rank` on each rank: 2 * (0 + 1 + 2) in total
        assert (r["after_reentrant"] == 6.0).all(), r["after_reentrant"]
    layout = {r.get("layout_error") for r in results}
    assert layout == {"Expected the same parameters on every rank (rank 2 has ('0.weight', (5, 4), 'torch.float32'), "
                      "rank 0 has ('0.weight', (4, 4), 'torch.float32'))"}, layout
    messages = {r.get("debug_error") for r in results}
    assert len(messages) == 1, messages
    message = messages.pop()
    assert message is not None and "\n" not in message
    assert message.startswith("DomainParallel: parameter 'b.bias' differs across ranks: ranks [2] hold other values")
    assert "(2 of 8 parameters differ)" in message


# --- one process -------------------------------------------------------------------------------


def test_world_of_one_is_the_bare_model_and_state_dict_keys_are_unchanged() -> None:
    bare = _model()
    model = DomainParallel(copy.deepcopy(bare))
    assert list(model.state_dict()) == list(bare.state_dict())
    model.load_state_dict(bare.state_dict())
    bare.load_state_dict(model.state_dict())
    assert model.checkpoint_steps is False and model.module.processor is model.processor  # attributes fall through
    parent = nn.Sequential(model)  # nested: keys get the parent's prefix only, and load back
    assert list(parent.state_dict()) == ["0." + k for k in bare.state_dict()]
    parent.load_state_dict(parent.state_dict())
    case = mesh_case(MESH, 1)
    ei = torch.as_tensor(case.edge_index)
    ea = edge_features(torch.as_tensor(case.pos, dtype=torch.float64), ei)
    x = torch.randn(case.num_nodes, 3, dtype=torch.float64)
    with _one_thread():
        model(x, ei, ea).sum().backward()
        bare(x, ei, ea).sum().backward()
    for (name, p), q in zip(bare.named_parameters(), model.module.parameters()):
        assert torch.equal(p.grad, q.grad), name


def test_argument_errors() -> None:
    from meshshard.comm import DeviceMesh2D

    with pytest.raises(TypeError, match="Expected 'module' to be a torch.nn.Module"):
        DomainParallel(lambda x: x)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"Expected 'bucket_cap_mb' > 0 \(got 0\)"):
        DomainParallel(nn.Linear(1, 1), bucket_cap_mb=0)
    with pytest.raises(ValueError, match=r"Expected 'mesh' to cover the world of 1 ranks \(got 2 data x 2 domain = 4 ranks\)"):
        DomainParallel(nn.Linear(1, 1), DeviceMesh2D(2, 2, 0, 0, None, None))
    with pytest.raises(TypeError, match="Expected 'mesh' to be a DeviceMesh2D"):
        DomainParallel(nn.Linear(1, 1), "mesh")  # type: ignore[arg-type]


# --- parameters used on globally reduced values (a graph-level head) ----------------------------


class _PooledHead(nn.Module):
    """Node features, a head on their global mean, and either a node-level output (the pooled
    value meets the rows again) or a graph-level one (the head's output is the model's)."""

    def __init__(self, use: str) -> None:
        from torch_geometric.nn import SAGEConv

        from meshshard.nn import ShardConv

        super().__init__()
        torch.manual_seed(5)
        self.use = use
        self.conv = ShardConv(SAGEConv(3, 8)).double()
        self.head, self.dec = nn.Linear(8, 8).double(), nn.Linear(8, 1).double()

    def forward(self, x, graph):
        h = torch.tanh(self.conv(x, graph))
        g = self.head(h.mean(0))
        if self.use == "graph":
            return self.dec(torch.tanh(g))
        if self.use == "both":  # the head's weights on the rows too
            return self.dec(self.head(h) + g)
        return self.dec(h + g)


def _pooled_head_grads(rank: int, world: int, use: str) -> list:
    case = mesh_case(MESH, max(world, 1))
    x_all, y_all = _sample(0, 0, case.num_nodes)
    model = _PooledHead(use)
    if world == 0:  # one process, the whole mesh
        out = model(x_all, torch.as_tensor(case.edge_index))
        y = y_all
    else:
        graph = ShardGraph.from_partition(case.parts[rank], dtype=torch.float64)
        own = graph.spec.global_ids
        model = DomainParallel(model)
        out = model(ShardTensor.from_local(x_all[own], graph.spec), graph)
        y = ShardTensor.from_local(y_all[own], graph.spec)
    loss = ((out - 0.3) ** 2).sum() if use == "graph" else ((out - y) ** 2).mean()
    loss.backward()
    return [p.grad.detach().numpy().copy() for p in model.parameters()]


POOLED_USES = ("rows", "graph")


def _pooled_head_grads_of_each_use(rank: int, world: int) -> dict[str, list]:
    return {use: _pooled_head_grads(rank, world, use) for use in POOLED_USES}


def test_a_head_on_globally_pooled_features_gets_the_single_process_gradient() -> None:
    """Its gradient is whole on every rank (the replicated computation runs on each); summed over
    the ranks it was R times the single-process one: DomainParallel counts it once. Both uses run
    in one spawn per rank count."""
    reference = _pooled_head_grads_of_each_use(0, 0)
    for world in (2, 3):
        for rank_grads in run_ranks(_pooled_head_grads_of_each_use, world, timeout=120):
            for use in POOLED_USES:
                for got, want in zip(rank_grads[use], reference[use], strict=True):
                    torch.testing.assert_close(torch.from_numpy(got), torch.from_numpy(want), rtol=1e-10, atol=1e-12,
                                               msg=lambda m: f"{use}, {world} ranks: {m}")


def test_a_parameter_on_both_rows_and_pooled_values_is_refused() -> None:
    with pytest.raises(Exception, match=r"DomainParallel: parameter\(s\) head.weight, head.bias are used both on the "
                                        r"mesh's rows and on globally reduced values"):
        run_ranks(_pooled_head_grads, 2, "both", timeout=60)
