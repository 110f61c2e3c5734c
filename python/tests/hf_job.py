"""A sharded training job that saves Hugging Face shards straight from its ranks through
``ckpt.dcp.Writer(path, to="hf")``: ``WORLD`` gloo processes on 127.0.0.1 (``torch.multiprocessing``, a 60 s
process-group timeout), the state of ``training_job.build`` (FSDP2 model and AdamW state, ``ShardedTensor``,
``Replicate`` and 2-D mesh DTensors, plain tensors, RNG state, ``BytesIO``, ints, strings).

    python hf_job.py SCENARIO OUT WORLD [OPTIONS_JSON]

Scenarios (each rank runs the same):

- ``save``: ``dcp.save`` to ``OUT/hf`` through ``ckpt.dcp.Writer(..., to="hf", **OPTIONS)`` (or to the URL in
  ``CKPT_TRAINING_URL``), and through torch's ``FileSystemWriter`` to ``OUT/torch`` (the reference the test
  converts with ``ckpt.convert``).
- ``async_thread`` / ``async_process``: the same save through ``dcp.async_save`` with torch's thread- and
  process-based checkpointers.
- ``load``: ``WORLD`` ranks (another world size than the save's) load ``OUT/hf`` through ``ckpt.dcp.Reader``
  into a sharded state dict and compare every rank's shards with what torch's ``FileSystemReader`` loads from
  ``OUT/torch``.
- ``llama``: a tiny ``transformers`` Llama sharded with FSDP2 saves its model state dict to ``OUT/llama``
  (``config.json`` written there first); ``OUT/llama.pt`` holds the full state dict for the test.
- ``fail``: rank 1 fails while resolving its items: every rank sees ``dcp.save`` fail (no rank hangs in the
  exchange), the previous checkpoint stays, the next save succeeds.

Exits 0 when every rank's checks passed.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from training_job import blank, build, compare, free_port  # noqa: E402


def rank_main(rank: int, world: int, port: int, scenario: str, out: str, options: dict) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    import ckpt.dcp

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    try:
        out_dir = Path(out)
        if scenario == "save":
            _, _, sd = build(rank, world, trained=True)
            dest = os.environ.get("CKPT_TRAINING_URL") or out_dir / "hf"
            meta = dcp.save(sd, storage_writer=ckpt.dcp.Writer(dest, to="hf", **options))
            assert not meta.storage_data, "a to='hf' save returned DCP storage data"
            dcp.save(sd, storage_writer=dcp.FileSystemWriter(out_dir / "torch"))
        elif scenario in ("async_thread", "async_process"):
            from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

            kind = AsyncCheckpointerType.THREAD if scenario == "async_thread" else AsyncCheckpointerType.PROCESS
            _, _, sd = build(rank, world, trained=True, sharded_tensor_item=False)
            pg = dist.new_group(backend="gloo")
            fut = dcp.async_save(sd, storage_writer=ckpt.dcp.Writer(out_dir / "hf", to="hf", **options),
                                 process_group=pg, async_checkpointer_type=kind)
            fut.result(timeout=120)
            dcp.save(sd, storage_writer=dcp.FileSystemWriter(out_dir / "torch"))
        elif scenario == "load":
            saved = dcp.FileSystemReader(out_dir / "torch").read_metadata().state_dict_metadata
            _, _, template = build(rank, world, trained=False,
                                   sharded_tensor_item="extra.sharded_tensor" in saved)
            ours, theirs = blank(template), blank(template)
            dcp.load(ours, storage_reader=ckpt.dcp.Reader(out_dir / "hf"))
            dcp.load(theirs, storage_reader=dcp.FileSystemReader(out_dir / "torch"))
            compare(ours, theirs, "state")
            assert ours["extra"]["step"] == 2 and ours["optim"]["param_groups"][0]["weight_decay"] == 0.1
        elif scenario == "llama":
            from torch.distributed.checkpoint.state_dict import get_model_state_dict
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard
            from transformers import LlamaConfig, LlamaForCausalLM

            torch.manual_seed(0)
            config = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
            model = LlamaForCausalLM(config)
            if rank == 0:
                torch.save({k: v.clone() for k, v in model.state_dict().items()}, out_dir / "llama.pt")
                config.save_pretrained(out_dir / "llama")
            mesh = init_device_mesh("cpu", (world,))
            for layer in model.model.layers:
                fully_shard(layer, mesh=mesh)
            fully_shard(model, mesh=mesh)
            dist.barrier()
            dcp.save(get_model_state_dict(model), storage_writer=ckpt.dcp.Writer(out_dir / "llama", to="hf",
                                                                                 **options))
        elif scenario == "fail":
            _, _, previous = build(rank, world, trained=False)
            dcp.save(previous, storage_writer=ckpt.dcp.Writer(out_dir / "hf", to="hf", **options))
            _, _, sd = build(rank, world, trained=True)

            class Failing(dcp.DefaultSavePlanner):
                def resolve_data(self, write_item):
                    if dist.get_rank() == 1 and write_item.index.fqn == "extra.sharded_rows":
                        raise RuntimeError("disk on fire on rank 1")
                    return super().resolve_data(write_item)

            try:
                dcp.save(sd, storage_writer=ckpt.dcp.Writer(out_dir / "hf", to="hf", **options), planner=Failing())
            except BaseException as e:  # torch's CheckpointException (a BaseException) on every rank
                failures = getattr(e, "failures", {})
                assert 1 in failures and "disk on fire" in str(failures[1]), repr(e)
            else:
                raise AssertionError("the save with a failing rank succeeded")
            dist.barrier()
            back = blank(previous)
            dcp.load(back, storage_reader=ckpt.dcp.Reader(out_dir / "hf"))
            compare(back, previous, "previous")
            dist.barrier()
            dcp.save(sd, storage_writer=ckpt.dcp.Writer(out_dir / "hf", to="hf", **options))
            back = blank(sd)
            dcp.load(back, storage_reader=ckpt.dcp.Reader(out_dir / "hf"))
            compare(back, sd, "after")
        else:
            raise SystemExit(f"unknown scenario {scenario}")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def main() -> int:
    import torch.multiprocessing as mp

    scenario, out, world = sys.argv[1], sys.argv[2], int(sys.argv[3])
    options = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
    mp.spawn(rank_main, args=(world, free_port(), scenario, out, options), nprocs=world, join=True)
    print(f"{scenario}: {world} ranks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
