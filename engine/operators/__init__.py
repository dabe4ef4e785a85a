"""The POISE operators, one module each: ``propose`` (with ``context`` and the ``proposers``),
``implement`` (with ``static_check``), ``verify``, ``evaluate``, ``reflect``; ``fingerprint`` gives the
behavioural signature screening and verification share, ``llm`` the OpenAI-compatible agent client."""
