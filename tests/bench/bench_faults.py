"""Faults, timed: a slot's hand-off, an API server outage, a failover.

How fast the system recovers from a fault is a target met in a benchmark, never a pass/fail
test. Three parts, each on a control plane of its own:

- ``handoff`` (``tests/bench/faults_handoff.py``): a pod holding a shared slot on one node is
  deleted while a pod pinned to another node waits for it; the time until that pod is Running,
  step by step (freed, released, reserved, bound, claimed), with the holder's sweep as built
  and, for comparison, sweeping only every second as before; target: 1 s;
- ``outage`` (``tests/bench/faults_outage.py``): kube-apiserver stopped for N seconds while
  devices vanish and appear; from its return, the time until Instances and their ``nodes``
  match the devices, until the broker pods do too, and until every broker is Running; target:
  5 s;
- ``failover`` (``tests/bench/controller_faults.py``): the active controller replica
  SIGKILLed → a new Instance's broker created by the standby (Instance → broker during the gap).

The hand-off and outage parts each print the machine's speed in the same run (the API server's
ConfigMap create rate). ``python -m tests.bench.bench_faults --help`` lists the
options; ``python -m tests.bench faults`` runs the defaults.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tests.bench import faults_handoff, faults_outage
from tests.bench.controller_faults import failover

PARTS = ("handoff", "outage", "failover")
DEFAULT_HANDOFF_RUNS = 12
DEFAULT_OUTAGES = "10:3,35:3"
DEFAULT_FAILOVER_RUNS = 3


def _outage_plan(text: str) -> list[tuple[float, int]]:
    """``10:3,35:3,90:1`` → [(10.0, 3), (35.0, 3), (90.0, 1)]; a clear error otherwise."""
    plan = []
    for item in text.split(","):
        seconds, _, runs = item.partition(":")
        try:
            plan.append((float(seconds), int(runs or "1")))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"--outages: {item!r} is not SECONDS[:RUNS] (e.g. 10:3)") from None
        if plan[-1][0] <= 0 or plan[-1][1] <= 0:
            raise argparse.ArgumentTypeError(f"--outages: {item!r} must be positive")
    return plan


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench_faults", description=__doc__.split("\n")[0])
    parser.add_argument("--parts", default=",".join(PARTS),
                        help=f"comma-separated, of {', '.join(PARTS)} (default: all)")
    parser.add_argument("--handoff-runs", type=int, default=DEFAULT_HANDOFF_RUNS)
    parser.add_argument("--no-compare", action="store_true",
                        help="skip the hand-off with the old 1 s sweep")
    parser.add_argument("--outages", type=_outage_plan, default=_outage_plan(DEFAULT_OUTAGES),
                        help=f"SECONDS:RUNS,... (default: {DEFAULT_OUTAGES})")
    parser.add_argument("--failover-runs", type=int, default=DEFAULT_FAILOVER_RUNS)
    parser.add_argument("--trace", action="store_true",
                        help="print each outage run's convergence step by step")
    parser.add_argument("--agent-retry-max", type=float, default=None, metavar="S",
                        help="experiment: cap the agents' retry backoff at S seconds "
                             "(settings.api.watch_retry_max_s) in the outage part")
    parser.add_argument("--keep-logs", type=Path, default=None,
                        help="keep the outage part's process logs in this directory")
    args = parser.parse_args(argv)
    parts = {p.strip() for p in args.parts.split(",") if p.strip()}
    if unknown := parts - set(PARTS):
        parser.error(f"--parts: unknown {sorted(unknown)}; expected some of {list(PARTS)}")
    if "handoff" in parts:
        print("-- cross-node slot hand-off after a pod is deleted (target: 1 s)", flush=True)
        faults_handoff.main(args.handoff_runs, compare=not args.no_compare)
    if "outage" in parts:
        print("-- API server outage, devices changing in it (target: 5 s after the return)",
              flush=True)
        results, rate = faults_outage.measure(
            args.outages, trace=print if args.trace else None, keep=args.keep_logs,
            agent_retry_max_s=args.agent_retry_max)
        faults_outage.report(results, rate)
    if "failover" in parts:
        print("-- controller failover (default peering lifetime)", flush=True)
        failover(args.failover_runs)


if __name__ == "__main__":
    main(sys.argv[1:])
