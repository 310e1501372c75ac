"""What runs inside a rank: one rank's run (``trainer``), its step graphs (``step`` for
data parallelism, ``pipelining`` for a stage of a pipelined model), their parts,
checkpoints, data and models. ``python -m dagtrain.training.rank CONFIG RESULT`` is the
entry point the launcher starts in every process (``__main__``). Nothing here imports
:mod:`dagtrain.training.driver`.
"""
