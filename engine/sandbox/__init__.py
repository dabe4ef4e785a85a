"""Where candidate code runs: a child process with limits (``process``)."""
