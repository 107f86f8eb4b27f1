"""``hfl-peer``: run one peer of a cohort.

    hfl-peer --config node0.yaml [--set cohort.rounds=50 --set node.device=cuda:0]

Exit status: 0 when the cohort's last round is done, 2 for a bad config, 1 for
anything else. SIGTERM / Ctrl-C stop the peer cleanly (it tells the others it
is leaving); a checkpoint from the last finished round lets it resume later.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="hfl-peer", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True, help="peer YAML file")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
                   help="override a config value (repeatable), e.g. --set timing.round_timeout_s=30")
    p.add_argument("--check", action="store_true", help="validate the config and exit")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from hfl.peer.config import ConfigError, load_config

    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as err:
        print(f"hfl-peer: invalid config: {err}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=cfg.node.log_level.upper(),
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if args.check:
        print(f"{args.config}: ok")
        return 0
    try:
        import uvloop  # optional: a faster event loop where available

        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    try:
        runner(_main(cfg))
    except ConfigError as err:
        print(f"hfl-peer: invalid config: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


async def _main(cfg) -> None:
    from hfl.peer.runner import run_peer

    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    try:
        await run_peer(cfg)
    except asyncio.CancelledError:
        logging.getLogger("hfl.peer").info("%s: stopped by signal", cfg.node.id)


if __name__ == "__main__":
    sys.exit(main())
