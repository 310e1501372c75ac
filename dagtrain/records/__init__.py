"""What dagtrain writes to disk that another part reads, typed in one place.

Standard library only: a base package every layer may import. Today: the op names of a
pipeline stage's step trace and the bubble read from them (:mod:`.trace`).
"""
