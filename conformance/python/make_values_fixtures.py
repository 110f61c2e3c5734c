#!/usr/bin/env python3
"""Generate the golden fixtures of what users load and convert (issue 11), with JSON manifests.

Usage::

    .venv/bin/python conformance/python/make_values_fixtures.py OUTDIR

Writes into OUTDIR (the committed copy lives in ``conformance/fixtures/values/``):

- ``numpy.pt``: a training checkpoint keeping numpy scalars (float64 best accuracy, int64 step, bool,
  uint64 above 2**63, float32, float16, complex128) and numpy arrays (float32 2x3, a Fortran-ordered
  int16 array, a bool array, a 0-d float64 array) beside a model state dict;
- ``numpy_legacy.pt``: numpy values in the legacy (non-ZIP) ``torch.save`` stream;
- ``numpy_unsupported.pt``: a numpy object array and a structured array (dtypes torch has no counterpart
  of);
- ``module_whole.pt``: ``torch.save(model)`` of a whole ``nn.Sequential`` (Linear, BatchNorm1d with set
  running statistics, ReLU, a nested Sequential with a bias-less Linear);
- ``lightning.ckpt``: a PyTorch Lightning style checkpoint (``state_dict`` under ``model.``,
  ``optimizer_states``, ``lr_schedulers``, ``loops``, ``callbacks``, ``hyper_parameters``);
- ``hf_sharded/``: a Hugging Face sharded safetensors directory written by ``huggingface_hub``'s
  ``save_torch_state_dict`` (``model-0000x-of-0000n.safetensors`` + ``model.safetensors.index.json``),
  as ``transformers``' ``save_pretrained`` writes it.

Every value is built from exact small dyadic rationals (no RNG, no training math), so every file is
byte-reproducible with the pinned wheels. Each fixture has ``<name>.json``: what the Python libraries load
from it (entry names in ``state_dict()`` / ``load_file`` order with dtype, shape and sha256 of the
row-major little-endian bytes; numpy scalars with their type, dtype and value), and whether
``torch.load(weights_only=True)`` accepts it. ``STAMP.json`` records the generator's sha256, the versions
and the sha256 of every file.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pinenv  # noqa: E402

pinenv.pin_environment()

import hashlib  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import shutil  # noqa: E402
import warnings  # noqa: E402
from collections import OrderedDict  # noqa: E402
from typing import Any  # noqa: E402

import huggingface_hub  # noqa: E402
import numpy as np  # noqa: E402
import safetensors  # noqa: E402
import safetensors.torch  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

GENERATOR = "make_values_fixtures.py"
COMMAND = ".venv/bin/python conformance/python/make_values_fixtures.py conformance/fixtures/values"

warnings.filterwarnings("ignore")


def exact(shape: tuple[int, ...], k: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Element i is ``((i * (2k + 5) + k) % 17 - 8) / 16``: exact in every float dtype."""
    n = 1
    for d in shape:
        n *= d
    v = (torch.arange(n, dtype=torch.int64) * (2 * k + 5) + k) % 17 - 8
    return (v.to(torch.float64) / 16).to(dtype).reshape(shape)


def sha256(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def tensor_record(t: torch.Tensor) -> dict[str, Any]:
    t = t.detach().contiguous()
    raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape), "sha256": sha256(raw)}


def numpy_record(v: Any) -> dict[str, Any]:
    if isinstance(v, np.ndarray):
        c = np.ascontiguousarray(v)
        return {
            "type": "numpy.ndarray",
            "dtype": str(v.dtype),
            "shape": list(v.shape),
            "fortran": bool(v.flags.f_contiguous and not v.flags.c_contiguous),
            # an object array's bytes are pointers
            "sha256": None if v.dtype.hasobject else sha256(c.tobytes()),
        }
    item = v.item()
    if isinstance(item, complex):
        value: Any = [float(item.real).hex(), float(item.imag).hex()]
    elif isinstance(item, float):
        value = float(item).hex()
    elif isinstance(item, bool):
        value = item
    else:
        value = str(item)
    return {"type": f"numpy.{type(v).__name__}", "dtype": str(v.dtype), "value": value}


def small_model() -> nn.Sequential:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Sequential(nn.Linear(4, 2, bias=False)))
    with torch.no_grad():
        for i, p in enumerate(model.parameters()):
            p.copy_(exact(tuple(p.shape), i + 1))
        bn = model[1]
        bn.running_mean.copy_(exact((4,), 7))
        bn.running_var.copy_(exact((4,), 8).abs() + 1)
        bn.num_batches_tracked.fill_(7)
    return model


def numpy_checkpoint() -> dict[str, Any]:
    return {
        "model": small_model().state_dict(),
        "best_acc": np.float64(0.8125),
        "step": np.int64(1200),
        "converged": np.bool_(True),
        "seed": np.uint64(2**63 + 5),
        "lr": np.float32(0.5),
        "scale": np.float16(-2.25),
        "phase": np.complex128(1.5 - 0.25j),
        "hist": np.arange(6, dtype=np.float32).reshape(2, 3) / 4,
        "fortran": np.asfortranarray(np.arange(12, dtype=np.int16).reshape(3, 4) - 5),
        "mask": np.array([True, False, True]),
        "zero_d": np.array(3.5),
    }


def numpy_unsupported() -> dict[str, Any]:
    return {
        "objects": np.array([1, "a", None], dtype=object),
        "records": np.array([(1, 2.0), (3, 4.0)], dtype=[("id", "<i4"), ("w", "<f8")]),
        "ok": np.float64(1.0),
    }


def lightning_checkpoint() -> dict[str, Any]:
    model = small_model()
    sd = OrderedDict((f"model.{k}", v) for k, v in model.state_dict().items())
    params = [k for k, _ in model.named_parameters()]
    state = {
        i: {"step": torch.tensor(3.0), "exp_avg": exact(tuple(p.shape), 10 + i), "exp_avg_sq": exact(tuple(p.shape), 20 + i).abs()}
        for i, p in enumerate(model.parameters())
    }
    groups = [{
        "lr": 0.001, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01, "amsgrad": False,
        "maximize": False, "foreach": None, "capturable": False, "differentiable": False, "fused": None,
        "decoupled_weight_decay": True, "params": list(range(len(params))),
    }]
    return {
        "epoch": 3,
        "global_step": 1200,
        "pytorch-lightning_version": "2.4.0",
        "state_dict": sd,
        "loops": {"fit_loop": {"state_dict": {}, "epoch_progress": {"total": {"ready": 4, "completed": 3}}}},
        "callbacks": {"ModelCheckpoint{'monitor': 'val_loss', 'mode': 'min'}": {"best_model_score": torch.tensor(0.25), "best_model_path": "epoch=2.ckpt"}},
        "optimizer_states": [{"state": state, "param_groups": groups}],
        "lr_schedulers": [{"T_max": 10, "eta_min": 0.0, "base_lrs": [0.001], "last_epoch": 3, "_step_count": 4}],
        "hparams_name": "kwargs",
        "hyper_parameters": {"lr": 0.001, "hidden": 4},
    }


def hf_state_dict() -> dict[str, torch.Tensor]:
    sd: dict[str, torch.Tensor] = {}
    sd["model.embed_tokens.weight"] = exact((32, 16), 1, torch.bfloat16)
    for layer in range(3):
        sd[f"model.layers.{layer}.self_attn.q_proj.weight"] = exact((16, 16), 10 + layer, torch.bfloat16)
        sd[f"model.layers.{layer}.mlp.up_proj.weight"] = exact((24, 16), 20 + layer, torch.bfloat16)
        sd[f"model.layers.{layer}.input_layernorm.weight"] = exact((16,), 30 + layer, torch.float32)
    sd["model.norm.weight"] = exact((16,), 40, torch.float32)
    sd["lm_head.weight"] = exact((32, 16), 41, torch.bfloat16)
    return sd


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, sort_keys=True, indent=1, ensure_ascii=False, allow_nan=False) + "\n", encoding="utf-8")


def weights_only_ok(path: Path) -> str | None:
    """None when torch.load(weights_only=True) loads the file, else the first line of its error."""
    try:
        torch.load(str(path), weights_only=True)
        return None
    except Exception as e:  # noqa: BLE001 - recorded, not hidden
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        for ln in lines:
            if "WeightsUnpickler error:" in ln:
                return ln.split("WeightsUnpickler error:", 1)[1].strip()[:200]
        return (lines[0] if lines else type(e).__name__)[:200]


def flat_records(obj: Any, prefix: str = "") -> dict[str, Any]:
    """Every leaf as ckpt names entries (dict keys and list/tuple indices joined by '.')."""
    out: dict[str, Any] = {}
    if isinstance(obj, dict) and obj:
        for k, v in obj.items():
            out.update(flat_records(v, f"{prefix}{k}."))
    elif isinstance(obj, (list, tuple)) and obj:
        for i, v in enumerate(obj):
            out.update(flat_records(v, f"{prefix}{i}."))
    elif isinstance(obj, torch.Tensor):
        out[prefix[:-1]] = {"kind": "tensor", **tensor_record(obj)}
    elif isinstance(obj, (np.ndarray, np.generic)):
        out[prefix[:-1]] = {"kind": "numpy", **numpy_record(obj)}
    else:
        out[prefix[:-1]] = {"kind": "value", "repr": repr(obj)}
    return out


def save_pt(outdir: Path, name: str, obj: Any, description: str, legacy: bool = False, **extra: Any) -> dict[str, Any]:
    path = outdir / name
    torch.save(obj, str(path), _use_new_zipfile_serialization=not legacy)
    manifest = {
        "file": name,
        "generator": GENERATOR,
        "description": description,
        "torch": torch.__version__.split("+")[0],
        "numpy": np.__version__,
        "weights_only_error": weights_only_ok(path),
        # (torch lists them for ZIP files only)
        "unsafe_globals": None if legacy else torch.serialization.get_unsafe_globals_in_checkpoint(str(path)),
        **extra,
    }
    write_json(outdir / (Path(name).stem + ".json"), manifest)
    return manifest


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    outdir = Path(argv[1])
    outdir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    manifests = []

    ck = numpy_checkpoint()
    manifests.append(save_pt(outdir, "numpy.pt", ck, "training checkpoint with numpy scalars (float64, int64, bool, "
                             "uint64 > 2**63, float32, float16, complex128) and arrays (float32 2x3, Fortran-ordered int16 "
                             "3x4, bool, 0-d float64) beside a model state dict", entries=flat_records(ck)))
    old = {"best_acc": np.float64(0.8125), "hist": np.arange(6, dtype=np.float32).reshape(2, 3) / 4}
    manifests.append(save_pt(outdir, "numpy_legacy.pt", old, "numpy values in the legacy (non-ZIP) torch.save stream "
                             "(_use_new_zipfile_serialization=False; no tensors, so byte-reproducible)", legacy=True,
                             entries=flat_records(old)))
    bad = numpy_unsupported()
    manifests.append(save_pt(outdir, "numpy_unsupported.pt", bad, "a numpy object array and a structured array "
                             "(no tensor dtype) beside a float64 scalar", entries=flat_records(bad)))
    model = small_model()
    classes = []
    for m in model.modules():
        c = f"{type(m).__module__}.{type(m).__qualname__}"
        if c not in classes:
            classes.append(c)
    sd = model.state_dict()
    manifests.append(save_pt(outdir, "module_whole.pt", model, "torch.save(model) of a whole nn.Sequential(Linear, "
                             "BatchNorm1d, ReLU, Sequential(Linear without bias)); entries are model.state_dict()",
                             state_dict={k: tensor_record(v) for k, v in sd.items()}, module_classes=classes))
    lt = lightning_checkpoint()
    manifests.append(save_pt(outdir, "lightning.ckpt", lt, "PyTorch Lightning style checkpoint: state_dict under "
                             "'model.', optimizer_states (AdamW), lr_schedulers, loops, callbacks, hyper_parameters",
                             entries=flat_records(lt)))

    hf = outdir / "hf_sharded"
    if hf.exists():
        shutil.rmtree(hf)
    hf.mkdir()
    hsd = hf_state_dict()
    huggingface_hub.save_torch_state_dict(hsd, hf, max_shard_size="2KB", safe_serialization=True)
    files = sorted(p.name for p in hf.iterdir())
    index = json.loads((hf / "model.safetensors.index.json").read_text())
    loaded: dict[str, Any] = {}
    for f in sorted(set(index["weight_map"].values())):
        for k, v in safetensors.torch.load_file(str(hf / f)).items():
            loaded[k] = tensor_record(v)
    manifest = {
        "file": "hf_sharded",
        "generator": GENERATOR,
        "description": "Hugging Face sharded safetensors (huggingface_hub.save_torch_state_dict, max_shard_size 2KB): "
                       "bf16 and f32 tensors of a small Llama-like model in several shards + model.safetensors.index.json",
        "huggingface_hub": huggingface_hub.__version__,
        "safetensors": safetensors.__version__,
        "files": files,
        "tensors": {k: tensor_record(v) for k, v in hsd.items()},
        "loaded": loaded,
    }
    write_json(outdir / "hf_sharded.json", manifest)
    manifests.append(manifest)

    here = Path(__file__).resolve().parent
    hashes: dict[str, str] = {}
    for p in sorted(outdir.rglob("*")):
        if p.is_file() and p.suffix in {".pt", ".ckpt", ".safetensors"} or p.name == "model.safetensors.index.json":
            hashes[str(p.relative_to(outdir))] = sha256(p.read_bytes())
    write_json(outdir / "STAMP.json", {
        "generator": GENERATOR,
        "generator_sha256": sha256((here / GENERATOR).read_bytes()),
        "helpers_sha256": {"pinenv.py": sha256((here / "pinenv.py").read_bytes())},
        "command": COMMAND,
        "torch": torch.__version__.split("+")[0],
        "numpy": np.__version__,
        "safetensors": safetensors.__version__,
        "huggingface_hub": huggingface_hub.__version__,
        "python": platform.python_version(),
        "pinned_env": pinenv.PINNED_ENV,
        "files": hashes,
    })
    rows = "\n".join(f"| `{m['file']}` | {m['description']} |" for m in manifests)
    (outdir / "README.md").write_text(README.format(command=COMMAND, rows=rows), encoding="utf-8")
    for m in manifests:
        print(f"wrote {m['file']}")
    return 0


README = """\
# What users load and convert: numpy values, whole modules, Lightning, Hugging Face shards

Made by the real torch, numpy, safetensors and huggingface_hub (versions in `STAMP.json`) with
`conformance/python/make_values_fixtures.py`; do not edit by hand. Regenerate (from the repository root,
with the virtual environment from `conformance/requirements.txt`) with

    {command}

Every value is an exact small dyadic rational and nothing comes from training math, so every file is
byte-reproducible: regenerating into a fresh directory gives the sha256s of `STAMP.json`
(`conformance/tests/values.rs` checks the committed files against it).

## Files

| file | what it is |
|---|---|
{rows}

## Manifests (`<name>.json`, UTF-8, sorted keys, indent 1)

- `file`, `generator`, `description`, versions.
- `weights_only_error` (`.pt`/`.ckpt`): null when `torch.load(weights_only=True)` loads the file, else
  the reason torch gives; `unsafe_globals`: what `torch.serialization.get_unsafe_globals_in_checkpoint`
  lists (the globals a `weights_only=True` load must be allowed; null for the legacy stream, which it does
  not read).
- `entries` (`numpy.pt`, `numpy_legacy.pt`, `numpy_unsupported.pt`, `lightning.ckpt`): every leaf by its dotted name
  (mapping keys and list/tuple indices joined by `.`), in order: tensors as `{{kind: "tensor", dtype, shape,
  sha256}}` (sha256 of the row-major little-endian bytes), numpy values as `{{kind: "numpy", type, dtype,
  value}}` for scalars (floats as `float.hex()`, complex as `[re, im]`, ints as decimal strings) and
  `{{kind: "numpy", type: "numpy.ndarray", dtype, shape, fortran, sha256}}` for arrays, anything else as
  `{{kind: "value", repr}}`.
- `state_dict` (`module_whole.pt`): `model.state_dict()` in order, as tensor records; `module_classes`:
  the classes of `model.modules()`, each once.
- `hf_sharded.json`: `files` of the directory, `tensors` (the saved state dict) and `loaded` (what
  `safetensors.torch.load_file` gives from the shards the index names).
"""


if __name__ == "__main__":
    sys.exit(main(sys.argv))
