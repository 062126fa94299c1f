"""``kubectl tally``: the command line, and what each command reads.

kubectl runs ``kubectl-tally`` from PATH for ``kubectl tally …`` and passes every argument after
``tally`` through, so the kubeconfig options kubectl users type (``--kubeconfig``,
``--context``, ``-n``) are taken here too, after the command.

Exit status: 0 done (``why``: the object fits); 1 ``why``: the server refused it; 2 bad usage
(argparse's own), an unreachable cluster, an unknown namespace, or something the user may not
read. A read that is forbidden does not hide what could be read: ``status`` shows the quotas
the user may see, then says on stderr, one line each, what it could not read, and exits 2.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Awaitable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, TextIO, TypeVar

from tally.cli import render
from tally.cli.api import Resource, Session
from tally.cli.errors import DOES_NOT_FIT, ERROR, OK, CliError, Target
from tally.cli.progress import Progress
from tally.cli.status import (
    RESOURCE_QUOTA,
    StatusReport,
    binding_cluster_quotas,
    status_report,
)
from tally.cli.top import TopReport, evaluators_for, rank
from tally.cli.why import Decision, Explanation, ManifestError, QuotaRef, explain, load_manifest
from tally.clusterquota import applied
from tally.clusterquota import quota as cluster_quota
from tally.evaluators.base import Evaluator, GroupResource
from tally.evaluators.podsets import PodSetEvaluator
from tally.evaluators.registry import Registry, new_registry
from tally.kube import cluster_quotas
from tally.quota.identity import CLUSTER_QUOTA_KIND

__all__ = ["build_parser", "main", "registry"]

T = TypeVar("T")

NAMESPACES: Final = Resource("", "v1", "namespaces", "Namespace", namespaced=False)
RESOURCE_QUOTAS: Final = Resource("", "v1", "resourcequotas", RESOURCE_QUOTA, namespaced=True)
CLUSTER_QUOTAS: Final = Resource(
    cluster_quotas.GROUP, cluster_quotas.VERSION, cluster_quotas.PLURAL, CLUSTER_QUOTA_KIND, False
)
APPLIED_CLUSTER_QUOTAS: Final = Resource(
    applied.GROUP, applied.VERSION, applied.PLURAL, applied.KIND, namespaced=True
)
DEFAULT_RESOURCE: Final = "requests.cpu"
DEFAULT_LIMIT: Final = 10

DESCRIPTION: Final = """\
tally's view of quota, with your own kubeconfig and rights: which ResourceQuotas and
ClusterQuotas bind a namespace and how full they are, who uses a resource, and why an object
would be admitted or refused. Figures come from tally's evaluators and the quota controller's
status; nothing runs in the cluster for it.
"""

EXAMPLES: Final = """\
examples:
  kubectl tally status                      # the quotas binding the current namespace
  kubectl tally status -n team-a -o json    # as JSON (or -o yaml)
  kubectl tally status -A                   # every quota in every namespace
  kubectl tally top -n team-a               # the 10 objects using the most requests.cpu
  kubectl tally top -n team-a --resource podsets.tally.dev/requests.cpu --limit 3
  kubectl tally why -f pod.yaml -n team-a   # would it fit? asks the server (a dry run)

exit status: 0 done (why: it fits), 1 why: the server refuses it, 2 an error
"""


def registry() -> Registry:
    """The evaluators tally's controller charges with: upstream's, and PodSet measures."""
    evaluators = new_registry()
    evaluators.register(PodSetEvaluator())
    return evaluators


def _common(*, namespace: bool = True, all_namespaces: bool = False) -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("--kubeconfig", help="the kubeconfig file (default: $KUBECONFIG)")
    parent.add_argument("--context", help="the kubeconfig context (default: the current one)")
    if namespace:
        scope = parent.add_mutually_exclusive_group()
        scope.add_argument(
            "-n", "--namespace", help="the namespace (default: the context's namespace)"
        )
        if all_namespaces:
            scope.add_argument(
                "-A", "--all-namespaces", action="store_true", help="every namespace"
            )
    parent.add_argument(
        "-o", "--output", choices=("text", "json", "yaml"), default="text", help="output format"
    )
    parent.add_argument(
        "--color",
        choices=("auto", "always", "never"),
        default="auto",
        help="colour the text output (auto: on a terminal, unless NO_COLOR is set)",
    )
    return parent


def build_parser() -> argparse.ArgumentParser:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(
        prog="kubectl tally", description=DESCRIPTION, epilog=EXAMPLES, formatter_class=formatter
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.add_parser(
        "status",
        parents=[_common(all_namespaces=True)],
        help="the quotas binding a namespace: used/hard, a bar, the headroom",
        description="Every ResourceQuota and ClusterQuota binding the namespace (or, with -A, "
        "every namespace): each resource as used/hard, with a bar and the headroom. The "
        "figures are what tally's quota controller wrote in the quotas' status; a "
        "ClusterQuota's are its totals over every namespace it selects, with this "
        "namespace's share beside them.",
        epilog="examples:\n  kubectl tally status -n team-a\n  kubectl tally status -A -o yaml",
        formatter_class=formatter,
    )
    top = commands.add_parser(
        "top",
        parents=[_common()],
        help="the objects of a namespace using the most of a resource",
        description="The objects of the namespace using the most of one quota resource, by "
        "tally's evaluators (what a quota on that name charges them), with their owners.",
        epilog="examples:\n  kubectl tally top -n team-a\n"
        "  kubectl tally top -n team-a --resource requests.memory --limit 3\n"
        "  kubectl tally top -n team-a --resource podsets.tally.dev/requests.cpu\n"
        "  kubectl tally top -n team-a --resource count/configmaps",
        formatter_class=formatter,
    )
    top.add_argument(
        "--resource",
        default=DEFAULT_RESOURCE,
        help=f"a quota resource name (default: {DEFAULT_RESOURCE})",
    )
    top.add_argument(
        "--limit",
        type=_limit,
        default=DEFAULT_LIMIT,
        help=f"show this many objects, 0 for all (default: {DEFAULT_LIMIT})",
    )
    why = commands.add_parser(
        "why",
        parents=[_common()],
        help="what an object would be charged, and whether the server admits it",
        description="What creating the object would charge, against which quotas (tally's "
        "evaluators, the quotas' status), and the API server's real decision: a server-side "
        "dry run, which every admission step judges and nothing stores or charges. Exit "
        "status 0 when the server admits it, 1 when it refuses it.",
        epilog="examples:\n  kubectl tally why -f pod.yaml -n team-a\n"
        "  kubectl get podset web -o yaml | kubectl tally why -f -",
        formatter_class=formatter,
    )
    why.add_argument(
        "-f", "--filename", required=True, help="the object's manifest (YAML or JSON; - for stdin)"
    )
    return parser


def _limit(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 (all) or more: {value}")
    return value


def use_colour(choice: str, stream: TextIO, environ: Mapping[str, str]) -> bool:
    """``always``/``never``; ``auto``: a terminal, without ``NO_COLOR`` (no-color.org) and
    not a ``dumb`` one."""
    if choice != "auto":
        return choice == "always"
    return stream.isatty() and "NO_COLOR" not in environ and environ.get("TERM") != "dumb"


class Reads:
    """Reads that RBAC may refuse without hiding the rest: each refusal becomes one line.
    Any other failure (an unreachable server) still ends the command."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    async def soft(self, read: Awaitable[T]) -> T | None:
        try:
            return await read
        except CliError as error:
            if not error.forbidden:
                raise
            self.problems.append(str(error))
            return None

    async def cluster_quotas(
        self, session: Session, namespace: str | None
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The ClusterQuotas, or, for a user who may not list them, ``namespace``'s
        AppliedClusterQuotas (what tally shows that namespace of each one binding it): then
        nothing is missing, and the refusal is not reported."""
        before = len(self.problems)
        cqs = await self.soft(session.list_all(CLUSTER_QUOTAS, None))
        if cqs is not None or namespace is None:
            return cqs or [], []
        try:
            shown = await session.list_all(APPLIED_CLUSTER_QUOTAS, namespace)
        except CliError as error:
            if not error.forbidden:
                raise
            return [], []
        del self.problems[before:]
        return [], shown


def applied_as_resource_quota(acq: Mapping[str, Any]) -> dict[str, Any]:
    """An AppliedClusterQuota as the ResourceQuota-shaped view ``why`` judges against (the
    shape :func:`tally.clusterquota.quota.as_resource_quota` gives a ClusterQuota): its limits
    and the total used."""
    metadata = acq.get("metadata") or {}
    total = (acq.get("status") or {}).get("total") or {}
    view: dict[str, Any] = {
        "kind": CLUSTER_QUOTA_KIND,
        "metadata": {"name": metadata.get("name"), "namespace": metadata.get("namespace")},
        "spec": dict((acq.get("spec") or {}).get("quota") or {}),
    }
    if total:
        view["status"] = {key: total[key] for key in ("hard", "used") if key in total}
    return view


def _labels(namespace: Mapping[str, Any]) -> dict[str, str]:
    metadata = namespace.get("metadata") or {}
    return dict(metadata.get("labels") or {})


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


async def _namespace(session: Session, name: str, reads: Reads) -> dict[str, Any] | None:
    """The namespace; a :class:`CliError` when it does not exist, None when the user may not
    read it (which :class:`Reads` notes)."""
    before = len(reads.problems)
    found = await reads.soft(
        session.get(f"/api/v1/namespaces/{name}", Target("get", "namespaces", name=name))
    )
    if found is None and len(reads.problems) == before:
        raise CliError(f'namespace "{name}" not found')
    return found


async def status(
    session: Session, namespace: str | None, all_namespaces: bool, reads: Reads
) -> StatusReport:
    labels: dict[str, dict[str, str]] = {}
    if all_namespaces:
        for ns in await reads.soft(session.list_all(NAMESPACES, None)) or []:
            labels[_name(ns)] = _labels(ns)
        rqs = await reads.soft(session.list_all(RESOURCE_QUOTAS, None)) or []
        asked = None
    else:
        assert namespace is not None
        found = await _namespace(session, namespace, reads)
        if found is not None:
            labels[namespace] = _labels(found)
        rqs = await reads.soft(session.list_all(RESOURCE_QUOTAS, namespace)) or []
        asked = [namespace]
    # Which ClusterQuotas bind a namespace depends on its labels: without them, none can be
    # shown (and reads.problems says why) but the namespace's applied view.
    cqs: list[dict[str, Any]] = []
    shown: list[dict[str, Any]] = []
    if labels or not all_namespaces:
        cqs, shown = await reads.cluster_quotas(session, None if all_namespaces else namespace)
    return status_report(asked, rqs, cqs, labels, shown)


async def top(
    session: Session, namespace: str, resource: str, limit: int, evaluators: Registry
) -> TopReport:
    measuring = evaluators_for(resource, evaluators)
    if not measuring:
        raise CliError(
            f'no evaluator measures "{resource}": a quota resource name such as requests.cpu, '
            "limits.memory, pods, count/configmaps or podsets.tally.dev/requests.cpu"
        )
    await _namespace(session, namespace, Reads())
    objects: list[tuple[str, Evaluator, list[dict[str, Any]]]] = []
    unserved: list[str] = []
    for evaluator in measuring:
        group_resource = evaluator.group_resource
        served = await session.resource(group_resource.group, group_resource.resource)
        if served is None:
            unserved.append(str(group_resource))
            continue
        objects.append((served.kind, evaluator, await session.list_all(served, namespace)))
    if not objects:
        raise CliError(
            f"{resource} is measured on {', '.join(unserved)}, which this cluster does not serve"
        )
    return rank(namespace, resource, objects, limit or None)


async def why(
    session: Session,
    obj: dict[str, Any],
    namespace: str | None,
    default_namespace: str,
    evaluators: Registry,
    reads: Reads,
) -> tuple[Explanation, Decision]:
    api_version, kind = str(obj["apiVersion"]), str(obj["kind"])
    resource = await session.resource_for_kind(api_version, kind)
    if resource is None:
        raise CliError(f'the server does not serve kind "{kind}" in "{api_version}"')
    if not resource.namespaced:
        raise CliError(f"{kind} is cluster-scoped: quotas charge namespaced objects only")
    metadata = dict(obj.get("metadata") or {})
    own = metadata.get("namespace")
    if namespace and own and own != namespace:
        raise CliError(
            f'the object names namespace "{own}", not "{namespace}": pass -n {own}, or edit '
            "the file"
        )
    namespace = str(namespace or own or default_namespace)
    obj = {**obj, "metadata": {**metadata, "namespace": namespace}}
    found = await _namespace(session, namespace, reads)
    rqs = await reads.soft(session.list_all(RESOURCE_QUOTAS, namespace)) or []
    refs = [QuotaRef(RESOURCE_QUOTA, _name(rq), rq) for rq in sorted(rqs, key=_name)]
    cqs, shown = await reads.cluster_quotas(session, namespace)
    if found is not None:
        refs.extend(
            QuotaRef(
                CLUSTER_QUOTA_KIND,
                cluster_quota.name_of(cq),
                cluster_quota.as_resource_quota(cq, namespace),
            )
            for cq, _ in binding_cluster_quotas(cqs, {namespace: _labels(found)})
        )
    refs.extend(
        QuotaRef(CLUSTER_QUOTA_KIND, _name(acq), applied_as_resource_quota(acq))
        for acq in sorted(shown, key=_name)
    )
    evaluator = evaluators.get_or_count(GroupResource(resource.group, resource.plural))
    explanation = explain(obj, kind, namespace, evaluator, refs)
    decision = await session.dry_run_create(resource, namespace, obj)
    return explanation, decision


def _read_manifest(filename: str, stdin: TextIO) -> dict[str, Any]:
    source = "stdin" if filename == "-" else filename
    try:
        text = stdin.read() if filename == "-" else Path(filename).read_text()
    except OSError as error:
        raise CliError(f"cannot read {source}: {error.strerror or error}") from None
    try:
        return load_manifest(text, source)
    except ManifestError as error:
        raise CliError(str(error)) from None


async def run(args: argparse.Namespace, stdout: TextIO, stderr: TextIO, stdin: TextIO) -> int:
    """One command; returns the exit status. Raises :class:`CliError` for fatal errors."""
    style = render.Style(colour=use_colour(args.color, stdout, os.environ))
    manifest = _read_manifest(args.filename, stdin) if args.command == "why" else None
    session, default_namespace = await Session.open(args.kubeconfig, args.context, Progress(stderr))
    reads = Reads()
    try:
        namespace = args.namespace
        if args.command == "status":
            report = await status(
                session, namespace or default_namespace, args.all_namespaces, reads
            )
            data = render.status_data(report)
            # "No quota binds it" would mislead when reads were refused: the errors say it all.
            text = (
                "" if reads.problems and not report.quotas else render.render_status(report, style)
            )
            code = OK
        elif args.command == "top":
            top_report = await top(
                session, namespace or default_namespace, args.resource, args.limit, registry()
            )
            data = render.top_data(top_report)
            text = render.render_top(top_report, style)
            code = OK
        else:
            assert manifest is not None
            explanation, decision = await why(
                session, manifest, namespace, default_namespace, registry(), reads
            )
            data = render.why_data(explanation, decision)
            text = render.render_why(explanation, decision, style)
            code = OK if decision.allowed else DOES_NOT_FIT
    finally:
        await session.close()
    stdout.write(text if args.output == "text" else render.dump(data, args.output))
    stdout.flush()
    for problem in reads.problems:
        stderr.write(f"error: {problem}\n")
    return ERROR if reads.problems else code


def main(argv: Sequence[str] | None = None) -> int:
    """The ``kubectl-tally`` console script."""
    args = build_parser().parse_args(argv)
    try:
        return asyncio.run(run(args, sys.stdout, sys.stderr, sys.stdin))
    except CliError as error:
        sys.stderr.write(f"error: {error}\n")
        return ERROR
    except KeyboardInterrupt:
        sys.stderr.write("error: interrupted\n")
        return 130
