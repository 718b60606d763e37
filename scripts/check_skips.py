#!/usr/bin/env python3
"""Reads GPU test logs (GoogleTest's text output, pytest's -rs summary) and fails when a test
skipped that was meant for the machine at hand: only a skip saying the test needs more GPUs than
there are ("needs 2 GPUs, found 1", "needs two GPUs") is allowed. A run where tests skipped
exits 0 under both runners, so scripts/device_check.sh asks this instead of the exit code alone.

    check_skips.py --gpus N LOG...      prints each skip and its verdict; exit 1 if one is wrong
"""
import argparse
import re
import sys

WORDS = {"one": 1, "two": 2, "three": 3, "four": 4, "eight": 8}


def needed_gpus(reason):
    m = re.search(r"needs (\d+|one|two|three|four|eight) GPUs?", reason)
    if not m:
        return None
    return int(m[1]) if m[1].isdigit() else WORDS[m[1]]


def gtest_skips(text):
    """(test, reason) for every '[  SKIPPED ] Suite.Test (N ms)' line of a GoogleTest log."""
    lines = text.splitlines()
    out = []
    for i, line in enumerate(lines):
        m = re.match(r"\[  SKIPPED \] (\S+) \(\d+ ms\)", line)
        if not m:
            continue
        reason = []
        j = i - 1
        while j >= 0 and not lines[j].startswith("[ RUN      ]"):
            if lines[j].endswith("Skipped"):
                reason = lines[j + 1:i]
                break
            j -= 1
        out.append((m[1], " ".join(reason).strip() or "(no reason given)"))
    return out


def pytest_skips(text):
    """(test, reason) for every 'SKIPPED [n] file:line: reason' line of pytest's -rs summary."""
    return [(m[2], m[3]) for m in re.finditer(r"^SKIPPED \[(\d+)\] (\S+?): (.*)$", text, re.M)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, required=True)
    parser.add_argument("logs", nargs="+")
    args = parser.parse_args()
    bad = 0
    for path in args.logs:
        text = open(path, errors="replace").read()
        for test, reason in gtest_skips(text) + pytest_skips(text):
            needed = needed_gpus(reason)
            ok = needed is not None and needed > args.gpus
            bad += not ok
            verdict = "allowed" if ok else f"NOT ALLOWED on {args.gpus} GPU(s)"
            print(f"skip: {test}: {reason} -- {verdict}")
    if bad:
        print(f"check_skips: {bad} test(s) meant for this machine skipped", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
