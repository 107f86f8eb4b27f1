"""``hfl-export``: a peer's trained model as a plain PyTorch state dict, with what rebuilds it.

    hfl-export RUN_DIR [--peer p0 ...] [--which final|selected] [--out DIR] [--format pt|safetensors] [--force]

RUN_DIR is a run directory of ``hfl-launch`` (every peer in it unless ``--peer``)
or of one ``hfl-peer``. The model comes from the peer's checkpoint: ``final`` is
the model of its last checkpointed round, ``selected`` the one that did best on
its validation split (peers with ``data.val_fraction > 0``). Per peer it writes
``<out>/<peer>.pt`` (``<peer>.selected.pt`` for ``--which selected``): a
``torch.save`` of ``{"state_dict", "model", "peer", "round", "which", "metrics",
"hfl_version", "source"}`` that loads with ``torch.load(path, weights_only=True)``,
and the same without the tensors as ``<out>/<peer>.json``. ``model`` is what
rebuilds the architecture: ``hfl.models.build_model(m["arch"], m["input_shape"],
m["num_classes"], m["embedding_dim"], **m["options"])`` (docs/runs.md). With
``--format safetensors`` (needs ``pip install safetensors``) the tensors go to
``<peer>.safetensors`` instead, the JSON in its metadata under ``"hfl"``.

Exit status: 0 when every model was written; 2 for a request that cannot be
met (not a run directory, an unknown peer, no checkpoint yet, no selected model,
an output file that exists without ``--force``, safetensors not installed); 1
for a checkpoint that cannot be read. Nothing is written unless every peer asked
for can be exported.
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import json
import math
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from hfl.launch.results import damage_note, read_metrics, seed_dirs
from hfl.peer.checkpoint import (
    CHECKPOINT_NAME,
    INCARNATION_NAME,
    RunFileError,
    load_checkpoint,
    read_jsonl,
    write_atomic,
)
from hfl.peer.config import ID_MEANS, ID_PATTERN

METRICS_NAME = "metrics.jsonl"
PEER_FILES = (CHECKPOINT_NAME, METRICS_NAME, INCARNATION_NAME)  # a peer writes one at its start
EXTRA_METRICS = ("acc", "bwt", "fwt")  # multi-domain runs (FedH2L's protocol)


class ExportError(Exception):
    """This export cannot be done as asked; the message is one line for the user."""


def _is_peer_dir(path: Path) -> bool:
    return any((path / name).exists() for name in PEER_FILES)


def peer_dirs(run_dir: Path) -> dict[str, Path]:
    """Peer id -> its run directory: ``run_dir`` itself when it is one peer's (its id
    as its metrics say), else its sub-folders that are."""
    if not run_dir.is_dir():
        raise ExportError(f"no such run directory: {run_dir}")
    if _is_peer_dir(run_dir):
        rows = read_jsonl(run_dir / METRICS_NAME)
        peer = str(next((r["peer"] for r in rows if "peer" in r), run_dir.name))
        if not re.fullmatch(ID_PATTERN, peer):  # (it names the files written: "../../x"
            #                                      wrote outside --out, a review)
            raise ExportError(f"{run_dir / METRICS_NAME} names its peer {peer!r}, not a peer "
                              f"id ({ID_MEANS}): a damaged or edited file")
        return {peer: run_dir}
    peers = {d.name: d for d in sorted(run_dir.iterdir()) if d.is_dir() and _is_peer_dir(d)}
    if not peers:
        seeds = [d.name for _, d in seed_dirs(run_dir)]
        hint = (f": a run of hfl-launch --seeds, export one seed's run ({run_dir / seeds[0]})"
                if seeds else " (a checkpoint.pt or metrics.jsonl, in it or in its sub-folders)")
        raise ExportError(f"{run_dir} is not a run directory: no peer's files{hint}")
    return peers


def _metrics(row: dict[str, Any]) -> dict[str, float]:
    """A metrics line's accuracies and losses (not those of the selected model, sel_*)."""
    return {k: v for k, v in row.items()
            if (k.endswith(("_acc", "_loss")) or k in EXTRA_METRICS) and not k.startswith("sel_")
            and isinstance(v, (int, float)) and not isinstance(v, bool)
            and math.isfinite(v)}  # (inf was written as Infinity: not JSON)


def _legacy_spec(peer: str, peer_dir: Path) -> dict[str, Any]:
    """The model description of a checkpoint written before checkpoints carried one:
    from the peer's config that hfl-launch wrote beside the run (peers/<id>.yaml)."""
    from hfl.peer.config import ConfigError, load_config
    from hfl.peer.factory import load_peer_data, model_spec

    path = peer_dir.parent / "peers" / f"{peer_dir.name}.yaml"
    if not path.exists():
        raise ExportError(f"{peer}: {peer_dir / CHECKPOINT_NAME} has no model description (an "
                          f"older hfl) and there is no peer config {path} to rebuild it from")
    try:
        cfg = load_config(str(path))
        data = load_peer_data(cfg.data)
    except ConfigError as exc:
        raise ExportError(f"{peer}: {path}: {exc}") from None
    return model_spec(cfg, data.train.input_shape, cfg.cohort.num_classes or data.num_classes)


def _check_rebuilds(peer: str, spec: dict[str, Any], weights: dict[str, Any]) -> None:
    """Build the model from ``spec`` as a user would and load ``weights`` strictly."""
    from hfl.models import build_model

    try:
        model = build_model(spec["arch"], tuple(spec["input_shape"]), spec["num_classes"],
                            spec["embedding_dim"], **spec["options"])
        model.load_state_dict(weights)
    except (ValueError, RuntimeError, KeyError, TypeError, MemoryError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ExportError(f"{peer}: the model description {spec} does not rebuild the "
                          f"checkpoint's weights: {first}") from None


def _check_owner(peer: str, peer_dir: Path, owner: Any) -> None:
    """Refuse a checkpoint that is not this peer's of this run: its model would be
    exported (and evaluated) under this peer's metrics (a review: another run's,
    another method's checkpoint copied in was exported with p0's accuracies). Whose
    rounds it holds is in the checkpoint (``runner.checkpoint_owner``); the run's are in
    the config hfl-launch wrote beside it (``peers/<id>.yaml``), where there is one."""
    from hfl.peer.config import ConfigError, load_config
    from hfl.peer.runner import checkpoint_owner

    if not isinstance(owner, dict):
        return  # (a checkpoint from before the record)
    where = peer_dir / CHECKPOINT_NAME
    if owner.get("peer", peer) != peer:
        raise ExportError(f"{peer}: {where} holds the rounds of peer {owner.get('peer')!r}, "
                          f"not of {peer}: another peer's checkpoint (copied by mistake?)")
    path = peer_dir.parent / "peers" / f"{peer_dir.name}.yaml"
    if not path.exists():
        return
    try:
        mine = checkpoint_owner(load_config(str(path)))
    except ConfigError as exc:
        raise ExportError(f"{peer}: {path}: {exc}") from None
    # (not its data: a config edited since, hfl-eval names the split that moved)
    differs = [f"{k} {owner[k]!r}, this run's {mine[k]!r}" for k in ("cohort", "run", "algorithm")
               if k in owner and owner[k] != mine[k]]
    if differs:
        raise ExportError(f"{peer}: {where} is not of this run ({path}): {'; '.join(differs)}; "
                          "its model would be exported with this run's metrics")


def collect(peer: str, peer_dir: Path, which: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(state dict, metadata) of ``peer``'s ``which`` model ("final" or "selected")."""
    state = load_checkpoint(peer_dir)
    if state is None:
        raise ExportError(f"{peer}: no checkpoint yet in {peer_dir} (no round finished, or the "
                          "peer runs with node.checkpoint: false)")
    _check_owner(peer, peer_dir, state.get("owner"))
    alg = state["algorithm"]
    # (read_metrics: only lines with a round, without values that are no number)
    damaged: Counter = Counter()
    rows = [r for r in read_metrics(peer_dir, damaged) if r["round"] <= state["round"]]
    if which == "final":
        weights, round_ = alg["model"], int(state["round"])
    else:
        weights = alg.get("selected_model")
        if weights is None:
            why = ("its checkpoint was written before checkpoints kept the selected model"
                   if alg.get("selected") else
                   "it selected none (selection needs a validation split: data.val_fraction > 0)")
            raise ExportError(f"{peer}: no selected model in {peer_dir / CHECKPOINT_NAME}: {why}; "
                              "--which final exports its last model")
        round_ = next((int(r["round"]) for r in reversed(rows) if r.get("newly_selected")), None)
    row = next((r for r in reversed(rows) if r.get("round") == round_), {})
    metrics = _metrics(row) or ({**alg.get("selected", {}), "val_acc": alg.get("best_val")}
                                if which == "selected" else {})
    spec = state.get("model") or _legacy_spec(peer, peer_dir)
    if "head" not in spec.get("options", {}) and any(k.startswith("head.proj.") for k in weights):
        # (a FedHP checkpoint written before descriptions named its head: described
        # again from the peer's config, where hfl-launch wrote one)
        try:
            spec = _legacy_spec(peer, peer_dir)
        except ExportError:
            pass
    _check_rebuilds(peer, spec, weights)
    meta = {"peer": peer, "which": which, "round": round_, "model": spec, "metrics": metrics,
            "hfl_version": _version(), "source": str((peer_dir / CHECKPOINT_NAME).resolve())}
    if sum(damaged.values()):  # said by main(); in the JSON file too, beside the metrics
        meta["damaged_metrics"] = {k: n for k, n in damaged.items() if n}
    return weights, meta


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("hfl")
    except PackageNotFoundError:
        return "unknown"


def outputs(out_dir: Path, peer: str, which: str, fmt: str) -> tuple[Path, Path]:
    """(the weights file, the JSON file) of one peer's export."""
    stem = peer if which == "final" else f"{peer}.selected"
    return out_dir / f"{stem}.{'pt' if fmt == 'pt' else 'safetensors'}", out_dir / f"{stem}.json"


def write(weights: dict[str, Any], meta: dict[str, Any], model_path: Path, json_path: Path,
          fmt: str) -> None:
    import torch

    if fmt == "pt":
        buf = io.BytesIO()
        torch.save({"state_dict": weights, **meta}, buf)
        data = buf.getvalue()
    else:
        from safetensors.torch import save

        data = save({k: v.contiguous() for k, v in weights.items()},
                    metadata={"hfl": json.dumps(meta)})
    write_atomic(model_path, data)
    write_atomic(json_path, (json.dumps(meta, indent=2) + "\n").encode())


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="hfl-export", description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", help="run directory of hfl-launch or of one hfl-peer")
    who = p.add_mutually_exclusive_group()
    who.add_argument("--peer", action="append", default=None, metavar="ID",
                     help="export this peer (repeatable; default: every peer)")
    who.add_argument("--all", action="store_true", help="export every peer (the default)")
    p.add_argument("--which", choices=("final", "selected"), default="final",
                   help="final: the last checkpointed model (default); selected: the model that "
                        "did best on the validation split")
    p.add_argument("--out", default=None, help="output folder (default: RUN_DIR/export)")
    p.add_argument("--format", choices=("pt", "safetensors"), default="pt",
                   help="pt: torch.save, loads with torch.load(weights_only=True) (default); "
                        "safetensors: needs the safetensors package")
    p.add_argument("--force", action="store_true", help="overwrite existing output files")
    return p.parse_args(argv)


def export(args: argparse.Namespace) -> list[tuple[dict[str, Any], Path, Path]]:
    """Write the exports; (metadata, weights file, JSON file) per peer."""
    if args.format == "safetensors" and importlib.util.find_spec("safetensors") is None:
        raise ExportError("--format safetensors needs the safetensors package: pip install "
                          "safetensors (or use --format pt)")
    run_dir = Path(args.run_dir)
    found = peer_dirs(run_dir)
    unknown = [p for p in args.peer or [] if p not in found]
    if unknown:
        raise ExportError(f"no peer {', '.join(unknown)} in {run_dir}; its peers: "
                          f"{', '.join(found)}")
    chosen = {p: found[p] for p in args.peer} if args.peer else found
    out_dir = Path(args.out) if args.out else run_dir / "export"
    planned = {p: outputs(out_dir, p, args.which, args.format) for p in chosen}
    existing = [str(f) for files in planned.values() for f in files if f.exists()]
    if existing and not args.force:
        more = f" (and {len(existing) - 1} more)" if len(existing) > 1 else ""
        raise ExportError(f"{existing[0]} exists already{more}: --force overwrites, --out "
                          "writes elsewhere")
    exports = {p: collect(p, d, args.which) for p, d in chosen.items()}  # all, before writing
    out_dir.mkdir(parents=True, exist_ok=True)
    for p, (weights, meta) in exports.items():
        write(weights, meta, *planned[p], args.format)
    return [(exports[p][1], *planned[p]) for p in chosen]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        written = export(args)
    except ExportError as err:
        print(f"hfl-export: {err}", file=sys.stderr)
        return 2
    except (RunFileError, OSError) as err:  # an unreadable or corrupt checkpoint, a full disk
        print(f"hfl-export: {err}", file=sys.stderr)
        return 1
    for meta, model_path, json_path in written:
        acc = meta["metrics"].get("test_acc")
        print(f"{meta['peer']}: {meta['which']} model of round {meta['round']}"
              f"{f' (test acc {acc:.4f})' if acc is not None else ''} -> {model_path}, {json_path}")
        if note := damage_note({meta["peer"]: meta.get("damaged_metrics", {})}):
            print(f"hfl-export: warning: {note}", file=sys.stderr)
    print("load it: docs/runs.md, 'Getting a trained model out'")
    return 0


if __name__ == "__main__":
    sys.exit(main())
