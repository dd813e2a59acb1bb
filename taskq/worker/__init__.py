"""The ``taskq worker``: a supervisor process and N worker processes.

========================  ==================================================================
module                    responsibility
========================  ==================================================================
``supervisor``            parent: declare, spawn, watch, replace; hard time limits; signals
``process``               child entry: import the app from ``module:app``, run the loop
``loop``                  delivery -> checks -> decode -> execute -> exactly one action
``execution``             run one task function, return an Outcome; knows nothing of pika
``retrying``              publish a retry (or an early delivery) to run later, then ack
``time_limits``           soft limit (SIGALRM) and the slot the supervisor watches
``deaths``                per-supervisor record of messages that killed their process
========================  ==================================================================
"""

from __future__ import annotations

from taskq.worker.process import load_app
from taskq.worker.supervisor import Supervisor

__all__ = ["Supervisor", "load_app"]
