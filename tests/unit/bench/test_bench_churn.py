"""bench/churn.py's arithmetic and judgement, on plain data: the schedules and the tight limit,
percentiles per phase, CPU per status update less a baseline, the targets, the quota checks and
the replenishment watch's lookup; and bench/_kubelet_patcher.py's updates (every one a change,
none a change any quota counts) and its open loop, in virtual time (hand-computed
expectations)."""

from __future__ import annotations

import asyncio
import random
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[3] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

# bench/ is put on sys.path above, as the benchmarks run.
import _kubelet_patcher as patcher  # noqa: E402
import churn  # noqa: E402

pytestmark = pytest.mark.unit

KOPF = churn.KOPF_WATCH


# -- schedules and limits


def test_within_keeps_poisson_arrivals_inside_the_time() -> None:
    offsets = churn.within(50.0, 20.0, random.Random(3))

    assert offsets == sorted(offsets)
    assert 0 < offsets[0]
    assert offsets[-1] < 20.0
    assert 1000 == pytest.approx(len(offsets), rel=0.1)  # 50/s for 20 s
    assert offsets == churn.within(50.0, 20.0, random.Random(3))


def test_the_schedule_is_a_warm_up_then_each_phase_in_blocks() -> None:
    plan = churn.Plan(phase_s=40.0, blocks=2, warmup_s=5.0)
    blocks = churn.schedule(plan)

    assert [("warm-up", 0, 5.0, True), ("calm", 0, 20.0, False), ("calm", 1, 20.0, False),
            ("churn", 0, 20.0, True), ("churn", 1, 20.0, True)] == [
        (b.phase, b.index, b.seconds, b.churn) for b in blocks
    ]  # fmt: skip
    assert all(block.creates[-1] < block.seconds for block in blocks)
    assert blocks == churn.schedule(plan)  # both sides, and every run with the seed
    assert blocks != churn.schedule(churn.Plan(phase_s=40.0, blocks=2, warmup_s=5.0, seed=2))


def block(phase: str, creates: int, deletes: int = 0) -> churn.Block:
    return churn.Block(phase, 0, 10.0, [0.1] * creates, [0.1] * deletes, phase != "calm")


def test_the_last_namespace_fills_half_way_through_the_churn_phase() -> None:
    # 12 creates in all, round robin over 2 namespaces: 2 warm-up, 4 calm, 6 churn. Half of the
    # churn's creates have been sent after create 9 (indices 0..8), of which 1, 3, 5, 7 went to
    # the last namespace: it holds its 5 pods, plus those 4.
    plan = churn.Plan(pods=11, namespaces=2)
    blocks = [block("warm-up", 2, 1), block("calm", 4, 3), block("churn", 6, 2)]

    assert {"churn-0": 6, "churn-1": 5} == plan.initial_pods()
    assert {"churn-0": None, "churn-1": 9} == churn.hard_pods(plan, blocks)
    assert 1 + 3 + 2 + 5 == churn.replenish_pods(blocks)


# -- what a phase saw


def test_a_phase_summary_has_nearest_rank_percentiles_of_what_ran_in_it() -> None:
    record = churn.Record(seconds=60.0, cpu_s={"tally": 3.0})
    record.creates = [i / 1000 for i in range(1, 1001)]  # 1 ms .. 1000 ms
    record.send_lags = [0.0] * 990 + [0.005] * 10
    record.refused = 4
    record.replenish = [0.010, 0.020, 0.030, 0.040]
    record.delete_answered = [0.004, 0.002, 0.008]
    record.replenish_seen = [0.006, -0.001, 0.003, 0.012]
    record.add_updates({"updates": 9000, "seconds": 30.0, "latencies_ms": [5.0, 7.0, 9.0],
                        "skipped": 12, "errors": {"429": 2}})  # fmt: skip
    record.add_updates({"updates": 3000, "seconds": 30.0, "latencies_ms": [11.0],
                        "skipped": 0, "errors": {"429": 1, "connection": 1}})  # fmt: skip

    record.drained_s = [1.0, 3.0]
    summary = record.summary()

    assert [1.0, 3.0] == summary.pop("drained_s")
    assert {"tally": 3.0} == summary.pop("cpu_s")
    assert {"429": 3, "connection": 1} == summary.pop("update_errors")
    assert {
        "seconds": 60.0, "creates": 1000, "refused": 4,
        "create_p50_ms": 500.0, "create_p99_ms": 990.0, "create_p99_9_ms": 999.0,
        "create_max_ms": 1000.0, "send_lag_p99_ms": 0.0,
        "deletes": 4, "replenish_p50_ms": 20.0, "replenish_p99_ms": 40.0,
        "replenish_max_ms": 40.0, "delete_answered_p50_ms": 4.0,
        "replenish_seen_p50_ms": 3.0, "replenish_seen_p99_ms": 12.0,
        "updates": 12000, "updates_per_s": 200.0, "update_skipped": 12,
        "update_p50_ms": 7.0, "update_p99_ms": 11.0,
    } == pytest.approx(summary)  # fmt: skip


def test_a_quiet_phase_has_only_its_time_and_cpu() -> None:
    assert {"seconds": 10.0, "cpu_s": {"etcd": 0.2}} == churn.Record(10.0, {"etcd": 0.2}).summary()


def test_cpu_is_summed_over_blocks_per_process() -> None:
    record = churn.Record()
    record.add_cpu({"tally": 10.0, "etcd": 5.0}, {"tally": 11.5, "etcd": 5.25})
    record.add_cpu({"tally": 20.0, "etcd": 6.0}, {"tally": 20.5, "etcd": 6.25})
    # A process that started between the two readings counts from its first one.
    record.add_cpu({"tally": 1.0}, {"tally": 1.0, KOPF: 0.3})

    assert {"tally": 2.0, "etcd": 0.5, KOPF: 0.0} == pytest.approx(record.cpu_s)


def test_the_machine_line_of_proc_stat_gives_process_interrupt_and_stolen_time() -> None:
    # user nice system idle iowait irq softirq steal guest guest_nice, in ticks of 1/100 s:
    # processes 100 + 20 + 30 = 150 ticks, interrupts 5 + 5, stolen 40.
    stat = "cpu  100 20 30 900 50 5 5 40 10 0\ncpu0 50 10 15 450 25 2 3 20 5 0\n"
    assert {churn.MACHINE: 1.5, churn.INTERRUPTS: 0.1, churn.STEAL: 0.4} == pytest.approx(
        churn.machine_seconds(stat, 100.0)
    )


def test_a_phase_says_what_else_kept_the_machine_busy() -> None:
    # 10 s: processes kept the machine busy 15 s (1.5 cores), of which the side's and the
    # benchmark 11 s: 0.4 cores elsewhere; 1 s in interrupts, 2 s stolen: 0.1 and 0.2 cores.
    # Neither of the last two is a CPU per update.
    cpu = {churn.MACHINE: 15.0, churn.INTERRUPTS: 1.0, churn.STEAL: 2.0, "tally": 6.0,
           churn.BENCHMARK: 1.0, "kube-apiserver": 4.0}  # fmt: skip
    summary = churn.Record(10.0, cpu).summary()
    assert (0.4, 0.1, 0.2) == pytest.approx(
        (summary["other_cores"], summary["interrupt_cores"], summary["stolen_cores"])
    )
    per_update = churn.cpu_ms_per_update(
        {**summary, "updates": 1000}, {"seconds": 10.0, "cpu_s": {}}
    )
    assert {churn.MACHINE, "tally", churn.BENCHMARK, "kube-apiserver"} == set(per_update)
    assert 15.0 == pytest.approx(per_update[churn.MACHINE])


def test_cpu_per_update_is_the_phase_cpu_less_the_baseline_rate_over_the_updates() -> None:
    # 30 s of status churn, 6 000 updates. tally: 9.0 s of CPU, of which its quiet rate (1.0 s
    # in 10 s) accounts for 3.0 s: 6.0 s / 6 000 = 1.0 ms. The watch: 4.5 s less 0.3 s * 3 =
    # 3.6 s: 0.6 ms. A process missing from the baseline is counted whole.
    phase = {"seconds": 30.0, "updates": 6000, "cpu_s": {"tally": 9.0, KOPF: 4.5, "new": 0.6}}
    quiet = {"seconds": 10.0, "cpu_s": {"tally": 1.0, KOPF: 0.3}}

    assert {"tally": 1.0, KOPF: 0.6, "new": 0.1} == pytest.approx(
        churn.cpu_ms_per_update(phase, quiet)
    )
    assert {} == churn.cpu_ms_per_update({"seconds": 30.0, "cpu_s": {"tally": 9.0}}, quiet)


def side(create_p99: float, replenish_p50: float, cpu: dict[str, float]) -> dict[str, Any]:
    def phase(p50: float, p99: float, replenish: float) -> dict[str, float]:
        return {"create_p50_ms": p50, "create_p99_ms": p99, "create_p99_9_ms": p99 * 1.2,
                "updates_per_s": 200.0, "replenish_p50_ms": replenish,
                "replenish_p99_ms": replenish * 2, "replenish_seen_p50_ms": replenish / 4,
                "delete_answered_p50_ms": replenish / 2}  # fmt: skip

    return {
        "phases": {"calm": phase(10.0, 30.0, 15.0),
                   "churn": phase(50.0, create_p99, replenish_p50)},
        "cpu_ms_per_update": {"status only": cpu, "churn": cpu},
    }  # fmt: skip


def test_the_three_targets_are_ratios_of_the_same_run() -> None:
    upstream = side(200.0, 100.0, {"kube-controller-manager": 0.4, "kube-apiserver": 4.0})
    tally = side(290.0, 110.0, {"tally": 1.5, KOPF: 1.0, "kube-apiserver": 4.0})

    found = churn.targets(upstream, tally)

    assert [
        ("create p99 under churn", 290.0, 200.0, "upstream", 1.45, True),
        ("CPU per status-only update", 1.5, 1.0, "Kopf pod watch", 1.5, False),
        ("replenishment p50 under churn", 110.0, 100.0, "upstream", 1.1, False),
    ] == [
        (t.name, t.tally, t.reference, t.reference_name, pytest.approx(t.ratio), t.met)
        for t in found
    ]
    assert [1.5, 1.2, 1.0] == [t.limit for t in found]
    assert (
        "create p99 under churn: tally 290.00 ms, upstream 200.00 ms: 1.45x (meets <= 1.5x)"
        == found[0].line()
    )
    assert found[1].line().endswith("1.50x (misses <= 1.2x)")


def test_a_ratio_at_the_limit_meets_it() -> None:
    assert churn.Target("t", "ms", 120.0, 100.0, "upstream", 1.2).met
    assert not churn.Target("t", "ms", 121.0, 100.0, "upstream", 1.2).met


def panel(figure: churn.Figure) -> tuple[float, float | None, str, str | None]:
    return figure.tally, figure.reference, figure.reference_name, figure.target


def test_the_figures_compare_tally_with_upstream_kcm_and_the_kopf_watch() -> None:
    upstream = side(200.0, 100.0, {"kube-controller-manager": 0.4})
    tally = side(290.0, 110.0, {"tally": 1.5, KOPF: 1.0})
    figures = churn.figures_of(upstream, tally, churn.targets(upstream, tally))
    by_name = {figure.name: panel(figure) for figure in figures}

    assert (290.0, 200.0, "upstream", "<= 1.5x") == by_name["create p99, under churn"]
    assert (1.5, 0.4, "kube-controller-manager", None) == (
        by_name["CPU per status update: tally vs kube-controller-manager"]
    )
    assert (1.5, 1.0, "Kopf pod watch", "<= 1.2x") == (
        by_name["CPU per status update: tally vs a Kopf pod watch"]
    )
    assert "<= 1.0x" == by_name["replenishment p50, under churn"][3]
    # The split has no target of its own: the target stays on the whole replenishment.
    assert (27.5, 25.0, "upstream", None) == (
        by_name["replenishment p50 from the deletion's watch event, under churn"]
    )
    assert (55.0, 50.0, "upstream", None) == by_name["DELETE answered p50, under churn"]
    assert ["status updates reached, under churn"] == [
        f.name for f in figures if f.better != "lower"
    ]
    assert 3 == sum(1 for figure in figures if figure.target)


def test_a_load_controls_panels_name_the_loaded_upstream_and_drop_its_targets() -> None:
    upstream = side(200.0, 100.0, {"kube-controller-manager": 0.4})
    tally = side(290.0, 110.0, {"tally": 1.5, KOPF: 1.0})
    figures = churn.figures_of(upstream, tally, churn.targets(upstream, tally))
    by_name = {f.name: panel(f) for f in churn.load_control_figures(figures)}

    assert (290.0, 200.0, "upstream + Kopf watch", None) == by_name["create p99, under churn"]
    assert (None, "upstream + Kopf watch") == (
        by_name["replenishment p50, under churn"][3],
        by_name["replenishment p50, under churn"][2],
    )
    # Against tally's own plane: the same comparison as in a standard run, target kept.
    assert (1.5, 1.0, "Kopf pod watch", "<= 1.2x") == (
        by_name["CPU per status update: tally vs a Kopf pod watch"]
    )
    assert (1.5, 0.4, "kube-controller-manager", None) == (
        by_name["CPU per status update: tally vs kube-controller-manager"]
    )
    assert [f.name for f in figures] == list(by_name)


def test_the_floor_side_is_compared_without_a_target() -> None:
    # side(): calm p99 30 ms; churn p99 as given.
    floor = side(100.0, 0.0, {churn.FLOOR: 0.0})
    tally = side(290.0, 110.0, {"tally": 1.5, KOPF: 1.0})
    upstream = side(200.0, 100.0, {"kube-controller-manager": 0.4})

    lines = churn.floor_lines(floor, tally, upstream)
    figures = {figure.name: panel(figure) for figure in churn.floor_figures(floor, tally)}

    assert [
        "calm: create p99 floor 30.0 ms; tally / floor 1.00x, upstream / floor 1.00x",
        "churn: create p99 floor 100.0 ms; tally / floor 2.90x, upstream / floor 2.00x",
    ] == lines
    assert {
        "create p99, no churn: tally vs floor": (30.0, 30.0, "floor", None),
        "create p99, under churn: tally vs floor": (290.0, 100.0, "floor", None),
    } == figures


# -- the checks


HARD = {"pods": "100", "count/pods": "100", "requests.cpu": "1"}


def quota(used: dict[str, str], pods: int, cpu_m: int | None = None) -> churn.QuotaState:
    return churn.QuotaState(HARD, used, pods, pods * 10 if cpu_m is None else cpu_m)


def test_a_quota_that_matches_its_pods_has_no_problem() -> None:
    used = {"pods": "100", "count/pods": "100", "requests.cpu": "1"}
    assert [] == churn.quota_problems("ns", quota(used, 100))


def test_over_admission_and_a_double_charge_are_problems() -> None:
    used = {"pods": "101", "count/pods": "101", "requests.cpu": "1010m"}
    assert [
        "ns: pods used 101, above hard 100",
        "ns: count/pods used 101, above hard 100",
        "ns: requests.cpu used 1010m, above hard 1",
        "ns: 101 pods, over hard pods 100",
    ] == churn.quota_problems("ns", quota(used, 101))
    # Charged twice for one pod: used above what the pods add up to.
    assert [
        "ns: pods used 51, the pods listed add up to 50",
        "ns: requests.cpu used 510m, the pods listed add up to 500m",
    ] == churn.quota_problems(
        "ns", quota({"pods": "51", "count/pods": "50", "requests.cpu": "510m"}, 50)
    )


def test_a_resource_missing_from_used_is_a_problem() -> None:
    assert ["ns: status.used has no count/pods"] == churn.quota_problems(
        "ns", quota({"pods": "5", "requests.cpu": "50m"}, 5)
    )


def test_every_admitted_pod_is_listed_and_no_other() -> None:
    expected = {"churn-0": 510, "churn-1": 505, "churn-replenish": 5}
    assert [] == churn.count_problems(dict(expected), expected)
    assert [
        "churn-0: 511 pods listed, 510 admitted and not deleted",
        "churn-replenish: 0 pods listed, 5 admitted and not deleted",
    ] == churn.count_problems({"churn-0": 511, "churn-1": 505}, expected)


def test_only_the_tight_quotas_refusals_are_expected() -> None:
    refusals = [
        "churn-2 403: exceeded quota: q, requested: pods=1, used: pods=10, limited: pods=10",
        'churn-2 403: admission webhook "quota.tally.dev" denied the request: exceeded quota: q',
        "churn-0 403: exceeded quota: q, requested: pods=1",
        "churn-2 500: Internal error occurred: failed calling webhook",
    ]
    assert refusals[2:] == churn.refusal_problems(refusals, "churn-2")


def test_a_deletion_shows_as_its_deletion_timestamp_or_its_deleted_event() -> None:
    assert churn.shows_deletion(
        "MODIFIED", {"name": "p", "deletionTimestamp": "2026-11-29T13:00:00Z"}
    )
    assert churn.shows_deletion("DELETED", {"name": "p"})
    assert not churn.shows_deletion("MODIFIED", {"name": "p"})
    assert not churn.shows_deletion("ADDED", {"name": "p", "deletionTimestamp": None})


def test_the_replenishment_watch_finds_the_first_status_after_the_delete() -> None:
    history = [(1.0, 10), (2.0, 9), (3.0, 7), (4.0, 6)]

    assert 2.0 == churn.first_at_most(history, 9, since=1.5)
    assert 3.0 == churn.first_at_most(history, 8, since=1.5)  # two deletions in one status
    assert 3.0 == churn.first_at_most(history, 9, since=2.5)  # only what arrived after it
    assert churn.first_at_most(history, 5, since=0.0) is None


# -- the kubelet patcher


def listed(name: str, status: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ns", "name": name},
        "spec": {"containers": [{"name": "app", "image": "img:1",
                                 "resources": {"requests": {"cpu": "10m"}}}]},
        "status": status or {"phase": "Pending"},
    }  # fmt: skip


def test_each_update_toggles_ready_and_a_container_going_unready_restarted() -> None:
    pod = patcher.PodState.of(listed("p"))
    assert (False, 0) == (pod.ready, pod.restarts)

    seen = []
    for _ in range(4):
        pod.advance()
        seen.append((pod.ready, pod.restarts))

    assert [(True, 0), (False, 1), (True, 1), (False, 2)] == seen


def test_the_state_is_read_back_from_the_listed_status() -> None:
    status = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}],
              "containerStatuses": [{"name": "app", "restartCount": 3}]}  # fmt: skip
    pod = patcher.PodState.of(listed("p", status))
    assert patcher.PodState("ns", "p", [("app", "img:1")], ready=True, restarts=3) == pod


def test_a_status_patch_changes_the_pod_and_nothing_a_quota_counts() -> None:
    pod = patcher.PodState("ns", "p", [("app", "img:1")], ready=True, restarts=2)
    first = patcher.status_patch(pod, "2026-11-27T10:00:01Z", "2026-11-27T09:00:00Z")
    pod.advance()
    second = patcher.status_patch(pod, "2026-11-27T10:00:01Z", "2026-11-27T09:00:00Z")

    assert ["status"] == list(first)  # the status subresource: no spec, no resources
    status = first["status"]
    assert "Running" == status["phase"]  # not terminal: charged as a Pending pod is
    conditions = {c["type"]: c["status"] for c in status["conditions"]}
    assert {"Initialized": "True", "ContainersReady": "True", "Ready": "True"} == conditions
    (container,) = status["containerStatuses"]
    assert {"name": "app", "image": "img:1", "ready": True, "restartCount": 2} == {
        key: container[key] for key in ("name", "image", "ready", "restartCount")
    }
    assert first != second  # the next update is a change even within the same second
    assert {"Initialized": "True", "ContainersReady": "False", "Ready": "False"} == {
        c["type"]: c["status"] for c in second["status"]["conditions"]
    }
    assert 3 == second["status"]["containerStatuses"][0]["restartCount"]


class VirtualTime:
    """A clock that moves only when the patcher sleeps, or when a request stalls."""

    def __init__(self) -> None:
        self.now = 1000.0

    def clock(self) -> float:
        return self.now

    async def sleep(self, delay: float) -> None:
        await asyncio.sleep(0)
        self.now += delay


class FakeRaw:
    def __init__(self, time: VirtualTime, stall: dict[int, float] | None = None) -> None:
        self.time = time
        self.stall = stall or {}
        self.calls: list[tuple[str, str, dict[str, Any], str]] = []

    async def call(self, method: str, path: str, body: Any = None, *, content_type: str = "",
                   request_timeout: float = 0.0) -> dict[str, Any]:  # fmt: skip
        self.time.now += self.stall.get(len(self.calls), 0.0)
        self.calls.append((method, path, body, content_type))
        return {}


def kubelets(time: VirtualTime, raw: FakeRaw, pods: int = 3) -> patcher.Kubelets:
    states = [patcher.PodState.of(listed(f"p{index}")) for index in range(pods)]
    return patcher.Kubelets(raw, states, 1, clock=time.clock, sleep=time.sleep)  # type: ignore[arg-type]


async def test_the_patcher_updates_the_pods_round_robin_at_the_rate() -> None:
    time = VirtualTime()
    raw = FakeRaw(time)
    run = kubelets(time, raw)

    result = await run.run(1.0, 10.0)  # updates due at 0.0, 0.1, ... 0.9

    assert {"updates": 10, "skipped": 0, "errors": {}} == {
        key: result[key] for key in ("updates", "skipped", "errors")
    }
    assert 0.9 == pytest.approx(result["seconds"])
    assert [f"/api/v1/namespaces/ns/pods/p{i % 3}/status" for i in range(10)] == [
        path for _, path, _, _ in raw.calls
    ]
    assert {("PATCH", "application/merge-patch+json")} == {(m, c) for m, _, _, c in raw.calls}
    readiness = [body["status"]["containerStatuses"][0]["ready"] for _, _, body, _ in raw.calls]
    assert [True, True, True, False, False, False, True, True, True, False] == readiness
    # The next run goes on with the next pod.
    await run.run(0.1, 10.0)
    assert raw.calls[-1][1].endswith("/p1/status")


async def test_updates_due_more_than_a_second_ago_are_skipped_not_sent_in_a_burst() -> None:
    # The third update (due at 0.2 s) is answered 1.55 s later, at 1.75 s: the updates due at
    # 0.3 .. 0.7 s are more than a second late and skipped; 0.8 .. 1.7 s are sent at once, and
    # the rest on time. 30 updates due in 3 s, 5 skipped.
    time = VirtualTime()
    raw = FakeRaw(time, stall={2: 1.55})

    result = await kubelets(time, raw).run(3.0, 10.0)

    assert (25, 5) == (result["updates"], result["skipped"])
    assert 25 == len(raw.calls)
