"""What starts and watches ranks, in the Airflow task's process: ``job.run_training``
launches a run's ranks through :mod:`dagtrain.launch`, ``elastic`` relaunches them on
the world left, ``preflight`` checks a run's input before any rank starts. Imports the
rank side's modules, never the other way round.
"""
