#!/usr/bin/env python3
"""Run two foldprint binaries on the same experiments (CPU backend) and say
whether what they write is the same: goldens byte for byte, report JSON
apart from times and the git revision, the table apart from its TIME
column, JUnit apart from times, and the dump files byte for byte.

    tools/same-outputs.py OLD_BINARY NEW_BINARY [EXPERIMENT ...]

Used to show that a refactor moved no output (ARCHITECTURE.md). Exit 0 when
all is the same, 1 otherwise (each difference listed).
"""
import difflib
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

TIMES = re.compile(r"(_ms|_s|seconds)$")


def strip_times(v):
    """The JSON without anything that measures time or names the build."""
    if isinstance(v, dict):
        return {
            k: strip_times(x)
            for k, x in v.items()
            if not TIMES.search(k) and k not in ("timings", "git", "startup_ms")
        }
    if isinstance(v, list):
        return [strip_times(x) for x in v]
    return v


def table(text):
    """The table without the TIME column (its last field) and `... ms`."""
    return [re.sub(r"\s+[0-9.]+ (ms|s)\s*$", "", line) for line in text.splitlines()]


def junit(text):
    return re.sub(r'time="[0-9.]+"', 'time=""', re.sub(r'timestamp="[^"]*"', "", text))


def run(binary, args, cwd):
    p = subprocess.run([binary, *args], cwd=cwd, capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def outputs(binary, exp, work, nan):
    work.mkdir()
    extra = ["--nan-policy", "preserve"] if nan else []
    out = {}
    rc, text, err = run(binary, ["run", str(exp), "--backend", "cpu", "--out", "r.json",
                                 "--junit", "j.xml", "--dump", "d", *extra], work)
    out["run exit code"] = [str(rc)]
    out["table"] = table(text)
    if (work / "r.json").exists():
        out["report"] = json.dumps(strip_times(json.loads((work / "r.json").read_text())),
                                   indent=1, sort_keys=True).splitlines()
        out["junit"] = junit((work / "j.xml").read_text()).splitlines()
        out["dump files"] = sorted(
            f"{f.name} {f.stat().st_size}" for f in (work / "d").glob("*.bin"))
        out["SHA256SUMS"] = (work / "d" / "SHA256SUMS").read_text().splitlines()
    (work / "g").mkdir()
    rc, _, err = run(binary, ["golden", str(exp), "--golden", "g", *extra], work)
    out["golden exit code"] = [str(rc)]
    for g in sorted((work / "g").glob("*.json")):
        out[f"golden {g.name}"] = g.read_text().splitlines()
    return out


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    old, new = (str(Path(b).resolve()) for b in sys.argv[1:3])
    root = Path(__file__).resolve().parent.parent
    exps = [Path(e).resolve() for e in sys.argv[3:]] or sorted(
        [*(root / "experiments").glob("*.toml"), *(root / "experiments/preserve").glob("*.toml")])
    same = True
    with tempfile.TemporaryDirectory() as t:
        for i, exp in enumerate(exps):
            nan = exp.parent.name == "preserve"
            a = outputs(old, exp, Path(t) / f"old{i}", nan)
            b = outputs(new, exp, Path(t) / f"new{i}", nan)
            for what in sorted(set(a) | set(b)):
                if a.get(what) != b.get(what):
                    same = False
                    print(f"DIFFERS {exp.name}: {what}")
                    for line in list(difflib.unified_diff(a.get(what, []), b.get(what, []),
                                                          "old", "new", lineterm="", n=1))[:40]:
                        print("   ", line)
            print(f"{'same' if all(a.get(k) == b.get(k) for k in set(a) | set(b)) else 'DIFF'}"
                  f"  {exp.name}: {', '.join(sorted(a))}")
    sys.exit(0 if same else 1)


main()
