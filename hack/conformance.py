#!/usr/bin/env python3
"""Upstream's own ResourceQuota e2e specs, run against tally and against upstream's quota system.

``make conformance`` (this script) builds upstream's ``e2e.test`` at the pinned version
(``hack/cluster.py``: ``build_e2e_test``, cached beside the control-plane binaries), then runs
its ResourceQuota specs twice, each on a fresh node-less control plane in a temporary
directory:

* **operator**: upstream's quota admission plugin and controller off, tally running
  (``kopf run operator/main.py``), registered as the quota admission webhook;
* **reference**: upstream's own quota system on, no tally.

It prints every focused spec's result in both modes and exits non-zero if tally fails a spec
that reference mode passes (a spec reference mode fails too, for lack of a kubelet say, says
nothing about tally). Both modes run at the same time by default (``--sequential`` for one after
the other); each is bounded by ``--timeout``. Everything started here is stopped at the end, on
failure, on Ctrl-C and on SIGTERM: e2e.test, tally (SIGINT first, so it removes its webhook
configuration), then the control plane. Logs stay in the work directory when something failed.

The planes have their simulated nodes (``cluster.DEFAULT_NODES``, kwok), so the specs' pods are
scheduled and run, and the DRA spec finds a schedulable node. e2e.test flags for such a plane
(checked at v1.37): ``--provider=skeleton --allowed-not-ready-nodes=-1 --num-nodes=2
--e2e-verify-service-account=false`` (no kube-system pods to wait for).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import NoReturn

import cluster

# tally is started the way the e2e tests start it (tests/e2e/operator_process.py).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "e2e"))
import operator_process

MODES = ("operator", "reference")
FOCUS = "ResourceQuota"
SKIP = r"\[Serial\]|\[Slow\]|\[Disruptive\]"
# Upstream's suite on a node-less control plane takes ~6 minutes per mode; a spec that waits
# for something that never comes waits 5 minutes. Ginkgo itself is told to stop a minute before
# this, so that it still writes its report.
DEFAULT_TIMEOUT_S = 1800.0
# Specs spend their time waiting (for status, for deletion), not computing: several at once
# cost little CPU. Upstream's own CI runs this suite with ginkgo -p the same way.
DEFAULT_PROCS = 4
OPERATOR_START_TIMEOUT_S = 120.0
PASSED = "passed"


class ConformanceError(Exception):
    """A run that could not produce a result (the control plane or tally did not start...)."""


class Interrupted(BaseException):
    """SIGTERM (and SIGINT in a child run): unwind, stopping everything started."""


def _say(message: str) -> None:
    print(f"[conformance] {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Spec:
    name: str
    state: str  # ginkgo's: passed, failed, timedout, interrupted, panicked, aborted, skipped
    seconds: float
    message: str = ""


@dataclass
class ModeResult:
    mode: str
    specs: dict[str, Spec] = field(default_factory=dict)
    error: str = ""  # set when the run produced no usable report
    exit_code: int | None = None
    seconds: float = 0.0
    log: str = ""

    def passed(self) -> set[str]:
        return {name for name, spec in self.specs.items() if spec.state == PASSED}

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> ModeResult:
        data = json.loads(text)
        specs = {name: Spec(**spec) for name, spec in data.pop("specs").items()}
        return cls(specs=specs, **data)


# --------------------------------------------------------------------------------------------
# Reading ginkgo's JUnit report


def parse_junit(path: Path) -> dict[str, Spec]:
    """The specs that were selected to run, by full name.

    Specs that the focus and skip filters left out are in the report too, as ``skipped`` with
    the bare message "skipped"; they are dropped. A spec skipped at run time (its message says
    why) is kept. Suite nodes (``[SynchronizedBeforeSuite]``...) are kept only when they failed:
    a failed BeforeSuite is why no spec ran.
    """
    specs: dict[str, Spec] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        raw_name = case.get("name", "")
        state = case.get("status", "")
        skipped = case.find("skipped")
        if skipped is not None and skipped.get("message", "skipped") == "skipped":
            continue
        node, _, name = raw_name.partition("] ")
        if node != "[It":
            if state == PASSED or skipped is not None:
                continue
            name = raw_name
        message = ""
        for tag in ("failure", "error"):
            element = case.find(tag)
            if element is not None:
                message = (element.text or element.get("message") or "").strip()
        if skipped is not None:
            message = skipped.get("message", "").removeprefix("skipped - ")
        specs[name] = Spec(name, state, float(case.get("time") or 0.0), message)
    return specs


# --------------------------------------------------------------------------------------------
# Processes


def _stop_group(process: subprocess.Popen[bytes], first: signal.Signals, grace: float) -> None:
    """Signal ``process``'s own process group (it was started in a session of its own), wait
    ``grace`` seconds, then SIGKILL it."""
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, first)
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@contextlib.contextmanager
def running_tally(state: cluster.State, log: Path) -> Iterator[operator_process.TallyProcess]:
    """tally against ``state``'s control plane as the e2e tests start it
    (``operator_process.TallyProcess``: as deployed, its ServiceAccount's token under the RBAC
    of ``manifests/``, its namespace ``tally-system``, mutual TLS with the API server), in a
    session of its own; yields once its liveness endpoint answers and its webhook configuration
    points at it."""
    tally = operator_process.TallyProcess(
        Path(state.kubeconfig), log, bin_dir=Path(state.bin_dir), new_session=True
    )
    try:
        try:
            tally.start(OPERATOR_START_TIMEOUT_S)
        except operator_process.OperatorError as error:
            first = str(error).splitlines()[0].rstrip(":")
            raise ConformanceError(f"{first} (log: {log})") from None
        yield tally
    finally:
        # SIGINT to its group: Kopf's graceful exit, which removes the webhook configuration;
        # SIGKILL after operator_process.STOP_TIMEOUT_S (20 s).
        tally.kill()


def e2e_command(
    binaries: Path,
    kubeconfig: str,
    report_dir: Path,
    focus: str,
    skip: str,
    timeout: float,
    procs: int,
) -> list[str]:
    """ginkgo running the precompiled e2e.test on ``procs`` processes (upstream's own way of
    running the suite in parallel; [Serial] specs are skipped, the rest are written for it)."""
    return [
        str(binaries / cluster.GINKGO),
        f"--procs={procs}",
        f"--focus={focus}",
        f"--skip={skip}",
        # Ginkgo stops a minute before the hard timeout, so that it still writes its report.
        f"--timeout={max(timeout - 60, 60):.0f}s",
        "-v",
        "--no-color",
        str(binaries / cluster.E2E_TEST),
        "--",
        f"--kubeconfig={kubeconfig}",
        "--provider=skeleton",
        # The plane's simulated nodes; no waiting for kube-system pods (there are none).
        "--allowed-not-ready-nodes=-1",
        f"--num-nodes={cluster.DEFAULT_NODES}",
        "--e2e-verify-service-account=false",
        f"--report-dir={report_dir}",
    ]


def _count_finished(log: Path) -> tuple[int, int]:
    """(finished, not passed) specs so far, from ginkgo's verbose output: one line starting
    with a bullet per finished spec ("• [1.2 seconds]", "• [FAILED] [...]", "S [SKIPPED]")."""
    finished = failed = 0
    with contextlib.suppress(OSError), open(log, errors="replace") as text:
        for line in text:
            if line.startswith("• "):
                finished += 1
                if line.startswith("• [") and not line[3].isdigit():
                    failed += 1
    return finished, failed


def run_mode(
    mode: str, workdir: Path, binaries: Path, focus: str, skip: str, timeout: float, procs: int
) -> ModeResult:
    """One mode, start to finish: control plane (+ tally), e2e.test, report, everything
    stopped again."""
    directory = workdir / mode
    directory.mkdir(parents=True, exist_ok=True)
    log = directory / "e2e.log"
    result = ModeResult(mode, log=str(log))
    started = time.monotonic()
    try:
        _say(f"{mode}: starting a control plane in {directory / 'cluster'}")
        with contextlib.ExitStack() as stack:
            state = stack.enter_context(
                cluster.running(directory / "cluster", mode, nodes=cluster.DEFAULT_NODES)
            )
            tally: operator_process.TallyProcess | None = None
            if mode == "operator":
                tally = stack.enter_context(running_tally(state, directory / "tally.log"))
                _say(f"{mode}: tally is up (log: {directory / 'tally.log'})")
            report_dir = directory / "report"
            command = e2e_command(
                binaries, state.kubeconfig, report_dir, focus, skip, timeout, procs
            )
            _say(f"{mode}: running e2e.test on {procs} processes (log: {log})")
            with open(log, "wb") as sink:
                process = subprocess.Popen(
                    command,
                    cwd=directory,
                    stdout=sink,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            try:
                deadline = time.monotonic() + timeout
                last_progress = time.monotonic()
                while process.poll() is None:
                    if time.monotonic() > deadline:
                        result.error = f"e2e.test did not finish within {timeout:.0f} s"
                        break
                    if time.monotonic() - last_progress > 60:
                        finished, failed = _count_finished(log)
                        _say(f"{mode}: {finished} specs finished, {failed} of them not passed")
                        last_progress = time.monotonic()
                    time.sleep(0.5)
            finally:
                _stop_group(process, signal.SIGTERM, 10)
            result.exit_code = process.returncode
            exited = None if tally is None or tally.process is None else tally.process.poll()
            if exited is not None:
                result.error = (
                    f"tally exited with {exited} during the run (log: {directory / 'tally.log'})"
                )
            junit = report_dir / "junit_01.xml"
            if junit.exists():
                result.specs = parse_junit(junit)
            elif not result.error:
                result.error = f"e2e.test exited {process.returncode} without a report (log: {log})"
    except (cluster.ClusterError, ConformanceError) as error:
        result.error = str(error)
    result.seconds = time.monotonic() - started
    return result


# --------------------------------------------------------------------------------------------
# Both modes, and the comparison


def _ignore(signum: int, frame: FrameType | None) -> None:
    # A Python no-op rather than SIG_IGN: a signal already pending when the handler changes
    # would otherwise surface as OSError("Signal 15 ignored due to race condition").
    pass


def _raise_interrupted(signum: int, frame: FrameType | None) -> NoReturn:
    """The first SIGINT or SIGTERM unwinds; later ones are ignored, so that they cannot cut
    short the stopping of what was started (which is bounded: a few seconds per process)."""
    signal.signal(signal.SIGINT, _ignore)
    signal.signal(signal.SIGTERM, _ignore)
    raise Interrupted(signal.Signals(signum).name)


def _run_children(
    modes: Sequence[str], workdir: Path, args: argparse.Namespace
) -> dict[str, ModeResult]:
    """Each mode in a child process of its own (this script, ``--child``), at the same time.

    The children share this process group, so a Ctrl-C in the terminal reaches them too; each
    stops what it started. A SIGTERM here is passed on to them.
    """
    children: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for mode in modes:
            command = [
                sys.executable, __file__, "--child", mode, "--workdir", str(workdir),
                "--focus", args.focus, "--skip", args.skip, "--timeout", str(args.timeout),
                "--procs", str(args.procs),
            ]  # fmt: skip
            children[mode] = subprocess.Popen(command, stdin=subprocess.DEVNULL)
        for child in children.values():
            child.wait()
    finally:
        for child in children.values():
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        for child in children.values():
            child.wait()
    results: dict[str, ModeResult] = {}
    for mode, child in children.items():
        path = workdir / mode / "result.json"
        if path.exists():
            results[mode] = ModeResult.from_json(path.read_text())
        else:
            results[mode] = ModeResult(mode, error=f"the {mode} run exited {child.returncode}")
    return results


def excerpt(message: str, limit: int = 40) -> str:
    """The telling part of a ginkgo failure, indented for the report.

    A timed-out quota wait prints the whole ResourceQuota (managedFields and all) between its
    first line and the matcher's phrase ("to have the following .status.used entries: ...");
    what matters is the first line, the ``used:`` block that was last seen, and the phrase with
    what was expected. Other failures are shown from the top.
    """
    lines = [line.rstrip() for line in message.splitlines() if line.strip()]
    # Gomega's phrase after the object it printed: "to have ...", "to equal ...".
    phrase = next((i for i, line in enumerate(lines) if i > 0 and line.startswith("to ")), None)
    if lines and lines[0].startswith("[FAILED] Timed out") and phrase is not None:
        kept = [lines[0]]
        used = next((i for i, line in enumerate(lines[:phrase]) if line.strip() == "used:"), None)
        if used is not None:
            indent = len(lines[used]) - len(lines[used].lstrip())
            kept.append("  last status.used:")
            for line in lines[used + 1 : phrase]:
                if len(line) - len(line.lstrip()) <= indent:
                    break
                kept.append("      " + line.strip())
        kept.extend(lines[phrase:])
        lines = kept
    shown = "\n".join(f"      {line}" for line in lines[:limit])
    more = len(lines) - limit
    return shown + (f"\n      ... ({more} more lines)" if more > 0 else "")


def report(results: dict[str, ModeResult]) -> int:
    """Print both modes' results and the comparison; the exit status."""
    problems = [r for r in results.values() if r.error and not r.specs]
    for result in results.values():
        passed = len(result.passed())
        _say(
            f"{result.mode}: {passed} of {len(result.specs)} specs passed in "
            f"{result.seconds / 60:.1f} min" + (f" — {result.error}" if result.error else "")
        )
    names = sorted(set().union(*(r.specs for r in results.values())))
    short = {name: name.removeprefix("[sig-api-machinery] ") for name in names}
    print()
    print("  ".join(f"{mode:<9}" for mode in results) + "  spec")
    for name in names:
        states = [r.specs[name].state if name in r.specs else "-" for r in results.values()]
        print("  ".join(f"{state:<9}" for state in states) + "  " + short[name])
    print()
    for result in results.values():
        failed = [s for s in result.specs.values() if s.state not in (PASSED, "skipped")]
        for spec in failed:
            print(f"{result.mode} {spec.state}: {short[spec.name]}\n{excerpt(spec.message)}")
    if problems:
        for result in problems:
            print(f"error: the {result.mode} run produced no result: {result.error}")
        return 1
    if "operator" not in results or "reference" not in results:
        only = next(iter(results.values()))
        failed_count = len(only.specs) - len(only.passed())
        print(f"conformance: {len(only.passed())} passed, {failed_count} failed")
        return 0 if failed_count == 0 and not only.error else 1
    reference = results["reference"].passed()
    if not reference:
        print("error: reference mode passed no spec; there is nothing to compare tally with")
        return 1
    operator = results["operator"].passed()
    regressions = sorted(reference - operator)
    extra = sorted(operator - reference)
    if extra:
        print(f"tally passes {len(extra)} spec(s) that reference mode does not:")
        for name in extra:
            print(f"  + {short[name]}")
    if regressions:
        print(f"tally fails {len(regressions)} spec(s) that reference mode passes:")
        for name in regressions:
            ran = results["operator"].specs.get(name)
            print(f"  - {short[name]} ({ran.state if ran else 'not run'})")
    for result in results.values():
        if result.error:
            print(f"warning: {result.mode}: {result.error}")
    # Counted over the specs reference mode passes: the ones tally is held to.
    print(f"conformance: {len(reference) - len(regressions)} passed, {len(regressions)} failed")
    return 1 if regressions else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hack/conformance.py", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--modes", default=",".join(MODES), help="comma-separated: operator,reference (default)"
    )
    parser.add_argument("--focus", default=FOCUS, help=f"ginkgo focus regexp ({FOCUS})")
    parser.add_argument("--skip", default=SKIP, help=f"ginkgo skip regexp ({SKIP})")
    parser.add_argument(
        "--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per mode (1800)"
    )
    parser.add_argument(
        "--procs",
        type=int,
        default=DEFAULT_PROCS,
        help=f"ginkgo processes per mode ({DEFAULT_PROCS})",
    )
    parser.add_argument("--sequential", action="store_true", help="one mode after the other")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--workdir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    signal.signal(signal.SIGTERM, _raise_interrupted)
    signal.signal(signal.SIGINT, _raise_interrupted)
    if args.child:
        try:
            result = run_mode(
                args.child,
                args.workdir,
                cluster.bin_dir(),
                args.focus,
                args.skip,
                args.timeout,
                args.procs,
            )
        except Interrupted:
            return 130
        (args.workdir / args.child / "result.json").write_text(result.to_json())
        return 0

    modes = [mode.strip() for mode in args.modes.split(",") if mode.strip()]
    if not modes or any(mode not in MODES for mode in modes):
        parser.error(f"--modes: expected some of {', '.join(MODES)}")
    workdir = Path(tempfile.mkdtemp(prefix="tally-conformance-"))
    status = 1
    try:
        started = time.monotonic()
        cluster.ensure_binaries()
        binaries = cluster.build_e2e_test()
        _say(f"e2e.test ready in {time.monotonic() - started:.0f} s: {binaries}")
        if args.sequential or len(modes) == 1:
            results = {
                mode: run_mode(
                    mode, workdir, binaries, args.focus, args.skip, args.timeout, args.procs
                )
                for mode in modes
            }
        else:
            results = _run_children(modes, workdir, args)
        status = report(results)
        _say(f"done in {(time.monotonic() - started) / 60:.1f} min")
        return status
    except cluster.ClusterError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except Interrupted:
        print("error: interrupted; everything started was stopped", file=sys.stderr)
        return 130
    finally:
        if status == 0 and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            _say(f"logs and reports kept in {workdir}")


if __name__ == "__main__":
    sys.exit(main())
