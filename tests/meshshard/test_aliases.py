"""Former names kept as aliases: each returns the very object of the name that replaced it.

DESIGN.md's vocabulary is ``owned_ids`` / ``ghost_ids`` / ``num_ghost``; the tensor form of a
dataset's ``Normalisation`` is ``TensorNormalisation``. The former spellings keep working.
"""

from __future__ import annotations

import pytest
import torch

from meshshard import ShardSpec
from meshshard.nn import BallQueryPlan


def test_shard_spec_global_ids_is_owned_ids() -> None:
    spec = ShardSpec.from_counts([4], owned_ids=[3, 0, 2, 1])
    assert spec.global_ids is spec.owned_ids
    assert spec.owned_ids.tolist() == [3, 0, 2, 1]
    chunked = ShardSpec.chunked(5)
    assert chunked.global_ids is chunked.owned_ids


def test_from_counts_takes_global_ids_as_an_alias_of_owned_ids() -> None:
    old = ShardSpec.from_counts([4], global_ids=[3, 0, 2, 1])
    new = ShardSpec.from_counts([4], owned_ids=[3, 0, 2, 1])
    assert old == new and torch.equal(old.owned_ids, new.owned_ids)
    with pytest.raises(ValueError, match="Expected 'owned_ids' or its alias 'global_ids', not both"):
        ShardSpec.from_counts([4], owned_ids=[0, 1, 2, 3], global_ids=[0, 1, 2, 3])
    with pytest.raises(ValueError, match="Expected 'global_ids' to be one-dimensional"):
        ShardSpec.from_counts([4], global_ids=[[0, 1], [2, 3]])


@pytest.mark.parametrize("sharded", [False, True])
def test_ball_query_plan_halo_names_are_its_ghost_names(sharded: bool) -> None:
    pos = torch.rand(40, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    plan = BallQueryPlan.build(pos, 0.3, 6, ShardSpec.chunked(40) if sharded else None)
    assert plan.halo_ids is plan.ghost_ids
    assert plan.halo_pos is plan.ghost_pos
    assert plan.num_halo == plan.num_ghost == plan.ghost_ids.numel()


def test_normaliser_is_tensor_normalisation() -> None:
    import meshshard.tasks
    from meshshard.tasks import Normaliser, TensorNormalisation

    assert Normaliser is TensorNormalisation
    assert {"Normaliser", "TensorNormalisation"} <= set(meshshard.tasks.__all__)
