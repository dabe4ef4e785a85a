"""poise-git's engine: the archive (git), the operators of the POISE loop, and the loop itself.

The core library never imports the CLI (``engine.cli``)."""

__version__ = "0.1.0"
