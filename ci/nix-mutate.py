#!/usr/bin/env python3
"""Mutation check of the flake's evaluation check (ci/nix-eval-check.sh).

Every known-bad edit in ci/nix-mutations.toml is applied alone to a copy of
the tree, and the evaluation check must reject it, with the entry's
`expect` in its output. The unedited copy must pass first, or a rejection
would prove nothing. Prints one line per edit and
"caught N/M"; exits 1 unless every edit is caught.

  python3 ci/nix-mutate.py [-j N] [--checker-rev REV]

--checker-rev takes the evaluation check and the stand-ins (ci/nix-eval-check.sh,
ci/nix-stubs/) from a git revision instead of the tree, to measure an older
check against today's list (any rejection then counts: its messages differ).
"""

import argparse
import concurrent.futures
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CHECKER = ["ci/nix-eval-check.sh", "ci/nix-stubs"]


def tree_files():
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, check=True).stdout
    return [f for f in out.decode().split("\0") if f and os.path.isfile(os.path.join(ROOT, f))]


def make_copy(dest, files, checker_rev):
    for f in files:
        os.makedirs(os.path.join(dest, os.path.dirname(f)), exist_ok=True)
        shutil.copy2(os.path.join(ROOT, f), os.path.join(dest, f))
    if checker_rev:
        for p in CHECKER:
            target = os.path.join(dest, p)
            if os.path.isdir(target):
                shutil.rmtree(target)
            elif os.path.exists(target):
                os.remove(target)
        archive = subprocess.run(["git", "archive", checker_rev, *CHECKER], cwd=ROOT,
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", dest], input=archive, check=True)
    # A git tree, as the flake is evaluated from a checkout.
    git = ["git", "-c", "user.name=m", "-c", "user.email=m@m", "-c", "init.defaultBranch=m"]
    subprocess.run(git + ["init", "-q"], cwd=dest, check=True)
    subprocess.run(git + ["add", "-A"], cwd=dest, check=True)


def apply(dest, m):
    path = os.path.join(dest, m["file"])
    text = open(path).read()
    n = text.count(m["old"])
    if n != 1:
        raise SystemExit(f"nix-mutate: {m['name']!r}: `old` occurs {n} times in {m['file']} (the list is stale)")
    open(path, "w").write(text.replace(m["old"], m["new"]))
    subprocess.run(["git", "add", "-A"], cwd=dest, check=True)


BUSY = "is busy"  # Nix without a daemon: concurrent writers of its SQLite database


def check(dest):
    r = subprocess.run(["bash", "ci/nix-eval-check.sh"], cwd=dest, capture_output=True, text=True)
    out = r.stderr + r.stdout
    lines = [l for l in out.splitlines() if l.strip() and not l.startswith("   ") and BUSY not in l]
    why = next((l for l in lines if "error" in l or "nix-eval-check" in l), lines[-1] if lines else "")
    return r.returncode, why.strip(), out


def run_one(m, template, strict):
    with tempfile.TemporaryDirectory(prefix="nix-mutate-") as d:
        d = os.path.join(d, "tree")
        shutil.copytree(template, d, symlinks=True)
        if m is not None:
            apply(d, m)
        for _ in range(3):
            rc, why, out = check(d)
            if rc == 0 or BUSY not in out or (m and m["expect"] in out):
                break
        # A rejection counts only for the reason the entry names (with
        # --checker-rev, whose messages differ, any rejection counts).
        caught = rc != 0 and (m is None or not strict or m["expect"] in out)
        return rc, caught, why


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-j", type=int, default=2, help="copies checked at once")
    ap.add_argument("--checker-rev", help="take the check and the stand-ins from this git revision")
    ap.add_argument("--list", default=os.path.join(HERE, "nix-mutations.toml"))
    a = ap.parse_args()
    mutations = tomllib.load(open(a.list, "rb"))["mutation"]
    with tempfile.TemporaryDirectory(prefix="nix-mutate-template-") as template:
        # One snapshot of the tree, copied for each edit.
        make_copy(template, tree_files(), a.checker_rev)
        rc, _, why = run_one(None, template, True)
        if rc != 0:
            raise SystemExit(f"nix-mutate: the unedited tree fails the evaluation check: {why}")
        strict = not a.checker_rev
        with concurrent.futures.ThreadPoolExecutor(a.j) as pool:
            results = list(pool.map(lambda m: run_one(m, template, strict), mutations))
    caught = 0
    for m, (rc, ok, why) in zip(mutations, results):
        caught += ok
        if ok:
            print(f"   caught  {m['name']}: {why[:150]}")
        elif rc:
            print(f"   MISSED  {m['name']}: rejected, but not for `{m['expect']}`: {why[:150]}")
        else:
            print(f"   MISSED  {m['name']}: accepted")
    checker = f"the check of {a.checker_rev}" if a.checker_rev else "the evaluation check"
    print(f"   caught {caught}/{len(mutations)} known-bad edits of the flake ({checker})")
    sys.exit(0 if caught == len(mutations) else 1)


if __name__ == "__main__":
    main()
