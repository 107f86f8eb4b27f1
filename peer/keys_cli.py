"""``hfl-keys``: CURVE key pairs and allow-lists for cohorts across machines.

    hfl-keys new p0 --dir keys/          # on p0's machine: keys/p0.key_secret (0600) + keys/p0.key
    hfl-keys show keys/p0.key            # the allow-list line for p0: "p0 <public key> <signing key>"
    hfl-keys cohort p0 p1 p2 --dir keys/ # every pair plus keys/allow_list, on one trusted box

Each party runs ``new`` on its own machine and sends only the printed line (its
CURVE public key and the Ed25519 key that checks its signed acks, derived from
its secret key) to the others; everyone puts all lines in one allow-list file and
points ``security.key_file`` / ``security.allow_list`` at the two files. Secret
keys never leave their machine and are never printed.

A folder hfl-keys creates is made 0700 (an existing one only when it holds nothing
but keys; otherwise a warning says to chmod it). A secret key inside a git work
tree that git does not ignore gets a warning: add it to .gitignore, or keep keys
outside the repository.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="hfl-keys", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    sub = p.add_subparsers(dest="command", required=True)
    new = sub.add_parser("new", help="create one peer's key pair and print its allow-list line")
    new.add_argument("peer_id")
    new.add_argument("--dir", default=".", help="where to write <id>.key and <id>.key_secret")
    new.add_argument("--force", action="store_true", help="replace an existing key pair")
    show = sub.add_parser("show", help="print the allow-list line of a key file")
    show.add_argument("key_file")
    cohort = sub.add_parser("cohort", help="key pairs for several peers plus their allow-list")
    cohort.add_argument("peer_ids", nargs="+")
    cohort.add_argument("--dir", default="keys")
    return p.parse_args(argv)


def _line(path) -> str:
    """``<peer id> <public key> <signing key>``: the allow-list line of a key file (the
    signing key only where the file has one: older key files have none)."""
    import re

    from hfl.peer.security import SecurityError, load_public_key, load_sign_key_hex

    public = load_public_key(path)
    found = re.search(r'^\s*name\s*=\s*"([^"]+)"', Path(path).read_text(), re.MULTILINE)
    if not found:
        raise SecurityError(f"{path} names no peer (no 'name' in its metadata)")
    sign = load_sign_key_hex(path)
    if sign is None:
        print(f"hfl-keys: warning: {path} has no signing key (made by an older hfl): its "
              "member's acks cannot be checked by the others; 'hfl-keys new <id> --force' makes "
              "a new pair", file=sys.stderr)
    return f"{found.group(1)} {public.decode()}" + (f" {sign}" if sign else "")


def _not_ignored_by_git(paths: list[Path]) -> list[Path]:
    """Those of ``paths`` (files of one folder) that lie in a git work tree and that git
    does not ignore: ``git add .`` would commit them. Empty where git is not installed."""
    import shutil
    import subprocess

    if not paths or shutil.which("git") is None:
        return []
    names = [p.name for p in paths]
    try:
        done = subprocess.run(["git", "check-ignore", "--", *names], cwd=paths[0].parent,
                              capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return []
    if done.returncode not in (0, 1):  # 128: not in a work tree
        return []
    ignored = set(done.stdout.splitlines())
    return [p for p, name in zip(paths, names, strict=True) if name not in ignored]


def _warn_about(directory: Path, secrets: list[Path]) -> None:
    from hfl.peer.security import key_directory_warning

    warning = key_directory_warning(directory)
    if warning:
        print(f"hfl-keys: warning: {warning}", file=sys.stderr)
    exposed = _not_ignored_by_git(secrets)
    if exposed:
        print(f"hfl-keys: warning: {', '.join(map(str, exposed))}: secret key(s) inside a git "
              "work tree and not ignored by git, so 'git add' would commit them; add them to "
              ".gitignore (a line '*.key_secret' covers every secret key) or keep keys in a "
              "folder outside the repository", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from hfl.peer.security import ALLOW_LIST_NAME, SecurityError, cohort_keys, create_key_pair

    try:
        if args.command == "new":
            public, secret = create_key_pair(args.dir, args.peer_id, overwrite=args.force)
            print(f"hfl-keys: wrote {secret} (secret, mode 0600) and {public}", file=sys.stderr)
            _warn_about(Path(args.dir), [secret])
            print("hfl-keys: add this line to the cohort's allow-list on every peer:", file=sys.stderr)
            print(_line(public))
        elif args.command == "show":
            print(_line(args.key_file))
        else:
            keys = cohort_keys(args.dir, args.peer_ids)
            print(f"hfl-keys: {len(args.peer_ids)} key pairs and {args.dir}/{ALLOW_LIST_NAME}",
                  file=sys.stderr)
            _warn_about(Path(args.dir), [Path(k["key_file"]) for k in keys.values()])
    except SecurityError as err:
        print(f"hfl-keys: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
