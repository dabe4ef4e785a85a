"""Benchmark evaluation: ``benchmarks`` (the shipped data, gold answers, suites), ``grading``
(boxed-answer extraction, math-verify), ``pool`` (grading in processes), ``metrics`` (pass@k, Overall,
bootstrap), ``generation`` (vLLM / OpenAI-compatible / transformers), ``suite`` (the node-level entry)."""
