"""dagtrain: distributed deep-learning training orchestrated by Apache Airflow 3.

Importing this package is cheap: nothing heavy (torch, horovod, mpi4py, airflow) is
imported here.
"""

from __future__ import annotations

__version__ = "0.1.0"
