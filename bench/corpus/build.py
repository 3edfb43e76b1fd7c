#!/usr/bin/env python3
"""Rebuild the benchmark corpus deterministically (see README.md beside this file).

    .venv/bin/python bench/corpus/build.py [--out FILE]

Same as `python -m embedfleet.bench corpus`; the harness also runs it on first use.
"""

from __future__ import annotations

import sys

from embedfleet.bench.corpus import main

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
