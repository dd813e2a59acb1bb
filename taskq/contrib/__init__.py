"""Framework integrations: :mod:`taskq.contrib.flask` and :mod:`taskq.contrib.django`.

Each imports its framework; ``import taskq`` imports neither.
"""
