"""The request parser's differential fuzzer, long: N generated requests to troupe's
parser and to h11 (troupe_rig.http_fuzz), every disagreement explained by one of the
documented choices or printed as a bug.

    .venv/bin/python bench/fuzz_http.py --count 100000

Prints how many requests were read alike (as a request, as an error, as incomplete),
how many differed by each choice, and any unexplained one (exit status 1).
"""

from __future__ import annotations

import argparse
import collections
import sys
import time

from hypothesis import HealthCheck, Phase, given, settings

from troupe_rig.http_fuzz import compare, requests


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=100_000, help="requests to generate")
    args = parser.parse_args()
    agree: collections.Counter[str] = collections.Counter()
    choices: collections.Counter[str] = collections.Counter()
    bugs: list[str] = []

    @settings(
        max_examples=args.count,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(requests())
    def one(data: bytes) -> None:
        ours, theirs, why = compare(data)
        if why == "":
            agree[ours.kind] += 1
        elif why is None:
            bugs.append(f"{data!r}\n  troupe: {ours}\n  h11:    {theirs}")
        else:
            choices[f"{why} (troupe {ours.kind}, h11 {theirs.kind})"] += 1

    start = time.monotonic()
    one()
    took = time.monotonic() - start
    total = sum(agree.values()) + sum(choices.values()) + len(bugs)
    print(f"{total} requests in {took:.0f} s")
    print(
        f"  alike: {sum(agree.values())} ({', '.join(f'{k} {v}' for k, v in agree.most_common())})"
    )
    for name, n in choices.most_common():
        print(f"  differ by a documented choice: {n:6d} {name}")
    print(f"  unexplained: {len(bugs)}")
    for bug in bugs[:20]:
        print(bug)
    return 1 if bugs else 0


if __name__ == "__main__":
    sys.exit(main())
