#!/usr/bin/env python3
"""The PBG fixture's graph, config and monkey-patches, shared by ``make_fixtures.py`` and
``check_roundtrip.py`` (imports torch; pins nothing).

The shims are documented in ``make_fixtures.py``; they patch torchbiggraph modules inside the
calling process only.
"""

from __future__ import annotations

import random
import types

import torch

SEED = 20240917
SCRATCH = "/nonexistent/pbg-fixture-scratch"
USERS = 29
ITEMS = 11
EDGES = 240
RELATIONS = [
    {"name": "follows", "lhs": "user_id", "rhs": "user_id", "operator": "linear"},
    {"name": "likes", "lhs": "user_id", "rhs": "item", "operator": "complex_diagonal"},
    {"name": "similar", "lhs": "item", "rhs": "item", "operator": "translation"},
]


def config_dict(num_epochs: int = 2) -> dict:
    """The PBG config, paths relative to the working directory."""
    return dict(
        entities={"user_id": {"num_partitions": 2}, "item": {"num_partitions": 1}},
        relations=RELATIONS,
        dimension=6,
        global_emb=True,
        comparator="dot",
        entity_path="data",
        edge_paths=["data/edges"],
        checkpoint_path="ckpt",
        num_epochs=num_epochs,
        num_edge_chunks=2,
        checkpoint_preservation_interval=1,
        workers=1,
        batch_size=40,
        num_uniform_negs=4,
        num_batch_negs=8,
        eval_fraction=0.0,
        hogwild_delay=0.0,
        lr=0.05,
    )


def seed_worker() -> None:
    """``subprocess_init`` for PBG's Hogwild pool: replaces ``torch.manual_seed(os.getpid())``."""
    torch.manual_seed(SEED + 1)


def apply_determinism_shims() -> None:
    import torchbiggraph.bucket_scheduling as bucket_scheduling

    bucket_scheduling.random = types.SimpleNamespace(Random=lambda: random.Random(SEED + 2))


def apply_export_shim() -> None:  # noqa: D103 - documented in make_fixtures.py
    import torchbiggraph.converters.export_to_tsv as export_to_tsv

    def write(outf, key, value):  # PBG master's write(): parameters are flattened
        if isinstance(value, torch.Tensor):
            value = value.flatten()
        outf.write("%s\t%s\n" % ("\t".join(key), "\t".join("%.9f" % x for x in value)))

    export_to_tsv.write = write


