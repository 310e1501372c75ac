"""What dagtrain writes to disk that another part reads, typed in one place.

Standard library only (and ``dagtrain.atomic``): a base package every layer may import.
:mod:`.metrics`: a training task's ``metrics.jsonl`` (its lines, their one writer each
and their readers, an elastic run's :class:`~.metrics.WorldChange`); :mod:`.trace`: the
op names of a pipeline stage's step trace and the bubble read from them; :mod:`.status`:
a rank's status record (``rank<N>.json``); :mod:`.result`: rank 0's result, the training
task's ``result.json`` and a try's failure record; :mod:`.registry`: the model registry
and a run's evaluation; :mod:`.mlflow`: what the phases record of MLflow;
:mod:`.layout` and :mod:`.names`: where each file lies and what it is called.
"""
