"""Periodic tasks: schedules that enqueue each tick exactly once (docs/periodic.md).

- :mod:`~taskq.schedules.spec` (pure): the schedule kinds, an interval (:class:`Every`)
  and :func:`crontab` in a time zone, with their daylight-saving rule;
- :mod:`~taskq.schedules.catchup` (pure): which ticks a scheduler fires when it comes late;
- :mod:`~taskq.schedules.definitions`: :class:`PeriodicTask` and the app's schedules;
- :mod:`~taskq.schedules.store`: the ``taskq_schedule`` and ``taskq_schedulers`` rows and
  the tick transaction (lock the row, add the outbox row, advance the next run);
- :mod:`~taskq.schedules.scheduler`: the loop of one scheduler;
- :mod:`~taskq.schedules.beat_process`: ``taskq beat`` and the process of ``taskq worker
  --beat``;
- :mod:`~taskq.schedules.report`: what ``taskq status`` and ``taskq beat list`` show.
"""
