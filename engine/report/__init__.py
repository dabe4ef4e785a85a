"""The HTML report (``html``) and its figures (``figures``)."""
