#!/usr/bin/env python3
"""Compiles every .cpp of a compile_commands.json for syntax only, all at once on every core.

    scripts/check-includes.py BUILD_DIR/compile_commands.json

scripts/test.sh points it at a build configured without the precompiled header and with warnings
as errors, so that a file which uses what it does not include fails here. Prints each failure's
compiler output and a one-line count; exits 1 if any unit failed.
"""
import concurrent.futures
import json
import os
import re
import subprocess
import sys


def check(unit):
    command = re.sub(r" -o \S+", "", unit["command"]) + " -fsyntax-only"
    done = subprocess.run(command, shell=True, cwd=unit["directory"], capture_output=True,
                          text=True)
    return done.returncode, done.stdout + done.stderr


def read_units(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        sys.exit(f"check-includes.py: cannot read the compile commands {path}: {e}")


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    units = [u for u in read_units(sys.argv[1]) if u["file"].endswith(".cpp")]
    with concurrent.futures.ThreadPoolExecutor(len(os.sched_getaffinity(0))) as pool:
        results = list(pool.map(check, units))
    failed = [out for code, out in results if code != 0]
    print("".join(failed), end="")
    print(f"[test] {len(units)} translation units without the precompiled header, warnings as "
          f"errors: {len(failed)} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
