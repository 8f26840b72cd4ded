"""A library peer (benchmarks/peer.py's kinds) driven phase by phase: it builds the peer,
prints READY, then for each stdin line `N C` runs N jobs with at most C at once (C threads
or coroutines, each running one job after another: a closed loop of C clients; the burst is
N jobs with C = the pool) and prints one JSON line {"start", "outcomes": [[ok, end], ...]}.
An empty line or EOF ends it.

    python -m benchmarks.peers.library --kind KIND [--durability sync|async|exit] \
        --base-url URL --pg-url URL --db-pool N --max-concurrency C
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.peers.library")
    parser.add_argument("--kind", required=True)
    parser.add_argument("--durability", choices=("sync", "async", "exit"))
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--pg-url", required=True)
    parser.add_argument("--db-pool", type=int, default=10)
    parser.add_argument("--max-concurrency", type=int, default=8)
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    from benchmarks.peer import make_peer, peer_available
    reason = peer_available(args.kind)
    if reason:
        print(json.dumps({"skipped": reason}), flush=True)
        return 0
    peer = make_peer(args.kind, base_url=args.base_url, pg_url=args.pg_url,
                     db_pool=args.db_pool, max_concurrency=args.max_concurrency,
                     poll_s=0.01, durability=args.durability)
    print("READY", flush=True)
    try:
        for line in sys.stdin:
            if not line.strip():
                break
            n, concurrency = (int(x) for x in line.split())
            start = time.time()
            outcomes = peer.run(n, concurrency)
            print(json.dumps({"start": start, "outcomes": outcomes}), flush=True)
    finally:
        peer.close()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code or 0)  # DBOS and the async pools may leave non-daemon threads behind
