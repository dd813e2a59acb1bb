"""``taskq teardown``: delete everything an app declared on the broker, after asking."""

from __future__ import annotations

from typing import Any

import click

from taskq.cli._common import APP_OPTION, fail, load, reported
from taskq.settings import redact_url


@click.command(short_help="Delete what the app declared on the broker, after asking.")
@APP_OPTION
@click.option(
    "-Q", "--queues", "extra", metavar="Q1,Q2",
    help="Also delete these queues (and their .dlq), e.g. queues only apply_async(queue=...) "
    "named.",
)
@click.option("--yes", is_flag=True, help="Do not ask for confirmation (for scripts).")
@click.option("--force", is_flag=True, help="Delete even while workers consume the queues.")
def teardown(app_path: str, extra: str | None, yes: bool, force: bool) -> None:
    """Delete the app's queues, their dead letters and, unless another app shares the
    namespace, its exchanges, unroutable queue and delay tiers.

    Lists everything first with its message count and asks; refuses while consumers are
    attached (stop the workers, or --force). Messages in what is deleted are lost.
    """
    from taskq.broker.teardown import survey, tear_down

    app = load(app_path)
    queues = [*app.queue_names(), *(q.strip() for q in (extra or "").split(",") if q.strip())]
    with reported():
        plan = survey(app.settings, app.topology, dict.fromkeys(queues))
    click.echo(f"taskq teardown of app {app.name} (namespace {plan.namespace}) on "
               f"{redact_url(app.settings.broker_url)}")
    if plan.empty:
        click.echo("  nothing of this app is on the broker")
        return
    _show(plan)
    if plan.consumers and not force:
        busy = ", ".join(f"{q.name} ({q.consumers})" for q in plan.consumers)
        fail(f"consumers are attached to {busy}: stop the app's workers first, or pass "
             "--force to delete the queues under them", 1)
    if not yes:
        click.confirm(f"Delete these? {plan.messages} message(s) in them will be lost",
                      abort=True)
    with reported():
        report = tear_down(app.settings, plan)
    click.echo(f"deleted {len(report.deleted)} queues and exchanges")
    if report.namespace_kept:
        click.echo(f"kept the namespace's exchanges, unroutable queue and delay tiers: "
                   f"{report.namespace_kept}")


def _show(plan: Any) -> None:
    if plan.queues:
        click.echo("  queues of the app:")
        for queue in plan.queues:
            click.echo(f"    {queue.name:<40} {queue.messages:>8} messages "
                       f"{queue.consumers:>4} consumers")
    if not plan.namespace_objects:
        return
    click.echo(f"  objects of namespace {plan.namespace} (deleted only if no other app's "
               f"queue is bound to exchange {plan.namespace}):")
    tiers = [o for o in plan.namespace_objects if ".delay." in o.name]
    for thing in plan.namespace_objects:
        if thing not in tiers:
            held = f" {thing.messages:>8} messages" if thing.kind == "queue" else ""
            click.echo(f"    {thing.kind} {thing.name}{held}")
    if tiers:
        waiting = sum(t.messages for t in tiers)
        queues = sum(1 for t in tiers if t.kind == "queue")
        click.echo(f"    delay tiers: {queues} queues and {len(tiers) - queues} exchanges "
                   f"{tiers[0].name.rsplit('.', 2)[0]}.* ({waiting} delayed messages)")

