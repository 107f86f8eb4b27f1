"""``hfl-eval``: a peer's exported model on that peer's own data, as the run saw it.

    hfl-eval RUN_DIR --peer p0 [--which final|selected] [--config PEER.yaml] [--save-splits FILE.npz]

Rebuilds the peer's splits from its recorded config (``RUN_DIR/peers/<peer>.yaml``,
as ``hfl-launch`` wrote it; ``--config`` for the run directory of one ``hfl-peer``):
the same seeded rows, columns and private / public / val / test split, and the same
preprocessing (a CSV's one-hot columns, the z-score statistics of its private split,
scaling). Then it evaluates the model ``hfl-export`` would write (``--which``) on the
peer's test, global test and validation splits, prints each accuracy beside the one
the run recorded for that round, and exits 0 when they are equal, 1 when one is not
(named) or the run recorded none to compare with, 2 for a request that cannot be met
(as hfl-export's).

``--save-splits FILE.npz`` writes the splits as arrays (``test_x``, ``test_y``,
``global_test_x``, ...; inputs preprocessed exactly as the model saw them). In
Python: ``hfl.launch.evaluate.peer_splits(run_dir, "p0")`` returns them as a dict
``{"train": (x, y), "test": (x, y), ...}`` of numpy arrays (docs/runs.md).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from hfl.launch.export import ExportError, collect, peer_dirs
from hfl.peer.checkpoint import RunFileError

# split name -> the metrics key the run recorded its accuracy under
RECORDED = {"test": "test_acc", "global_test": "global_acc", "val": "val_acc"}


def peer_config_path(run_dir: str | Path, peer: str, config: str | Path | None = None) -> Path:
    if config is not None:
        return Path(config)
    peer_dir = peer_dirs(Path(run_dir))[peer]
    path = peer_dir.parent / "peers" / f"{peer_dir.name}.yaml"
    if not path.exists():
        raise ExportError(f"{peer}: no recorded config at {path} (a run of hfl-peer, not "
                          "hfl-launch?): name the peer's config with --config")
    return path


def peer_data(run_dir: str | Path, peer: str, config: str | Path | None = None):
    """The peer's ``PeerData`` (hfl.peer.factory), rebuilt from its recorded config."""
    from hfl.peer.config import ConfigError, load_config
    from hfl.peer.factory import load_peer_data

    path = peer_config_path(run_dir, peer, config)
    try:
        return load_peer_data(load_config(str(path)).data)
    except ConfigError as exc:
        raise ExportError(f"{peer}: {path}: {exc}") from None


def peer_splits(run_dir: str | Path, peer: str, config: str | Path | None = None
                ) -> dict[str, tuple[Any, Any]]:
    """{split: (x, y)} numpy arrays of the peer's splits, preprocessed as in the run:
    ``train`` (private, with any label noise the run applied), ``test``, and where the
    run had them ``global_test``, ``val``, ``public``."""
    data = peer_data(run_dir, peer, config)
    parts = {"train": data.train, "test": data.test, "global_test": data.global_test,
             "val": data.val, "public": data.public}
    return {name: (ds.x, ds.y) for name, ds in parts.items() if ds is not None and len(ds)}


def accuracy(model, x, y, batch_size: int = 512) -> float:
    """Plain top-1 accuracy of ``model`` on numpy ``x`` (N, ...) and ``y`` (N,), on the CPU."""
    import torch

    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(y), batch_size):
            logits = model(torch.as_tensor(x[i:i + batch_size]))  # (B, C)
            correct += int((logits.argmax(1) == torch.as_tensor(y[i:i + batch_size])).sum())
    return correct / len(y)


def evaluate(run_dir: str | Path, peer: str, which: str = "final",
             config: str | Path | None = None) -> tuple[dict[str, Any], dict[str, tuple[float, float | None]]]:
    """(export metadata, {split: (accuracy now, accuracy the run recorded or None)})."""
    from hfl.models import build_model

    found = peer_dirs(Path(run_dir))
    if peer not in found:
        raise ExportError(f"no peer {peer} in {run_dir}; its peers: {', '.join(found)}")
    weights, meta = collect(peer, found[peer], which)
    m = meta["model"]
    model = build_model(m["arch"], tuple(m["input_shape"]), m["num_classes"], m["embedding_dim"],
                        **m["options"])
    model.load_state_dict(weights)
    recorded = meta["metrics"]
    out = {}
    shape, classes = tuple(m["input_shape"]), int(m["num_classes"])
    for name, (x, y) in peer_splits(run_dir, peer, config).items():
        if name not in RECORDED:
            continue
        # Data the model cannot read, or labels it can never give: said, not a
        # traceback from a matrix product, nor an accuracy that cannot reach 1 (a review)
        source = f"the {name} split of {peer_config_path(run_dir, peer, config)}"
        if tuple(x.shape[1:]) != shape:
            raise ExportError(f"{peer}: {source} has samples of shape {tuple(x.shape[1:])}; the "
                              f"model takes {shape}: not the data it was trained on")
        if len(y) and (int(y.min()) < 0 or int(y.max()) >= classes):
            raise ExportError(f"{peer}: {source} has labels {int(y.min())} to {int(y.max())}; "
                              f"the model gives classes 0 to {classes - 1}")
        key = "head_test_acc" if name == "test" and "head_test_acc" in recorded else RECORDED[name]
        out[name] = (accuracy(model, x, y), recorded.get(key))
    return meta, out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="hfl-eval", description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", help="run directory of hfl-launch or of one hfl-peer")
    p.add_argument("--peer", required=True, metavar="ID", help="the peer whose model and data")
    p.add_argument("--which", choices=("final", "selected"), default="final",
                   help="final: the last checkpointed model (default); selected: the model that "
                        "did best on the validation split")
    p.add_argument("--config", default=None,
                   help="the peer's config (default: RUN_DIR/peers/<peer>.yaml, as hfl-launch wrote it)")
    p.add_argument("--save-splits", default=None, metavar="FILE.npz",
                   help="also write the peer's splits as arrays: <split>_x, <split>_y "
                        "(.npz is added to a name without it; an existing file is kept "
                        "unless --force)")
    p.add_argument("--force", action="store_true", help="overwrite the --save-splits file")
    args = p.parse_args(argv)
    if args.save_splits and not args.save_splits.endswith(".npz"):
        args.save_splits += ".npz"  # (numpy adds it: the name printed was not the file's)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.save_splits and Path(args.save_splits).exists() and not args.force:
            raise ExportError(f"{args.save_splits} exists: --force overwrites it")
        meta, result = evaluate(args.run_dir, args.peer, args.which, args.config)
        if args.save_splits:
            import numpy as np

            splits = peer_splits(args.run_dir, args.peer, args.config)
            np.savez(args.save_splits, **{f"{k}_{part}": v for k, (x, y) in splits.items()
                                          for part, v in (("x", x), ("y", y))})
    except ExportError as err:
        print(f"hfl-eval: {err}", file=sys.stderr)
        return 2
    except (RunFileError, OSError) as err:
        print(f"hfl-eval: {err}", file=sys.stderr)
        return 1
    print(f"{args.peer}: {meta['which']} model of round {meta['round']} ({meta['model']['arch']}) "
          "on its own splits, rebuilt from its config:")
    differ = []
    for name, (acc, then) in result.items():
        same = then is not None and not math.isnan(then) and abs(acc - then) < 1e-9
        note = ("the same as the run recorded" if same else "the run recorded none"
                if then is None or math.isnan(then) else f"the run recorded {then:.4f}: DIFFERENT")
        print(f"  {name:<12} acc {acc:.4f}   {note}")
        if then is not None and not math.isnan(then) and not same:
            differ.append(name)
    if args.save_splits:
        print(f"splits as arrays: {args.save_splits}")
    if differ:
        print(f"hfl-eval: {', '.join(differ)}: not the recorded accuracy (a config or data file "
              "changed since the run?)", file=sys.stderr)
        return 1
    if all(then is None or math.isnan(then) for _, then in result.values()):
        # (exit 0 said "every split gives the recorded accuracy" with none checked)
        print(f"hfl-eval: the run recorded no accuracy for round {meta['round']} (its metrics "
              "line is missing): nothing was checked", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
