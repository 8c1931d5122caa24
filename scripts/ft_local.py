#!/usr/bin/env python3
"""Replica-group fault tolerance on one machine: a torchft lighthouse and N replica groups,
each a `run_train.sh` job of M ranks, stopped together when this script ends.

    python scripts/ft_local.py --groups 2 --ranks 2 --dump outputs/ft -- --training.steps=60
    python scripts/ft_local.py --groups 2 --ranks 2 --kill 1@20 --restart-at 30 -- ...

Each group trains with `--fault_tolerance.enable=true --fault_tolerance.replica_id=<g>
--fault_tolerance.group_size=<N>`, its own dump folder `<dump>/group_<g>` (console.log,
metrics.jsonl, its data positions) and the shared checkpoint folder `<dump>/checkpoint` (one
group writes it). `--kill G@S` SIGKILLs every process of group G once it logs step S;
`--restart-at R` starts it again once group 0 logs step R. At the end: each group's exit
code, the survivors' step times around the kill, the restarted group's time from its start
to its first step after healing, and the weights digests both sides logged at the heal.
(Cluster: one launch per group with the same keys; docs/reliability.md.)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEP = re.compile(r"\bstep\s+(\d+)/\d+\s+loss\b")
HEALED = re.compile(r"healed from a live replica group at step (\d+) \(weights digest (\w+)\)")
SENT = re.compile(r"sending step (\d+) to a healing replica group \(weights digest (\w+)\)")


def descendants(pid: int) -> list[int]:
    """`pid` and every process below it (run_train.sh, torchrun, its workers in sessions of
    their own)."""
    children: dict[int, list[int]] = {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(parent, []).append(int(name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def kill_all(pid: int) -> None:
    for p in descendants(pid):
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def group_args(g: int, args, overrides: list[str]) -> list[str]:
    """run_train.sh's arguments for replica group `g`."""
    return [
        "--fault_tolerance.enable=true",
        f"--fault_tolerance.replica_id={g}",
        f"--fault_tolerance.group_size={args.groups}",
        f"--job.dump_folder={os.path.join(args.dump, f'group_{g}')}",
        f"--checkpoint.folder={os.path.abspath(os.path.join(args.dump, 'checkpoint'))}",
        *overrides,
    ]


def kill_spec(text: str) -> tuple[int, int]:
    """--kill G@S -> (G, S)."""
    group, _, step = text.partition("@")
    if not (group.isdigit() and step.isdigit() and int(step) >= 1):
        raise argparse.ArgumentTypeError(f"'{text}': give G@S, a group and a step >= 1 (e.g. 1@20)")
    return int(group), int(step)


def check(ap, args) -> None:
    """Every bad input in one line (argparse's error: exit 2) before anything starts or is
    written: this script's own, then the groups' config (group 0's, as a dry run's check)."""
    if args.groups < 1 or args.ranks < 1:
        ap.error(f"--groups={args.groups} --ranks={args.ranks}: both must be >= 1")
    if args.kill is not None and args.kill[0] >= args.groups:
        ap.error(f"--kill={args.kill[0]}@{args.kill[1]}: there are groups 0..{args.groups - 1}")
    if args.restart_at and args.kill is None:
        ap.error("--restart-at: restarts the group --kill stops; give --kill too")
    sys.path.insert(0, ROOT)
    from torchtitan.checks import load_config
    from torchtitan.config import ConfigError

    try:
        config = os.environ.get("CONFIG_FILE", "train_configs/llama3_debug.toml")  # run_train.sh's
        path = config if os.path.isfile(config) else os.path.join(ROOT, config)
        argv = [f"--job.config_file={path}", *group_args(0, args, args.overrides)]
        load_config([*argv, "--job.dry_run=true"], args.ranks)
    except ConfigError as e:
        ap.error(str(e))


class Group:
    """One replica group's run_train.sh, its console lines watched."""

    def __init__(self, g: int, args, lighthouse: str, overrides: list[str]):
        self.g, self.args, self.lighthouse, self.overrides = g, args, lighthouse, overrides
        self.folder = os.path.join(args.dump, f"group_{g}")
        self.proc: subprocess.Popen | None = None
        self.steps: dict[int, float] = {}  # step -> when its line appeared (this launch)
        self.lines: list[str] = []
        self.started = 0.0
        self.launches = 0

    def start(self) -> None:
        os.makedirs(self.folder, exist_ok=True)
        env = {
            **os.environ,
            "NGPU": str(self.args.ranks),
            "TORCHFT_LIGHTHOUSE": self.lighthouse,
            "LOG_RANK": os.environ.get("LOG_RANK", "0"),
        }
        cmd = [os.path.join(ROOT, "run_train.sh"), *group_args(self.g, self.args, self.overrides)]
        self.launches += 1
        self.steps = {}
        self.started = time.monotonic()
        log = open(os.path.join(self.folder, f"console_{self.launches}.log"), "w")
        self.proc = subprocess.Popen(
            cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        threading.Thread(target=self._read, args=(self.proc, log), daemon=True).start()

    def _read(self, proc, log) -> None:
        for line in proc.stdout:
            log.write(line)
            log.flush()
            self.lines.append(line)
            print(f"[group {self.g}] {line}", end="", flush=True)
            m = STEP.search(line)
            if m:
                self.steps.setdefault(int(m.group(1)), time.monotonic())

    def last_step(self) -> int:
        return max(self.steps, default=0)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            kill_all(self.proc.pid)
            self.proc.wait()

    def terminate(self) -> None:
        """SIGTERM to the group's run_train.sh (as Slurm preempts a job): it passes it on to
        its ranks, which finish the step and stop."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)


def _readable(summary: dict, args, kill_s) -> list[str]:
    """The summary as the lines a reader wants: steps done, the survivor's step times around
    the kill, the restarted group's time to its first step, the weights compared at the heal."""
    lines = [
        f"exit codes {summary['exit_codes']}; group 0 completed {summary['group0_steps']} steps"
    ]
    gaps = {int(s): t for s, t in summary["group0_step_seconds"].items()}
    if gaps:
        median = sorted(gaps.values())[len(gaps) // 2]
        worst = max(gaps, key=gaps.get)
        lines.append(
            f"group 0's longest step: {gaps[worst]:.2f} s (step {worst}), median {median:.2f} s"
        )
        if kill_s is not None:
            near = [s for s in sorted(gaps) if kill_s - 3 <= s <= kill_s + 4]
            lines.append(
                "group 0's step times around the kill: "
                + ", ".join(f"{s}: {gaps[s]:.2f} s" for s in near)
            )
    if "healed" in summary:
        lines.append(
            f"restarted group: its first step {summary['restart_to_first_step_s']} s after its start"
        )
        if summary["healed"]:
            step, mine = summary["healed"]
            theirs = [d for s, d in summary["sent"]]
            same = "bitwise equal" if theirs == [mine] else "DIFFERENT"
            lines.append(
                f"healed at step {step}: weights digest {mine} (healed) vs"
                f" {', '.join(theirs) or 'none'} (sent): {same}"
            )
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--groups", type=int, default=2)
    ap.add_argument("--ranks", type=int, default=2, help="ranks per group (NGPU)")
    ap.add_argument("--dump", default="outputs/ft")
    ap.add_argument("--min-replicas", type=int, default=1)
    ap.add_argument(
        "--kill", type=kill_spec, default=None, help="G@S: SIGKILL group G once it logs step S"
    )
    ap.add_argument(
        "--restart-at", type=int, default=0, help="restart it once group 0 logs this step"
    )
    ap.add_argument(
        "--signal",
        choices=("KILL", "TERM"),
        default="KILL",
        help="--kill's signal: KILL every process of the group, or TERM its run_train.sh",
    )
    ap.add_argument("--timeout", type=float, default=1800.0)
    ap.add_argument("overrides", nargs="*", help="run_train.sh overrides, after --")
    args = ap.parse_args()
    check(ap, args)
    # torchft's Rust side logs every quorum and commit at INFO; its warnings are enough here
    os.environ.setdefault("RUST_LOG", "warn")
    from torchft._torchft import LighthouseServer

    lighthouse = LighthouseServer(
        bind="[::]:0",
        min_replicas=args.min_replicas,
        join_timeout_ms=1000,
        quorum_tick_ms=100,
        heartbeat_timeout_ms=2000,
    )
    address = lighthouse.address()
    print(
        f"[ft_local] lighthouse at {address}; {args.groups} groups x {args.ranks} ranks", flush=True
    )
    groups = [Group(g, args, address, args.overrides) for g in range(args.groups)]
    kill_g, kill_s = args.kill if args.kill is not None else (None, None)
    killed_at = restarted_at = None
    around: dict[int, float] = {}
    try:
        for grp in groups:
            grp.start()
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline:
            if kill_g is not None and killed_at is None and groups[kill_g].last_step() >= kill_s:
                if args.signal == "KILL":
                    groups[kill_g].kill()
                    what = f"killed every rank of group {kill_g} (SIGKILL)"
                else:
                    groups[kill_g].terminate()
                    what = f"sent SIGTERM to group {kill_g}'s run_train.sh"
                killed_at = time.monotonic()
                print(f"[ft_local] {what} at its step {kill_s}", flush=True)
            if (
                killed_at is not None
                and restarted_at is None
                and args.restart_at
                and groups[0].last_step() >= args.restart_at
            ):
                groups[kill_g].start()
                restarted_at = time.monotonic()
                print(
                    f"[ft_local] restarted group {kill_g} at group 0's step {args.restart_at}",
                    flush=True,
                )
            alive = [grp for grp in groups if grp.proc.poll() is None]
            if not alive:
                break
            time.sleep(0.1)
        else:
            print(f"[ft_local] timed out after {args.timeout:.0f} s", flush=True)
            return 1
        around = dict(groups[0].steps)
    finally:
        for grp in groups:
            grp.kill()
        lighthouse.shutdown()
    codes = [grp.proc.returncode for grp in groups]
    summary = {"exit_codes": codes, "group0_steps": groups[0].last_step()}
    if kill_g is not None and restarted_at is None:
        summary["stopped_group_steps"] = groups[kill_g].last_step()
    times = sorted(around.items())
    gaps = {s: round(b - a, 3) for (_, a), (s, b) in zip(times, times[1:])}
    summary["group0_step_seconds"] = gaps
    if restarted_at is not None:
        g = groups[kill_g]
        text = "".join(g.lines)
        heal = HEALED.findall(text)
        first = min(g.steps.values(), default=None)
        summary["restart_to_first_step_s"] = round(first - restarted_at, 2) if first else None
        summary["healed"] = heal[-1] if heal else None
        sent = SENT.findall("".join(groups[0].lines))
        summary["sent"] = [s for s in sent if heal and s[0] == heal[-1][0]]
    for line in _readable(summary, args, kill_s):
        print(f"[ft_local] {line}", flush=True)
    print("[ft_local] summary " + json.dumps(summary), flush=True)
    # a group stopped on purpose and not restarted: SIGKILL (any code), SIGTERM (preempted: 75)
    expected = [0] * len(codes)
    if kill_g is not None and restarted_at is None:
        expected[kill_g] = codes[kill_g] if args.signal == "KILL" else 75
    return 0 if codes == expected else 1


if __name__ == "__main__":
    sys.exit(main())
