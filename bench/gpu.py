"""GPU check: the quickstart and a ResNet-18 FedAvg cohort on CUDA beside the same runs on CPU.

    python bench/gpu.py [--quick] [--device cuda|cpu] [--budget-s 540]

Two configurations, each launched through hfl-launch (``--fresh --quiet``), one
run after the other (never concurrently):

* **quickstart**: examples/quickstart.yaml as it is (fedavg, 4 peers, MLP on
  the 8x8 digits, 20 rounds; ``--quick``: 5 rounds);
* **resnet18**: 4 peers, FedAvg of a whole ResNet-18 (11.2 M parameters, the
  small-input variant of hfl.models.resnet) on scikit-learn's digits upsampled
  to 32 x 32 (the ``rotated_digits`` built-in at angle 0: bilinear resize, all
  1,797 images, IID split), Adam, 1 local epoch, 10 rounds. Offline, no
  download. ``--quick``: 16 x 16, 30 images per class, 3 rounds.

``--device cuda`` (the default) runs each configuration twice, CUDA then CPU:

* CUDA: ``--set defaults.node.device=cuda``. The GPUs are spread by the
  launcher itself: with ``devices: auto`` (the experiment default) hfl-launch
  finds the GPUs (``CUDA_VISIBLE_DEVICES``, else ``nvidia-smi``), gives peer i
  ``CUDA_VISIBLE_DEVICES=<GPU i mod n>`` and ``node.device: cuda:0`` (round
  robin). Only if the launcher finds none while torch sees some (no nvidia-smi
  on the PATH) does this script pass ``--set devices=0,..,n-1``, still the
  launcher's round robin, and say so;
* CPU: ``--set devices=cpu --set defaults.node.device=cpu`` (every peer
  ``CUDA_VISIBLE_DEVICES=""``).

Both runs of a configuration use the same file, seeds and threads per peer
(the launcher's default, cores / peers). ``--device cpu`` runs only the CPU
side (for machines with no GPU: this is what the test runs). With
``--device cuda`` and no CUDA here the script exits 2 with one line.

From each run's peers' ``metrics.jsonl``: s/round (mean ``round_time_s`` over
every peer-round; also over rounds 2..R, without round 1's warm-up: cuDNN
autotuning, the first allocations), compute s/round (``compute_s``: local
training, aggregation, evaluation), bytes sent per peer per round
(``bytes_sent``) and for the whole cohort per round, the rounds span, the final
mean global accuracy, and the whole hfl-launch wall time. The ratio rows give
CPU / CUDA for times (above 1: the GPU is faster) and CUDA / CPU for bytes (1:
the same messages). Each number is labelled with the device it came from:
``torch.cuda.get_device_name(0)`` asked in a process with the peer's own
``CUDA_VISIBLE_DEVICES``, and the CPU's model name from /proc/cpuinfo.

A run that outlasts its share of ``--budget-s`` (default 540 s, so that the
whole script ends inside a 10-minute limit) is stopped by hfl-launch's own
``timeout_s`` (the peers are stopped with it) and reported with the rounds it
finished. Writes runs/bench/gpu.json; the runs go under runs/bench/gpu/
(``--runs-dir``). The whole run took 2 min 41 s on one H200 with 16 cores;
``--quick`` 85 s there, about 25 s on an idle 2-core CPU box with ``--device cpu``.
``--quick`` is too short for the ResNet to learn (accuracy near chance while
BatchNorm's running statistics catch up): its times and bytes are what it is for.
"""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import _common as c
import yaml

#: Per-run caps (seconds); each is also cut to what is left of --budget-s.
RUN_TIMEOUT_S = {"quickstart": 150, "resnet18": 300}
#: Seconds kept back from a run's subprocess timeout for hfl-launch to stop its peers itself.
STOP_MARGIN_S = 20
#: Seconds of the budget kept for what follows the last run (reading metrics, the table).
RESERVE_S = 15

PROBE = r"""
import json, os, sys
import torch
out = {"torch": torch.__version__, "cuda": torch.version.cuda,
       "visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "available": torch.cuda.is_available()}
if out["available"]:
    out["count"] = torch.cuda.device_count()
    out["names"] = [torch.cuda.get_device_name(i) for i in range(out["count"])]
print(json.dumps(out))
"""


def probe_cuda(visible: str | None = None) -> dict:
    """torch's view of CUDA in a fresh process (this one never initialises CUDA).

    ``visible``: that process's CUDA_VISIBLE_DEVICES (a peer's); None keeps ours."""
    env = dict(os.environ)
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    try:
        proc = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True,
                              text=True, timeout=120)
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, OSError, ValueError, IndexError) as exc:
        return {"available": False, "error": f"{type(exc).__name__}: {exc}"}


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def resnet_experiment(quick: bool, path: Path) -> Path:
    """The ResNet-18 FedAvg cohort's experiment file (kept beside its runs)."""
    size, per_class, rounds = (16, 30, 3) if quick else (32, None, 10)
    exp = {
        "name": "bench-gpu-resnet18",
        "peers": 4,
        "defaults": {
            "cohort": {"algorithm": "fedavg", "rounds": rounds},
            "data": {
                # scikit-learn's digits, resized 8x8 -> size x size (bilinear), not rotated
                "dataset": "rotated_digits",
                "options": {"angle": 0, "size": size, "per_class": per_class},
                "partition": "iid",
            },
            "model": {"arch": "resnet18", "embedding_dim": 64},
            "train": {"optimizer": "adam", "lr": 0.001, "batch_size": 32, "local_epochs": 1},
            "timing": {
                "heartbeat_interval_s": 0.5,
                "suspect_after_s": 5.0,
                "dead_after_s": 10.0,
                "round_timeout_s": 120,
            },
        },
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "# Written by bench/gpu.py: the ResNet-18 FedAvg cohort it runs on CUDA and on CPU.\n"
        + yaml.safe_dump(exp, sort_keys=False)
    )
    return path


class Budget:
    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()


def run_one(config: str, experiment: Path, device: str, quick: bool, budget: Budget,
            cuda_overrides: list[str], runs_dir: Path) -> dict:
    label = f"{config}-{device}"
    run_dir = runs_dir / label
    timeout = min(RUN_TIMEOUT_S[config], budget.left() - RESERVE_S)
    result: dict = {"config": config, "device": device, "run_dir": str(run_dir)}
    if timeout < 30:
        print(f"  {label}: skipped, {budget.left():.0f} s of --budget-s left")
        result.update(exit_status=None, status="skipped (budget spent)")
        return result
    overrides = [f"name=bench-gpu-{label}", f"timeout_s={max(10, timeout - STOP_MARGIN_S):.0f}"]
    if config == "quickstart" and quick:
        overrides.append("defaults.cohort.rounds=5")
    if device == "cuda":
        overrides += ["defaults.node.device=cuda", *cuda_overrides]
    else:
        overrides += ["devices=cpu", "defaults.node.device=cpu"]
    busy = c.Contention()
    rc, wall, out = c.launch(experiment, run_dir, overrides, timeout, f"gpu-{label}")
    result["contention"] = busy.stop()  # (the peers are ours: c.launch reaps them)
    result.update(exit_status=rc, wall_s=wall, overrides=overrides)
    # The launcher's own line: "hfl-launch: NAME: 4 peers, fedavg, R rounds, run dir D, GPUs 0, T thread(s)/peer"
    line = next((ln for ln in out.splitlines() if " peers, " in ln and "thread(s)/peer" in ln), "")
    result["launcher_line"] = line.strip()
    result.update(read_run(run_dir))
    result["status"] = (
        "ok" if rc == 0 else f"hfl-launch exited {rc}" + (" (timed out)" if rc == 124 else "")
    )
    if rc != 0 and result.get("rounds_done"):
        result["status"] += f"; numbers from the {result['rounds_done']} round(s) done"
    return result


def read_run(run_dir: Path) -> dict:
    """Per-round numbers from each peer's metrics.jsonl, and each peer's device and env."""
    peers, records = {}, []
    for cfg_path in sorted((run_dir / "peers").glob("*.yaml")):
        cfg = yaml.safe_load(cfg_path.read_text())
        peers[cfg["node"]["id"]] = {"device": cfg["node"]["device"],
                                    "threads": cfg["node"]["threads"],
                                    "rounds_configured": cfg["cohort"]["rounds"]}
    for mpath in sorted(run_dir.glob("p*/metrics.jsonl")):
        recs = sorted(c.read_jsonl(mpath), key=lambda r: r["round"])
        peers.setdefault(mpath.parent.name, {})["rounds"] = len(recs)
        records += recs
    if not records:
        return {"peers": peers, "rounds_done": 0}
    later = [r for r in records if r["round"] > 1]
    rounds = max(r["round"] for r in records)
    last = [r for r in records if r["round"] == rounds]
    return {
        "peers": peers,
        "rounds_done": rounds,
        "peer_rounds": len(records),
        "s_per_round": c.mean([r["round_time_s"] for r in records]),
        "s_per_round_after_1": c.mean([r["round_time_s"] for r in later]) if later else math.nan,
        "compute_s_per_round": c.mean([r.get("compute_s", math.nan) for r in records]),
        "bytes_per_peer_round": c.mean([r["bytes_sent"] for r in records]),
        "bytes_per_round_cohort": sum(r["bytes_sent"] for r in records) / rounds,
        "received_per_peer_round": c.mean([r.get("bytes_received", math.nan) for r in records]),
        "rounds_span_s": max(r["time"] + r["round_time_s"] for r in records)
        - min(r["time"] for r in records),
        "global_acc": c.mean([r.get("global_acc", math.nan) for r in last]),
        "test_acc": c.mean([r.get("test_acc", math.nan) for r in last]),
    }


def device_labels(cuda_runs: list[dict]) -> tuple[dict[str, str], dict[str, dict]]:
    """The GPU every CUDA peer used, named as that peer saw it.

    The launcher gives peer i ``CUDA_VISIBLE_DEVICES=gpus[i mod n]`` with ``gpus`` from
    ``detect_gpus(devices)`` in its environment, which is ours: the same call here gives
    each peer's GPU; a process with that CUDA_VISIBLE_DEVICES names it
    (``torch.cuda.get_device_name(0)``, the peer's ``cuda:0``)."""
    from hfl.launch.experiment import detect_gpus

    names: dict[str, dict] = {}
    per_run: dict[str, str] = {}
    for run in cuda_runs:
        order = detect_gpus(run.get("devices_spec", "auto"))
        for i, pid in enumerate(sorted(run.get("peers", {}))):
            run["peers"][pid]["cuda_visible_devices"] = order[i % len(order)] if order else "?"
        for g in sorted({q["cuda_visible_devices"] for q in run.get("peers", {}).values()}):
            if g not in names and g != "?":
                names[g] = probe_cuda(g)

        def name(g: str) -> str:
            return (names.get(g, {}).get("names") or ["?"])[0]

        per_run[run["config"]] = "; ".join(
            f"{pid} on {q.get('device')} = CUDA_VISIBLE_DEVICES {q['cuda_visible_devices']}: "
            f"{name(q['cuda_visible_devices'])}"
            for pid, q in sorted(run.get("peers", {}).items())
        ) + (f" (launcher: {run['launcher_line'].split(', ')[-2]})"
             if run.get("launcher_line", "").count(", ") >= 2 else "")
    return per_run, names


def main(argv: list[str] | None = None) -> int:
    p = c.parser(__doc__)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cuda: each configuration on CUDA, then on CPU, with the ratios "
                        "(default); cpu: only the CPU runs")
    p.add_argument("--budget-s", type=float, default=540.0,
                   help="the whole script's time limit (default 540 s): each run's timeout is "
                        "cut to what is left")
    p.add_argument("--configs", default="quickstart,resnet18",
                   help="which configurations, comma-separated (default quickstart,resnet18)")
    p.add_argument("--runs-dir", type=Path, default=c.OUT_DIR / "gpu",
                   help="where the runs go, one folder each (default runs/bench/gpu)")
    args = p.parse_args(argv)
    runs_dir = args.runs_dir.resolve()
    configs = [x.strip() for x in args.configs.split(",") if x.strip()]
    unknown = sorted(set(configs) - set(RUN_TIMEOUT_S))
    if unknown:
        p.error(f"--configs: unknown {', '.join(unknown)}; allowed: {', '.join(RUN_TIMEOUT_S)}")
    budget = Budget(args.budget_s)

    cuda_overrides: list[str] = []
    cuda_info: dict = {}
    devices_note = ""
    if args.device == "cuda":
        from hfl.launch.experiment import detect_gpus

        cuda_info = probe_cuda()
        if not cuda_info.get("available"):
            why = cuda_info.get("error") or (
                f"torch {cuda_info.get('torch')} (CUDA build {cuda_info.get('cuda')}) "
                f"sees no GPU, CUDA_VISIBLE_DEVICES={cuda_info.get('visible')!r}"
            )
            print(f"bench/gpu.py: --device cuda: no CUDA device here ({why}); "
                  "run with --device cpu for the CPU side only", file=sys.stderr)
            return 2
        found = detect_gpus("auto")
        if found:
            devices_note = (f"the launcher finds GPU(s) {','.join(found)} (devices: auto) and "
                            f"spreads the 4 peers over them round robin")
        else:
            spec = ",".join(str(i) for i in range(cuda_info["count"]))
            cuda_overrides = [f"devices={spec}"]
            devices_note = (f"the launcher finds no GPU by itself (no CUDA_VISIBLE_DEVICES, no "
                            f"nvidia-smi) but torch sees {cuda_info['count']}: passing "
                            f"--set devices={spec} (the launcher's round robin over those)")
        print(f"gpu: torch {cuda_info.get('torch')}, CUDA {cuda_info.get('cuda')}, "
              f"{cuda_info['count']} GPU(s) visible here: {'; '.join(cuda_info['names'])}")
        print(f"gpu: {devices_note}")

    devices = ["cuda", "cpu"] if args.device == "cuda" else ["cpu"]
    cpu = cpu_name()
    print(f"gpu: {', '.join(configs)} on {' and '.join(devices)}"
          f"{' (quick)' if args.quick else ''}; CPU: {cpu}, {os.cpu_count()} cores; "
          f"budget {args.budget_s:.0f} s")
    runs: dict[str, dict[str, dict]] = {}
    for config in configs:
        experiment = (c.QUICKSTART if config == "quickstart"
                      else resnet_experiment(args.quick, runs_dir / "resnet18.yaml"))
        runs[config] = {}
        for device in devices:
            r = run_one(config, experiment, device, args.quick, budget, cuda_overrides, runs_dir)
            r["devices_spec"] = cuda_overrides[0].split("=", 1)[1] if (
                device == "cuda" and cuda_overrides) else ("auto" if device == "cuda" else "cpu")
            runs[config][device] = r

    gpu_names: dict[str, dict] = {}
    if "cuda" in devices:
        per_run, gpu_names = device_labels([runs[k]["cuda"] for k in configs])
        for k in configs:
            runs[k]["cuda"]["device_label"] = per_run.get(k, "?")
    for k in configs:
        r = runs[k]["cpu"]
        threads = sorted({p.get("threads") for p in r.get("peers", {}).values()} - {None})
        r["device_label"] = f"CPU {cpu}, {'/'.join(map(str, threads)) or '?'} thread(s)/peer"

    # ------------------------------------------------------------------ table
    cols = [
        ("s_per_round", "{:.3f}"), ("s_per_round_after_1", "{:.3f}"),
        ("compute_s_per_round", "{:.3f}"), ("bytes_per_peer_round", "{:,.0f}"),
        ("bytes_per_round_cohort", "{:,.0f}"), ("rounds_span_s", "{:.2f}"),
        ("wall_s", "{:.1f}"), ("global_acc", "{:.4f}"),
    ]
    header = ["config", "device", "status", "rounds", "s/round", "s/round (2..R)",
              "compute s/round", "sent B/peer/round", "sent B/round (cohort)", "rounds span s",
              "wall s", "global acc", "others' CPU"]
    rows = []
    ratios: dict[str, dict] = {}
    for k in configs:
        for d in devices:
            r = runs[k][d]
            rows.append([k, d, r.get("status", "-"), r.get("rounds_done", 0),
                         *(r.get(key, math.nan) for key, _ in cols),
                         c.fmt(c.others_share(r.get("contention", {})), "{:.0%}")])
        if len(devices) == 2:
            g, u = runs[k]["cuda"], runs[k]["cpu"]
            rt = {key: c.ratio(u.get(key, math.nan), g.get(key, math.nan))
                  for key in ("s_per_round", "s_per_round_after_1", "compute_s_per_round",
                              "rounds_span_s", "wall_s")}
            rb = {key: c.ratio(g.get(key, math.nan), u.get(key, math.nan))
                  for key in ("bytes_per_peer_round", "bytes_per_round_cohort")}
            ratios[k] = {"cpu_over_cuda": rt, "cuda_over_cpu": rb}
            x = lambda v: c.fmt(v, "{:.2f}x")  # noqa: E731
            rows.append([k, "cpu / cuda (bytes: cuda / cpu)", "", "",
                         x(rt["s_per_round"]), x(rt["s_per_round_after_1"]),
                         x(rt["compute_s_per_round"]), x(rb["bytes_per_peer_round"]),
                         x(rb["bytes_per_round_cohort"]), x(rt["rounds_span_s"]),
                         x(rt["wall_s"]), "", ""])
    specs = ["{}", "{}", "{}", "{}", *(s for _, s in cols), "{}"]
    print()
    print(c.table(header, rows, specs))
    print("\nwhere each number came from:")
    for k in configs:
        for d in devices:
            print(f"  {k} {d}: {runs[k][d].get('device_label', '?')}")
    print(
        "\ns/round: mean round_time_s over every peer-round (2..R: without round 1); compute: "
        "local training, aggregation, evaluation (compute_s); sent B: bytes_sent from the peers' "
        "metrics.jsonl, per peer and per round, and the cohort's sum per round; wall s: the "
        "whole hfl-launch, start-up included. Ratio row: CPU / CUDA for times (> 1: the GPU "
        "is faster), CUDA / CPU for bytes (1.00x: the same messages)."
    )
    for k in configs:
        for d in devices:
            r = runs[k][d]
            short = [f"{pid} ({q.get('rounds', 0)})" for pid, q in r.get("peers", {}).items()
                     if q.get("rounds", 0) < q.get("rounds_configured", 0)]
            if short:
                print(f"NOTE ({k} {d}): fewer rounds than configured: {', '.join(short)}")
            if d == "cuda":
                wrong = [pid for pid, q in r.get("peers", {}).items()
                         if not str(q.get("device", "")).startswith("cuda")]
                if wrong:
                    print(f"NOTE ({k} cuda): not on a GPU: {', '.join(wrong)}")
    c.write_json(
        c.out_path("gpu", args.out),
        {
            "benchmark": "gpu",
            "quick": args.quick,
            "device": args.device,
            "budget_s": args.budget_s,
            "cpu": {"name": cpu, "cores": os.cpu_count()},
            "cuda": cuda_info,
            "gpus": gpu_names,
            "spreading": devices_note,
            "runs": runs,
            "ratios": ratios,
        },
    )
    ok = all(runs[k][d].get("exit_status") == 0 for k in configs for d in devices)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
