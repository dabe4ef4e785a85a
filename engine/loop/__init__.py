"""The closed loop: the rounds (``core``), the typed run plan (``plan``), budgets (``budget``), the run
state kept in git (``state``) and where evaluations run (``executor``: worker processes or Ray;
``inline``: threads of this process)."""
