"""The fault suite's checker classifies ids as the issue defines (pure, no services)."""

from __future__ import annotations

from collections import Counter

from tests.faults.ledger import FaultSchedule, Ledger, Observed, check


def _check(ledger: Ledger, observed: Observed):
    schedule = FaultSchedule(seed=7)
    schedule.add("kill child 1")
    return check(ledger, observed, done_at=schedule.started_at + 2.5, schedule=schedule)


def test_completed_and_dead_lettered_ids_are_not_lost_the_others_are():
    ledger = Ledger()
    ledger.commit("done", "parked", "missing")
    observed = Observed(executions=Counter(done=1, parked=3), effects=Counter(done=1),
                        dead_letters={"parked": "ProcessCrashLoop"})

    counts = _check(ledger, observed)

    assert counts.lost == ["missing"]
    assert counts.dead_lettered == {"parked": "ProcessCrashLoop"}
    assert counts.histogram == {1: 1, 3: 1, 0: 1}
    assert not counts.ok


def test_rolled_back_or_never_sent_ids_that_ran_or_wait_are_unexpected():
    ledger = Ledger()
    ledger.commit("ok")
    ledger.roll_back("rolled-back")
    ledger.doubt("in-doubt")
    observed = Observed(executions=Counter({"ok": 1, "rolled-back": 1, "in-doubt": 1}),
                        effects=Counter({"ok": 1, "in-doubt": 1}), queued={"never-sent"})

    counts = _check(ledger, observed)

    assert counts.unexpected == ["never-sent", "rolled-back"]
    assert counts.recovered == 1  # the in-doubt id ran: neither lost nor unexpected
    assert counts.lost == []


def test_two_effect_rows_are_a_duplicated_effect_two_runs_are_not():
    ledger = Ledger()
    ledger.commit("twice-applied", "twice-run")
    observed = Observed(executions=Counter({"twice-applied": 2, "twice-run": 2}),
                        effects=Counter({"twice-applied": 2, "twice-run": 1}))

    counts = _check(ledger, observed)

    assert counts.dup_effects == ["twice-applied"]
    assert counts.histogram == {2: 2}


def test_the_counts_line_ends_with_the_seed_and_the_schedule():
    ledger = Ledger()
    ledger.commit("a")
    counts = _check(ledger, Observed(executions=Counter(a=1), effects=Counter(a=1)))

    line = counts.line("demo", FaultSchedule(seed=42), {"resumed_after_heal": "1.00s"})

    assert counts.ok
    assert line.startswith("faults[demo] committed=1 lost=0 unexpected=0 dup_effects=0 ")
    assert "resumed_after_heal=1.00s seed=42 faults=0 schedule=[]" in line
    assert counts.done_after_last_fault_s is not None
    assert 2.4 < counts.done_after_last_fault_s < 2.6
