"""The closed loop: the rounds (``core``), budgets (``budget``), the run state kept in git (``state``) and
the parallel evaluation workers (``executor``)."""
