"""Where candidate code runs: behind the OS boundary, with kernel limits, talking only over a channel.

- ``boundary``: bubblewrap namespaces (or the documented weak mode) and what the child may see;
- ``limits``: the rlimits / tmpfs sizes / wall clock of one child; ``launch`` applies them in it;
- ``env``: allowlisted environments (no secrets); ``channel``: the parent's frame reader;
- ``runner``: start a child, read its frames and output incrementally, enforce deadlines, kill it;
- ``process``: trusted children (no candidate code) with limits and capped output.
"""
